package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// managedRedis starts a redis-server set up as managed offerings often
// are: a memory limit, the given eviction policy, CONFIG renamed away, and
// evicted-key events on (the tests' signal that a heartbeat was evicted).
func managedRedis(t *testing.T, maxmemory, policy string) *testutil.RedisServer {
	t.Helper()
	return testutil.StartRedis(t, "--maxmemory", maxmemory, "--maxmemory-policy", policy,
		"--rename-command", "CONFIG", "", "--notify-keyspace-events", "Ke")
}

func TestStartRefusesARedisThatCanEvictItsKeys(t *testing.T) {
	for _, policy := range []string{"volatile-lru", "allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			srv := managedRedis(t, "64mb", policy)
			rdb := srv.Client(t)
			require.Error(t, rdb.ConfigGet(context.Background(), "maxmemory-policy").Err(), "CONFIG is renamed away")
			w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")

			err := w.Start(context.Background())

			require.ErrorIs(t, err, ErrEvictionPolicy)
			assert.Contains(t, err.Error(), "maxmemory-policy "+policy)
			assert.Contains(t, err.Error(), "set maxmemory-policy noeviction")
			assert.Contains(t, err.Error(), "WithEvictionAccepted")
			n, derr := rdb.DBSize(context.Background()).Result()
			require.NoError(t, derr)
			assert.Zero(t, n, "nothing written to Redis")
		})
	}
}

func TestStartAcceptsEvictionWhenTold(t *testing.T) {
	srv := managedRedis(t, "64mb", "volatile-lru")
	w, logs := newWorker(t, srv.Client(t), &fakeResetter{}, "w1", WithEvictionAccepted())

	require.NoError(t, w.Start(context.Background()))

	assert.Equal(t, 1, logs.Count("accepted (WithEvictionAccepted)"))
}

func TestStartPassesARedisThatCannotEvict(t *testing.T) {
	for _, c := range []struct{ maxmemory, policy string }{
		{"64mb", "noeviction"},
		{"0", "volatile-lru"}, // no limit: nothing is ever evicted
	} {
		t.Run(c.policy+"-"+c.maxmemory, func(t *testing.T) {
			srv := managedRedis(t, c.maxmemory, c.policy)
			w, _ := newWorker(t, srv.Client(t), &fakeResetter{}, "w1")

			require.NoError(t, w.Start(context.Background()))
		})
	}
}

// A server that refuses INFO (an ACL without +info) is not trusted: the
// worker could not read its policy, nor see its evictions.
func TestStartRefusesARedisThatHidesItsPolicy(t *testing.T) {
	srv := testutil.StartRedis(t)
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-info").Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "worker", Password: "pw"})
	t.Cleanup(func() { rdb.Close() })

	for _, opts := range [][]Option{nil, {WithEvictionAccepted()}} {
		w, _ := newWorker(t, rdb, &fakeResetter{}, "w1", opts...)
		err := w.Start(ctx)
		require.ErrorIs(t, err, ErrEvictionPolicy)
		require.ErrorIs(t, err, ErrRedisAuth, "a NOPERM reply is the ACL refusing the client")
		assert.Contains(t, err.Error(), "ACL +info")
		assert.Contains(t, err.Error(), "NOPERM")
	}
}

