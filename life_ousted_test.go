package recovery

// Per-life owner values against an ousted process, a rolled-back life
// record and a block fetched under the life before a loss. Each test
// states the interleaving; each failed on the code as first merged.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
)

// An ousted process keeps its sweep loop, and the sweep judges every value
// of its own instance ID by its own memory (ownerSweep.lifeEnded: id ==
// w.opts.instanceID). Process A of ID w holds the sweep turn and is paused
// past its heartbeat TTL (but not past the sweep turn's TTL, 2.2 × the
// recovery interval; 2 s and 8.8 s here). Process B of the same ID starts (a restart of its
// pod while A is stalled), recovers A's rows and takes row 1 under its own
// life. A resumes: its heartbeat finds B's value (ousted), but its sweep
// renews the turn it still holds, lists w{B's life} as "its own", finds it
// is not A's incarnation, and resets it after two sightings a TTL apart:
// B's live row goes back to the queue and is processed twice. A's host
// follows the protocol (it sees ErrLeaseLost and releases; it has nothing
// to release).
func TestAnOustedProcessLeavesTheRowsOfTheTwinThatTookItsID(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 2, "HO")
	ctx := context.Background()
	r := fencedResetter(t, db)
	opts := holeTimings(prefix, 4*time.Second)
	a, fr, _ := frozenWorker(t, rdb, r, "w", opts...)
	signals(a).sweep.WaitOrTimeout(t) // A's sweep ran at Start and holds the turn

	fr.freeze() // A stalls, holding the sweep turn (TTL about 9 s)
	waitHeartbeatGone(t, rdb, prefix, "w")
	b, _ := startWorker(t, rdb, r, "w", opts...)
	ownerB := b.OwnerValue()
	take(t, db, ownerB, 1)
	require.NoError(t, b.TrackAs(ctx, ownerB, 1))
	fr.thaw() // A resumes

	waitTurns(t, &signals(a).beat, 5*time.Second, func() bool { return a.CheckLease() != nil })
	s := watchLiveRow(t, db, b, ownerB, 1, 20*time.Second, a)
	assert.True(t, complete(t, db, ownerB, 1), "B completes its row")
	t.Logf("A ousted: %v; A stats errors=%d; row 1 status %q", a.lease.ousted.Load(), a.Stats().Errors, s)
}

// The same hole with a wider window: the ousted process need not hold the
// sweep turn when it resumes. A (ID w) is paused past its TTL while a third
// worker C holds the turn; B starts under w and takes row 1 under its life;
// A resumes, is ousted, and its host goes on (CheckLease says ErrLeaseLost,
// nothing to release). Minutes later C leaves the fleet (a rolling deploy):
// the turn expires and A, still sweeping, takes it, judges w{B's life} ended
// by its own memory and resets B's live row. (B sweeps hourly here, so that
// the turn goes to A deterministically; with equal timings it is a coin
// toss at every change of holder.)
func TestAnOustedProcessNeverSweepsEvenOnceTheTurnIsFree(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 2, "HT")
	ctx := context.Background()
	r := fencedResetter(t, db)
	opts := holeTimings(prefix, 1200*time.Millisecond)
	c, _ := startWorker(t, rdb, r, "c", opts...) // sweeps at once: holds the turn
	signals(c).sweep.WaitOrTimeout(t)
	a, fr, aLogs := frozenWorker(t, rdb, r, "w", opts...)

	fr.freeze()
	waitHeartbeatGone(t, rdb, prefix, "w")
	b, _ := startWorker(t, rdb, r, "w", append(opts[:len(opts):len(opts)], WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}))...)
	ownerB := b.OwnerValue()
	take(t, db, ownerB, 1)
	require.NoError(t, b.TrackAs(ctx, ownerB, 1))
	fr.thaw()
	waitTurns(t, &signals(a).beat, 5*time.Second, func() bool { return a.lease.ousted.Load() }, "A learns it is ousted")

	// A, ousted, goes on; C sweeps. Both sweep every 1.2 s: each must have
	// taken at least two turns across the 4 s, C's without error.
	signals(a).sweep.Clear()
	cSweeps := signals(c).sweep.Span(t, 4*time.Second)
	require.GreaterOrEqual(t, succeeded(cSweeps), 2, "C swept throughout the window: %v", cSweeps)
	require.GreaterOrEqual(t, signals(a).sweep.Clear(), 2, "A's sweep loop went on throughout the window")
	s, _ := rowState(t, db, 1)
	require.Equal(t, "inprog", s, "while C holds the turn B's row is safe")
	c.crash() // C leaves; its turn expires (2.2 × 1.2 s + op timeout)

	watchLiveRow(t, db, b, ownerB, 1, 24*time.Second, a)
	assert.Zero(t, aLogs.Count("reset the rows of an ended life of a live worker"), "the ousted process A reset them")
}

