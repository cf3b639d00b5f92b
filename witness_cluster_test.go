package recovery

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// The liveness witness on a real Redis Cluster (shard channels, Redis 7):
// each life's channel is in its instance's slot, counted on that slot's
// master with that master's run ID.

// onWitnessCluster gives a test a Cluster of its own (masters, each with
// replicas), PostgreSQL with a batch of n rows, a key prefix named after
// name, and an owner-fencing resetter.
func onWitnessCluster(t *testing.T, masters, replicas, n int, name string) (*testutil.Cluster, *redis.ClusterClient, *pgxpool.Pool, string, Resetter) {
	t.Helper()
	var c *testutil.Cluster
	if replicas == 0 {
		c = testutil.StartCluster(t, masters)
	} else {
		c = testutil.StartClusterWithReplicas(t, masters, replicas, time.Second)
	}
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, n)
	return c, c.Client(t), db, testutil.Name(name), fencedResetter(t, db)
}

// idsOnMasters returns one instance ID per master of cc (three), each of whose
// keys (and life channels) are in a slot of that master, in the order of
// the masters' addresses.
func idsOnMasters(t *testing.T, cc *redis.ClusterClient, prefix, stem string) []string {
	t.Helper()
	ctx := context.Background()
	byNode := map[string]string{}
	var masters []string
	for i := 0; i < 1000 && len(masters) < 3; i++ {
		id := fmt.Sprintf("%s%d", stem, i)
		m, err := cc.MasterForKey(ctx, store.InstanceKeys(prefix, id).Heartbeat)
		require.NoError(t, err)
		if _, ok := byNode[m.Options().Addr]; !ok {
			byNode[m.Options().Addr] = id
			masters = append(masters, m.Options().Addr)
		}
	}
	slices.Sort(masters)
	ids := make([]string, 0, len(masters))
	for _, m := range masters {
		ids = append(ids, byNode[m])
	}
	return ids
}

// masterOf returns the address of the master of id's slot, as the
// Cluster's nodes see it.
func masterOf(t *testing.T, c *testutil.Cluster, cc *redis.ClusterClient, prefix, id string) (string, int64) {
	t.Helper()
	ctx := context.Background()
	slot, err := cc.ClusterKeySlot(ctx, store.InstanceKeys(prefix, id).Heartbeat).Result()
	require.NoError(t, err)
	m, err := c.MasterOf(ctx, slot)
	require.NoError(t, err)
	return m, slot
}

// nodeRunID returns the run ID of the node at addr.
func nodeRunID(t *testing.T, c *testutil.Cluster, addr string) string {
	t.Helper()
	return runID(t, c.Node(addr).Client(t))
}

// markerRun returns the server run id's marker names ("" if none, or
// judged), read through a client that follows failovers.
func markerRun(t *testing.T, rc redis.UniversalClient, prefix, id string) string {
	t.Helper()
	v, err := rc.Get(context.Background(), store.WitnessKey(prefix, id)).Result()
	if err != nil {
		return ""
	}
	m, ok := store.ParseWitness(v)
	if !ok || m.Judged {
		return ""
	}
	return m.RunID
}

// Killed workers whose keys are on each of the three masters are judged
// by one peer, one after the other: their rows are back long before their
// heartbeats expire (10 s), each channel counted on its own master and
// checked against that master's run. (Reverted to checking every channel
// against the run of the first one's master, as a single server's count
// does, the workers on the two other masters were never judged; with the
// witness turns read by one EXISTS of two keys, CROSSSLOT on a Cluster, no
// worker took a turn and none was judged.)
func TestWitnessOnClusterJudgesKilledWorkersOnEveryMaster(t *testing.T) {
	t.Parallel()
	c, cc, db, prefix, r := onWitnessCluster(t, 3, 0, 3, "WCK")
	ctx := context.Background()
	var ev witnessEvents
	ids := idsOnMasters(t, cc, prefix, "v")
	require.Len(t, ids, 3, "a worker on each master")
	// Every worker observed: a verdict comes from whichever holds a turn.
	_, _ = startWorker(t, cc, r, "judge", append(witnessTimings(prefix), WithObserver(ev.observe))...)
	var victims []*Worker
	for i, id := range ids {
		w, _ := startWorker(t, cc, r, id, append(witnessTimings(prefix), WithObserver(ev.observe))...)
		require.NotNil(t, w.lease.witness, "the witness runs on a Redis 7 Cluster")
		m, _ := masterOf(t, c, cc, prefix, id)
		require.Equal(t, nodeRunID(t, c, m), markerRun(t, cc, prefix, id), "the marker names the run of the master of its slot")
		take(t, db, w.OwnerValue(), int64(i+1))
		require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), int64(i+1)))
		victims = append(victims, w)
	}
	var took []time.Duration
	for i, w := range victims {
		w.witness.killed.Store(true) // a killed process leaves its marker
		killed := time.Now()
		w.crash()
		require.Eventually(t, func() bool {
			s, _ := rowState(t, db, int64(i+1))
			return s == "queued"
		}, 8*time.Second, 10*time.Millisecond, "the row of the worker on master %d is back", i)
		took = append(took, time.Since(killed))
		alive, err := cc.Exists(ctx, store.InstanceKeys(prefix, ids[i]).Heartbeat).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), alive, "found by the witness, not by the heartbeat's expiry")
	}
	t.Logf("kill -> rows back, one worker per master: %v", took)
	assert.Equal(t, 3, ev.count(EventRowsRecovered), "each judged once")
	for _, d := range took {
		assert.Less(t, d, 2*time.Second, "under the issue's 2 s at worst")
	}
}

