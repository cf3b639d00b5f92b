package recovery

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"

	"github.com/alya/recovery/internal/store"
)

// killToReset starts a worker that tracks rows, crashes it, and returns how
// long a peer started with opts takes to reset them.
func killToReset(t *testing.T, rdb redis.UniversalClient, opts ...Option) time.Duration {
	t.Helper()
	prefix := testutil.Name("X")
	r := &fakeResetter{}
	base := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RowsTTL:           30 * time.Second,
	})}
	peer, _ := startWorker(t, rdb, r, "peer", append(base, WithTimings(Timings{RecoveryInterval: 5 * time.Second}))...)
	victim, _ := startWorker(t, rdb, r, "victim", append(base, WithTimings(Timings{RecoveryInterval: 5 * time.Second}))...)
	require.NoError(t, victim.Track(context.Background(), 1, 2, 3))
	watcher, _ := startWorker(t, rdb, r, "watcher", append(append(base, WithTimings(Timings{RecoveryInterval: 5 * time.Second})), opts...)...)
	// The first scan (one per fleet: the scan turn) is done once each
	// worker's first recovery turn, at its Start, has ended: one of them
	// took the scan turn and scanned in it.
	deadline := time.Now().Add(5 * time.Second)
	for _, w := range []*Worker{peer, victim, watcher} {
		signals(w).scan.WaitForWithin(t, time.Until(deadline), func(struct{}) bool { return true })
	}
	require.GreaterOrEqual(t, peer.Stats().Scans+victim.Stats().Scans+watcher.Stats().Scans, uint64(1),
		"the first scan (one per fleet: the scan turn) is done")
	victim.crash()
	killed := time.Now()
	require.Eventually(t, func() bool { return len(r.resetOf("victim")) == 3 }, 15*time.Second, 5*time.Millisecond)
	return time.Since(killed)
}

func TestExpiryNotificationsRecoverWithinTheHeartbeatTTLPlusOneSecond(t *testing.T) {
	srv := testutil.StartRedis(t, "--notify-keyspace-events", "Ex")
	rdb := srv.Client(t)

	with := killToReset(t, rdb, WithExpiryNotifications())
	t.Logf("kill to reset: %v with expiry notifications (TTL 2s, recovery interval 5s)", with.Round(time.Millisecond))
	assert.LessOrEqual(t, with, 3*time.Second, "heartbeat TTL + 1s")
}

// The same kill found by the periodic scan only, for comparison
// (docs/performance.md): within TTL + 1.1 × the recovery interval + the
// scan lease, the documented worst case. It asserts no tight latency, so
// it runs in parallel with other tests.
func TestPeriodicScanAloneRecoversWithinTheDocumentedBound(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	without := killToReset(t, srv.Client(t))
	t.Logf("kill to reset: %v with the periodic scan only (TTL 2s, recovery interval 5s)", without.Round(time.Millisecond))
	assert.LessOrEqual(t, without, 2*time.Second+5*time.Second*11/10+2*time.Second, "TTL + 1.1 × interval + the scan lease (min(0.8 × interval, TTL))")
}

func TestExpiryNotificationsAreConfiguredWhenAllowed(t *testing.T) {
	srv := testutil.StartRedis(t) // notify-keyspace-events is "" by default
	rdb := srv.Client(t)
	ctx := context.Background()

	_, logs := startWorker(t, rdb, &fakeResetter{}, "cautious", WithExpiryNotifications())
	assert.Equal(t, 1, logs.Count("expiry notifications unavailable"))
	cfg, err := rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	require.NoError(t, err)
	assert.Empty(t, cfg["notify-keyspace-events"], "left alone without permission")

	_, logs = startWorker(t, rdb, &fakeResetter{}, "bold", WithExpiryNotifications(), WithExpiryConfigSet())
	assert.Equal(t, 1, logs.Count("enabled keyspace notifications of expired keys"))
	cfg, err = rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	require.NoError(t, err)
	assert.True(t, store.ExpiredEventsEnabled(cfg["notify-keyspace-events"]), "got %q", cfg["notify-keyspace-events"])
}

func TestExpiryNotificationsOnCluster(t *testing.T) {
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	took := killToReset(t, rdb, WithExpiryNotifications(), WithExpiryConfigSet())
	t.Logf("cluster: kill to reset %v with expiry notifications", took.Round(time.Millisecond))
	assert.LessOrEqual(t, took, 3*time.Second, "heartbeat TTL + 1s")
}

