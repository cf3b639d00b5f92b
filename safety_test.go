package recovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// The guarantees of docs/safety.md, each against real Redis and PostgreSQL.

// take marks rows in progress for owner, as FetchBlockOfRows does.
func take(t *testing.T, db *pgxpool.Pool, owner string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		`UPDATE batchrows SET status = 'inprog', owner = $1 WHERE rowid = ANY($2)`, owner, ids)
	require.NoError(t, err)
}

// rowState returns status and owner of one row.
func rowState(t *testing.T, db *pgxpool.Pool, id int64) (status string, owner *string) {
	t.Helper()
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT status, owner FROM batchrows WHERE rowid = $1`, id).Scan(&status, &owner))
	return status, owner
}

func fencedResetter(t *testing.T, db *pgxpool.Pool, opts ...ResetterOption) *PgxResetter {
	t.Helper()
	r, err := NewPgxResetter(db, append([]ResetterOption{WithOwnerColumn("owner")}, opts...)...)
	require.NoError(t, err)
	return r
}

func TestSafetyTenRecoverersResetEachRowOfADeadPeerOnce(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 200)
	prefix := testutil.Name("S")
	ids := make([]any, 200)
	for i := range ids {
		ids[i] = int64(i + 1)
		take(t, db, "dead", int64(i+1))
	}
	plantDeadPeer(t, rdb, prefix, "dead", ids...)
	r := &countingResetter{RowResetter: fencedResetter(t, db)}
	recoverAtOnce(t, 10, func(int) *Worker {
		w, _ := newWorker(t, rdb, r, testutil.Name("rec"), WithKeyPrefix(prefix))
		return w
	})

	per := r.perRow()
	assert.Len(t, per, 200)
	for id, n := range per {
		assert.Equal(t, 1, n, "row %d passed to ResetRows %d times", id, n)
	}
	for id := int64(1); id <= 200; id++ {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s)
	}
}

// blockingResetter lets a test hold a recoverer inside ResetRows.
type blockingResetter struct {
	RowResetter
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingResetter) ResetRows(ctx context.Context, peer string, ids []int64) (int64, error) {
	b.once.Do(func() { close(b.entered); <-b.release })
	return b.RowResetter.ResetRows(ctx, peer, ids)
}

// The design's race: B resets rows 105-109, C fetches them again, and a slow
// D that read the rows set before B's DEL resets them under C. With claims D
// cannot read the set while B works on it, and finds nothing after. This
// holds without owner fencing.
func TestSafetyTheBCDInterleavingCannotHappen(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 110)
	prefix := testutil.Name("S")
	take(t, db, "A", 105, 106, 107, 108, 109)
	plantDeadPeer(t, rdb, prefix, "A", "105", "106", "107", "108", "109")
	plain, err := NewPgxResetter(db) // no owner fencing
	require.NoError(t, err)
	slowB := &blockingResetter{RowResetter: plain, entered: make(chan struct{}), release: make(chan struct{})}
	counted := &countingResetter{RowResetter: plain}
	b, _ := newWorker(t, rdb, slowB, "B", WithKeyPrefix(prefix))
	d, _ := newWorker(t, rdb, counted, "D", WithKeyPrefix(prefix))

	bDone := make(chan error)
	go func() { _, err := b.RecoverNow(context.Background()); bDone <- err }()
	<-slowB.entered // B holds the claim and is about to reset

	rep, err := d.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"A"}, rep.Skipped, "D may not touch A while B recovers it")

	close(slowB.release)
	require.NoError(t, <-bDone)
	take(t, db, "C", 105, 106, 107, 108, 109) // C fetches the recovered rows

	rep, err = d.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Zero(t, len(rep.Dead), "A is gone from the registry")
	assert.Empty(t, counted.perRow(), "D never reset anything")
	for id := int64(105); id <= 109; id++ {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s)
		assert.Equal(t, "C", *o, "row %d still C's", id)
	}
}

func TestSafetyOwnerFencingNeverResetsARowAnotherWorkerTook(t *testing.T) {
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 6)
	take(t, db, "dead", 1, 2, 3)
	take(t, db, "C", 4, 5) // recovered earlier and fetched again by C
	r := fencedResetter(t, db)

	n, err := r.ResetRows(context.Background(), "dead", []int64{1, 2, 3, 4, 5, 6})

	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	for _, id := range []int64{1, 2, 3} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "queued", s)
		assert.Nil(t, o, "owner cleared on reset")
	}
	for _, id := range []int64{4, 5} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s)
		assert.Equal(t, "C", *o)
	}
}

func TestSafetyPausedWorkerLosesItsLeaseBeforeAnyPeerSeesItDead(t *testing.T) {
	srv := testutil.StartRedis(t)
	frozenClient := srv.Client(t)
	fr := &freezer{}
	frozenClient.AddHook(fr)
	observer := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	r := fencedResetter(t, db)
	ctx := context.Background()
	a, logs := startWorker(t, frozenClient, r, "A",
		WithHeartbeatTTL(time.Second), WithHeartbeatInterval(250*time.Millisecond),
		WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	take(t, db, "A", 1, 2, 3)
	require.NoError(t, a.Track(ctx, 1, 2, 3))

	fr.freeze() // A can no longer reach Redis: a GC pause, a partition
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := observer.Exists(ctx, "ALYA_{A}_HEARTBEAT").Result()
		require.NoError(t, err)
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "heartbeat never expired")
		time.Sleep(2 * time.Millisecond)
	}
	// The first moment a peer could find A dead, A already knows.
	assert.ErrorIs(t, a.CheckLease(), ErrLeaseLost)
	assert.ErrorIs(t, a.Track(ctx, 4), ErrLeaseLost)

	// The host abandons its block: the rows go back at once, but a row
	// someone else has taken meanwhile stays theirs.
	take(t, db, "C", 3)
	require.NoError(t, a.Release(ctx, 1, 2, 3))
	for _, id := range []int64{1, 2} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s)
	}
	s, o := rowState(t, db, 3)
	assert.Equal(t, "inprog", s)
	assert.Equal(t, "C", *o)
	assert.Zero(t, a.Stats().TrackedRows)

	fr.thaw()
	require.Eventually(t, func() bool { return a.CheckLease() == nil }, 3*time.Second, 5*time.Millisecond)
	ok, err := observer.SIsMember(ctx, "ALYA_WORKER_REGISTRY", "A").Result()
	require.NoError(t, err)
	assert.True(t, ok, "re-registered with the new lease")
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease regained") == 1 }, time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.Count("heartbeat lease lost"))
	n, err := observer.Exists(ctx, "ALYA_{A}_ROWS").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released rows are untracked")
}

func TestSafetyRowsComeBackAfterRedisRestartedEmptyAndTheWorkerIsKilled(t *testing.T) {
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	r := fencedResetter(t, db)
	ctx := context.Background()
	a, _ := startWorker(t, rdb, r, "A", WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour), WithRowsSets())
	take(t, db, "A", 1, 2, 3, 4)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4))
	require.NoError(t, a.Untrack(1))

	srv.Restart() // no persistence: registry, heartbeat and rows set are gone
	n, err := rdb.Exists(ctx, "ALYA_{A}_ROWS").Result()
	require.NoError(t, err)
	require.Zero(t, n)

	require.Eventually(t, func() bool {
		m, err := rdb.SMembers(ctx, "ALYA_{A}_ROWS").Result()
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

func TestSafetyWarnsOnceWhenRedisMayEvictKeys(t *testing.T) {
	evicting := testutil.StartRedis(t, "--maxmemory-policy", "allkeys-lru")
	_, logs := startWorker(t, evicting.Client(t), &fakeResetter{}, "w1")
	assert.Equal(t, 1, logs.Count("redis may evict keys"))
	assert.Contains(t, logs.String(), `"maxmemory_policy":"allkeys-lru"`)

	safe := testutil.StartRedis(t)
	_, logs = startWorker(t, safe.Client(t), &fakeResetter{}, "w2")
	assert.Zero(t, logs.Count("redis may evict keys"))
}

func TestSafetyBackstopSweepRecoversRowsAfterADayLongOutage(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix := testutil.Name("S")
	ctx := context.Background()
	// Yesterday's fleet died; Redis has nothing about it any more.
	take(t, db, "gone-1", 1, 2)
	take(t, db, "gone-2", 3)
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = NULL WHERE rowid = 4`)
	require.NoError(t, err)
	r := fencedResetter(t, db)
	// Rows-set mode: in owner mode the live worker would sweep too.
	opts := []Option{WithKeyPrefix(prefix), WithRowsSets(),
		WithHeartbeatTTL(500 * time.Millisecond), WithHeartbeatInterval(100 * time.Millisecond),
		WithRecoveryInterval(time.Hour), WithRowsTTL(2 * time.Hour)}
	live, _ := startWorker(t, rdb, r, "live", opts...) // no sweep of its own
	opts = append(opts, WithBackstopSweep())
	take(t, db, "live", 5)
	require.NoError(t, live.Track(ctx, 5))
	// Sweeps are driven by hand here; the loop's part is tested below.
	w, _ := newWorker(t, rdb, r, "newcomer", opts...)
	other, _ := newWorker(t, rdb, r, "other", opts...)

	rep, err := w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.turnHeld)
	assert.Equal(t, 3, rep.owners, "gone-1, gone-2, live")
	assert.ElementsMatch(t, []string{"gone-1", "gone-2"}, rep.absent, "first sighting: not yet reset")
	assert.Empty(t, rep.recovered)
	orep, err := other.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.False(t, orep.turnHeld, "one sweeper at a time")

	time.Sleep(200 * time.Millisecond)
	rep, err = w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.recovered, "absent for less than a heartbeat TTL")

	time.Sleep(400 * time.Millisecond)
	rep, err = w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.Len(t, rep.recovered, 2)
	assert.Equal(t, uint64(3), w.Stats().RowsRecovered, "the sweep's rows are counted")
	assert.Equal(t, uint64(2), w.Stats().PeersRecovered)
	for _, id := range []int64{1, 2, 3} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d", id)
		assert.Nil(t, o)
	}
	s, o := rowState(t, db, 5)
	assert.Equal(t, "inprog", s, "a live owner's row is never swept")
	assert.Equal(t, "live", *o)
	s, _ = rowState(t, db, 4)
	assert.Equal(t, "inprog", s, "rows without an owner are not the sweep's")
}

