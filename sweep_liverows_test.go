package recovery

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Review of issue 21 (review1). Release after a lost lease relies on the
// reset ledger to skip the rows a recovery already reset; the backstop
// sweep records nothing in the ledger. A worker paused past its rows TTL,
// whose rows the sweep reset and a peer took again, releases the peer's
// row when it resumes:
//
//  1. w takes rows 2-4 (tracked before the COMMIT), then is paused (its
//     Redis calls hang) past its rows TTL: its heartbeat and rows set
//     expire. No peer scans meanwhile (the fleet is down, or Redis lost
//     the registry), so no recovery of w records anything in the ledger.
//  2. Sweeper s finds rows 2-4 in progress in no set at two looks a gap
//     apart and resets them by version (no ledger record).
//  3. q fetches row 2 and tracks it.
//  4. w resumes: its lease stays lost (rows 2-4 held at the loss), and its
//     host releases the rest of its block, as docs/safety.md §3 says to.
//
// Row 2 is q's and must stay in progress.
func TestReleaseAfterLostLeaseLeavesARowTheBackstopSweepResetAndAPeerTookAgain(t *testing.T) {
	t.Parallel()
	pausedPastRowsTTL(t, func(t *testing.T, rdb redis.UniversalClient, w, q *Worker) {
		require.NoError(t, w.Release(context.Background(), 2, 3, 4))
	})
}

// The same without Release: w's resumed heartbeat wrote rows 2-4 back into
// its set, and Healthy fails while they are tracked (the lease stays lost),
// so a liveness probe restarts it. q's recovery of w finds row 2 in w's
// set and no ledger record for it.
func TestResumedWorkerKilledAfterTheBackstopSweepResetItsRowsLeavesAPeersRow(t *testing.T) {
	t.Parallel()
	pausedPastRowsTTL(t, func(t *testing.T, rdb redis.UniversalClient, w, q *Worker) {
		require.ErrorIs(t, w.Healthy(), ErrLeaseLost, "a liveness probe fails")
		w.crash()
		ctx := context.Background()
		require.Eventually(t, func() bool {
			_, _ = q.recoverNow(ctx) // a rows set lost is an error; what counts is w gone
			return !rdb.SIsMember(ctx, q.store.Registry(), "w").Val()
		}, 10*time.Second, 50*time.Millisecond, "q's recovery of w ends")
	})
}

// pausedPastRowsTTL runs the story above up to w's resumption, then
// then(w, q), and checks that q's row 2 is still in progress.
func pausedPastRowsTTL(t *testing.T, then func(t *testing.T, rdb redis.UniversalClient, w, q *Worker)) {
	rdb, db, prefix := onRealServers(t, 10, "RV")
	waitUptime(t, rdb, 2*time.Second)
	ctx := context.Background()
	r := resetterImpls[0].Must(t, db)
	require.True(t, r.Info().Ledger)
	wc := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = wc.Close() })
	fr := &freezer{}
	wc.AddHook(fr)
	timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      time.Second,
		HeartbeatInterval: 250 * time.Millisecond,
		RecoveryInterval:  200 * time.Millisecond,
		RowsTTL:           2 * time.Second,
		ResetTimeout:      500 * time.Millisecond,
	})}
	// w runs the sweep too, as every member of a fleet without an owner
	// column does by default: that is what tells it that a sweep may have
	// reset the rows it held when its lease was lost.
	w, logs := startWorker(t, wc, r, "w", timing...)

	setStatus(t, db, "inprog", 2, 3, 4)
	require.NoError(t, w.Track(ctx, 2, 3, 4))
	fr.freeze() // paused
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, w.ownKeys().Rows, w.ownKeys().Heartbeat).Result()
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "w's heartbeat and rows set expire")

	s, _ := newWorker(t, rdb, r, "s", timing...)
	require.Eventually(t, func() bool {
		rep, err := s.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep.strayReset > 0
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, map[int64]string{2: "queued", 3: "queued", 4: "queued"}, statusesOf(t, db, 2, 3, 4), "the sweep reset w's rows")

	q, _ := startWorker(t, rdb, r, "q", append(timing, WithBackstopSweep(false))...)
	setStatus(t, db, "inprog", 2) // q's fetch
	require.NoError(t, q.Track(ctx, 2))

	fr.thaw() // resumed
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	require.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "rows 2-4 held at the loss")
	then(t, rdb, w, q)
	assert.Equal(t, "inprog", statusesOf(t, db, 2)[2], "q's row 2 is left alone")
}