// The reproduction (issue 20, item 4): volatile-lru evicts the
// live worker's heartbeat under another application's memory pressure.
// With evictions accepted, no verdict is taken while the server evicts:
// the live worker's rows stay in progress. Once the pressure stops, a
// worker that really died is recovered, a heartbeat TTL later.
func TestEvictedHeartbeatDoesNotResetALiveWorkersRows(t *testing.T) {
	srv := managedRedis(t, "16mb", "volatile-lru")
	rdb := srv.Client(t)
	// The heartbeat written every 1.5 s is then older than the short-lived
	// cache keys, and volatile-lru picks it (its clock counts seconds).
	timing := []Option{WithEvictionAccepted(), WithTimings(Timings{
		HeartbeatTTL:      4 * time.Second,
		HeartbeatInterval: 1500 * time.Millisecond,
		RowsTTL:           8 * time.Second,
	})}
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 20)
	ctx := context.Background()
	r := fencedResetter(t, db) // owner mode: what the docs advise for an evicting server

	live, _ := startWorker(t, rdb, r, "live", timing...)
	take(t, db, "live", 1, 2, 3, 4, 5)
	require.NoError(t, live.Track(ctx, 1, 2, 3, 4, 5))
	// Only the live heartbeat's channel: a subscriber to every evicted key
	// fills its output buffer, which eviction cannot free (OOM).
	sub := rdb.Subscribe(ctx, "__keyspace@0__:"+keysOf("live").Heartbeat)
	t.Cleanup(func() { sub.Close() })
	_, err := sub.Receive(ctx)
	require.NoError(t, err)

	rec, logs := startWorker(t, rdb, r, "rec", timing...)
	testutil.Ballast(t, rdb, "otherapp", 1<<20)
	pctx, stopPressure := context.WithCancel(ctx)
	pressed := make(chan int, 1)
	go func() { pressed <- testutil.Pressure(pctx, srv.Client(t), "otherapp") }()

	start := time.Now()
	testutil.AwaitEvicted(t, sub, 20*time.Second, keysOf("live").Heartbeat)
	evictedSeen := time.Since(start)
	// dead: a worker that died holding rows 11..15 while the server
	// evicts (registered; its heartbeat gone).
	plantDeadPeer(t, rdb, defaultKeyPrefix, "dead")
	take(t, db, "dead", 11, 12, 13, 14, 15)
	// Keep the server evicting for three TTLs: every scan meanwhile finds
	// the heartbeat absent at some point, or the evictions moving. The rows
	// are checked at the end of each of rec's recovery turns, whichever
	// worker held the scan turn: a reset stays, so a check also sees one
	// made by live's turn or by a sweep since the check before.
	scans := &signals(rec).scan
	scans.Clear()
	window := 3 * live.opts.heartbeatTTL
	deadline := time.Now().Add(window)
	turns := 0
	for time.Now().Before(deadline) {
		scans.WaitOrTimeout(t)
		turns++
		st := statuses(t, db)
		reset := 0
		for _, id := range []int64{1, 2, 3, 4, 5} {
			if st[id] != "inprog" {
				reset++
			}
		}
		require.Zero(t, reset, "rows of the live worker reset %v after the pressure began (heartbeat evicted after %v)",
			time.Since(start).Round(time.Millisecond), evictedSeen.Round(time.Millisecond))
	}
	// About one turn a recovery interval, the fleet's timing (12 in the
	// window); half of them leaves room for a loaded machine.
	require.GreaterOrEqual(t, turns, int(window/live.opts.recoveryInterval)/2, "rec's recovery loop turned throughout the pressure")
	stopPressure()
	written := <-pressed
	t.Logf("pressure: %d keys written, %d evicted; live heartbeat first evicted after %v; %d recovery turns of rec checked", written, testutil.InfoField(t, rdb, "stats", "evicted_keys"), evictedSeen, turns)
	assert.Positive(t, logs.Count("the Redis server evicted keys less than a heartbeat TTL ago"), "the hold was taken and logged")
	assert.Equal(t, 1, logs.Count("the Redis server evicted keys less than a heartbeat TTL ago"), "once per episode")

	// The other application deletes its data: evictions stop. The dead
	// worker's rows come back within the hold (a TTL from the last look
	// that saw evictions) and a scan.
	testutil.DropPressure(t, rdb, "otherapp")
	stopped := time.Now()
	// The first look after the evictions (it may still see the count
	// moved), the hold from it, and a scan; the slack is 3 s, not 1 s: a
	// make test run under -race, with four tests in parallel, once took
	// more than the 8.3 s a 1 s slack gave (5.1-5.6 s alone).
	bound := live.opts.heartbeatTTL + 3*live.opts.recoveryInterval*11/10 + 3*time.Second
	require.Eventually(t, func() bool {
		st := statuses(t, db)
		return st[11] == "queued" && st[15] == "queued"
	}, bound, 20*time.Millisecond, "the dead worker's rows are recovered once evictions stop")
	t.Logf("dead worker's rows recovered %v after the pressure stopped", time.Since(stopped).Round(time.Millisecond))
	for _, id := range []int64{1, 2, 3, 4, 5} {
		assert.Equal(t, "inprog", statuses(t, db)[id], "row %d of the live worker", id)
	}
}

