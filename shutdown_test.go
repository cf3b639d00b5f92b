package recovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShutdownRemovesHeartbeatAndRegistry(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Track(context.Background(), 1, 2))
	require.NoError(t, w.Untrack(1, 2)) // the block is finished

	require.NoError(t, w.Shutdown(context.Background()))

	assert.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"))
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
	assert.False(t, ok, "peers see at once that it left")
	assert.NoError(t, rdb.Ping(context.Background()).Err(), "the caller's client is not closed")
	assert.ErrorIs(t, w.CheckLease(), ErrShutdown)
}

func TestShutdownStopsEveryGoroutine(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithRecoveryInterval(50*time.Millisecond))
	time.Sleep(150 * time.Millisecond) // both loops have run a few times
	require.Equal(t, 3, workerGoroutines(), "two loops and their waiter")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.Zero(t, workerGoroutines(), "no goroutine outlives Shutdown")
}

func TestShutdownIsIdempotentAndSafeConcurrently(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.Shutdown(context.Background())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	assert.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"))
	assert.ErrorIs(t, w.Start(context.Background()), ErrShutdown)
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown)
}

func TestShutdownWithoutStart(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.ErrorIs(t, w.Start(context.Background()), ErrShutdown)
	assert.Empty(t, mr.Keys(), "a worker that never started writes nothing")
}

// stubbornResetter ignores its context for a while, like a driver stuck in
// a system call.
type stubbornResetter struct {
	entered chan struct{}
	release chan struct{}
}

func (s *stubbornResetter) ResetRows(context.Context, string, []int64) (int64, error) {
	close(s.entered)
	<-s.release
	return 0, nil
}

func TestShutdownReturnsContextErrorWhenItEndsFirstAndCanBeRetried(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	r := &stubbornResetter{entered: make(chan struct{}), release: make(chan struct{})}
	w, _ := startWorker(t, rdb, r, "w1")
	<-r.entered // the recovery loop is stuck in a reset

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := w.Shutdown(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, mr.Exists("ALYA_{w1}_HEARTBEAT"), "not cleaned up while a loop still runs")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown, "shut down for callers all the same")

	close(r.release)
	require.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"), "a later call finishes the clean-up")
}

func TestShutdownCleanupFailureIsReportedAndRetried(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	mr.SetError("ERR down")
	err := w.Shutdown(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "shut down w1: remove heartbeat and registry entry")
	mr.SetError("")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"))
}

func TestShutdownWithRowsStillTrackedLeavesThemForPeers(t *testing.T) {
	mr, rdb := newMini(t)
	a, logs := startWorker(t, rdb, &fakeResetter{}, "A")
	require.NoError(t, a.Track(context.Background(), 101, 102))
	require.NoError(t, a.Shutdown(context.Background())) // the deadline came before the block was done

	assert.False(t, mr.Exists("ALYA_{A}_HEARTBEAT"), "the heartbeat goes at once")
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "A")
	assert.True(t, ok, "still registered, so peers look for its rows")
	assert.Equal(t, 1, logs.Count("shut down with rows still tracked"))

	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "B")
	_, err := b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{101, 102}, r.resetOf("A"), "recovered by the next scan, no TTL to wait for")
}