// A fleet whose members' timings differ (a rolling timing change from
// long timings to short ones, as docs/safety.md allows): the sweeping
// worker's gap is its own rows TTL and the TTLs left on the registered
// members' keys. After FLUSHALL (here: every key of the prefix deleted,
// the shared server being others' too), the slow member is registered
// again only at its next heartbeat, so the gap is the sweeper's own rows
// TTL, shorter than the slow member's heartbeat interval: its row,
// tracked before the COMMIT, is in no set at two looks a gap apart and is
// reset while it processes it. The sweeper knew better: the slow member
// announced its heartbeat TTL in the fleet record, which the sweeper keeps
// in memory.
func TestBackstopSweepLeavesTheRowOfALiveMemberWithALongerHeartbeatIntervalAfterAFlush(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	waitUptime(t, rdb, 5*time.Second)
	ctx := context.Background()
	prefix := testutil.Name("RH")
	slow, _ := startWorker(t, rdb, r, "slow", WithKeyPrefix(prefix), WithBackstopSweep(false),
		WithTimings(Timings{
			HeartbeatTTL:      5 * time.Second,
			HeartbeatInterval: 3 * time.Second,
			OperationTimeout:  300 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           8 * time.Second,
		}))
	setJobs(t, db, schema, "running", 1)
	require.NoError(t, slow.Track(ctx, 1))
	s, _ := startWorker(t, rdb, r, "s", rowsSweepTimings(WithKeyPrefix(prefix))...)
	waitTurns(t, &signals(s).beat, 5*time.Second, func() bool { return s.fleet.ttl() == 5*time.Second },
		"the sweeper learns the slow member's TTL (its heartbeat reads the fleet record)")

	beats := slow.Stats().Heartbeats
	waitTurns(t, &signals(slow).beat, 5*time.Second, func() bool { return slow.Stats().Heartbeats > beats })
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, keys...).Err()) // FLUSHALL, right after slow's beat
	beats = slow.Stats().Heartbeats
	waitTurns(t, &signals(slow).beat, 10*time.Second, func() bool { return slow.Stats().Heartbeats >= beats+2 })
	assert.Equal(t, "running", jobStates(t, db, schema)[1], "slow's row, tracked before its COMMIT")
	assert.Zero(t, s.Stats().StrayRowsReset)
}

// partialInfos is a store whose MasterInfos answers for the masters it
// reaches and fails for one more: a Cluster master down, or the old
// address of a master that failed over while the client's slot map still
// names it (go-redis follows MOVED for the set reads, so the promoted
// replica answers them while its INFO is never asked).
type partialInfos struct {
	store.Store
	on *atomic.Bool // fails only once set
}

func (p partialInfos) MasterInfos(ctx context.Context) (map[string]string, error) {
	infos, err := p.Store.MasterInfos(ctx)
	if err != nil || !p.on.Load() {
		return infos, err
	}
	return infos, errors.New("10.0.0.9:7000: dial tcp: connection refused")
}

// A look from masters one of which could not be asked its age must not
// count: that master may have just been promoted without the last writes.
// (Before review1 the answers of the others were taken, the failure
// dropped without a log line, and the look counted.)
func TestBackstopSweepHoldsALookWhenOneMastersInfoFails(t *testing.T) {
	t.Parallel()
	rdb, _, _, r := backstopWorld(t, 1)
	waitUptime(t, rdb, 3*time.Second)
	var partial atomic.Bool
	w, _ := newWorker(t, rdb, r, "s", rowsSweepTimings(WithKeyPrefix(testutil.Name("RI")),
		withStore(func(s store.Store) store.Store { return partialInfos{s, &partial} }))...)
	require.True(t, w.sweeper.by.(*rowSweep).mastersTrusted(context.Background(), time.Now()), "every master answered and is old enough")
	partial.Store(true)
	assert.False(t, w.sweeper.by.(*rowSweep).mastersTrusted(context.Background(), time.Now()), "one master's age unknown")
}