// Start's recovery of a predecessor under its instance ID is a death
// verdict too: on a server that evicts, the absent heartbeat may be a live
// twin's, evicted. Start waits out the hold, then finds the twin.
func TestStartDoesNotRecoverATwinWhoseHeartbeatWasEvicted(t *testing.T) {
	t.Parallel()
	srv := managedRedis(t, "16mb", "volatile-lru")
	rdb := srv.Client(t)
	ctx := context.Background()
	testutil.Ballast(t, rdb, "otherapp", 1<<20)
	pctx, stop := context.WithCancel(ctx)
	go testutil.Pressure(pctx, srv.Client(t), "otherapp")
	require.Eventually(t, func() bool { return testutil.InfoField(t, rdb, "stats", "evicted_keys") > 0 }, 10*time.Second, 10*time.Millisecond)
	stop()
	testutil.DropPressure(t, rdb, "otherapp")
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	r := fencedResetter(t, db)
	timing := []Option{WithEvictionAccepted(), WithTimings(Timings{
		HeartbeatTTL:      4 * time.Second,
		HeartbeatInterval: 3 * time.Second,
		OperationTimeout:  200 * time.Millisecond,
		RowsTTL:           8 * time.Second,
	})}
	twin, _ := startWorker(t, rdb, r, "pod-0", timing...)
	take(t, db, "pod-0", 1, 2)
	require.NoError(t, twin.Track(ctx, 1, 2))
	// Evicted, as far as a process starting now can tell: the twin writes
	// it again within its interval (3 s).
	require.NoError(t, rdb.Del(ctx, keysOf("pod-0").Heartbeat).Err())

	second, logs := newWorker(t, rdb, r, "pod-0", timing...)
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := second.Start(sctx)

	assert.ErrorIs(t, err, ErrInstanceIDInUse)
	for _, id := range []int64{1, 2} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "row %d of the live twin", id)
		if assert.NotNil(t, o, "row %d's owner", id) {
			assert.Equal(t, "pod-0", *o)
		}
	}
	assert.Equal(t, 1, logs.Count("the Redis server evicted keys less than a heartbeat TTL ago"))
}

// With evictions accepted, a server whose evicted_keys cannot be read at a
// verdict may be evicting: no verdict. Without, the peer is judged as
// before (the restart check skipped, said once).
func TestAcceptedEvictionsHoldVerdictsWhileINFOCannotBeRead(t *testing.T) {
	_, rdb := newMini(t) // miniredis has no INFO server section: NodeInfo fails
	plantDeadPeer(t, rdb, defaultKeyPrefix, "gone", 1, 2)
	ctx := context.Background()

	r := &fakeResetter{}
	w, logs := newWorker(t, rdb, r, "rec", WithEvictionAccepted())
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Recovered)
	assert.Empty(t, r.resetOf("gone"))
	assert.Equal(t, 1, logs.Count("evicted_keys cannot be read"))

	other, _ := newWorker(t, rdb, r, "rec2")
	rep, err = other.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Len(t, r.resetOf("gone"), 2)
}

