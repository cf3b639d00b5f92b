package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Owner mode's resets against a live worker. Each test is an interleaving,
// found by an adversarial review of owner mode (issue 14), that once reset
// the rows of a live worker following the documented protocol (fetch sets
// the owner, CheckLease before taking rows, Release when the lease is
// lost); each now asserts that the worker's rows are left alone.
//
// The common root: a reset by owner resets whatever the owner value holds
// when its statement runs, not what the dead process held. A recoverer that
// took its claim while the heartbeat was absent may run that statement up
// to the claim TTL later (a GC pause, a pool that has no free connection,
// a long chunked reset); a heartbeat written meanwhile only deletes the
// claim key, which the holder never looks at again before it resets.

// ownerGatedResetter is a pgxreset.Resetter whose first reset by owner waits at
// g before it runs: a recoverer paused between its claim and its reset.
type ownerGatedResetter struct {
	*pgxreset.Resetter
	g *gate
}

func (r *ownerGatedResetter) ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error) {
	r.g.pass()
	return r.Resetter.ResetOwner(ctx, req)
}

// assertHeldBy asserts that each row is in progress and owned by owner.
func assertHeldBy(t *testing.T, db *pgxpool.Pool, owner string, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		s, o := rowState(t, db, id)
		got := "<nil>"
		if o != nil {
			got = *o
		}
		assert.Equal(t, "inprog/"+owner, s+"/"+got, "row %d was reset under its live holder %s", id, owner)
	}
}

// freezableFleet is a redis-server of the test's own, a client for the
// victim that fr can freeze (a pause, a partition), a client for everyone
// else, a batch of rows in PostgreSQL and a fresh key prefix.
type freezableFleet struct {
	srv         *testutil.RedisServer
	victim, rdb *redis.Client
	fr          *freezer
	db          *pgxpool.Pool
	prefix      string
}

func newFreezableFleet(t *testing.T, rows int) freezableFleet {
	t.Helper()
	f := freezableFleet{srv: testutil.StartRedis(t), fr: &freezer{}, db: testutil.Postgres(t), prefix: testutil.Name("R2")}
	f.victim, f.rdb = f.srv.Client(t), f.srv.Client(t)
	f.victim.AddHook(f.fr)
	testutil.CreateBatch(t, f.db, rows)
	return f
}

// pausedOwnerComesBack runs the paused-worker interleaving with a
// victim built with victimOpts and an owner-mode recoverer:
//
//  1. A (rows 1, 2) cannot reach Redis past its TTL; its heartbeat expires
//     and its lease is lost. The host sees ErrLeaseLost and releases 1, 2.
//  2. R claims A (heartbeat absent) and is paused before its reset.
//  3. A reaches Redis again; its heartbeat deletes R's claim; the lease is
//     valid again. The host fetches rows 1, 2, 3 and tracks them.
//  4. R resumes: ResetOwner(A) resets rows 1, 2, 3 under live A.
func pausedOwnerComesBack(t *testing.T, victimOpts ...Option) {
	f := newFreezableFleet(t, 5)
	aClient, fr, rdb, db, prefix := f.victim, f.fr, f.rdb, f.db, f.prefix
	ctx := context.Background()
	// Claim TTL: 1s reset timeout + 3 × 125ms operation timeout = 1.375s.
	timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      time.Second,
		HeartbeatInterval: 250 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      time.Second,
	})}

	a, logs := startWorker(t, aClient, fencedResetter(t, db), "A", append(timing, victimOpts...)...)
	take(t, db, "A", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))

	fr.freeze() // A loses Redis (a partition, a pause)
	require.Eventually(t, func() bool { return rdb.Exists(ctx, store.InstanceKeys(prefix, "A").Heartbeat).Val() == 0 },
		5*time.Second, 2*time.Millisecond)
	require.ErrorIs(t, a.CheckLease(), ErrLeaseLost)
	require.NoError(t, a.Release(ctx, 1, 2), "the host gives its block back, as documented")

	g := newGate()
	rec, _ := newWorker(t, rdb, &ownerGatedResetter{fencedResetter(t, db), g}, "R", timing...)
	require.True(t, rec.Stats().OwnerMode)
	type result struct {
		pr  report.PeerRecovery
		err error
	}
	done := make(chan result, 1)
	go func() {
		pr, _, err := rec.peers.recoverDead(ctx, "A", foundByScan, time.Now())
		done <- result{pr, err}
	}()
	select {
	case <-g.entered: // R holds the claim on A and is about to reset by owner
	case r := <-done:
		t.Fatalf("recovery of A ended before its reset by owner: %+v, %v", r.pr, r.err)
	}

	fr.thaw()
	waitTurns(t, &signals(a).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	regained := time.Now()
	// The fix (H1): the regained lease is held for a claim TTL, by which
	// time R's claim context, started before its claim, has ended.
	require.ErrorIs(t, a.CheckLease(), ErrLeaseLost, "held after the regain")
	// poll: the hold ends with the clock alone and no turn marks its end;
	// checked at each heartbeat (every 250ms), its measured length would be
	// rounded up by as much as an interval, and a hold that much too short
	// would pass.
	require.Eventually(t, func() bool { return a.CheckLease() == nil }, 5*time.Second, 5*time.Millisecond,
		"A's lease comes back a claim TTL after its heartbeat")
	require.GreaterOrEqual(t, time.Since(regained), 1300*time.Millisecond)
	// The host takes a new block: 1 and 2 were queued by its Release.
	take(t, db, "A", 1, 2, 3)
	require.NoError(t, a.Track(ctx, 1, 2, 3))
	require.NoError(t, a.CheckLease(), "A may process these rows")

	close(g.release) // R resumes: its claim context has ended
	r := <-done
	t.Logf("R's recovery of A: rows reset %d, error %v", r.pr.RowsReset, r.err)
	require.Error(t, r.err, "R's reset could not run after its claim context ended")

	require.NoError(t, a.CheckLease(), "A still holds a valid lease")
	assertHeldBy(t, db, "A", 1, 2, 3)
}