// The ended-life judgement needs two sightings a TTL apart and a third
// read just before the reset: a Redis restored once to an older life of a
// live worker (a snapshot, a failover to a lagging replica), just before a
// sweep, gives one sighting, and the worker's next heartbeat rewrites its
// life before the second. Two such rollbacks, each within a heartbeat
// interval before a sweep of one holder, would give two sightings: that
// case is not covered (docs/safety.md §2).
func TestALiveLifeIsNotJudgedEndedOnARollbackOfItsRecord(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 1, "HR")
	ctx := context.Background()
	r := fencedResetter(t, db)
	opts := append(holeTimings(prefix, time.Hour), WithTimings(Timings{RowsTTL: 2 * time.Hour}))
	x, _ := startWorker(t, rdb, r, "x", opts...) // sweeps once at Start, holds the turn
	signals(x).sweep.WaitFor(t, func(err error) bool { return err == nil })
	w, _ := startWorker(t, rdb, r, "w", opts...)
	old, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	// w loses its lease once and is in a new life, recorded.
	w.lease.markLeaseLost(nil)
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil })
	require.NotEqual(t, lifeOwner("w", old), w.OwnerValue())
	owner := w.OwnerValue()
	take(t, db, owner, 1)
	require.NoError(t, w.TrackAs(ctx, owner, 1))

	rollback := func() {
		require.NoError(t, rdb.Set(ctx, store.InstanceKeys(prefix, "w").Incarnation, old, time.Hour).Err())
	}
	rollback()
	_, _ = x.sweeper.runOnce(ctx) // sighting 1
	// A TTL and more between the sightings, w heartbeating (every 400 ms)
	// throughout: its heartbeats rewrite its life.
	beats := signals(w).beat.Span(t, x.opts.heartbeatTTL+700*time.Millisecond)
	require.GreaterOrEqual(t, len(beats), 3, "w's heartbeat ran throughout the window between the sightings: %v", beats)
	cur, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	require.Equal(t, owner, lifeOwner("w", cur), "w's heartbeat rewrote its life between the sightings")
	_, _ = x.sweeper.runOnce(ctx) // sighting 2, a TTL later: the life is w's again
	require.NoError(t, w.CheckLease(), "w's lease was valid throughout")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "row 1 of w's current life")
}