// On Cluster every master is checked: one evicting master is enough for
// the heartbeats whose slots it serves to be evicted.
func TestStartChecksEveryClusterMaster(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	ctx := context.Background()
	odd := cluster.Addrs[2]
	node := redis.NewClient(&redis.Options{Addr: odd})
	t.Cleanup(func() { node.Close() })
	require.NoError(t, node.ConfigSet(ctx, "maxmemory", "64mb").Err())
	require.NoError(t, node.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err())
	w, _ := newWorker(t, cluster.Client(t), &fakeResetter{}, "w1")

	err := w.Start(ctx)

	require.ErrorIs(t, err, ErrEvictionPolicy)
	assert.Contains(t, err.Error(), "redis node "+odd+" has maxmemory-policy allkeys-lfu")
}

// The hold's arithmetic: a TTL from the look that saw evicted_keys move,
// for EXISTS sent before its end; a first look at a node that has evicted
// counts as a move; a look without a move ends the episode once the TTL
// is over, and the next move is a new episode, logged again.
func TestEvictionHoldLastsATTLFromTheLookThatSawTheCountMove(t *testing.T) {
	const ttl = 10 * time.Second
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	facts := func(evicted int64) nodeFacts {
		return nodeFacts{runID: "r1", replID: "x1", master: true, uptime: time.Hour, evicted: evicted}
	}
	var a nodeAges
	look := func(evicted int64, recv time.Time) {
		a.observe("", facts(evicted), recv, ttl, false)
	}

	look(0, at(0)) // never evicted: nothing held
	until, _ := a.evictionHold("", at(0), at(0), ttl, false, false)
	assert.True(t, until.IsZero())

	look(5, at(3*time.Second)) // moved
	until, first := a.evictionHold("", at(2*time.Second), at(3*time.Second), ttl, false, false)
	assert.Equal(t, at(13*time.Second), until, "a TTL from the look that saw the move")
	assert.True(t, first)
	look(5, at(8*time.Second)) // no move since, but within the TTL
	until, first = a.evictionHold("", at(8*time.Second), at(8*time.Second), ttl, false, false)
	assert.Equal(t, at(13*time.Second), until)
	assert.False(t, first, "logged once per episode")
	look(5, at(13*time.Second))
	until, _ = a.evictionHold("", at(13*time.Second), at(13*time.Second), ttl, false, false)
	assert.True(t, until.IsZero(), "an EXISTS sent a TTL after the move counts")

	look(6, at(20*time.Second)) // a new episode
	until, first = a.evictionHold("", at(20*time.Second), at(20*time.Second), ttl, false, false)
	assert.Equal(t, at(30*time.Second), until)
	assert.True(t, first, "a new episode is logged again")

	var b nodeAges
	b.observe("", facts(1000), at(0), ttl, false) // first look at a node that evicted once
	until, _ = b.evictionHold("", at(0), at(0), ttl, false, false)
	assert.Equal(t, at(ttl), until, "when it moved is unknown: as if just now")

	var c nodeAges
	c.observe("", facts(-1), at(0), ttl, false) // evicted_keys not reported
	until, _ = c.evictionHold("", at(0), at(0), ttl, true, false)
	assert.True(t, until.IsZero(), "not accepted: judged as before")
	until, _ = c.evictionHold("", at(0), at(0), ttl, true, true)
	assert.Equal(t, at(ttl), until, "accepted: the node may be evicting")
}

// Behind Sentinel the master the client follows is checked.
func TestStartChecksTheSentinelMaster(t *testing.T) {
	s := testutil.StartSentinel(t, 0, 1, 5*time.Second)
	ctx := context.Background()
	master := s.Data[0].Client(t)
	require.NoError(t, master.ConfigSet(ctx, "maxmemory", "64mb").Err())
	require.NoError(t, master.ConfigSet(ctx, "maxmemory-policy", "volatile-random").Err())
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs})
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")

	err := w.Start(ctx)

	require.ErrorIs(t, err, ErrEvictionPolicy)
	assert.Contains(t, err.Error(), "maxmemory-policy volatile-random")
}
