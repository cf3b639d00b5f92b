package recovery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// F7: Redis restarts from a snapshot taken more than a heartbeat TTL ago.
// The registry and rows sets come back, the heartbeats in the file have
// expired: until each live worker's next heartbeat the server reports it
// dead. No verdict may come from a server up for less than a TTL; a worker
// that really died before the snapshot is still recovered after that.
func TestSafetyRedisRestartedFromAnOldSnapshotResetsNoLiveWorkersRows(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 30)
	ctx := context.Background()
	const ttl = time.Second
	opts := []Option{WithKeyPrefix(testutil.Name("R")), WithTimings(Timings{
		HeartbeatTTL:      ttl,
		HeartbeatInterval: 300 * time.Millisecond,
		RecoveryInterval:  300 * time.Millisecond,
		RowsTTL:           10 * time.Second,
	})}
	r := &fakeResetter{inner: fencedResetter(t, db)}
	r.setFail("D", context.DeadlineExceeded) // as PostgreSQL out of reach would: D is still to recover at the restart

	live := map[string][]int64{"A": {1, 2, 3, 4, 5}, "B": {11, 12, 13, 14, 15}}
	frozen := map[string]*freezer{}
	var fleet []*Worker
	for id, rows := range live {
		c := srv.Client(t)
		frozen[id] = &freezer{}
		c.AddHook(frozen[id])
		w, _ := startWorker(t, c, r, id, opts...)
		fleet = append(fleet, w)
		take(t, db, id, rows...)
		require.NoError(t, w.Track(ctx, rows...))
	}
	d, _ := startWorker(t, srv.Client(t), r, "D", opts...)
	dRows := []int64{21, 22, 23, 24, 25}
	take(t, db, "D", dRows...)
	require.NoError(t, d.Track(ctx, dRows...))
	d.crash() // SIGKILL: D's heartbeat, registry entry and rows set stay

	admin := srv.Client(t)
	require.NoError(t, admin.Save(ctx).Err())
	// The file keeps each heartbeat's absolute expiry time, at most a TTL
	// after the SAVE. Two TTLs leave a whole TTL of margin.
	time.Sleep(2 * ttl) // real time: nothing marks the file's expiry times passing (the running server's copies are renewed)

	// Restart from the snapshot while A and B are between heartbeats, and
	// let a worker that was not running look at once.
	for _, f := range frozen {
		f.freeze()
	}
	restarted := time.Now()
	srv.RestartKeepingData()
	observer, logs := newWorker(t, srv.Client(t), r, "observer", opts...)
	rep, err := observer.recoverNow(ctx)
	for _, f := range frozen {
		f.thaw()
	}
	// D's resets fail until A and B have each finished a scan begun after
	// the thaw: a recovery of D they judged on the server before the
	// restart (D was dead then: a sound verdict) may reach its reset after
	// it on a loaded machine. What must not happen is a verdict from the
	// restarted server within its first TTL.
	for _, w := range fleet {
		signals(w).scan.WaitTurn(t)
	}
	r.setFail("D", nil)
	require.NoError(t, err)
	assert.Empty(t, rep.Dead, "no verdict from a server up for less than a heartbeat TTL")
	assert.Equal(t, 1, logs.Count("the Redis server restarted or was promoted less than a heartbeat TTL ago"))

	require.Eventually(t, func() bool {
		for _, id := range dRows {
			if s, _ := rowState(t, db, id); s != "queued" {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "D died before the snapshot: its rows come back after the grace")
	for _, c := range r.of("D") {
		if c.ok {
			assert.False(t, c.at.Before(restarted.Add(ttl)),
				"D reset %v after the restart, before a heartbeat TTL had passed", c.at.Sub(restarted))
		}
	}
	fleet = append(fleet, observer)
	scans := func() (n uint64) {
		for _, w := range fleet {
			n += w.Stats().Scans
		}
		return n
	}
	before := scans()
	// Whoever holds the scan turn scans (the observer was never started);
	// the live workers' recovery loops turn at the same interval, so the
	// count is checked at each turn of the first one's.
	waitTurns(t, &signals(fleet[0]).scan, 10*time.Second, func() bool { return scans() >= before+3 },
		"three more scans of the fleet, A's and B's heartbeats back")

	for id, rows := range live {
		assert.Empty(t, r.of(id), "rows of live worker %s passed to ResetRows", id)
		tag, err := db.Exec(ctx, `UPDATE batchrows SET status = 'done' WHERE rowid = ANY($1) AND owner = $2 AND status = 'inprog'`, rows, id)
		require.NoError(t, err)
		assert.Equal(t, int64(len(rows)), tag.RowsAffected(), "live worker %s completes every row it holds", id)
	}
}

// An expiry event from a server that has just restarted from a snapshot is
// no verdict either: the heartbeat that expired may be a live worker's
// stale copy from the file.
func TestExpiryEventRightAfterARestartFromASnapshotResetsNothing(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t, "--notify-keyspace-events", "Ex")
	rdb := srv.Client(t)
	ctx := context.Background()
	prefix := testutil.Name("R")
	r := &fakeResetter{}
	// A long recovery interval: only the expiry event could act soon.
	listener, logs := startWorker(t, srv.Client(t), r, "listener", WithKeyPrefix(prefix), WithTimings(Timings{RecoveryInterval: 10 * time.Second, RowsTTL: time.Minute}), WithExpiryNotifications())

	plantDeadPeer(t, rdb, prefix, "peer", "7")
	require.NoError(t, rdb.Set(ctx, store.InstanceKeys(prefix, "peer").Heartbeat, "alive", 1200*time.Millisecond).Err())
	require.NoError(t, rdb.Save(ctx).Err())
	restarted := time.Now()
	srv.RestartKeepingData() // the heartbeat comes back and expires about a second later

	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "peer").Heartbeat).Result()
		return err == nil && n == 0
	}, 3*time.Second, 10*time.Millisecond)
	// The event is heard and judged: the peer is held, not handed on
	// (the warning is logged once the hold is decided, before the event's
	// judgement signals).
	waitTurns(t, &signals(listener).heard, 5*time.Second, func() bool {
		return logs.Count("the Redis server restarted or was promoted less than a heartbeat TTL ago") == 1
	})
	for _, c := range r.of("peer") {
		assert.False(t, c.at.Before(restarted.Add(2*time.Second)),
			"reset %v after the restart, before a heartbeat TTL (2s) had passed", c.at.Sub(restarted))
	}
}

