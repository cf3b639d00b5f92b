package recovery

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

func TestScanLeaseLetsOneWorkerScanPerInterval(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	for _, lease := range []bool{true, false} {
		prefix := testutil.Name("L")
		var fleet []*Worker
		for i := range 5 {
			w, _ := newWorker(t, rdb, &fakeResetter{}, fmt.Sprintf("w%d", i), WithKeyPrefix(prefix), WithScanTurn(lease))
			fleet = append(fleet, w)
			beating(t, rdb, prefix, w.InstanceID()) // a turn's holder is a live worker
		}
		for _, w := range fleet {
			w.recov.runOnce(ctx)
		}
		var scans uint64
		for _, w := range fleet {
			scans += w.Stats().Scans
		}
		if lease {
			assert.Equal(t, uint64(1), scans, "one scan per interval for the whole fleet")
		} else {
			assert.Equal(t, uint64(5), scans, "every worker scans without the lease")
		}
	}
}

// beating writes the heartbeat key of id under prefix, with the fast
// timings' TTL, as a live worker's last heartbeat: a scan turn held by an
// instance without one is taken over (TestTurnsOfLiveWorkersAreNotTaken).
func beating(t *testing.T, rdb redis.UniversalClient, prefix, id string) {
	t.Helper()
	require.NoError(t, rdb.Set(context.Background(), store.InstanceKeys(prefix, id).Heartbeat, "alive", 2*time.Second).Err())
}

func TestScanLeaseOfADeadHolderDelaysRecoveryByAtMostOneInterval(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	prefix := testutil.Name("L")
	plantDeadPeer(t, rdb, prefix, "dead", "1")
	r := &fakeResetter{}
	holder, _ := newWorker(t, rdb, &fakeResetter{delay: time.Hour}, "holder", WithKeyPrefix(prefix))
	beating(t, rdb, prefix, "holder") // its last heartbeat outlives its turn
	require.True(t, holder.recov.takeScanTurn(ctx), "the holder takes the lease and dies before scanning")
	other, _ := newWorker(t, rdb, r, "other", WithKeyPrefix(prefix)) // recovery interval 1s

	other.recov.runOnce(ctx)
	assert.Zero(t, other.Stats().Scans, "lease held: skipped")
	require.Eventually(t, func() bool { return rdb.Exists(ctx, store.ScanTurnKey(prefix)).Val() == 0 },
		5*time.Second, 10*time.Millisecond, "the dead holder's turn ends (0.8 × the 1s interval)")
	other.recov.runOnce(ctx)
	assert.Equal(t, uint64(1), other.Stats().Scans)
	assert.Equal(t, []int64{1}, r.resetOf("dead"))
}

func TestScanOfTenThousandLivePeersTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	_, rdb := newMini(t)
	ctx := context.Background()
	plantLivePeers(t, rdb, "ALYA", 10000)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	// It counts round trips, not time: a loaded machine with -race may take
	// longer than the fast timings' 250ms operation timeout for 10,000 EXISTS.
	w, _ := newWorker(t, rdb, &fakeResetter{}, "scanner", WithTimings(Timings{
		HeartbeatTTL:      20 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		OperationTimeout:  5 * time.Second,
		RowsTTL:           time.Minute,
	}))

	rep, err := w.recoverNow(ctx)

	require.NoError(t, err)
	assert.Equal(t, 10000, rep.PeersChecked)
	trips, cmds := counter.snapshot()
	// A worker not started reads the fleet record first (it has learnt
	// no member's timings from a heartbeat); then SMEMBERS, then every
	// EXISTS in one pipeline.
	assert.Equal(t, 3, trips, "HGETALL of the fleet record, SMEMBERS, then every EXISTS in one pipeline")
	assert.Equal(t, 10002, len(cmds))
}