// Owner mode: a worker that comes back after its heartbeat expired, and
// follows the protocol, has the rows it fetched after its lease came back
// reset by a recovery that claimed it while it was away.
func TestOwnerModeRecoveryInFlightLeavesTheRowsTheResumedWorkerTookAfterItsLeaseCameBack(t *testing.T) {
	t.Parallel()
	pausedOwnerComesBack(t)
}

// Mixed fleet: the same with a rows-set worker (WithRowsSets, as a worker of
// the release before owner mode) recovered by an owner-mode worker. A
// rows-set recoverer resets only the rows the set listed when it read it;
// the owner-mode recoverer then resets by owner, which reaches the rows the
// worker took after it came back.
func TestMixedFleetOwnerModeRecovererInFlightLeavesTheRowsARowsSetWorkerTookAfterItCameBack(t *testing.T) {
	t.Parallel()
	pausedOwnerComesBack(t, WithRowsSets())
}

// Owner mode, a fixed instance ID (a StatefulSet pod) whose predecessor
// died long ago (Redis has nothing left of it; PostgreSQL still names it
// the owner of rows 1, 2). A sweeper has seen the ID absent twice and
// claims it; it is paused before its reset. The pod starts meanwhile:
// Start finds no heartbeat and no record, resets rows 1, 2 itself (not
// under a claim), writes its first heartbeat (which deletes the sweeper's
// claim) and returns; the host fetches rows 1, 2, 3. The sweeper resumes
// and resets them under the live pod.
func TestOwnerModeSweepClaimedBeforeAFixedIDRestartLeavesTheNewProcesssRows(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	prefix := testutil.Name("R2")
	ctx := context.Background()
	take(t, db, "pod-0", 1, 2)

	g := newGate()
	sweeper, _ := newWorker(t, rdb, &ownerGatedResetter{fencedResetter(t, db), g}, "sweeper", WithKeyPrefix(prefix))
	done := make(chan error, 1)
	go func() {
		_, _, err := sweeper.peers.recoverDead(ctx, "pod-0", foundBySweep, time.Now())
		done <- err
	}()
	<-g.entered // the sweeper holds the claim on pod-0

	pod, _ := startWorker(t, rdb, fencedResetter(t, db), "pod-0", WithKeyPrefix(prefix))
	require.True(t, pod.Stats().OwnerMode)
	take(t, db, "pod-0", 1, 2, 3) // the host's first block
	require.NoError(t, pod.Track(ctx, 1, 2, 3))
	require.NoError(t, pod.CheckLease())

	close(g.release)
	t.Logf("the sweeper's recovery of pod-0: %v", <-done)

	require.NoError(t, pod.CheckLease())
	assertHeldBy(t, db, "pod-0", 1, 2, 3)
}

// Owner mode, two processes given one instance ID that start together
// (issue 10's F3; docs/safety.md §10 says the second is refused "having
// written nothing"). B reads the heartbeat (absent) and goes on to reset
// the rows under its ID; it is slow to do so. A reads the heartbeat too,
// writes its first one and returns; its host fetches rows 1, 2. B's reset
// then runs and resets A's live rows; only after that does B's first
// heartbeat find A's value and refuse B.
func TestOwnerModeTwinStartingTogetherLeavesTheRowsOfTheTwinThatWon(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	prefix := testutil.Name("R2")
	ctx := context.Background()

	g := newGate()
	b, _ := newWorker(t, rdb, &ownerGatedResetter{fencedResetter(t, db), g}, "twin", WithKeyPrefix(prefix))
	startB := make(chan error, 1)
	go func() { startB <- b.Start(ctx) }()
	<-g.entered // B found no heartbeat and is about to reset the rows under "twin"

	a, _ := startWorker(t, rdb, fencedResetter(t, db), "twin", WithKeyPrefix(prefix))
	take(t, db, "twin", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2))
	require.NoError(t, a.CheckLease())

	close(g.release)
	err := <-startB
	assert.ErrorIs(t, err, ErrInstanceIDInUse, "B is refused, as §10 says: A waited for B's claim on the ID, then took it")

	require.NoError(t, a.CheckLease())
	assertHeldBy(t, db, "twin", 1, 2)
}

