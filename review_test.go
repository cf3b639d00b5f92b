package recovery

// Regressions of a second adversarial review, of the second protocol
// version (incarnations, reset ledger, failure notes, tombstones, rows not
// reset). Each test drives one interleaving that failed before its fix (R1
// to R5 below; the fixes are in docs/safety.md §9). Real redis-server and
// PostgreSQL (internal/testutil) unless the hole is on the Redis side only
// (miniredis).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// R1 (fixed). Release racing with a Track of the same row strands the row.
//
// A worker runs several goroutines on one Worker (the README's loop, times
// N). Goroutine A abandons row 1 with Release; goroutine B fetches the
// queue and gets row 1 back, since A's reset just queued it:
//
//	A: Release(1): reset COMMITs (row 1 queued, owner NULL)
//	B: FetchBlockOfRows: row 1 inprog, owner w; Track(1)   (ids += 1; SADD 1)
//	A: Release continues: Untrack(1)                         (ids -= 1; SREM 1)
//	B: processes row 1 ...; w is SIGKILLed
//
// Row 1 is in progress and in no rows set, in memory or in Redis: no
// heartbeat writes it back and no recovery ever resets it (owner fencing
// without the backstop sweep, the default). The same happens if B's Track
// lands between Release's markReleased and its Untrack (the rotation then
// runs, and the Untrack removes the row all the same), and without owner
// fencing. Release's Untrack cannot tell the row it released from the same
// ID tracked since.
func TestSafetyReleaseRacingWithATrackOfTheSameRowLeavesItTracked(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RV1")
	h := &hookResetter{PgxResetter: fencedResetter(t, db)}
	w, _ := startWorker(t, rdb, h, "w", WithKeyPrefix(prefix), WithRowsSets()) // rows-set mode: the set is what is checked
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))

	h.after = func() { // right after Release's reset committed: goroutine B
		s, _ := rowState(t, db, 1)
		require.Equal(t, "queued", s, "A's Release put row 1 back in the queue")
		take(t, db, "w", 1) // B's fetch gets it again
		require.NoError(t, w.Track(ctx, 1))
	}
	require.NoError(t, w.Release(ctx, 1))

	s, o := rowState(t, db, 1)
	require.Equal(t, "inprog", s)
	require.Equal(t, "w", *o, "B holds row 1")
	assert.Equal(t, 2, w.Stats().TrackedRows, "rows 1 (B's) and 2 are tracked")
	assert.ElementsMatch(t, []string{"1", "2"}, rowsOf(t, rdb, prefix, "w"), "rows set holds B's row 1")

	w.crash()
	require.NoError(t, rdb.Del(ctx, w.ownKeys().Heartbeat).Err())
	r, _ := newWorker(t, rdb, fencedResetter(t, db), "r", WithKeyPrefix(prefix))
	_, err := r.RecoverNow(ctx)
	require.NoError(t, err)
	s, _ = rowState(t, db, 2)
	require.Equal(t, "queued", s, "row 2 recovered")
	s, _ = rowState(t, db, 1)
	assert.Equal(t, "queued", s, "row 1, in progress by the dead w, must be recovered too; it is stuck")
}