func TestExpiryWatchIgnoresOtherKeysAndItself(t *testing.T) {
	srv := testutil.StartRedis(t, "--notify-keyspace-events", "Ex")
	rdb := srv.Client(t)
	ctx := context.Background()
	r := &fakeResetter{}
	w, _ := startWorker(t, rdb, r, "self", WithExpiryNotifications(),
		WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}))
	keys := []string{"unrelated", keysOf("").Heartbeat, keysOf("a b").Heartbeat, store.InstanceKeys("OTHER", "x").Heartbeat, keysOf("x").Rows}
	for _, k := range keys {
		require.NoError(t, rdb.Set(ctx, k, "1", 10*time.Millisecond).Err())
	}
	require.Eventually(t, func() bool { // an EXISTS expires a key at once, and publishes its event
		for _, k := range keys {
			if rdb.Exists(ctx, k).Val() != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	// Then a real peer's heartbeat expires: its event comes after all the
	// others on the subscription, so once it is recovered they were handled.
	plantDeadPeer(t, rdb, defaultKeyPrefix, "last", "1")
	require.NoError(t, rdb.Set(ctx, keysOf("last").Heartbeat, "alive", 10*time.Millisecond).Err())
	waitTurns(t, &signals(w).expired, 5*time.Second, func() bool { return len(r.resetOf("last")) == 1 },
		"recovered through its expiry event (the recovery interval is an hour)")
	assert.Equal(t, 1, r.callCount(), "the other keys' events reset nothing")
	assert.Equal(t, uint64(1), w.Stats().PeersDead, "and found no one else dead")
}

// nodeHoldEnd is when w's hold on death verdicts from node, as it
// remembers the node's age (registry.go), ends; zero when it holds none.
func nodeHoldEnd(w *Worker, node string) time.Time {
	a := &w.peers.judge.nodes.ages
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.nodes[node]
	if !ok || s.since.IsZero() {
		return time.Time{}
	}
	return s.since.Add(w.fleet.ttl())
}

// idOn returns an instance ID starting with prefix whose keys live on the
// Cluster master at addr (on) or on another one (!on).
func idOn(t *testing.T, cluster *testutil.Cluster, rdb *redis.ClusterClient, keyPrefix, prefix, addr string, on bool) string {
	t.Helper()
	ctx := context.Background()
	for i := range 1000 {
		id := fmt.Sprintf("%s%d", prefix, i)
		slot, err := rdb.ClusterKeySlot(ctx, store.InstanceKeys(keyPrefix, id).Heartbeat).Result()
		require.NoError(t, err)
		m, err := cluster.MasterOf(ctx, slot)
		require.NoError(t, err)
		if (m == addr) == on {
			return id
		}
	}
	t.Fatalf("no ID %s* on/off %s", prefix, addr)
	return ""
}

// A Cluster master SIGKILLed and its replica promoted: the watcher
// subscribes on the promoted master at its next check, and a peer that
// dies after the failover, its keys on the promoted master, is recovered
// through its expiry event: within the TTL + 1 s, with a recovery interval
// of 30 s that a scan would need.
func TestExpiryNotificationsFollowAClusterFailover(t *testing.T) {
	cluster := testutil.StartClusterWithReplicas(t, 3, 1, time.Second)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	prefix := testutil.Name("XF")
	target := cluster.Addrs[0]
	require.Equal(t, "master", testutil.Role(ctx, cluster.Node(target)), "redis-cli --cluster create makes the first nodes masters")
	victimID := idOn(t, cluster, rdb, prefix, "victim-", target, true)
	watcherID := idOn(t, cluster, rdb, prefix, "watcher-", target, false)
	slot, err := rdb.ClusterKeySlot(ctx, store.InstanceKeys(prefix, victimID).Heartbeat).Result()
	require.NoError(t, err)

	const ttl = 4 * time.Second // longer than the failover (about 2.5 s): no lease lost to it
	r := &fakeResetter{}
	base := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      ttl,
		HeartbeatInterval: time.Second,
		RowsTTL:           time.Minute,
		RecoveryInterval:  30 * time.Second,
	})}
	watcher, logs := startWorker(t, rdb, r, watcherID, append(base, WithExpiryNotifications(), WithExpiryConfigSet())...)
	victim, _ := startWorker(t, rdb, r, victimID, base...)

	killedAt := time.Now()
	cluster.Node(target).Kill()
	promoted := cluster.WaitFailover(t, slot, target, 20*time.Second)
	failover := time.Since(killedAt)
	waitTurns(t, &signals(watcher).masters, 5*time.Second, func() bool { return logs.Count("expiry notifications: subscribed on a new master") == 1 },
		"the watcher subscribed on", promoted)
	subscribed := time.Since(killedAt) - failover
	assert.Equal(t, 1, logs.Count("expiry notifications: subscription closed, the node is no longer a master"))
	require.Eventually(t, func() bool { return victim.Track(ctx, 1, 2, 3) == nil }, 5*time.Second, 10*time.Millisecond,
		"the victim's rows tracked on the promoted master")
	// The watcher holds verdicts from the promoted master for a TTL from
	// its subscription (registry.go); the victim dies after that.
	node, err := watcher.store.NodeOf(ctx, victimID)
	require.NoError(t, err)
	holdEnd := nodeHoldEnd(watcher, node)
	require.False(t, holdEnd.IsZero(), "the watcher holds verdicts from %s since it subscribed there", node)
	// The hold ends a TTL after the watcher first saw the promoted master.
	time.Sleep(time.Until(holdEnd)) // real time: a hold ends at a moment of the clock, and no loop acts then
	deadBefore := watcher.Stats().PeersDead
	victim.crash()
	crashedAt := time.Now()
	require.Eventually(t, func() bool { return len(r.resetOf(victimID)) == 3 }, 15*time.Second, 10*time.Millisecond)
	took := time.Since(crashedAt)
	t.Logf("failover %v; subscribed on %s %v after the promotion; crash to reset %v (TTL %v, recovery interval 30s)",
		failover.Round(time.Millisecond), promoted, subscribed.Round(time.Millisecond), took.Round(time.Millisecond), ttl)
	assert.LessOrEqual(t, subscribed, time.Second*11/10+time.Second, "subscribed at the next check: a heartbeat interval ±10%, and its round trips")
	assert.LessOrEqual(t, took, ttl+time.Second, "found by its expiry event: TTL + 1 s, not the 30 s scan")
	assert.Equal(t, deadBefore+1, watcher.Stats().PeersDead, "the watcher found it")
}
