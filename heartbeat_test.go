package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartWritesHeartbeatAndRegistersBeforeReturning(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"))

	require.NoError(t, w.Start(context.Background()))

	v, err := mr.Get("ALYA_{w1}_HEARTBEAT")
	require.NoError(t, err)
	assert.Regexp(t, "^alive:[0-9a-f]{32}$", v, "alive:<this Worker's token>")
	assert.Equal(t, w.beatValue, v)
	assert.Equal(t, 2*time.Second, mr.TTL("ALYA_{w1}_HEARTBEAT"))
	ok, err := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Zero(t, mr.TTL("ALYA_WORKER_REGISTRY"), "the registry has no TTL")
	assert.NoError(t, w.CheckLease())
}

func TestStartFailsWhenRedisIsUnreachable(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	mr.Close()

	err := w.Start(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "start w1: first heartbeat")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrNotStarted, "a failed Start starts nothing")

	mr2, rdb2 := newMini(t) // Start may be tried again once Redis is back
	w2, _ := newWorker(t, rdb2, &fakeResetter{}, "w1")
	require.NoError(t, w2.Start(context.Background()))
	assert.True(t, mr2.Exists("ALYA_{w1}_HEARTBEAT"))
}

func TestStartTwiceIsRefused(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	assert.ErrorIs(t, w.Start(context.Background()), ErrAlreadyStarted)
}

func TestHeartbeatExpiresWhenNotRefreshed(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	w.crash()

	mr.FastForward(1999 * time.Millisecond)
	assert.True(t, mr.Exists("ALYA_{w1}_HEARTBEAT"))
	mr.FastForward(time.Millisecond)
	assert.False(t, mr.Exists("ALYA_{w1}_HEARTBEAT"), "expiry means death")
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
	assert.True(t, ok, "a killed worker stays registered until a peer recovers it")
}

func TestHeartbeatRefreshesKeyRegistryAndRowsTTLEveryInterval(t *testing.T) {
	mr, rdb := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Track(ctx, 7))
	// The processing context ends (SIGTERM): the heartbeat must go on.
	cancel()

	for range 3 {
		mr.FastForward(1500 * time.Millisecond) // 500ms of heartbeat TTL left
		_, err := mr.SRem("ALYA_WORKER_REGISTRY", "w1")
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
			return mr.TTL("ALYA_{w1}_HEARTBEAT") == 2*time.Second &&
				mr.TTL("ALYA_{w1}_ROWS") == 4*time.Second && ok
		}, 3*time.Second, 10*time.Millisecond, "heartbeat, registry and rows TTL refreshed")
	}
	assert.NoError(t, w.CheckLease())
}

func TestHeartbeatOutageIsRetriedQuicklyAndLoggedOnce(t *testing.T) {
	mr, rdb := newMini(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w1", WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	_ = w

	mr.SetError("LOADING down for the test")
	counter.reset()
	time.Sleep(1200 * time.Millisecond) // a bit over two heartbeat intervals
	trips, _ := counter.snapshot()
	mr.SetError("")

	// A ticker alone would try twice in 1.2s; the backoff starts at 50ms.
	assert.GreaterOrEqual(t, trips, 4, "failed heartbeats are retried before a whole interval passes")
	require.Eventually(t, func() bool { return logs.Count("heartbeat restored") == 1 },
		3*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, logs.Count("heartbeat failed"), "one log line per outage, not per try")
}

func TestRetryDelayGrowsAndIsCappedAtTheInterval(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	interval := w.opts.heartbeatInterval
	for n := 1; n <= 10; n++ {
		d := w.heart.retryDelay(n)
		assert.LessOrEqual(t, d, interval*12/10, "retry %d", n)
		assert.Greater(t, d, time.Duration(0))
		base := min(interval/10<<(n-1), interval)
		assert.InDelta(t, float64(base), float64(d), float64(base)*0.2+1, "retry %d", n)
	}
	assert.Less(t, w.heart.retryDelay(1), interval/5, "the first retry comes well before the next tick")
}

func TestLeaseIsLostWhileHeartbeatFailsAndRegainedAfter(t *testing.T) {
	mr, rdb := newMini(t)
	w, logs := startWorker(t, rdb, &fencedFake{}, "w1",
		WithHeartbeatTTL(400*time.Millisecond), WithHeartbeatInterval(100*time.Millisecond),
		WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	ctx := context.Background()
	require.NoError(t, w.Track(ctx, 1))

	mr.SetError("ERR unreachable")
	require.Eventually(t, func() bool { return w.CheckLease() != nil }, 2*time.Second, 5*time.Millisecond)
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost)
	assert.ErrorIs(t, w.Track(ctx, 2), ErrLeaseLost, "no new rows while peers may consider us dead")
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease lost") == 1 }, 2*time.Second, 5*time.Millisecond)

	mr.SetError("")
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease regained") == 1 }, 2*time.Second, 5*time.Millisecond)
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "row 1, held at the loss, is not given back yet")
	require.NoError(t, w.Untrack(1))
	assert.NoError(t, w.CheckLease())
	assert.NoError(t, w.Track(ctx, 2))
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "w1")
	assert.True(t, ok, "re-registered")
}

func TestHealthyWorkerWithTheTightestTimingsNeverLosesItsLease(t *testing.T) {
	_, rdb := newMini(t)
	// 550ms + the derived 275ms operation timeout: just inside the 900ms lease.
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithHeartbeatTTL(time.Second),
		WithHeartbeatInterval(550*time.Millisecond), WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.NoError(t, w.Healthy())
		time.Sleep(5 * time.Millisecond)
	}
	assert.Zero(t, w.Stats().LeaseLosses)
	assert.GreaterOrEqual(t, w.Stats().Heartbeats, uint64(5))
}
