package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// A worker killed within the linger of a deferred Untrack leaves a finished
// row in its set; the reset's guards leave it finished.
func TestSafetyDeferredUntrackNeverResetsAFinishedRow(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("S")
	ctx := context.Background()
	r := fencedResetter(t, db)
	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix), WithDeferredUntrack(400*time.Millisecond), WithRowsSets())
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	setStatus(t, db, "done", 1)
	require.NoError(t, a.Untrack(1))
	a.crash() // before the deferred SREM
	ok, err := rdb.SIsMember(ctx, store.InstanceKeys(prefix, "A").Rows, "1").Result()
	require.NoError(t, err)
	require.True(t, ok, "the finished row is still in the set")

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix), WithRowsSets())
	require.Eventually(t, func() bool {
		rep, err := b.recoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "done", s)
	s, _ = rowState(t, db, 2)
	assert.Equal(t, "queued", s)
}

// A finished row left in a dead worker's set (deferred Untrack) that the
// application re-queued and another worker took again is left to its new
// holder by an owner-fenced reset (docs/safety.md, section 7).
func TestSafetyDeferredUntrackWithOwnerFencingLeavesARequeuedRowToItsNewHolder(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("S")
	ctx := context.Background()
	r := fencedResetter(t, db)
	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix), WithDeferredUntrack(400*time.Millisecond))
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	setStatus(t, db, "done", 1)
	require.NoError(t, a.Untrack(1))
	a.crash()                     // before the deferred SREM: row 1 stays in A's set
	setStatus(t, db, "queued", 1) // the application re-queues the finished row
	take(t, db, "C", 1)           // and live worker C takes it

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix))
	require.Eventually(t, func() bool {
		rep, err := b.recoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	s, owner := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "row 1 is C's now")
	require.NotNil(t, owner)
	assert.Equal(t, "C", *owner)
	s, _ = rowState(t, db, 2)
	assert.Equal(t, "queued", s, "A's unfinished row is recovered")
}

func TestDeferredUntrackRemovesABlockInOneCommand(t *testing.T) {
	mr, rdb := newMini(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithDeferredUntrack(50*time.Millisecond),
		WithTimings(Timings{
			HeartbeatTTL:      time.Hour,
			HeartbeatInterval: 30 * time.Minute,
			RecoveryInterval:  time.Hour,
			RowsTTL:           3 * time.Hour,
		}))
	ids := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.NoError(t, w.Track(context.Background(), ids...))
	counter.reset()
	for _, id := range ids {
		require.NoError(t, w.Untrack(id))
	}
	assert.Zero(t, w.Stats().TrackedRows, "forgotten in memory at once")
	waitTurns(t, &signals(w).flush, 2*time.Second, func() bool { return !mr.Exists(keysOf("w1").Rows) })
	_, cmds := counter.snapshot()
	srems := 0
	for _, c := range cmds {
		if c == "srem" {
			srems++
		}
	}
	assert.Equal(t, 1, srems, "ten Untracks, one SREM")
}

func TestDeferredUntrackIsFlushedByShutdown(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithDeferredUntrack(400*time.Millisecond))
	require.NoError(t, w.Track(context.Background(), 1, 2))
	require.NoError(t, w.Untrack(1))
	require.NoError(t, w.Shutdown(context.Background()))
	got, _ := mr.Members(keysOf("w1").Rows)
	assert.Equal(t, []string{"2"}, got)
	require.NoError(t, w.Untrack(2), "after Shutdown Untrack is synchronous again")
	assert.False(t, mr.Exists(keysOf("w1").Rows))
}

func TestDeferredUntrackLingerIsValidated(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Millisecond, 30 * time.Second} {
		_, err := New(idleClient(t), &fakeResetter{}, WithDeferredUntrack(d))
		require.ErrorIs(t, err, ErrInvalidConfig, "%v", d)
		assert.Contains(t, err.Error(), "deferred untrack linger")
	}
}

func TestRowTrackedAgainWhileItsRemovalIsPendingStaysTracked(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithDeferredUntrack(50*time.Millisecond),
		WithTimings(Timings{
			HeartbeatTTL:      time.Hour,
			HeartbeatInterval: 30 * time.Minute,
			RecoveryInterval:  time.Hour,
			RowsTTL:           3 * time.Hour,
		}))
	ctx := context.Background()
	require.NoError(t, w.Track(ctx, 7))
	require.NoError(t, w.Untrack(7)) // SREM 7 pending
	// The flusher's SREM lands after the new Track's SADD, the worst order:
	// simulate it by sending the SREM the flusher would send, by hand.
	require.NoError(t, w.Track(ctx, 7))
	_, err := mr.SRem(keysOf("w1").Rows, "7")
	require.NoError(t, err)
	w.tracker.retrack(ctx, []int64{7})
	ok, _ := mr.SIsMember(keysOf("w1").Rows, "7")
	assert.True(t, ok, "tracked again, so written back")

	w.tracker.(*rowsSetTracker).flusher.runOnce(ctx) // what the flusher does when its linger ends
	ok, _ = mr.SIsMember(keysOf("w1").Rows, "7")
	assert.True(t, ok, "the pending removal was cancelled by the new Track")
}