func TestSafetyBackstopSweepRunsFromTheRecoveryLoop(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	take(t, db, "gone", 1, 2)
	_, logs := startWorker(t, rdb, fencedResetter(t, db), "sweeper", WithKeyPrefix(testutil.Name("S")), WithBackstopSweep(),
		WithHeartbeatTTL(300*time.Millisecond), WithHeartbeatInterval(100*time.Millisecond),
		WithRecoveryInterval(100*time.Millisecond), WithRowsTTL(time.Second))
	require.Eventually(t, func() bool { s, _ := rowState(t, db, 2); return s == "queued" }, 5*time.Second, 20*time.Millisecond)
	assert.Contains(t, logs.String(), `"found_by":"sweep"`)
}

func TestSafetyBackstopSweepNeedsAnOwnerColumn(t *testing.T) {
	db := testutil.Postgres(t)
	plain, err := NewPgxResetter(db)
	require.NoError(t, err)
	_, err = New(idleClient(t), plain, WithBackstopSweep())
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "backstop sweep needs a PgxResetter WithOwnerColumn")
	_, err = New(idleClient(t), &fakeResetter{}, WithBackstopSweep())
	assert.Contains(t, err.Error(), "backstop sweep needs a resetter that implements OwnerSweeper")
}

func TestSafetyPoisonRowIsQuarantinedAfterMaxRecoveries(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	prefix := testutil.Name("S")
	r := fencedResetter(t, db, WithRecoveryCountColumn("recoveries"), WithMaxRecoveries(3, ""))
	rec, logs := newWorker(t, rdb, r, "rec", WithKeyPrefix(prefix))
	ctx := context.Background()

	// Row 1 kills every worker that takes it; rows 2 and 3 die with it once.
	for round := 1; round <= 3; round++ {
		dead := testutil.Name("dead")
		ids := []any{"1"}
		take(t, db, dead, 1)
		if round == 1 {
			take(t, db, dead, 2, 3)
			ids = append(ids, "2", "3")
		}
		plantDeadPeer(t, rdb, prefix, dead, ids...)
		rep, err := rec.RecoverNow(ctx)
		require.NoError(t, err)
		require.Len(t, rep.Recovered, 1)
		if round < 3 {
			assert.Empty(t, rep.Recovered[0].Quarantined, "round %d", round)
		} else {
			assert.Equal(t, []int64{1}, rep.Recovered[0].Quarantined)
		}
	}
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "failed", s)
	for _, id := range []int64{2, 3} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s, "siblings go back to the queue")
	}
	var count int
	require.NoError(t, db.QueryRow(ctx, `SELECT recoveries FROM batchrows WHERE rowid = 1`).Scan(&count))
	assert.Equal(t, 3, count)
	_ = logs // RecoverNow returns the report; the loop logs it:
	l := recoveryLog{w: rec}
	l.recovered(PeerRecovery{InstanceID: "x", Quarantined: []int64{1}}, "registry")
	assert.Contains(t, logs.String(), `"row_id":1`)
}