// Blips of the subscriber's connection on the master that holds it are
// not deaths: CLIENT KILL TYPE pubsub ten times and TYPE normal twice on
// that node, 100 ms apart; go-redis reconnects to the slot's master and
// subscribes to the shard channel again within the grace. No verdict, the
// rows stay the live worker's, its life goes on and it is not fenced at
// the end. (Reverted to reading only "subscribe" as a confirmation, not
// the shard channel's "ssubscribe", the witness never saw its
// subscription confirmed, not even at Start, and did not run.)
func TestWitnessOnClusterConnectionBlipsAreNotDeaths(t *testing.T) {
	t.Parallel()
	c, cc, db, prefix, r := onWitnessCluster(t, 3, 0, 3, "WCB")
	ctx := context.Background()
	var ev witnessEvents
	ids := idsOnMasters(t, cc, prefix, "a")
	a, _ := startWorker(t, cc, r, ids[0], append(witnessTimings(prefix), WithObserver(ev.observe))...)
	_, _ = startWorker(t, cc, r, "b", append(witnessTimings(prefix), WithObserver(ev.observe))...)
	owner := a.OwnerValue()
	take(t, db, owner, 1, 2, 3)
	require.NoError(t, a.TrackAs(ctx, owner, 1, 2, 3))
	require.NotNil(t, a.lease.witness, "the witness runs on a Redis 7 Cluster")
	node, _ := masterOf(t, c, cc, prefix, ids[0])
	admin := c.Node(node).Client(t)
	subs := func() int {
		list, err := admin.ClientList(ctx).Result()
		require.NoError(t, err)
		return strings.Count(list, "cmd=ssubscribe") + strings.Count(list, "cmd=ping")
	}
	require.Positive(t, subs(), "the life's connection is on the master of its slot")
	for i := range 12 {
		kind := "pubsub"
		if i%6 == 5 {
			kind = "normal"
		}
		require.NoError(t, admin.Do(ctx, "CLIENT", "KILL", "TYPE", kind).Err())
		time.Sleep(100 * time.Millisecond) // real time: the blips come 100 ms apart
	}
	time.Sleep(2 * a.opts.witnessGrace) // real time: past any grace the last blip began
	noVerdict(t, db, &ev, a, owner, 3, "after the blips")
	require.NoError(t, a.CheckLease(), "it waits for its witness, back at once")
}

