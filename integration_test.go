package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// These tests run against a real redis-server (standalone and Cluster) and
// a real PostgreSQL; see internal/testutil for how they are found or started.

func TestIntegrationKilledWorkerRowsAreQueuedAgainStandalone(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	testKilledWorkerRowsAreQueuedAgain(t, rdb)
}

func TestIntegrationKilledWorkerRowsAreQueuedAgainCluster(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	testKilledWorkerRowsAreQueuedAgain(t, rdb)
}

// testKilledWorkerRowsAreQueuedAgain is the design's recovery sequence: A
// takes rows 1-10, finishes 1-5 (row 5 without reaching Untrack), dies; row 6
// is committed done after the crash; B must queue rows 7-10 again, and
// nothing else, within heartbeat TTL + recovery interval.
func testKilledWorkerRowsAreQueuedAgain(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 20)
	resetter, err := pgxreset.New(db)
	require.NoError(t, err)
	prefix := testutil.Name("IT")

	a, _ := startWorker(t, rdb, resetter, "workerA", WithKeyPrefix(prefix))
	setStatus(t, db, "inprog", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
	for _, id := range []int64{1, 2, 3, 4} {
		setStatus(t, db, "done", id)
		require.NoError(t, a.Untrack(id))
	}
	setStatus(t, db, "done", 5) // committed; the process died before Untrack
	a.crash()
	killedAt := time.Now()
	setStatus(t, db, "done", 6) // a commit that lands after the crash

	b, logs := startWorker(t, rdb, resetter, "workerB", WithKeyPrefix(prefix))
	bound := b.opts.heartbeatTTL + b.opts.recoveryInterval + 2*time.Second
	require.Eventually(t, func() bool { return statuses(t, db)[10] == "queued" }, bound, 20*time.Millisecond,
		"rows queued again within heartbeat TTL + recovery interval (+2s slack)")
	t.Logf("kill to reset: %v (bound %v)", time.Since(killedAt).Round(time.Millisecond), bound)

	got := statuses(t, db)
	for id := int64(1); id <= 6; id++ {
		assert.Equal(t, "done", got[id], "finished row %d is not reset", id)
	}
	for id := int64(7); id <= 10; id++ {
		assert.Equal(t, "queued", got[id], "row %d", id)
	}
	for id := int64(11); id <= 20; id++ {
		assert.Equal(t, "queued", got[id], "untouched row %d", id)
	}
	var batch string
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM batches WHERE batchid = 1`).Scan(&batch))
	assert.Equal(t, "inprog", batch, "the batch is not reset")

	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "workerA").Rows, store.InstanceKeys(prefix, "workerA").Heartbeat, store.InstanceKeys(prefix, "workerA").Claim).Result()
		return err == nil && n == 0
	}, 2*time.Second, 10*time.Millisecond, "A's keys are gone")
	isMember, err := rdb.SIsMember(ctx, store.RegistryKey(prefix), "workerA").Result()
	require.NoError(t, err)
	assert.False(t, isMember, "A deregistered")
	isMember, err = rdb.SIsMember(ctx, store.RegistryKey(prefix), "workerB").Result()
	require.NoError(t, err)
	assert.True(t, isMember)
	assert.Equal(t, 1, logs.Count("recovered rows of dead peer"))
	assert.Contains(t, logs.String(), `"rows_reset":4`)
}

func TestIntegrationClusterKeysOfOneWorkerShareASlot(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	ctx := context.Background()
	w, _ := startWorker(t, rdb, &fakeResetter{}, "host-1234-1234567890")
	require.NoError(t, w.Track(ctx, 1))
	slot := func(k string) int64 {
		s, err := rdb.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		return s
	}
	k := keysOf("host-1234-1234567890")
	hb := slot(k.Heartbeat)
	assert.Equal(t, hb, slot(k.Rows))
	assert.Equal(t, hb, slot(k.Claim))
	assert.Equal(t, hb, slot(k.Incarnation))
	assert.Equal(t, hb, slot("host-1234-1234567890"), "the hash tag decides the slot")
	n, err := rdb.Exists(ctx, k.Heartbeat, k.Rows).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
}

func TestIntegrationCancellingProcessingContextDoesNotStopHeartbeat(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("IT")
	ctx, cancel := context.WithCancel(context.Background())
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      400 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
		}))
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Track(ctx, 1))
	cancel() // SIGTERM: processing context cancelled, the block goes on

	beats := w.Stats().Heartbeats
	waitTurns(t, &signals(w).beat, 10*time.Second, func() bool { return w.Stats().Heartbeats >= beats+12 },
		"heartbeats go on for three heartbeat TTLs")
	ttl, err := rdb.PTTL(context.Background(), store.InstanceKeys(prefix, "w1").Heartbeat).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "heartbeat still refreshed")
	assert.NoError(t, w.CheckLease())
	require.NoError(t, w.Untrack(1))
	require.NoError(t, w.Shutdown(context.Background()))
	n, err := rdb.Exists(context.Background(), store.InstanceKeys(prefix, "w1").Heartbeat).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "gone at once on Shutdown")
}

func TestIntegrationNoScanOrKeysCommandIsEverSent(t *testing.T) {
	rdb := testutil.Redis(t)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	prefix := testutil.Name("IT")
	plantDeadPeer(t, rdb, prefix, "dead", "1", "2")
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithKeyPrefix(prefix))
	require.NoError(t, w.Track(context.Background(), 5))
	_, err := w.recoverNow(context.Background())
	require.NoError(t, err)
	require.NoError(t, w.Untrack(5))
	require.NoError(t, w.Shutdown(context.Background()))
	_, cmds := counter.snapshot()
	assert.NotEmpty(t, cmds)
	for _, c := range cmds {
		assert.NotContains(t, []string{"scan", "keys"}, c, "keyspace scans do not work across Cluster nodes")
	}
}