// Adding an owner column to a fleet that ran without one is "the rollout
// of owner mode" (docs/integration.md). During it, workers of the old
// configuration (rows sets, a resetter without WithOwnerColumn: the
// backstop sweep by row version is on by default) run beside owner-mode
// workers, which keep no rows set. When an old worker holds the sweep
// turn, every row an owner-mode worker has in progress is in no set. On
// review1's snapshot it was reset a gap after the first look, while its
// live worker processed it; main's fix (the sweep by version leaves the
// turn to owner-mode members) holds here too, with the old worker holding
// the turn before the owner-mode worker starts.
func TestBackstopSweepByVersionLeavesTheRowsOfLiveOwnerModeWorkers(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "RM")
	waitUptime(t, rdb, 2*time.Second)
	ctx := context.Background()
	opts := rowsSweepTimings(WithKeyPrefix(prefix))
	old, err := pgxreset.New(db) // no owner column: rows sets, the sweep by version
	require.NoError(t, err)
	s, _ := newWorker(t, rdb, old, "old-1", opts...)
	require.True(t, s.sweeper.byVersion())
	rep, err := s.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.turnHeld, "an old worker holds the sweep turn")

	owner, _ := startWorker(t, rdb, fencedResetter(t, db), "new-1", opts...)
	require.True(t, owner.Stats().OwnerMode)
	take(t, db, "new-1", 1) // the owner-mode worker's fetch
	require.NoError(t, owner.Track(ctx, 1))
	// The old worker's own sweep loop, from now on, for three rows TTLs.
	require.NoError(t, s.Start(ctx))
	window := 3 * time.Second
	turns := signals(s).sweep.Span(t, window)
	// About one turn a recovery interval, the fleet's timing (30 in the
	// window); a quarter of them leaves room for a loaded machine.
	require.GreaterOrEqual(t, len(turns), int(window/owner.opts.recoveryInterval)/4, "the old worker swept throughout the window")
	for i, err := range turns {
		require.NoError(t, err, "sweep %d of the window", i)
	}
	require.NoError(t, owner.CheckLease(), "the owner-mode worker is alive")
	st, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", st, "a live owner-mode worker's row")
}

// A correct configuration: a live worker has just committed its row's
// outcome and not yet untracked it (Untrack follows the COMMIT, and with
// WithDeferredUntrack it lingers), while a row of a fleet gone is stuck in
// progress. The look sees the sets hold rows, none in progress, and other
// rows in progress: the shape of swapped statuses, but the held row is
// finished, not queued. It must raise no ErrMisconfigured (an Error line,
// Stats.Errors) and remember the stuck row. (On review1's snapshot it
// did; main's heldRowsStale, which reads the held rows' states, fixed it.)
func TestBackstopSweepRaisesNoMisconfigurationForARowFinishedBeforeItsUntrack(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 6)
	ctx := context.Background()
	opts := rowsSweepTimings(WithKeyPrefix(testutil.Name("RF")))
	live, _ := startWorker(t, rdb, r, "live", append(opts, WithBackstopSweep(false))...)
	setJobs(t, db, schema, "running", 1, 5) // 1: a fleet gone; 5: live's
	require.NoError(t, live.Track(ctx, 5))
	setJobs(t, db, schema, "finished", 5) // live's COMMIT; its Untrack comes next

	s, _ := newWorker(t, rdb, r, "s", opts...)
	rep, err := s.sweeper.runOnce(ctx)
	require.NoError(t, err, "a correct configuration")
	assert.Equal(t, 1, rep.strayWaiting, "row 1 waits for its gap")
	assert.Zero(t, s.Stats().Errors)
	require.NoError(t, live.Untrack(5))
}
