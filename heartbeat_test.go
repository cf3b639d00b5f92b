package recovery

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

func TestHeartbeatExpiresWhenNotRefreshed(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	w.crash()

	mr.FastForward(1999 * time.Millisecond)
	assert.True(t, mr.Exists(keysOf("w1").Heartbeat))
	mr.FastForward(time.Millisecond)
	assert.False(t, mr.Exists(keysOf("w1").Heartbeat), "expiry means death")
	ok, _ := mr.SIsMember(registryKey, "w1")
	assert.True(t, ok, "a killed worker stays registered until a peer recovers it")
}

func TestHeartbeatRefreshesKeyRegistryAndRowsTTLEveryInterval(t *testing.T) {
	t.Parallel()
	mr, rdb := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Track(ctx, 7))
	// The processing context ends (SIGTERM): the heartbeat must go on.
	cancel()

	for range 3 {
		mr.FastForward(1500 * time.Millisecond) // 500ms of heartbeat TTL left
		_, err := mr.SRem(registryKey, "w1")
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			ok, _ := mr.SIsMember(registryKey, "w1")
			return mr.TTL(keysOf("w1").Heartbeat) == 2*time.Second &&
				mr.TTL(keysOf("w1").Rows) == 4*time.Second && ok
		}, 3*time.Second, 10*time.Millisecond, "heartbeat, registry and rows TTL refreshed")
	}
	assert.NoError(t, w.CheckLease())
}

// beatStore is a store whose heartbeats the test decides, for the
// heartbeat loop under testing/synctest: it records when each Beat came and
// fails it while err is set. Every other method is the nil Store's and
// panics: the loop must need nothing else.
type beatStore struct {
	store.Store
	mu    sync.Mutex
	err   error
	beats []time.Time
}

func (s *beatStore) Beat(context.Context, string, store.Heartbeat) (store.BeatResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beats = append(s.beats, time.Now())
	if s.err != nil {
		return store.BeatResult{}, s.err
	}
	return store.BeatResult{Wrote: true}, nil
}

func (s *beatStore) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// since returns the times of the beats sent after t.
func (s *beatStore) since(t time.Time) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for _, b := range s.beats {
		if b.After(t) {
			out = append(out, b)
		}
	}
	return out
}

// The heartbeat loop on the fake clock (testing/synctest): the real loop,
// timers and backoff, with a store that fails on demand.
func TestHeartbeatOutageIsRetriedQuicklyAndLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &beatStore{}
		w, logs := newWorker(t, idleClient(t), &fakeResetter{}, "w1", WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}),
			withStore(func(store.Store) store.Store { return s }))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		require.NoError(t, w.heart.runOnce(ctx)) // Start's first heartbeat
		go func() { defer close(done); w.heart.run(ctx) }()
		defer func() { cancel(); <-done }()

		// Beats at 0 (above), 500ms and 1s: each wait lets the fake clock
		// run to the loop's next turn.
		beat := &signals(w).beat
		start := time.Now()
		for _, at := range []time.Duration{500 * time.Millisecond, time.Second} {
			require.NoError(t, beat.WaitOrTimeout(t), "the beat at %v", at)
			require.Equal(t, at, time.Since(start), "a beat every interval")
		}
		require.Len(t, s.since(time.Time{}), 3)
		down := time.Now() // the instant of the beat at 1s: the tries come after it
		s.fail(errors.New("LOADING down for the test"))
		// Four tries by 2s: the tick at 1.5s, then three retries. The bound
		// is part of the check: a loop that retried only at its ticks would
		// otherwise run the outage on past the lease.
		end := start.Add(2 * time.Second)
		for i := range 4 {
			err := beat.WaitForWithin(t, time.Until(end), func(error) bool { return true })
			require.ErrorContains(t, err, "LOADING", "try %d during the outage", i+1)
		}

		// The first try fails at the tick (1.5s); the retries follow after
		// 50, 100 and 200ms (±20%), not a whole 500ms interval later.
		tries := s.since(down)
		require.GreaterOrEqual(t, len(tries), 4)
		assert.Equal(t, 500*time.Millisecond, tries[0].Sub(down), "the first failure is the regular tick")
		for i, want := range []time.Duration{50, 100, 200} {
			gap := tries[i+1].Sub(tries[i])
			assert.InDelta(t, float64(want*time.Millisecond), float64(gap), float64(want*time.Millisecond)/5+1, "retry %d", i+1)
		}
		assert.Less(t, tries[3].Sub(tries[0]), w.opts.heartbeatInterval, "four tries within one interval; a ticker alone would take three")

		s.fail(nil)
		// The next try, within the longest backoff, succeeds.
		require.NoError(t, beat.WaitForWithin(t, w.opts.heartbeatInterval*12/10, func(error) bool { return true }), "the next try succeeds")
		synctest.Wait()
		assert.Equal(t, 1, logs.Count("heartbeat restored"))
		assert.Equal(t, 1, logs.Count("heartbeat failed"), "one log line per outage, not per try")
		assert.Zero(t, w.Stats().LeaseLosses, "the outage was shorter than the lease")
	})
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
	for range 200 {
		require.LessOrEqual(t, w.heart.retryDelay(10), interval,
			"a retry comes within an interval: a worker whose lease was lost takes rows again within one interval of Redis coming back")
	}
}

func TestSafetyRowsComeBackAfterRedisRestartedEmptyAndTheWorkerIsKilled(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	r := fencedResetter(t, db)
	ctx := context.Background()
	a, _ := startWorker(t, rdb, r, "A", WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}), WithRowsSets())
	take(t, db, "A", 1, 2, 3, 4)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4))
	require.NoError(t, a.Untrack(1))

	srv.Restart() // no persistence: registry, heartbeat and rows set are gone
	n, err := rdb.Exists(ctx, keysOf("A").Rows).Result()
	require.NoError(t, err)
	require.Zero(t, n)

	require.Eventually(t, func() bool {
		m, err := rdb.SMembers(ctx, keysOf("A").Rows).Result()
		return err == nil && len(m) == 3
	}, 2*time.Second, 10*time.Millisecond, "the live worker re-asserts its rows within one interval")
	a.crash()

	b, _ := startWorker(t, rdb, r, "B", WithRowsSets())
	_ = b
	require.Eventually(t, func() bool {
		for _, id := range []int64{2, 3, 4} {
			if s, _ := rowState(t, db, id); s != "queued" {
				return false
			}
		}
		return true
	}, 6*time.Second, 20*time.Millisecond, "rows recovered after TTL + recovery interval")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "row 1 was untracked (finished, in the host's terms): never reset")
}

func TestRecoveryIntervalIsJitteredByTenPercent(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := jitter(time.Second, 0.1)
		require.GreaterOrEqual(t, d, 900*time.Millisecond)
		require.LessOrEqual(t, d, 1100*time.Millisecond)
		seen[d] = true
	}
	assert.Greater(t, len(seen), 100, "the waits differ")
}