func TestParseNodeFactsReadsAgeAndOrigin(t *testing.T) {
	info := "# Server\r\nrun_id:abc\r\nuptime_in_seconds:3\r\n# Replication\r\nrole:master\r\nmaster_replid:r1\r\nsecond_repl_offset:-1\r\n" +
		"# Persistence\r\nrdb_last_load_keys_loaded:0\r\naof_enabled:0\r\n"
	f, err := parseNodeFacts(info)
	require.NoError(t, err)
	assert.Equal(t, nodeFacts{runID: "abc", replID: "r1", master: true, uptime: 3 * time.Second, evicted: -1}, f,
		"started empty; evicted_keys not reported")
	f, err = parseNodeFacts(info + "# Stats\r\nevicted_keys:7\r\n")
	require.NoError(t, err)
	assert.EqualValues(t, 7, f.evicted)

	f, err = parseNodeFacts(strings.Replace(info, "keys_loaded:0", "keys_loaded:12", 1))
	require.NoError(t, err)
	assert.True(t, f.withData, "keys loaded from a file")
	f, err = parseNodeFacts(strings.Replace(info, "aof_enabled:0", "aof_enabled:1", 1))
	require.NoError(t, err)
	assert.True(t, f.withData, "AOF")
	f, err = parseNodeFacts(strings.Replace(info, "rdb_last_load_keys_loaded:0\r\n", "", 1))
	require.NoError(t, err)
	assert.True(t, f.withData, "Redis < 7 does not say: assume data")
	f, err = parseNodeFacts(strings.Replace(info, "second_repl_offset:-1", "second_repl_offset:51", 1))
	require.NoError(t, err)
	assert.True(t, f.shifted && f.withData, "promoted, or restarted from a file")
	f, err = parseNodeFacts(strings.Replace(info, "role:master", "role:slave", 1))
	require.NoError(t, err)
	assert.False(t, f.master)

	for _, bad := range []string{"", "run_id:abc\nrole:master\n", "run_id:abc\nuptime_in_seconds:-1\nrole:master\n"} {
		_, err := parseNodeFacts(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestNodeAgesHoldVerdictsForATTLAfterARestartWithDataOrAPromotion(t *testing.T) {
	const ttl = 10 * time.Second
	t0 := time.Now()
	empty := nodeFacts{runID: "r1", replID: "x1", master: true, uptime: 3 * time.Second}
	loaded := nodeFacts{runID: "r2", replID: "x2", master: true, uptime: 3 * time.Second, withData: true}
	old := nodeFacts{runID: "r1", replID: "x1", master: true, uptime: time.Hour, withData: true}
	promoted := nodeFacts{runID: "r3", replID: "x3", master: true, uptime: time.Hour, withData: true, shifted: true}

	var a nodeAges
	until, _ := a.observe("", empty, t0, ttl, false)
	assert.True(t, until.IsZero(), "a server that started empty holds no stale registry")

	a = nodeAges{}
	a.observe("", old, t0, ttl, false)
	until, _ = a.observe("", nodeFacts{runID: "r9", replID: "x9", master: true, uptime: 3 * time.Second}, t0.Add(time.Minute), ttl, false)
	assert.Equal(t, t0.Add(time.Minute).Add(-2*time.Second).Add(ttl), until,
		"a restart the worker saw, even empty: held a TTL from the start (a scan may have read the registry before it)")

	a = nodeAges{}
	until, first := a.observe("", loaded, t0, ttl, false)
	assert.Equal(t, t0.Add(-2*time.Second).Add(ttl), until, "start with data: held a TTL from the start (uptime less its rounding)")
	assert.True(t, first)
	until, first = a.observe("", loaded, t0.Add(time.Second), ttl, false)
	assert.Equal(t, t0.Add(-2*time.Second).Add(ttl), until, "the same start, remembered")
	assert.False(t, first, "logged once")
	until, _ = a.observe("", loaded, t0.Add(ttl), ttl, false)
	assert.True(t, until.IsZero(), "a TTL after the start")

	a = nodeAges{}
	until, _ = a.observe("", old, t0, ttl, false)
	assert.True(t, until.IsZero(), "up for an hour")
	until, _ = a.observe("", promoted, t0.Add(time.Minute), ttl, false)
	assert.Equal(t, t0.Add(time.Minute).Add(ttl), until, "another server, promoted at an unknown time: held a TTL from now")
	until, _ = a.observe("", nodeFacts{runID: "r3", replID: "x4", master: true, uptime: time.Hour, withData: true, shifted: true}, t0.Add(time.Hour), ttl, false)
	assert.Equal(t, t0.Add(time.Hour).Add(ttl), until, "same process, new replication ID: promoted again")

	a = nodeAges{}
	a.observe("n1", old, t0, ttl, true)
	until, _ = a.observe("n2", promoted, t0, ttl, true)
	assert.True(t, until.IsZero(), "the first look at a Cluster goes by uptime only")
	until, _ = a.observe("n3", promoted, t0.Add(time.Minute), ttl, false)
	assert.Equal(t, t0.Add(time.Minute).Add(ttl), until, "a master new to a worker that knew the Cluster: a failover")

	until, _ = a.observe("n1", nodeFacts{runID: "r1", replID: "x1", uptime: time.Hour}, t0.Add(time.Minute), ttl, false)
	assert.Equal(t, t0.Add(time.Minute).Add(ttl), until, "a node that answers as a replica gives no verdict")
}

func TestDeadPeersJudgesAsBeforeWhenTheServerHidesINFO(t *testing.T) {
	_, rdb := newMini(t) // miniredis has no INFO server section, like a server that forbids INFO
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	w, logs := newWorker(t, rdb, &fakeResetter{}, "scanner")
	for range 2 {
		dead, err := w.peers.judge.deadPeers(context.Background(), []string{"dead"})
		require.NoError(t, err)
		assert.Equal(t, []string{"dead"}, dead)
	}
	assert.Equal(t, 1, logs.Count("cannot read the Redis server's uptime"), "logged once")
}

// Simulation seed 1359: while verdicts are held after a restart or a
// failover, the rows set of a peer that died just before goes on counting
// down its TTL. Held long enough (two TTLs and a scan's wait after its
// last heartbeat, against a rows TTL of three TTLs), it expired before
// the first claim and the peer's rows stayed in progress for ever without
// the sweep. A held verdict now renews the set as a claim would.
func TestARowsSetOutlivesTheVerdictHoldAfterARestart(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	prefix := testutil.Name("R")
	const ttl = 2 * time.Second
	k := store.InstanceKeys(prefix, "dead")
	plantDeadPeer(t, rdb, prefix, "dead", "7")
	require.NoError(t, rdb.Set(ctx, k.Incarnation, "inc-1", 0).Err())
	// What the dead peer's last heartbeat left: a set that lives less
	// than the hold the restart below starts.
	require.NoError(t, rdb.PExpire(ctx, k.Rows, 1200*time.Millisecond).Err())
	require.NoError(t, rdb.PExpire(ctx, k.Incarnation, 1200*time.Millisecond).Err())
	require.NoError(t, rdb.Save(ctx).Err())
	restarted := time.Now()
	srv.RestartKeepingData()

	r := &fakeResetter{}
	w, logs := newWorker(t, srv.Client(t), r, "scanner", WithKeyPrefix(prefix), WithTimings(Timings{HeartbeatTTL: ttl, RowsTTL: 20 * time.Second}))
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Dead, "held: the server restarted with data less than a TTL ago")
	require.Equal(t, 1, logs.Count("the Redis server restarted or was promoted less than a heartbeat TTL ago"))
	assert.Greater(t, rdb.PTTL(ctx, k.Rows).Val(), 10*time.Second, "the held peer's set renewed to the rows TTL")
	assert.Greater(t, rdb.PTTL(ctx, k.Incarnation).Val(), 10*time.Second, "and its incarnation")

	// The set's old TTL (from the file) is over, and the scans' bound below
	// counts from a TTL after the restart.
	time.Sleep(time.Until(restarted.Add(ttl + 200*time.Millisecond))) // real time: the old TTL was renewed away, so nothing marks its end
	// The hold ends a TTL after the server's own start, which its restart
	// (loading the snapshot) puts after restarted, and INFO reports in
	// whole seconds: scan until it has ended.
	require.Eventually(t, func() bool {
		rep, err = w.recoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 2*time.Second, 100*time.Millisecond, "the hold ends within a second of a TTL after the restart: %+v, %v", rep, err)
	assert.Equal(t, []int64{7}, r.resetOf("dead"), "the row comes back")
}