// R2 (fixed). A fixed instance ID restarted before its predecessor's heartbeat
// expired inherits the predecessor's rows set and never recovers it.
//
// docs/design.md asks only that an ID set with WithInstanceID be unique "at
// any one time"; a StatefulSet pod (w-0) restarted after an OOM kill meets
// that. Its restart usually takes less than the 60 s TTL:
//
//	w-0 (life 1): takes rows 1-3, Tracks them; OOM-killed
//	w-0 (life 2): Start within the TTL: SET heartbeat, new incarnation;
//	              the old heartbeat never expires, so no peer ever finds
//	              life 1 dead; its rows 1-3 stay in the set under life 2's
//	              incarnation, unknown to life 2's memory
//	w-0 (life 2): processes other rows; Shutdown with nothing tracked:
//	              DEL heartbeat, SREM registry; the set {1,2,3} is orphaned
//
// Rows 1-3 stay in progress for ever (no sweep: the default). Even while
// life 2 runs they are held for as long as it lives. The incarnation was
// meant to name "the life of the rows set"; a new life should start a new
// set (or hand the old members to recovery) instead of adopting it.
func TestSafetyFixedInstanceIDRestartedWithinTheTTLGetsItsPredecessorsRowsRecovered(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RV2")
	life1, _ := startWorker(t, rdb, fencedResetter(t, db), "w-0", WithKeyPrefix(prefix))
	take(t, db, "w-0", 1, 2, 3)
	require.NoError(t, life1.Track(ctx, 1, 2, 3))
	life1.crash() // OOM kill: its heartbeat lives on for up to a TTL

	life2, _ := startWorker(t, rdb, fencedResetter(t, db), "w-0", WithKeyPrefix(prefix))
	take(t, db, "w-0", 4)
	require.NoError(t, life2.Track(ctx, 4))
	setStatus(t, db, "done", 4)
	require.NoError(t, life2.Untrack(4))
	require.NoError(t, life2.Shutdown(ctx), "a clean shutdown, nothing tracked")

	peer, _ := startWorker(t, rdb, fencedResetter(t, db), "peer", WithKeyPrefix(prefix))
	deadline := time.Now().Add(3 * 2 * time.Second) // three heartbeat TTLs of the fast timings
	for time.Now().Before(deadline) {
		_, _ = peer.RecoverNow(ctx)
		time.Sleep(200 * time.Millisecond)
	}
	for id := int64(1); id <= 3; id++ {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d of the killed first life must be recovered; it is stuck", id)
	}
	t.Logf("left in Redis: rows set %v, registered %v", rowsOf(t, rdb, prefix, "w-0"), registered(t, rdb, prefix, "w-0"))
}

// R3 (fixed). F1's alarm never fires for a worker of this version: its rows set can
// vanish after a failed recovery and the peer is counted as recovered.
//
// Claim answers ClaimTakenLost only when the rows set AND the incarnation
// are both gone. A worker of the second version always has an incarnation
// key (every heartbeat writes it; an idle worker has one and no rows set),
// and every claim renews both, so when the set alone is lost (eviction
// under an allkeys-* policy, an operator's DEL) the claim answers
// ClaimTaken:
//
//	R: claim V (renews set + incarnation); reset fails (PostgreSQL down); Fail: note "failed"
//	Redis loses V's rows set (not its incarnation)
//	R: claim: note "failed", incarnation exists -> ClaimTaken (not Lost)
//	R: reads 0 rows; Finish deletes the incarnation; V deregistered;
//	   counted in PeersRecovered, no ErrRowsSetLost, no Error log
//
// The existing test plants an old-version peer (no incarnation), which is
// the only case the alarm covers.
func TestRowsSetLostAfterAFailedRecoveryOfANewVersionPeerIsReported(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2")
	require.NoError(t, rdb.Set(ctx, "ALYA_{dead}_INCARNATION", "life-1", 0).Err(), "what every heartbeat of this version writes")
	r := &fakeResetter{}
	pgDown := errors.New("connection refused")
	r.setFail("dead", pgDown)
	w, _ := newWorker(t, rdb, r, "w")

	_, err := w.RecoverNow(ctx)
	require.ErrorIs(t, err, pgDown)
	require.True(t, mr.Exists("ALYA_{dead}_ROWS"))
	mr.Del("ALYA_{dead}_ROWS") // lost; the incarnation is not

	rep, err := w.RecoverNow(ctx)
	assert.ErrorIs(t, err, ErrRowsSetLost, "rows 1 and 2 were never reset and nothing knows them any more")
	assert.Zero(t, w.Stats().PeersRecovered, "not a recovery")
	assert.Empty(t, rep.Recovered)
}