func TestSafetyHungPostgresCannotBlockShutdown(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	ctx := context.Background()
	take(t, db, "dead", 1)
	_, err := db.Exec(ctx, `
		CREATE FUNCTION hang() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;
		CREATE TRIGGER hang BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION hang();`)
	require.NoError(t, err)
	prefix := testutil.Name("S")
	plantDeadPeer(t, rdb, prefix, "dead", "1")
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix), WithResetTimeout(time.Minute))
	require.Eventually(t, func() bool {
		var n int
		_ = db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'WITH locked%'`).Scan(&n)
		return n > 0
	}, 5*time.Second, 10*time.Millisecond, "the reset is stuck in PostgreSQL")

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(sctx))
	assert.Less(t, time.Since(start), 3*time.Second, "Shutdown cancels the stuck reset")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "the cancelled reset changed nothing")
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

// A worker killed within the linger of a deferred Untrack leaves a finished
// row in its set; the reset's guards leave it finished.
func TestSafetyDeferredUntrackNeverResetsAFinishedRow(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("S")
	ctx := context.Background()
	r := fencedResetter(t, db)
	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix), WithDeferredUntrack(400*time.Millisecond), WithRowsSets())
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	setStatus(t, db, "done", 1)
	require.NoError(t, a.Untrack(1))
	a.crash() // before the deferred SREM
	ok, err := rdb.SIsMember(ctx, prefix+"_{A}_ROWS", "1").Result()
	require.NoError(t, err)
	require.True(t, ok, "the finished row is still in the set")

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix), WithRowsSets())
	require.Eventually(t, func() bool {
		rep, err := b.RecoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "done", s)
	s, _ = rowState(t, db, 2)
	assert.Equal(t, "queued", s)
}

// A finished row left in a dead worker's set (deferred Untrack) that the
// application re-queued and another worker took again is left to its new
// holder by an owner-fenced reset (docs/safety.md, section 7).
func TestSafetyDeferredUntrackWithOwnerFencingLeavesARequeuedRowToItsNewHolder(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("S")
	ctx := context.Background()
	r := fencedResetter(t, db)
	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix), WithDeferredUntrack(400*time.Millisecond))
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	setStatus(t, db, "done", 1)
	require.NoError(t, a.Untrack(1))
	a.crash()                     // before the deferred SREM: row 1 stays in A's set
	setStatus(t, db, "queued", 1) // the application re-queues the finished row
	take(t, db, "C", 1)           // and live worker C takes it

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix))
	require.Eventually(t, func() bool {
		rep, err := b.RecoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	s, owner := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "row 1 is C's now")
	require.NotNil(t, owner)
	assert.Equal(t, "C", *owner)
	s, _ = rowState(t, db, 2)
	assert.Equal(t, "queued", s, "A's unfinished row is recovered")
}

// fencedFake is a fakeResetter that declares owner fencing.
type fencedFake struct{ fakeResetter }

func (*fencedFake) FencesByOwner() bool { return true }

func TestSafetyReleaseWithoutOwnerFencingRefusesOnceTheLeaseIsLost(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	timing := []Option{WithHeartbeatTTL(400 * time.Millisecond), WithHeartbeatInterval(100 * time.Millisecond),
		WithRecoveryInterval(time.Hour), WithRowsTTL(2 * time.Hour)}
	plain := &fakeResetter{}
	a, _ := startWorker(t, rdb, plain, "plain", timing...)
	fenced := &fencedFake{}
	b, _ := startWorker(t, rdb, fenced, "fenced", timing...)
	require.NoError(t, a.Track(ctx, 1))
	require.NoError(t, b.Track(ctx, 2))

	mr.SetError("ERR down")
	require.Eventually(t, func() bool { return a.CheckLease() != nil && b.CheckLease() != nil }, 2*time.Second, 5*time.Millisecond)

	err := a.Release(ctx, 1)
	assert.ErrorIs(t, err, ErrLeaseLost, "peers may have recovered row 1 and handed it to someone else")
	assert.Zero(t, plain.callCount())
	assert.Equal(t, 1, a.Stats().TrackedRows, "still tracked for a peer to recover")

	require.NoError(t, b.Release(ctx, 2), "an owner guard makes it safe")
	assert.Equal(t, []int64{2}, fenced.resetOf("fenced"))
	mr.SetError("")

	require.NoError(t, a.Shutdown(ctx))
	assert.ErrorIs(t, a.Release(ctx, 1), ErrShutdown)
}

// A worker paused past its TTL must not learn it is healthy again just
// because its next heartbeat succeeded: the rows it held may be a peer's now.
func TestSafetyLeaseStaysLostUntilTheRowsHeldAtTheLossAreGivenBack(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	r := &fencedFake{}
	w, logs := startWorker(t, rdb, r, "w", WithHeartbeatTTL(400*time.Millisecond),
		WithHeartbeatInterval(100*time.Millisecond), WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	require.NoError(t, w.Track(ctx, 1, 2, 3))

	mr.SetError("ERR paused") // the process is stopped, the key expires
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease lost") == 1 }, 2*time.Second, 5*time.Millisecond)
	mr.SetError("")
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease regained") == 1 }, 2*time.Second, 5*time.Millisecond)

	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "rows 1-3 may have been recovered meanwhile")
	assert.ErrorIs(t, w.Track(ctx, 4), ErrLeaseLost)
	assert.Contains(t, logs.String(), `"stale_rows":3`)

	require.NoError(t, w.Untrack(1)) // the row it was in the middle of (its completion was refused)
	assert.ErrorIs(t, w.Healthy(), ErrLeaseLost)
	require.NoError(t, w.Release(ctx, 2, 3)) // the rest of the block
	assert.NoError(t, w.CheckLease(), "every stale row given back")
	assert.NoError(t, w.Track(ctx, 4))
}