// plantLivePeers registers n peers with a heartbeat each, in one pipeline.
func plantLivePeers(t testing.TB, rdb redis.UniversalClient, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	pipe := rdb.Pipeline()
	for i := range ids {
		ids[i] = "peer-" + strconv.Itoa(i)
		pipe.SAdd(ctx, store.RegistryKey(prefix), ids[i])
		pipe.Set(ctx, store.InstanceKeys(prefix, ids[i]).Heartbeat, "alive", time.Hour)
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	return ids
}

// fleetMinute plays one default minute of a fleet of n workers without
// waiting for it: two heartbeats and one recovery tick each, as the
// defaults (30 s heartbeat, 60 s recovery) would in 60 s. It returns the
// commands the server executed, from INFO commandstats.
func fleetMinute(t testing.TB, rdb *redis.Client, n int, lease bool) int64 {
	t.Helper()
	ctx := context.Background()
	prefix := testutil.Name("F")
	fleet := make([]*Worker, n)
	for i := range fleet {
		w, err := New(rdb, &fakeResetter{}, WithKeyPrefix(prefix), WithInstanceID(fmt.Sprintf("w%d", i)),
			WithScanTurn(lease), WithLogger(discardLogger))
		require.NoError(t, err)
		fleet[i] = w
		require.NoError(t, w.heart.runOnce(ctx))
	}
	before := totalCommands(t, rdb)
	for range 2 {
		for _, w := range fleet {
			require.NoError(t, w.heart.runOnce(ctx))
		}
	}
	for _, w := range fleet {
		w.recov.runOnce(ctx)
	}
	return totalCommands(t, rdb) - before - 1 // the INFO call itself
}

// totalCommands sums the calls of INFO commandstats.
func totalCommands(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if i := strings.Index(line, "calls="); i >= 0 && strings.HasPrefix(line, "cmdstat_") {
			v := line[i+len("calls="):]
			v = v[:strings.IndexByte(v, ',')]
			n, _ := strconv.ParseInt(v, 10, 64)
			total += n
		}
	}
	return total
}

// TestFleetLoadGrowsLinearlyWithTheScanLease counts the Redis commands a
// fleet sends per default minute on a real server, with and without the
// scan lease. docs/performance.md has the figures.
func TestFleetLoadGrowsLinearlyWithTheScanLease(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fleet simulation")
	}
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	for _, n := range []int{10, 100, 1000} {
		without := fleetMinute(t, rdb, n, false)
		with := fleetMinute(t, rdb, n, true)
		t.Logf("fleet of %4d: %8d commands/min without scan lease, %6d with (%.1f per worker)",
			n, without, with, float64(with)/float64(n))
		// Per worker and minute, as INFO counts them (a script's own
		// commands count too): 2 heartbeats of 13 (the Beat script's EVAL,
		// GET heartbeat, GET claim, DEL rows seen, SET heartbeat, SET
		// incarnation, PEXPIRE rows; SADD registry beside it; the fleet script's EVAL, TIME,
		// HSETNX serves when the resetter tells, HSET announcement,
		// HGETALL; the SET of the oldest row's age; one round trip), a
		// lease try (EVAL, GET, SET) with the HGET of the worker's
		// untracked-rows note in its pipeline, and one scan (1 + n
		// commands) for the fleet.
		assert.LessOrEqual(t, with, int64(28*n+4*n+n+1), "n=%d: linear", n)
		assert.GreaterOrEqual(t, without, int64(n*n), "n=%d: quadratic without the lease", n)
	}
}

// The worst case of the stated bound: the lease holder scans just before a
// peer's heartbeat expires and dies; another worker's tick comes just
// before the lease ends (skipped) and its next one a jittered interval
// later. Recovery then comes TTL + 1.1 × interval + the scan lease after
// the dead peer's last heartbeat, as README and docs/design.md state (the
// scan itself aside), and no later.
func TestScanLeaseOfAHolderThatDiesAfterScanningDelaysRecoveryByAtMostTheLease(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	const ttl, interval = 2 * time.Second, time.Second // fast()
	stated := ttl + interval*11/10 + min(interval*8/10, ttl)
	plantDeadPeer(t, rdb, "ALYA", "V", "1")
	require.NoError(t, rdb.Set(ctx, keysOf("V").Heartbeat, "alive", ttl).Err()) // V's last heartbeat: now
	elapsed := time.Duration(0)
	advance := func(d time.Duration) { mr.FastForward(d); elapsed += d }
	holder, _ := newWorker(t, rdb, &fakeResetter{}, "holder")
	r := &fakeResetter{}
	other, _ := newWorker(t, rdb, r, "other")

	advance(ttl - time.Millisecond)
	holder.recov.runOnce(ctx)
	beating(t, rdb, "ALYA", "holder") // its last heartbeat, a TTL long, outlives its turn
	require.Equal(t, uint64(1), holder.Stats().Scans, "the holder scans while V is alive")
	require.Empty(t, holder.Stats().PeersDead)
	advance(2 * time.Millisecond) // V's heartbeat expires; the holder dies
	advance(holder.opts.scanTurnTTL() - 3*time.Millisecond)
	other.recov.runOnce(ctx)
	require.Zero(t, other.Stats().Scans, "a tick just before the lease ends is skipped")
	advance(interval * 11 / 10) // the next tick, jitter at its worst
	other.recov.runOnce(ctx)

	assert.Equal(t, []int64{1}, r.resetOf("V"))
	assert.LessOrEqual(t, elapsed, stated, "recovered within TTL + 1.1 × interval + the scan lease of V's last heartbeat")
	assert.Greater(t, elapsed, ttl+interval*11/10, "the lease adds to TTL + 1.1 × interval")
}

