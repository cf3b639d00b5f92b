package recovery

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

func TestSafetyPausedWorkerLosesItsLeaseBeforeAnyPeerSeesItDead(t *testing.T) {
	srv := testutil.StartRedis(t)
	frozenClient := srv.Client(t)
	fr := &freezer{}
	frozenClient.AddHook(fr)
	observer := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	r := fencedResetter(t, db)
	ctx := context.Background()
	a, logs := startWorker(t, frozenClient, r, "A",
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 250 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
			ResetTimeout:      500 * time.Millisecond,
		})) // the hold after the regain: a claim TTL, 875ms
	take(t, db, "A", 1, 2, 3)
	require.NoError(t, a.Track(ctx, 1, 2, 3))

	fr.freeze() // A can no longer reach Redis: a GC pause, a partition
	require.Eventually(t, func() bool { return observer.Exists(ctx, keysOf("A").Heartbeat).Val() == 0 },
		5*time.Second, 2*time.Millisecond, "heartbeat never expired")
	// The first moment a peer could find A dead, A already knows.
	assert.ErrorIs(t, a.CheckLease(), ErrLeaseLost)
	assert.ErrorIs(t, a.Track(ctx, 4), ErrLeaseLost)

	// The host abandons its block: the rows go back at once, but a row
	// someone else has taken meanwhile stays theirs.
	take(t, db, "C", 3)
	require.NoError(t, a.Release(ctx, 1, 2, 3))
	for _, id := range []int64{1, 2} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s)
	}
	s, o := rowState(t, db, 3)
	assert.Equal(t, "inprog", s)
	assert.Equal(t, "C", *o)
	assert.Zero(t, a.Stats().TrackedRows)

	fr.thaw()
	waitTurns(t, &signals(a).beat, 3*time.Second, func() bool { return a.CheckLease() == nil })
	ok, err := observer.SIsMember(ctx, registryKey, "A").Result()
	require.NoError(t, err)
	assert.True(t, ok, "re-registered with the new lease")
	waitTurns(t, &signals(a).beat, time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	assert.Equal(t, 1, logs.Count("heartbeat lease lost"))
	n, err := observer.Exists(ctx, keysOf("A").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released rows are untracked")
}

// A worker paused past its TTL must not learn it is healthy again just
// because its next heartbeat succeeded: the rows it held may be a peer's now.
func TestSafetyLeaseStaysLostUntilTheRowsHeldAtTheLossAreGivenBack(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	r := &fakeResetter{fenced: true}
	w, logs := startWorker(t, rdb, r, "w", WithTimings(Timings{
		HeartbeatTTL:      400 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      100 * time.Millisecond,
	})) // claim TTL 250ms: the hold after the regain
	require.NoError(t, w.Track(ctx, 1, 2, 3))

	mr.SetError("ERR paused") // the process is stopped, the key expires
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease lost") == 1 })
	mr.SetError("")
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })

	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "rows 1-3 may have been recovered meanwhile")
	assert.ErrorIs(t, w.Track(ctx, 4), ErrLeaseLost)
	assert.Contains(t, logs.String(), `"stale_rows":3`)

	require.NoError(t, w.Untrack(1)) // the row it was in the middle of (its completion was refused)
	assert.ErrorIs(t, w.Healthy(), ErrLeaseLost)
	require.NoError(t, w.Release(ctx, 2, 3)) // the rest of the block
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return w.CheckLease() == nil },
		"every stale row given back, and the hold after the regain over")
	assert.NoError(t, w.Track(ctx, 4))
}

func TestLeaseIsLostWhileHeartbeatFailsAndRegainedAfter(t *testing.T) {
	mr, rdb := newMini(t)
	w, logs := startWorker(t, rdb, &fakeResetter{fenced: true}, "w1",
		WithTimings(Timings{
			HeartbeatTTL:      400 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
			ResetTimeout:      100 * time.Millisecond,
		}))
	ctx := context.Background()
	require.NoError(t, w.Track(ctx, 1))

	mr.SetError("ERR unreachable")
	// Each failed heartbeat turn, a retry delay apart, notes the loss once
	// the lease has run out.
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return w.CheckLease() != nil })
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost)
	assert.ErrorIs(t, w.Track(ctx, 2), ErrLeaseLost, "no new rows while peers may consider us dead")
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease lost") == 1 })

	mr.SetError("")
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "row 1, held at the loss, is not given back yet")
	require.NoError(t, w.Untrack(1))
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return w.CheckLease() == nil },
		"row 1 given back, and the hold after the regain (a claim TTL, 250ms) over")
	assert.NoError(t, w.Track(ctx, 2))
	ok, _ := mr.SIsMember(registryKey, "w1")
	assert.True(t, ok, "re-registered")
}

