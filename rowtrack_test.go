package recovery

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTrackAddsRowsAndRefreshesTTLInOneRoundTrip(t *testing.T) {
	mr, rdb := newMini(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w1",
		WithHeartbeatTTL(time.Hour), WithHeartbeatInterval(30*time.Minute), // no tick during the count
		WithRecoveryInterval(time.Hour), WithRowsTTL(3*time.Hour))
	require.Eventually(t, func() bool { return logs.Count("recovery scan done") == 1 }, 2*time.Second, 5*time.Millisecond)
	ids := make([]int64, 100)
	want := make([]string, 100)
	for i := range ids {
		ids[i] = int64(1000 + i)
		want[i] = strconv.Itoa(1000 + i)
	}
	mr.FastForward(time.Minute) // the TTL seen below is Track's refresh, not Start's
	counter.reset()

	require.NoError(t, w.Track(context.Background(), ids...))

	trips, cmds := counter.snapshot()
	assert.Equal(t, 1, trips, "one round trip for a 100-row block")
	assert.Equal(t, []string{"sadd", "pexpire"}, cmds)
	got, err := mr.Members("ALYA_{w1}_ROWS")
	require.NoError(t, err)
	assert.ElementsMatch(t, want, got, "decimal row IDs")
	assert.Equal(t, 3*time.Hour, mr.TTL("ALYA_{w1}_ROWS"))
	assert.Equal(t, 100, w.Stats().TrackedRows)
}

func TestTrackHonoursTheCallersContext(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.Track(ctx, 1, 2)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, mr.Exists("ALYA_{w1}_ROWS"))
	// The rows are kept in memory: if the host processes them anyway they
	// are written with the next heartbeat.
	require.Eventually(t, func() bool { ok, _ := mr.SIsMember("ALYA_{w1}_ROWS", "2"); return ok },
		2*time.Second, 10*time.Millisecond)
}

func TestTrackBeforeStartAndAfterShutdownIsRefused(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrNotStarted)
	require.NoError(t, w.Start(context.Background()))
	require.NoError(t, w.Shutdown(context.Background()))
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown)
	assert.False(t, mr.Exists("ALYA_{w1}_ROWS"))
}

func TestUntrackRemovesRowsWhateverTheProcessingContext(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Track(ctx, 1, 2, 3))
	cancel() // SIGTERM: the processing context is gone, the block goes on

	require.NoError(t, w.Untrack(1))
	require.NoError(t, w.Untrack(2, 3))
	assert.False(t, mr.Exists("ALYA_{w1}_ROWS"), "every finished row removed")
	assert.Zero(t, w.Stats().TrackedRows)

	// After Shutdown too: the host may finish its block late.
	require.NoError(t, w.Track(context.Background(), 4))
	require.NoError(t, w.Shutdown(context.Background()))
	require.NoError(t, w.Untrack(4))
	assert.False(t, mr.Exists("ALYA_{w1}_ROWS"))
}

func TestFailedUntrackIsCompletedByTheNextHeartbeat(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Track(context.Background(), 1, 2))

	mr.SetError("ERR down")
	err := w.Untrack(1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "untrack 1 rows of w1")
	mr.SetError("")

	require.Eventually(t, func() bool { ok, _ := mr.SIsMember("ALYA_{w1}_ROWS", "1"); return !ok },
		3*time.Second, 10*time.Millisecond, "the heartbeat removes the row Untrack could not")
	ok, _ := mr.SIsMember("ALYA_{w1}_ROWS", "2")
	assert.True(t, ok, "rows still in progress stay")
}

func TestHeartbeatWritesTrackedRowsBackAfterRedisForgetsThem(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Track(context.Background(), 10, 11, 12))
	require.NoError(t, w.Untrack(11))

	mr.FlushAll() // Redis restarted without persistence

	require.Eventually(t, func() bool {
		got, _ := mr.Members("ALYA_{w1}_ROWS")
		ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
		return ok && len(got) == 2 && mr.Exists("ALYA_{w1}_HEARTBEAT")
	}, 2*time.Second, 10*time.Millisecond, "rows, registry and heartbeat back within one interval")
	got, _ := mr.Members("ALYA_{w1}_ROWS")
	assert.ElementsMatch(t, []string{"10", "12"}, got, "finished rows are not written back")
	assert.Equal(t, 4*time.Second, mr.TTL("ALYA_{w1}_ROWS"))
}

func TestDeferredUntrackRemovesABlockInOneCommand(t *testing.T) {
	mr, rdb := newMini(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithDeferredUntrack(50*time.Millisecond),
		WithHeartbeatTTL(time.Hour), WithHeartbeatInterval(30*time.Minute), WithRecoveryInterval(time.Hour), WithRowsTTL(3*time.Hour))
	ids := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.NoError(t, w.Track(context.Background(), ids...))
	counter.reset()
	for _, id := range ids {
		require.NoError(t, w.Untrack(id))
	}
	assert.Zero(t, w.Stats().TrackedRows, "forgotten in memory at once")
	require.Eventually(t, func() bool { return !mr.Exists("ALYA_{w1}_ROWS") }, 2*time.Second, 5*time.Millisecond)
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
	got, _ := mr.Members("ALYA_{w1}_ROWS")
	assert.Equal(t, []string{"2"}, got)
	require.NoError(t, w.Untrack(2), "after Shutdown Untrack is synchronous again")
	assert.False(t, mr.Exists("ALYA_{w1}_ROWS"))
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
		WithHeartbeatTTL(time.Hour), WithHeartbeatInterval(30*time.Minute), WithRecoveryInterval(time.Hour), WithRowsTTL(3*time.Hour))
	ctx := context.Background()
	require.NoError(t, w.Track(ctx, 7))
	require.NoError(t, w.Untrack(7)) // SREM 7 pending
	// The flusher's SREM lands after the new Track's SADD, the worst order:
	// simulate it by sending the SREM the flusher would send, by hand.
	require.NoError(t, w.Track(ctx, 7))
	_, err := mr.SRem("ALYA_{w1}_ROWS", "7")
	require.NoError(t, err)
	w.retrack(ctx, []int64{7})
	ok, _ := mr.SIsMember("ALYA_{w1}_ROWS", "7")
	assert.True(t, ok, "tracked again, so written back")

	time.Sleep(150 * time.Millisecond) // the real flusher has run meanwhile
	ok, _ = mr.SIsMember("ALYA_{w1}_ROWS", "7")
	assert.True(t, ok, "the pending removal was cancelled by the new Track")
}