// A failover of the master that holds a worker's channel is no death,
// whether a replica takes over on request (CLUSTER FAILOVER: the old
// master becomes its replica and ends its shard channels' subscriptions)
// or because the master was killed. The worker subscribes again on the
// new master and marks its life on that master's run; no verdict, its
// rows stay its own, and it is not fenced once the Cluster is whole.
// Redis 7.0.15 ends the shard channel's subscription at the demotion
// (sunsubscribe) in most runs and keeps it on the demoted master in
// others; then the marker's renewal finds the channel on another run.
// (Reverted to renewing the marker without that check, this test failed
// in 1 of 6 runs: the worker stayed marked on the demoted master's run;
// TestWitnessRenewalFindingItsChannelOnAnotherRunSubscribesAnew checks it
// every time.)
func TestWitnessOnClusterAFailoverIsNoVerdict(t *testing.T) {
	t.Parallel()
	c, cc, db, prefix, r := onWitnessCluster(t, 3, 1, 3, "WCF")
	ctx := context.Background()
	var ev witnessEvents
	ids := idsOnMasters(t, cc, prefix, "a")
	a, _ := startWorker(t, cc, r, ids[0], append(witnessTimings(prefix), WithObserver(ev.observe))...)
	// The judge's keys on another master: its own failover is not this test's.
	_, _ = startWorker(t, cc, r, ids[1], append(witnessTimings(prefix), WithObserver(ev.observe))...)
	owner := a.OwnerValue()
	take(t, db, owner, 1, 2, 3)
	require.NoError(t, a.TrackAs(ctx, owner, 1, 2, 3))
	follow := c.FollowingClient(t)
	reMarked := func(step, master string, within time.Duration) {
		t.Helper()
		run := nodeRunID(t, c, master)
		require.Eventually(t, func() bool { return markerRun(t, follow, prefix, ids[0]) == run }, within, 20*time.Millisecond,
			"%s: the worker marks its life on the new master's run", step)
	}

	// A replica takes over on request.
	old, slot := masterOf(t, c, cc, prefix, ids[0])
	replica := replicaOf(t, c, old)
	require.NoError(t, c.Node(replica).Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err())
	require.Equal(t, replica, c.WaitFailover(t, slot, old, 10*time.Second))
	// The old master keeps the subscription (its shard's replica now): the
	// worker finds its channel on another run at its marker's next renewal,
	// every third of the heartbeat TTL.
	reMarked("CLUSTER FAILOVER", replica, a.fleet.ttl()/3+3*time.Second)
	time.Sleep(2 * a.opts.witnessGrace) // real time: past any grace the failover began
	noVerdict(t, db, &ev, a, owner, 3, "CLUSTER FAILOVER")
	waitTurns(t, &signals(a).witness, 5*time.Second, func() bool { return a.CheckLease() == nil }, "not fenced after CLUSTER FAILOVER")

	// The new master is killed: the old one, its replica now, takes over.
	c.Node(replica).Kill()
	require.Equal(t, old, c.WaitFailover(t, slot, replica, 15*time.Second))
	reMarked("master killed", old, 10*time.Second)
	time.Sleep(2 * a.opts.witnessGrace) // real time: past any grace the failover began
	noVerdict(t, db, &ev, a, owner, 3, "master killed")
	waitTurns(t, &signals(a).witness, 5*time.Second, func() bool { return a.CheckLease() == nil }, "not fenced after the master was killed")
}

// replicaOf returns the address of a replica of the master at addr.
func replicaOf(t *testing.T, c *testutil.Cluster, addr string) string {
	t.Helper()
	ctx := context.Background()
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	for _, n := range c.Nodes {
		info, err := n.Client(t).Info(ctx, "replication").Result()
		require.NoError(t, err)
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r") {
			return n.Addr
		}
	}
	t.Fatalf("no replica of %s", addr)
	return ""
}

// A slot moved to another master (a resharding: its keys migrated, then
// CLUSTER SETSLOT NODE) ends its shard channels' subscriptions on the old
// master (a sunsubscribe from the server). The worker whose channel it was
// takes that as a lost subscription: no proof counts until it subscribed
// on the new master and marked its life on that master's run, within
// three fences; no verdict, the rows stay its own. (Reverted to ignoring
// the server's sunsubscribe, the worker went on proving a channel nobody
// held and marked its life on the new master only at its marker's
// renewal, a third of the heartbeat TTL later; reverted to leaving a
// MOVED reply to SSUBSCRIBE to the watchdog, it marked it after the
// watchdog's four fences.)
func TestWitnessOnClusterASlotMovedToAnotherMasterIsNoVerdict(t *testing.T) {
	t.Parallel()
	c, cc, db, prefix, r := onWitnessCluster(t, 3, 0, 3, "WCM")
	ctx := context.Background()
	var ev witnessEvents
	ids := idsOnMasters(t, cc, prefix, "a")
	a, _ := startWorker(t, cc, r, ids[0], append(witnessTimings(prefix), WithObserver(ev.observe))...)
	_, _ = startWorker(t, cc, r, ids[1], append(witnessTimings(prefix), WithObserver(ev.observe))...)
	owner := a.OwnerValue()
	take(t, db, owner, 1, 2, 3)
	require.NoError(t, a.TrackAs(ctx, owner, 1, 2, 3))

	src, slot := masterOf(t, c, cc, prefix, ids[0])
	dst, _ := masterOf(t, c, cc, prefix, ids[1])
	moveSlot(t, c, slot, src, dst)
	moved := time.Now()
	follow := c.FollowingClient(t)
	run := nodeRunID(t, c, dst)
	require.Eventually(t, func() bool { return markerRun(t, follow, prefix, ids[0]) == run }, 3*a.opts.witnessFence, 20*time.Millisecond,
		"the worker marks its life on the new master's run at once, not at its marker's renewal nor after its watchdog's four fences")
	t.Logf("marked on the new master %v after the move", time.Since(moved).Round(time.Millisecond))
	time.Sleep(2 * a.opts.witnessGrace) // real time: past any grace the move began
	noVerdict(t, db, &ev, a, owner, 3, "after the move")
	waitTurns(t, &signals(a).witness, 5*time.Second, func() bool { return a.CheckLease() == nil }, "not fenced once moved")
}

