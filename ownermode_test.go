package recovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Owner mode (owner.go), against real Redis and PostgreSQL.

func TestOwnerModeIsWhatAResetterThatFencesByOwnerGets(t *testing.T) {
	_, rdb := newMini(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)

	w, _ := newWorker(t, rdb, fencedResetter(t, db), "w")
	assert.True(t, w.Stats().OwnerMode, "pgxreset.New(pool, postgres.WithOwnerColumn(...)) is all it takes")
	assert.NotNil(t, w.sweeper, "the owners in PostgreSQL are always looked at")

	plain, err := pgxreset.New(db)
	require.NoError(t, err)
	w, _ = newWorker(t, rdb, plain, "w2")
	assert.False(t, w.Stats().OwnerMode, "without an owner column: rows sets")

	w, _ = newWorker(t, rdb, fencedResetter(t, db), "w3", WithRowsSets())
	assert.False(t, w.Stats().OwnerMode, "WithRowsSets keeps the rows-set mode")
	assert.Nil(t, w.sweeper)

	w, _ = newWorker(t, rdb, &fakeResetter{fenced: true}, "w4")
	assert.False(t, w.Stats().OwnerMode, "fencing alone is not enough: the resetter must reset by owner")
}

func TestOwnerModeTrackUntrackAndReleaseSendNothingToRedis(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix := testutil.Name("O")
	counter := &commandCounter{}
	rdb.AddHook(counter)
	// The witness's own loop looks at its turns every grace, whatever the
	// host does (BenchmarkWitnessIdleFleetCost measures that processing
	// adds nothing to it): off here, so the window holds the host's calls.
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix), WithLivenessWitness(false),
		WithTimings(Timings{
			HeartbeatInterval: time.Hour / 2,
			HeartbeatTTL:      time.Hour,
			RowsTTL:           4 * time.Hour,
			RecoveryInterval:  time.Hour,
		})) // after their first turns, no loop sends anything for an hour
	require.True(t, w.Stats().OwnerMode)
	ctx := context.Background()
	// The first scan and sweep run at Start: wait for them to end.
	signals(w).scan.WaitOrTimeout(t)
	signals(w).sweep.WaitOrTimeout(t)
	counter.reset()

	take(t, db, "w", 1, 2, 3, 4, 5)
	require.NoError(t, w.Track(ctx, 1, 2, 3, 4, 5))
	require.NoError(t, w.Untrack(1, 2))
	assert.Equal(t, 3, w.Stats().TrackedRows, "the worker's own view is kept")
	require.NoError(t, w.Release(ctx, 3))
	require.NoError(t, w.CheckLease())

	trips, cmds := counter.snapshot()
	assert.Zero(t, trips, "no Redis command for Track, Untrack or Release: %v", cmds)
	s, o := rowState(t, db, 3)
	assert.Equal(t, "queued", s, "Release resets through the resetter")
	assert.Nil(t, o)
	assert.Equal(t, 2, w.Stats().TrackedRows)
	n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "w").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no rows set")

	// A heartbeat writes no row either.
	require.NoError(t, w.heart.runOnce(ctx))
	n, err = rdb.Exists(ctx, store.InstanceKeys(prefix, "w").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestOwnerModeRecoversADeadPeerByOwner(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 6)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db, postgres.WithRecoveryCountColumn("recoveries"))
	ctx := context.Background()

	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix))
	take(t, db, "A", 1, 2, 3, 4)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4))
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'done', owner = NULL WHERE rowid = 4`)
	require.NoError(t, err) // finished; A died before its Untrack
	a.crash()
	take(t, db, "C", 5) // another worker's row is never touched

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix))
	waitHeartbeatGone(t, rdb, prefix, "A") // its TTL, 2s
	rep, err := b.recoverNow(ctx)

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(3), rep.Recovered[0].RowsReset)
	assertRequeued(t, db, 1, 2, 3)
	s, _ := rowState(t, db, 4)
	assert.Equal(t, "done", s, "a finished row stays finished")
	s, o := rowState(t, db, 5)
	assert.Equal(t, "inprog", s)
	assert.Equal(t, "C", *o)
	var count int
	require.NoError(t, db.QueryRow(ctx, `SELECT recoveries FROM batchrows WHERE rowid = 1`).Scan(&count))
	assert.Equal(t, 1, count, "recovery counted, as in rows-set mode")
	assert.False(t, registered(t, rdb, prefix, "A"))

	// Idempotent: a second recovery finds nothing A owns.
	pr, err := b.recoverDeadForTest(ctx, "A")
	require.NoError(t, err)
	assert.Zero(t, pr.RowsReset)
}

// recoverDeadForTest runs the dead-peer path on peer as the scan would.
func (w *Worker) recoverDeadForTest(ctx context.Context, peer string) (report.PeerRecovery, error) {
	pr, _, err := w.peers.recoverDead(ctx, peer, foundByScan, time.Now())
	return pr, err
}

func TestOwnerModeRecoversRowsWhenRedisForgotEverything(t *testing.T) {
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db)
	ctx := context.Background()
	opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      500 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  200 * time.Millisecond,
	})}

	a, _ := startWorker(t, rdb, r, "A", opts...)
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	a.crash()
	require.NoError(t, rdb.FlushAll(ctx).Err(), "Redis forgets the registry and every key")

	start := time.Now()
	b, _ := startWorker(t, rdb, r, "B", opts...)
	require.Eventually(t, func() bool {
		s1, _ := rowState(t, db, 1)
		s2, _ := rowState(t, db, 2)
		return s1 == "queued" && s2 == "queued"
	}, 10*time.Second, 20*time.Millisecond, "the owners in PostgreSQL are part of what recovery looks at")
	took := time.Since(start)
	// Two sightings a heartbeat TTL apart, each at most an interval (+10%)
	// after the last: TTL + 2.2 intervals; and the sweep judges nothing
	// from a server up for less than a TTL (this one started with the
	// test: up to a TTL + 1s of uptime rounding), with scheduling to spare.
	assert.Less(t, took, 500*time.Millisecond+3*220*time.Millisecond+1500*time.Millisecond+time.Second)
	// Counted after the finish, which follows the reset's commit.
	// Redis lists no peer, so B's sweep is what finds A.
	waitTurns(t, &signals(b).sweep, 5*time.Second, func() bool { return b.Stats().PeersRecovered == 1 })
}

func TestOwnerModeStartResetsRowsAPredecessorLeftUnderItsID(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	prefix := testutil.Name("O")
	// A process that ran as "pod-0" crashed long ago: Redis has nothing of
	// it any more, PostgreSQL still names it the owner of rows 1 and 2.
	take(t, db, "pod-0", 1, 2)

	w, logs := startWorker(t, rdb, fencedResetter(t, db), "pod-0", WithKeyPrefix(prefix))

	assertRequeued(t, db, 1, 2) // nobody else would ever recover them while pod-0 heartbeats
	assert.Equal(t, 1, logs.Count(`recovered rows a previous process left under this instance ID`))
	assert.Equal(t, uint64(2), w.Stats().RowsRecovered)
}

func TestOwnerModeAndRowsSetWorkersRecoverEachOther(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 8)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db)
	ctx := context.Background()
	// An old-style worker (rows set + owner fencing) dies; an owner-mode
	// worker recovers it by owner and deletes its set.
	old, _ := startWorker(t, rdb, r, "old", WithKeyPrefix(prefix), WithRowsSets())
	take(t, db, "old", 1, 2)
	require.NoError(t, old.Track(ctx, 1, 2))
	old.crash()
	owner, _ := newWorker(t, rdb, r, "new", WithKeyPrefix(prefix))
	waitHeartbeatGone(t, rdb, prefix, "old")
	rep, err := owner.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(2), rep.Recovered[0].RowsReset)
	n, _ := rdb.Exists(ctx, store.InstanceKeys(prefix, "old").Rows).Result()
	assert.Zero(t, n, "its rows set is gone")

	// An owner-mode worker dies; an old-style worker finds no rows set and
	// deregisters it; the owners in PostgreSQL bring its rows back all the
	// same, through the next owner-mode worker's sweep.
	gone, _ := startWorker(t, rdb, r, "gone", WithKeyPrefix(prefix))
	take(t, db, "gone", 3, 4)
	require.NoError(t, gone.Track(ctx, 3, 4))
	gone.crash()
	oldRec, _ := newWorker(t, rdb, r, "old2", WithKeyPrefix(prefix), WithRowsSets())
	waitHeartbeatGone(t, rdb, prefix, "gone")
	_, err = oldRec.recoverNow(ctx)
	require.NoError(t, err)
	s, _ := rowState(t, db, 3)
	assert.Equal(t, "inprog", s, "the rows-set worker cannot see them")
	assert.False(t, registered(t, rdb, prefix, "gone"))

	// The sweep turn may still be the dead worker's (it swept at Start):
	// sweep as the loop would, every interval, until the turn is ours and
	// "gone" was seen absent twice a heartbeat TTL (2s) apart.
	sweeper, _ := newWorker(t, rdb, r, "new2", WithKeyPrefix(prefix))
	var recovered []report.PeerRecovery
	require.Eventually(t, func() bool {
		srep, err := sweeper.sweeper.runOnce(ctx)
		require.NoError(t, err)
		recovered = append(recovered, srep.recovered...)
		return len(recovered) > 0
	}, 10*time.Second, 200*time.Millisecond)
	require.Len(t, recovered, 1)
	assert.Equal(t, "gone", recovered[0].InstanceID)
	assertRequeued(t, db, 3, 4)
}

func TestOwnerModeShutdownWithRowsStillHeldStaysRegisteredWithoutARowsSet(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("O")
	ctx := context.Background()
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix))
	take(t, db, "w", 1)
	require.NoError(t, w.Track(ctx, 1))

	require.NoError(t, w.Shutdown(ctx))

	assert.True(t, registered(t, rdb, prefix, "w"), "peers must find it dead and reset row 1")
	n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "w").Heartbeat, store.InstanceKeys(prefix, "w").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "heartbeat deleted, no rows set written")

	// Start's own recovery of a predecessor left a finish tombstone on w's
	// claim (2 × the operation timeout): a scan right after it skips w, the
	// next one recovers it.
	peer, _ := newWorker(t, rdb, fencedResetter(t, db), "peer", WithKeyPrefix(prefix))
	require.Eventually(t, func() bool {
		rep, err := peer.recoverNow(ctx)
		require.NoError(t, err)
		return len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "queued", s)
}

func TestOwnerModeConcurrentRecoverersResetEachRowOnce(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 300)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db, postgres.WithRecoveryCountColumn("recoveries"), postgres.WithChunkSize(7))
	ctx := context.Background()
	ids := make([]int64, 300)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	take(t, db, "dead", ids...)
	// A registered peer without a heartbeat: dead.
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "dead").Err())

	var wg sync.WaitGroup
	for i := range 8 {
		w, _ := newWorker(t, rdb, r, testutil.Name("rec"), WithKeyPrefix(prefix))
		wg.Go(func() {
			if _, err := w.recoverNow(ctx); err != nil {
				t.Errorf("recoverer %d: %v", i, err)
			}
		})
	}
	wg.Wait()

	var once, queued int
	require.NoError(t, db.QueryRow(ctx,
		`SELECT count(*) FILTER (WHERE recoveries = 1), count(*) FILTER (WHERE status = 'queued') FROM batchrows`).Scan(&once, &queued))
	assert.Equal(t, 300, once, "every row reset exactly once, in chunks of 7")
	assert.Equal(t, 300, queued)
}

var _ redis.Hook = (*commandCounter)(nil)

func TestOwnerModePlanRecoveryShowsTheRowsADeadPeerOwns(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 4)
	prefix := testutil.Name("O")
	ctx := context.Background()
	r := fencedResetter(t, db, postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(2, "failed"))
	_, err := db.Exec(ctx, `UPDATE batchrows SET recoveries = 1 WHERE rowid = 2`)
	require.NoError(t, err)
	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix))
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	life, err := rdb.Get(ctx, store.InstanceKeys(prefix, "A").Incarnation).Result()
	require.NoError(t, err)
	take(t, db, lifeOwner("A", life), 4) // a row of its life (owner.go)
	a.crash()
	take(t, db, "C", 3)

	planner, _ := newWorker(t, rdb, r, "planner", WithKeyPrefix(prefix))
	waitHeartbeatGone(t, rdb, prefix, "A") // its TTL, 2s
	plan, err := planner.planRecovery(ctx)

	require.NoError(t, err)
	require.Len(t, plan.Peers, 1)
	p := plan.Peers[0]
	assert.Equal(t, report.PlanReset, p.Action, "no rows set, but rows owned in progress")
	assert.Equal(t, []int64{1, 2, 4}, p.WouldReset)
	assert.Equal(t, []int64{2}, p.Quarantined, "its second recovery reaches the limit")
	assert.Equal(t, 3, plan.RowsToReset)
	for _, id := range []int64{1, 2} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "a plan changes nothing")
		assert.Equal(t, "A", *o)
	}

	rep, err := planner.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(3), rep.Recovered[0].RowsReset, "the plan said what the recovery did")
	assert.Equal(t, []int64{2}, rep.Recovered[0].Quarantined)
}

// waitHeartbeatGone waits until the heartbeat of id under prefix has
// expired (the fast timings' 2s TTL).
func waitHeartbeatGone(t *testing.T, rdb redis.UniversalClient, prefix, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(context.Background(), store.InstanceKeys(prefix, id).Heartbeat).Result()
		return err == nil && n == 0
	}, 5*time.Second, 20*time.Millisecond, "heartbeat of %s expired", id)
}