func TestHealthyWorkerWithTheTightestTimingsNeverLosesItsLease(t *testing.T) {
	_, rdb := newMini(t)
	// 550ms + the derived 275ms operation timeout: just inside the 900ms lease.
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithTimings(Timings{
		HeartbeatTTL:      time.Second,
		HeartbeatInterval: 550 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
	}))
	// Healthy is polled all along, until four heartbeats after Start's.
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for w.Stats().Heartbeats < 5 {
		require.NoError(t, w.Healthy())
		require.True(t, time.Now().Before(deadline), "four heartbeats in 10s")
		<-poll.C
	}
	assert.Zero(t, w.Stats().LeaseLosses)
}

func TestHealthyBeforeStart(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	assert.ErrorIs(t, w.Healthy(), ErrNotStarted)
}

// Model hole H1 (docs/model.md): a recoverer that claimed this worker while
// its heartbeat was gone may still be resetting when the heartbeat comes
// back and cancels the claim. The regained lease is held for a claim TTL,
// so no row taken meanwhile can be reset under the worker.
func TestRegainedLeaseIsHeldForAClaimTTL(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w", WithTimings(Timings{
		HeartbeatTTL:      400 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      600 * time.Millisecond,
		OperationTimeout:  50 * time.Millisecond,
	})) // claim TTL 750ms
	require.Equal(t, 750*time.Millisecond, w.opts.claimTTL())

	mr.SetError("ERR paused")
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease lost") == 1 })
	mr.SetError("")
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	regained := time.Now()

	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "no stale rows, but held")
	assert.ErrorIs(t, w.Track(ctx, 1), ErrLeaseLost, "no new rows while a recovery of it may still run")
	// poll: the hold ends with the clock alone and no turn marks its end;
	// checked at each heartbeat (every 100ms), its measured length would be
	// rounded up by as much as an interval, and a hold that much too short
	// would pass.
	require.Eventually(t, func() bool { return w.CheckLease() == nil }, 3*time.Second, 5*time.Millisecond)
	held := time.Since(regained)
	assert.GreaterOrEqual(t, held, 700*time.Millisecond, "held for about the claim TTL from the regain")
	assert.NoError(t, w.Track(ctx, 1))
	assert.Contains(t, logs.String(), `"held_for":750000000`)
}

// lateBeatStore delivers one heartbeat late: armed, its Beat waits until
// the worker's lease has ended before it writes, as a heartbeat retry sent
// just before the end of the lease and answered after it, within its
// operation timeout (a server restarting, a network stall), does.
type lateBeatStore struct {
	store.Store
	w     *Worker
	armed atomic.Bool
	done  chan struct{}
}

func (s *lateBeatStore) Beat(ctx context.Context, id string, b store.Heartbeat) (store.BeatResult, error) {
	if s.armed.Swap(false) {
		defer close(s.done)
		for s.w.lease.valid() {
			// This Beat holds the one loop that renews the lease.
			time.Sleep(s.w.lease.remaining()) // real time: the lease ends at a moment of the clock, which nothing marks
		}
		// Sent late enough (a retry after failures) that its operation
		// timeout runs past the end of the lease: the answer is in time.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		return s.Store.Beat(ctx, id, b)
	}
	return s.Store.Beat(ctx, id, b)
}

// Found by the resume measurement (issue 22): a heartbeat sent before the
// lease ended and answered after it renewed the lease without the loss
// being noted, so the lease went from lost to valid with no hold, though
// the key may have expired and a recoverer be resetting by owner.
func TestALateHeartbeatThatRenewsAnEndedLeaseIsHeldAsARegain(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	late := &lateBeatStore{done: make(chan struct{})}
	w, logs := newWorker(t, rdb, &fakeResetter{}, "w", withStore(func(s store.Store) store.Store { late.Store = s; return late }),
		WithKeyPrefix(testutil.Name("L")), WithTimings(Timings{
			HeartbeatTTL:      400 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
			ResetTimeout:      600 * time.Millisecond,
			OperationTimeout:  50 * time.Millisecond,
		})) // claim TTL 750ms
	late.w = w
	require.NoError(t, w.Start(ctx))
	beats := w.Stats().Heartbeats
	late.armed.Store(true)
	<-late.done
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return w.Stats().Heartbeats > beats })
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "held after the late heartbeat")
	assert.ErrorIs(t, w.Track(ctx, 1), ErrLeaseLost)
	assert.Equal(t, 1, logs.Count("heartbeat lease lost"))
	assert.Equal(t, 1, logs.Count("heartbeat lease regained"))
}