// R4 (fixed). The unknown incarnation "" makes the ledger skip a row for every
// later life of the same instance ID, for the ledger's retention (7 days).
//
// docs/integration.md: "a new recoverer of an old worker finds no
// incarnation and records its reset under the incarnation ”". So every
// life of an old-version worker with a fixed ID (a StatefulSet pod during
// a rolling deploy, or a host calling PgxResetter.ResetRows itself, which
// also records under "") shares one ledger key:
//
//	old-0 (life 1, first version): row 1 in progress; killed
//	R (second version): resets row 1, ledger (old-0, "", 1)
//	old-0 (life 2, same ID, still the first version): takes row 1 again; killed
//	R: row 1 is in the ledger under (old-0, "") -> settled, skipped;
//	   old-0 deregistered as recovered; row 1 in progress for ever
func TestSafetyUnknownIncarnationNeverHidesARowOfTheNextLifeOfTheSameID(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RV4")
	pg, err := NewPgxResetter(db)
	require.NoError(t, err)
	require.True(t, pg.UsesLedger())
	r, _ := newWorker(t, rdb, pg, "r", WithKeyPrefix(prefix))

	setStatus(t, db, "inprog", 1, 2) // life 1 of old-0 (a first-version worker: no incarnation key)
	plantDeadPeer(t, rdb, prefix, "old-0", "1", "2")
	rep, err := r.RecoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	require.Equal(t, "queued", statuses(t, db)[1])

	setStatus(t, db, "inprog", 1)       // life 2 of old-0 takes row 1 again, and dies
	require.Eventually(t, func() bool { // once the tombstone of the first recovery is gone
		plantDeadPeer(t, rdb, prefix, "old-0", "1")
		rep, err = r.RecoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 100*time.Millisecond)
	assert.Equal(t, "queued", statuses(t, db)[1], "row 1 of old-0's second life must be recovered; the ledger of its first life skips it")
	assert.False(t, registered(t, rdb, prefix, "old-0"), "and old-0 is gone from the registry: nobody will retry")
}

// R5 (fixed). A reset that waits for another transaction's row locks reports, as
// not reset, rows that transaction settled: with owner fencing there is no
// advisory lock, and the "rest" CTE reads the statement's snapshot, taken
// before the wait, while "locked" re-reads the rows after it (READ
// COMMITTED: EvalPlanQual).
//
//	R1 (claim expired mid-reset, COMMIT late) or a paused owner completing
//	   its row: holds rows 1-3 locked, changes them
//	R2: reset of the same dead peer: "locked" waits; R1 commits;
//	    "locked" drops the rows (no longer inprog/owned), "changed" is empty,
//	    "rest" still sees them inprog and owned by the dead peer -> NotReset
//	R2: ErrRowsNotReset, Error log "could neither reset nor show finished",
//	    rows_not_reset event and counter, failed note; next scan is fine.
//
// A false alarm on the metric the runbook pages on, each time a claim
// expires mid-reset or a resumed worker completes a row under recovery.
func TestPgxResetterWaitingOnAConcurrentResetReportsSettledRowsAsSettled(t *testing.T) {
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	take(t, db, "dead", 1, 2, 3)

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	late, err := NewPgxResetter(tx, WithOwnerColumn("owner"))
	require.NoError(t, err)
	res1, err := late.ResetIncarnation(ctx, ResetRequest{InstanceID: "dead", RowIDs: []int64{1, 2, 3}})
	require.NoError(t, err)
	require.Equal(t, int64(3), res1.Reset, "R1's reset, not committed yet")

	r2 := fencedResetter(t, db)
	type result struct {
		res ResetResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r2.ResetIncarnation(ctx, ResetRequest{InstanceID: "dead", RowIDs: []int64{1, 2, 3}})
		done <- result{res, err}
	}()
	require.Eventually(t, func() bool { // R2 waits on R1's row locks
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%FOR UPDATE%'`).Scan(&n))
		return n > 0
	}, 10*time.Second, 20*time.Millisecond, "R2 blocks on R1's row locks")
	require.NoError(t, tx.Commit(ctx))
	got := <-done

	require.NoError(t, got.err)
	assert.Zero(t, got.res.Reset)
	assert.Empty(t, got.res.NotReset, "rows 1-3 are queued and ownerless: settled, not 'not reset'")
}