func TestRecoveryLeavesRowsOfLivePeers(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	a, _ := startWorker(t, rdb, r, "workerA")
	require.NoError(t, a.Track(context.Background(), 1, 2, 3))
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, 1, rep.PeersChecked)
	assert.Zero(t, len(rep.Dead))
	assert.Zero(t, r.callCount())
	got, _ := mr.Members(keysOf("workerA").Rows)
	assert.ElementsMatch(t, []string{"1", "2", "3"}, got)
}

func TestKilledWorkerIsRecoveredOnceItsHeartbeatExpires(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	a, _ := startWorker(t, rdb, r, "workerA", WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}))
	require.NoError(t, a.Track(context.Background(), 100, 101, 102, 103, 104, 105, 106, 107, 108, 109))
	for _, id := range []int64{100, 101, 102, 103, 104} {
		require.NoError(t, a.Untrack(id))
	}
	a.crash()
	b, _ := newWorker(t, rdb, r, "workerB")

	mr.FastForward(1900 * time.Millisecond)
	rep, err := b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Zero(t, len(rep.Dead), "heartbeat still there: not dead yet")
	assert.Zero(t, r.callCount())

	mr.FastForward(100 * time.Millisecond)
	rep, err = b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, len(rep.Dead))
	assert.Equal(t, []int64{105, 106, 107, 108, 109}, r.resetOf("workerA"))
}

func TestWorkerNeverRecoversItself(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	w, _ := startWorker(t, rdb, r, "self", WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}))
	require.NoError(t, w.Track(context.Background(), 1))
	mr.Del(keysOf("self").Heartbeat) // as if our own key expired in a pause

	rep, err := w.recoverNow(context.Background())

	require.NoError(t, err)
	assert.Zero(t, rep.PeersChecked)
	assert.Zero(t, r.callCount())
	ok, _ := mr.SIsMember(keysOf("self").Rows, "1")
	assert.True(t, ok)
}

func TestRecoveryRunsAtStartAndEveryInterval(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "early", "1")
	r := &fakeResetter{}
	// miniredis expires keys only when told to: no scan lease here.
	_, _ = startWorker(t, rdb, r, "workerB", WithTimings(Timings{RecoveryInterval: 300 * time.Millisecond}), WithScanTurn(false))
	require.Eventually(t, func() bool { return len(r.resetOf("early")) == 1 }, time.Second, 5*time.Millisecond,
		"the first scan runs at Start")

	plantDeadPeer(t, rdb, "ALYA", "late", "2")
	require.Eventually(t, func() bool { return len(r.resetOf("late")) == 1 }, 2*time.Second, 5*time.Millisecond,
		"later deaths are found by the periodic scan")
}

func TestRecoverNowBeforeStartWorksAndAfterShutdownIsRefused(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "operator")

	_, err := w.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{1}, r.resetOf("dead"))

	require.NoError(t, w.Shutdown(context.Background()))
	_, err = w.recoverNow(context.Background())
	assert.ErrorIs(t, err, ErrShutdown)
}

func TestRecoveryScanFailsCleanlyWhenRedisIsDown(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w")
	mr.SetError("ERR down")
	_, err := w.recoverNow(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "read registry "+registryKey)
}