// Owner mode: the reset by owner walks keyset chunks from "ID > 0"
// (resetValues.after starts at 0), so a dead peer's rows with an ID of 0 or
// below are never reset, and nothing says so: the recovery reports success
// and the sweep finds the same owner again at every turn, forever. Row IDs
// are any bigint (the rows-set mode takes any int64); a sequence started
// at its MINVALUE, or IDs derived from a hash, have them.
func TestOwnerModeResetByOwnerReachesRowsWhoseIDIsZeroOrNegative(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("R2")
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO batchrows (rowid, batchid) VALUES (-7, 1), (0, 1)`)
	require.NoError(t, err)
	take(t, db, "dead", -7, 0, 1)
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "dead").Err()) // registered, no heartbeat

	rec, _ := newWorker(t, rdb, fencedResetter(t, db), "rec", WithKeyPrefix(prefix))
	require.True(t, rec.Stats().OwnerMode)
	rep, err := rec.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)

	for _, id := range []int64{-7, 0, 1} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d of the dead peer", id)
	}
	assert.Equal(t, int64(3), rep.Recovered[0].RowsReset)
}

// Owner mode: the sweep takes its candidates from PostgreSQL, so a Redis
// that restarted empty gives it verdicts on live workers, and registry.go
// holds nothing back after an empty start ("cannot hold a stale
// registry": true of the scan, not of the sweep). The two-sightings rule
// asks for two absent sightings a TTL apart, not for an absence that
// lasted a TTL: a Redis restarted empty twice, each time seen by a sweep
// before live worker L's next heartbeat (up to an interval, 30 s by
// default, while sweeps come every 60 s), resets L's rows while L's lease
// is valid.
func TestOwnerModeSweepAfterTwoEmptyRedisRestartsLeavesALiveWorkersRows(t *testing.T) {
	t.Parallel()
	f := newFreezableFleet(t, 3)
	srv, lClient, fr, rdb, db, prefix := f.srv, f.victim, f.fr, f.rdb, f.db, f.prefix
	ctx := context.Background()

	// Without the witness: its fence, waiting for Redis to answer after
	// each restart, would make L's lease invalid whenever a restart on a
	// loaded machine outlasts it; this test is the sweep's.
	l, _ := startWorker(t, lClient, fencedResetter(t, db), "L", WithKeyPrefix(prefix), WithLivenessWitness(false), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 250 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           3 * time.Hour,
	}))
	take(t, db, "L", 1, 2)
	require.NoError(t, l.Track(ctx, 1, 2))
	s, _ := newWorker(t, rdb, fencedResetter(t, db), "S", WithKeyPrefix(prefix)) // TTL 2s too
	require.True(t, s.Stats().OwnerMode)

	// Redis restarts empty; a sweep runs before L's next heartbeat reaches
	// it (here: L's next heartbeat is held until the sweep is done).
	restartSeenBySweep := func() sweepReport {
		t.Helper()
		fr.freeze()
		srv.Restart()
		rep, err := s.sweeper.runOnce(ctx)
		require.NoError(t, l.CheckLease(), "L's lease is valid when the sweep judges it")
		fr.thaw()
		require.NoError(t, err)
		require.Eventually(t, func() bool { return rdb.Exists(ctx, store.InstanceKeys(prefix, "L").Heartbeat).Val() == 1 },
			5*time.Second, 5*time.Millisecond, "L heartbeats again")
		return rep
	}

	rep := restartSeenBySweep()
	// The fix: the sweep takes no verdict from a server that started,
	// even empty, less than a TTL ago.
	require.NotContains(t, rep.absent, "L", "no sighting from a server that just restarted")
	// A heartbeat TTL, L heartbeating all along (every 250 ms: at least
	// three that succeeded); no sweep meanwhile (sweeps are an interval
	// apart).
	beats := signals(l).beat.Span(t, 2100*time.Millisecond)
	require.GreaterOrEqual(t, succeeded(beats), 3, "L's heartbeat ran throughout the TTL between the sweeps: %v", beats)
	rep = restartSeenBySweep()
	t.Logf("second sweep: absent %v, recovered %+v", rep.absent, rep.recovered)

	require.NoError(t, l.CheckLease())
	assertHeldBy(t, db, "L", 1, 2)
}