// moveSlot moves slot from the master at src to the master at dst, its
// keys with it (IMPORTING, MIGRATING, MIGRATE, then NODE on every master).
func moveSlot(t *testing.T, c *testutil.Cluster, slot int64, src, dst string) {
	t.Helper()
	ctx := context.Background()
	s, d := c.Node(src).Client(t), c.Node(dst).Client(t)
	srcID, err := s.Do(ctx, "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	dstID, err := d.Do(ctx, "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	require.NoError(t, d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	require.NoError(t, s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	host, port, _ := strings.Cut(dst, ":")
	for {
		keys, err := s.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, s.Do(ctx, args...).Err())
	}
	for _, n := range c.Nodes {
		require.NoError(t, n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
}

// movedRun is a witness store whose LifeHeld reports the channel held on
// another server run once, when on is set: what a marker's renewal finds
// after a Cluster failover that left the subscription on the demoted
// master (the slot's master is another node, on another run).
type movedRun struct {
	witnessStore
	on *atomic.Bool
}

func (m movedRun) LifeHeld(ctx context.Context, channel string) (bool, string, error) {
	held, run, err := m.witnessStore.LifeHeld(ctx, channel)
	if m.on.CompareAndSwap(true, false) {
		return held, "another-run", err
	}
	return held, run, err
}

// A marker's renewal that finds the channel held on another server run
// than the marker names subscribes anew and marks a new epoch on the run
// it then finds: on a Cluster, a failover within the slot's shard may
// leave the subscription on the demoted master (Redis 7.0.15 ends it at
// the demotion in some runs of TestWitnessOnClusterAFailoverIsNoVerdict,
// keeps it in others), where no judge counts it. Checked on a single
// server, whose LifeHeld lies once. (Reverted to renewing the marker
// without the check, the epoch never moved.)
func TestWitnessRenewalFindingItsChannelOnAnotherRunSubscribesAnew(t *testing.T) {
	t.Parallel()
	_, rdb, _, prefix, r := onWitnessServers(t, 1, "WN")
	ctx := context.Background()
	a, _ := newWorker(t, rdb, r, "a", WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      3 * time.Second, // the marker renewed every second
		HeartbeatInterval: time.Second,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      2 * time.Second,
	}))
	var on atomic.Bool
	a.witness.ws = movedRun{a.witness.ws, &on}
	require.NoError(t, a.Start(ctx))
	marker := func() store.Witness {
		v, err := rdb.Get(ctx, store.WitnessKey(prefix, "a")).Result()
		require.NoError(t, err)
		m, ok := store.ParseWitness(v)
		require.True(t, ok)
		return m
	}
	first := marker()
	on.Store(true)
	waitTurns(t, &signals(a).witness, 5*time.Second, func() bool { return marker().Epoch > first.Epoch },
		"a new subscription and a new epoch after the renewal found another run")
	assert.Equal(t, first.RunID, marker().RunID, "marked on the run it found then")
	waitTurns(t, &signals(a).witness, 5*time.Second, func() bool { return a.CheckLease() == nil }, "not fenced")
}

// before7 is a witness store over a Cluster whose masters run Redis 6.2,
// as WitnessAvailable reports it (the servers here run 7.0, so the 6.2
// path is taken by this double; store.ShardChannels, the version decision
// itself, is checked by TestShardChannelsNeedRedis7).
type before7 struct{ witnessStore }

func (before7) WitnessAvailable(context.Context) error {
	return fmt.Errorf("%w: 127.0.0.1:7000 runs 6.2.14", store.ErrWitnessUnsupported)
}

// On a Cluster before Redis 7 (no shard channels) the witness is off for
// the worker's whole run, both sides, decided once at Start with one log
// line; the worker runs on the heartbeat TTL, its lease unfenced.
// (Reverted, without the decision, the witness ran.) And a Ring never runs
// it.
func TestWitnessOffOnAClusterBeforeRedis7DecidedAtStart(t *testing.T) {
	t.Parallel()
	c, cc, db, prefix, r := onWitnessCluster(t, 3, 0, 1, "WC6")
	a, logs := newWorker(t, cc, r, "a", witnessTimings(prefix)...)
	require.NotNil(t, a.witness)
	a.witness.ws = before7{a.witness.ws}
	require.NoError(t, a.Start(context.Background()))
	assert.Nil(t, a.lease.witness, "no fence")
	assert.Nil(t, a.witness, "no subscription")
	assert.Nil(t, a.watch, "no judge")
	assert.Equal(t, 1, logs.Count("liveness witness off: a Redis Cluster master has no shard channels"))
	take(t, db, a.OwnerValue(), 1)
	require.NoError(t, a.TrackAs(context.Background(), a.OwnerValue(), 1))
	require.NoError(t, a.CheckLease())

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": c.Addrs[0]}})
	t.Cleanup(func() { ring.Close() })
	assert.False(t, store.NewRedis(ring, prefix, time.Second).WitnessSupported(), "a Ring never runs it")
}

// The witness's cost on a 3-master Cluster, per node, over 5 s of an idle
// fleet of five, witness off then on (INFO commandstats, INFO included,
// this test's own reading not): each worker's pings go to the master of
// its slot; the turn's holder counts on every master holding a marked
// life (PUBSUB SHARDNUMSUB and INFO server each, 20 a second per master),
// its second on the holder's. The bound is the single server's
// (TestWitnessCostPerWorkerIsBounded) with the holder's counts times the
// masters, INFO added.
func TestWitnessOnClusterCostPerNodeIsBounded(t *testing.T) {
	t.Parallel()
	c, cc, _, _, r := onWitnessCluster(t, 3, 0, 1, "WCX")
	const n = 5
	rate := func(on bool) (float64, map[string]map[string]float64) {
		prefix := testutil.Name("WCX")
		var ws []*Worker
		for i := range n {
			w, _ := startWorker(t, cc, r, fmt.Sprintf("w%d", i), append(witnessTimings(prefix), WithLivenessWitness(on))...)
			ws = append(ws, w)
		}
		time.Sleep(2 * time.Second) // real time: the turns settle
		before := map[string]map[string]int64{}
		for _, a := range c.Addrs {
			before[a] = nodeCommandCalls(t, c.Node(a).Client(t))
		}
		time.Sleep(5 * time.Second) // real time: the window counted
		total, perNode := 0.0, map[string]map[string]float64{}
		for _, a := range c.Addrs {
			after := nodeCommandCalls(t, c.Node(a).Client(t))
			perNode[a] = map[string]float64{}
			for cmd, v := range after {
				d := v - before[a][cmd]
				if cmd == "info" {
					d-- // this test's first reading
				}
				if d > 0 {
					perNode[a][cmd] = float64(d) / 5
					total += float64(d) / 5
				}
			}
		}
		for _, w := range ws {
			require.NoError(t, w.Shutdown(context.Background()))
		}
		return total, perNode
	}
	off, offNodes := rate(false)
	on, onNodes := rate(true)
	pings := 0.0
	sum := func(m map[string]float64) (s float64) {
		for _, v := range m {
			s += v
		}
		return s
	}
	for _, a := range c.Addrs {
		t.Logf("node %s: %.0f commands a second without the witness, %.0f with it: %v", a, sum(offNodes[a]), sum(onNodes[a]), onNodes[a])
		pings += onNodes[a]["ping"]
	}
	t.Logf("commands a second, %d idle workers on 3 masters: %.0f without the witness, %.0f with it", n, off, on)
	// As TestWitnessCostPerWorkerIsBounded, the holder's 20 counts a
	// second on each of 3 masters, and INFO server with each count.
	added := float64(n)*13 + 16 + 20*3 + 16 + 20 + 2*float64(n+1) + 4 + (20*3 + 20)
	assert.LessOrEqual(t, on-off, added*1.2, "commands the witness adds a second")
	assert.InDelta(t, 10*n, pings, 3*n, "PINGs: 10 a second per worker")
}

// nodeCommandCalls reads INFO commandstats of one node: calls by command.
func nodeCommandCalls(t *testing.T, rc *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(t, err)
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}
