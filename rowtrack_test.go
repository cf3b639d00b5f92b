package recovery

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestTrackAddsRowsAndRefreshesTTLInOneRoundTrip(t *testing.T) {
	mr, rdb := newMini(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w1",
		WithTimings(Timings{HeartbeatTTL: time.Hour, HeartbeatInterval: 30 * time.Minute}), // no tick during the count
		WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}))
	waitTurns(t, &signals(w).scan, 2*time.Second, func() bool { return logs.Count("recovery scan done") == 1 })
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
	got, err := mr.Members(keysOf("w1").Rows)
	require.NoError(t, err)
	assert.ElementsMatch(t, want, got, "decimal row IDs")
	assert.Equal(t, 3*time.Hour, mr.TTL(keysOf("w1").Rows))
	assert.Equal(t, 100, w.Stats().TrackedRows)
}

func TestTrackHonoursTheCallersContext(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.Track(ctx, 1, 2)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, mr.Exists(keysOf("w1").Rows))
	// The rows are kept in memory: if the host processes them anyway they
	// are written with the next heartbeat.
	require.Eventually(t, func() bool { ok, _ := mr.SIsMember(keysOf("w1").Rows, "2"); return ok },
		2*time.Second, 10*time.Millisecond)
}

func TestTrackBeforeStartAndAfterShutdownIsRefused(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrNotStarted)
	require.NoError(t, w.Start(context.Background()))
	require.NoError(t, w.Shutdown(context.Background()))
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown)
	assert.False(t, mr.Exists(keysOf("w1").Rows))
}

func TestUntrackRemovesRowsWhateverTheProcessingContext(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Track(ctx, 1, 2, 3))
	cancel() // SIGTERM: the processing context is gone, the block goes on

	require.NoError(t, w.Untrack(1))
	require.NoError(t, w.Untrack(2, 3))
	assert.False(t, mr.Exists(keysOf("w1").Rows), "every finished row removed")
	assert.Zero(t, w.Stats().TrackedRows)

	// After Shutdown too: the host may finish its block late.
	require.NoError(t, w.Track(context.Background(), 4))
	require.NoError(t, w.Shutdown(context.Background()))
	require.NoError(t, w.Untrack(4))
	assert.False(t, mr.Exists(keysOf("w1").Rows))
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

	require.Eventually(t, func() bool { ok, _ := mr.SIsMember(keysOf("w1").Rows, "1"); return !ok },
		3*time.Second, 10*time.Millisecond, "the heartbeat removes the row Untrack could not")
	ok, _ := mr.SIsMember(keysOf("w1").Rows, "2")
	assert.True(t, ok, "rows still in progress stay")
}

func TestHeartbeatWritesTrackedRowsBackAfterRedisForgetsThem(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Track(context.Background(), 10, 11, 12))
	require.NoError(t, w.Untrack(11))

	mr.FlushAll() // Redis restarted without persistence

	require.Eventually(t, func() bool {
		got, _ := mr.Members(keysOf("w1").Rows)
		ok, _ := mr.SIsMember(registryKey, "w1")
		return ok && len(got) == 2 && mr.Exists(keysOf("w1").Heartbeat)
	}, 2*time.Second, 10*time.Millisecond, "rows, registry and heartbeat back within one interval")
	got, _ := mr.Members(keysOf("w1").Rows)
	assert.ElementsMatch(t, []string{"10", "12"}, got, "finished rows are not written back")
	assert.Equal(t, 4*time.Second, mr.TTL(keysOf("w1").Rows))
}

// Without owner fencing, Release records its reset in the ledger under the
// worker's incarnation. A row released and then taken again by the same
// worker must still be recovered when that worker dies: the incarnation
// changes before it is tracked again.
func TestSafetyARowReleasedAndTakenAgainIsRecoveredWhenItsWorkerDies(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RL")
	pg, err := pgxreset.New(db)
	require.NoError(t, err)
	w, _ := startWorker(t, rdb, pg, "w", WithKeyPrefix(prefix))
	setStatus(t, db, "inprog", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	before, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)

	require.NoError(t, w.Release(ctx, 1, 2))
	require.Equal(t, "queued", statuses(t, db)[1])
	setStatus(t, db, "inprog", 1) // w fetches row 1 again
	require.NoError(t, w.Track(ctx, 1))
	after, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	assert.NotEqual(t, before, after, "a new incarnation before the row is tracked again")
	assert.Equal(t, []string{"1"}, rowsOf(t, rdb, prefix, "w"))
	w.crash()
	require.NoError(t, rdb.Del(ctx, w.ownKeys().Heartbeat).Err())

	r, _ := newWorker(t, rdb, pg, "r", WithKeyPrefix(prefix))
	require.Eventually(t, func() bool {
		_, err := r.recoverNow(ctx)
		return err == nil && statuses(t, db)[1] == "queued"
	}, 10*time.Second, 100*time.Millisecond, "row 1 is not stuck")
	assert.Equal(t, "queued", statuses(t, db)[2])
}