// watchLiveRow watches row id of live worker w, taken under owner, for d
// or until it leaves in progress, while the sweeps of sweepers (those that
// could reset it) run. At each heartbeat of w it asserts that w's lease is
// valid and reads the row. When the row stayed in progress for d, it
// asserts that each sweeper swept throughout (at least half the turns its
// recovery interval gives, and two). It then asserts that the row is still
// w's, and returns its status.
func watchLiveRow(t *testing.T, db *pgxpool.Pool, w *Worker, owner string, id int64, d time.Duration, sweepers ...*Worker) string {
	t.Helper()
	for _, sw := range sweepers {
		signals(sw).sweep.Clear()
	}
	beats := &signals(w).beat
	beats.Clear()
	losses := w.Stats().LeaseLosses
	end := time.Now().Add(d)
	watched := true
	for time.Now().Before(end) {
		require.NoError(t, w.CheckLease(), "the live worker's lease stays valid throughout")
		if s, _ := rowState(t, db, id); s != "inprog" {
			watched = false
			break
		}
		beats.WaitOrTimeout(t)
	}
	// A lease lost and regained between two checks is counted.
	require.Equal(t, losses, w.Stats().LeaseLosses, "the live worker's lease stays valid throughout")
	if watched {
		for _, sw := range sweepers {
			want := max(2, int(d/sw.opts.recoveryInterval)/2)
			require.GreaterOrEqual(t, signals(sw).sweep.Clear(), want, "%s swept throughout the watch of %v", sw.InstanceID(), d)
		}
	}
	s, o := rowState(t, db, id)
	assert.Equal(t, "inprog", s, "row %d of the live worker's current life", id)
	if assert.NotNil(t, o) {
		assert.Equal(t, owner, *o)
	}
	return s
}

// The previous release's quickstart (README before the merge of life2):
//
//	me := w.OwnerValue() // once per block
//	UPDATE ... SET status='inprog', owner=$me ...; w.Track(ctx, ids...) before the COMMIT
//
// A host written so and upgraded to this release (nothing to change: it
// compiles) writes the life it read before the fetch, but Track tracks the
// rows under the life current at Track time. A lease lost and regained
// during the fetch (no hold any more: the new life is usable as soon as a
// heartbeat recorded it) makes Track accept rows committed under the ended
// life: CheckLease stays nil, the host processes them, and the sweep
// resets them as an ended life's rows under the host, after two sightings
// a TTL apart; another worker takes them, and the host's guarded
// completion (owner = me) finds nothing: processed twice. With the previous
// release the hold refused this Track for a claim TTL.
func TestTrackRefusesABlockFetchedUnderTheLifeOwnerNamedBeforeALoss(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 1, "HK")
	ctx := context.Background()
	r := fencedResetter(t, db)
	opts := holeTimings(prefix, 1200*time.Millisecond)
	w, fr, logs := frozenWorker(t, rdb, r, "w", opts...)
	p, _ := startWorker(t, rdb, r, "p", opts...) // a peer; its sweep (or w's) judges ended lives

	me := w.OwnerValue() // the host begins a block
	loseLease(t, rdb, w, fr)
	fr.thaw() // Redis back during the fetch
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 && w.CheckLease() == nil })
	take(t, db, me, 1) // the fetch's UPDATE, under the value read before
	err := w.Track(ctx, 1)
	require.ErrorIs(t, err, ErrLeaseLost, "the block was fetched under the life OwnerValue() named before the loss")
	// The documented reaction: roll the fetch back and fetch again under
	// the new value.
	again := w.OwnerValue()
	require.NotEqual(t, me, again, "a new life since the loss")
	take(t, db, again, 1)
	require.NoError(t, w.Track(ctx, 1))
	watchLiveRow(t, db, w, again, 1, 8*time.Second, w, p)
	assert.True(t, complete(t, db, again, 1), "the host completes its row once")
}

// holeTimings are the tests' short timings: TTL 2 s, a heartbeat every
// 400 ms (an operation timeout of 200 ms), a rows TTL of 16 s, and the
// given recovery interval. The tests run in parallel: they were written
// with four times shorter timings (TTL 500 ms, rows TTL 4 s, recovery
// intervals of 300 ms and 1 s, the waits and watches after them), which a
// loaded machine does not keep (the live worker's lease of 450 ms, Redis
// calls of 50 ms); every timing and wait of the interleavings is four
// times the original.
func holeTimings(prefix string, recovery time.Duration) []Option {
	return []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 400 * time.Millisecond,
		RecoveryInterval:  recovery,
		RowsTTL:           16 * time.Second,
	})}
}
