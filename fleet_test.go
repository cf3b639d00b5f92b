package recovery

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Issue 20, item 2: two applications (two tables) on one Redis under one
// prefix. Each would take the other's dead workers for its own: A's scan
// reset B's row IDs in A's table, under A's live worker. Start refuses the
// second application, naming both tables and the fix; with a prefix each,
// a dead worker of B never touches A's rows.
func TestStartRefusesASecondFleetOnThePrefixAndPrefixesKeepFleetsApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testutil.Redis(t)
	dbA, dbB, rA, rB := twoTables(t, 10)
	shared := testutil.Name("F2")

	a, _ := startWorker(t, rdb, rA, "liveA", WithKeyPrefix(shared))
	take(t, dbA, "liveA", 1, 2, 3, 4, 5)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4, 5))

	b, _ := newWorker(t, rdb, rB, "deadB", WithKeyPrefix(shared))
	err := b.Start(ctx)
	if assert.ErrorIs(t, err, ErrFleetMismatch, "a second table under the prefix is refused") {
		assert.Contains(t, err.Error(), "table=batchrows")
		assert.Contains(t, err.Error(), "WithKeyPrefix")
		fleet, ferr := store.NewRedis(rdb, shared, time.Second).ReadFleet(ctx)
		require.NoError(t, ferr)
		assert.Contains(t, err.Error(), fleet.Serves, "names what the prefix serves")
		assert.False(t, registered(t, rdb, shared, "deadB"), "the refused worker wrote nothing")
	} else {
		secondFleetCost(t, rdb, dbA, dbB, a, b, "second fleet")
		return
	}

	// With a prefix each, both run; B's dead worker is B's fleet's alone.
	other := testutil.Name("F2b")
	victim(t, rdb, dbB, rB, "deadB2", []Option{WithKeyPrefix(other)}, 1, 2, 3, 4, 5)
	rb, _ := startWorker(t, rdb, rB, "liveB", WithKeyPrefix(other))
	rep, err := a.recoverNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Dead, "A's scan never sees B's workers")
	repB, err := rb.recoverNow(ctx)
	require.NoError(t, err)
	if len(repB.Recovered) == 0 { // the loop's first scan may have done it
		require.Eventually(t, func() bool { return !registered(t, rdb, other, "deadB2") }, 5*time.Second, 20*time.Millisecond)
	}
	assertRequeued(t, dbB, 1, 2, 3, 4, 5)
	for id := int64(1); id <= 5; id++ {
		s, o := rowState(t, dbA, id)
		assert.Equal(t, "inprog", s, "A's row %d untouched", id)
		assert.Equal(t, "liveA", *o)
	}
}

// A fleet of workers that predate the fleet record (rolling upgrade): they
// write no record; the first worker of this version records it at Start,
// and a heartbeat records it again after Redis lost it.
func TestFleetRecordIsWrittenByTheFirstNewWorkerAndAgainAfterRedisLosesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "F2u")
	// An old worker: heartbeat, registry entry and rows set, no record.
	old := store.InstanceKeys(prefix, "old")
	require.NoError(t, rdb.Set(ctx, old.Heartbeat, store.HeartbeatValue, time.Minute).Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "old").Err())
	s := store.NewRedis(rdb, prefix, time.Second)
	f, err := s.ReadFleet(ctx)
	require.NoError(t, err)
	require.Empty(t, f.Serves)

	r, err := pgxreset.New(db)
	require.NoError(t, err)
	w, _ := startWorker(t, rdb, r, "new", WithKeyPrefix(prefix))
	f, err = s.ReadFleet(ctx)
	require.NoError(t, err)
	assert.Regexp(t, `^database=\S+ schema=t_\S+ table=batchrows$`, f.Serves)
	served := f.Serves
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Dead, "the old worker is alive")

	require.NoError(t, rdb.Del(ctx, store.FleetKey(prefix)).Err()) // evicted, or Redis restarted empty
	require.Eventually(t, func() bool {
		f, err := s.ReadFleet(ctx)
		return err == nil && f.Serves == served && len(f.Members) == 1 && f.Members[0].ID == "new"
	}, 5*time.Second, 20*time.Millisecond, "the next heartbeat records the fleet and its announcement again")
	f, _ = s.ReadFleet(ctx)
	assert.Equal(t, 2*time.Second, f.Members[0].TTL)
	assert.Equal(t, "rows-set", f.Members[0].Mode)
}

// twoTables returns two batches of n rows in two schemas (two
// applications' tables of one name), and a pgxreset.Resetter on each.
func twoTables(t *testing.T, n int) (dbA, dbB *pgxpool.Pool, rA, rB *pgxreset.Resetter) {
	t.Helper()
	dbA, dbB = testutil.Postgres(t), testutil.Postgres(t)
	testutil.CreateBatch(t, dbA, n)
	testutil.CreateBatch(t, dbB, n)
	var err error
	rA, err = pgxreset.New(dbA)
	require.NoError(t, err)
	rB, err = pgxreset.New(dbB)
	require.NoError(t, err)
	return dbA, dbB, rA, rB
}

// secondFleetCost shows what a second fleet (what) that started on the
// prefix costs, its check reverted: B's worker b dies with rows 1..5 of
// B's table in progress; a's scan recovers it into A's table, under a's
// live worker liveA, and the test fails with the count.
func secondFleetCost(t *testing.T, rdb *redis.Client, dbA, dbB *pgxpool.Pool, a, b *Worker, what string) {
	t.Helper()
	ctx := context.Background()
	setStatus(t, dbB, "inprog", 1, 2, 3, 4, 5)
	require.NoError(t, b.Track(ctx, 1, 2, 3, 4, 5))
	b.crash()
	require.NoError(t, rdb.Del(ctx, b.ownKeys().Heartbeat).Err())
	rep, _ := a.recoverNow(ctx)
	reset := 0
	for id := int64(1); id <= 5; id++ {
		if s, _ := rowState(t, dbA, id); s == "queued" {
			reset++
		}
	}
	t.Errorf("%s started on the prefix: A's scan found %v dead; rows of live worker liveA reset in A's table: %d of 5",
		what, rep.Dead, reset)
}

// Issue 20, item 3: a rolling change of timings. One worker uses a long
// TTL (8 s, a heartbeat every 4 s), one a short TTL (1 s); Redis restarts
// empty right after the long one's heartbeat. The short one's backstop
// sweep finds the long one's rows in PostgreSQL and no heartbeat: judged
// by its own TTL it reset them about 2 s after the restart, under the long
// one's valid lease. The long one announced its TTL; the short one
// remembers it across the restart and holds its verdicts for it.
func TestRollingTimingChangeWithARedisRestartResetsNoLiveWorkersRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix := testutil.Name("T3")

	beats := make(chan struct{}, 16)
	long, _ := startWorker(t, srv.Client(t), fencedResetter(t, db), "long", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      8 * time.Second,
			HeartbeatInterval: 4 * time.Second,
			RecoveryInterval:  2 * time.Second,
			RowsTTL:           30 * time.Second,
		}),
		WithObserver(func(e Event) {
			if e.Kind == EventHeartbeat {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}))
	require.True(t, long.Stats().OwnerMode)
	take(t, db, "long", 1, 2, 3, 4, 5)
	require.NoError(t, long.Track(ctx, 1, 2, 3, 4, 5))

	short, _ := newWorker(t, srv.Client(t), fencedResetter(t, db), "short", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 300 * time.Millisecond,
			RecoveryInterval:  300 * time.Millisecond,
			ResetTimeout:      time.Second,
		}))
	require.NoError(t, short.Start(ctx))
	require.True(t, short.Stats().OwnerMode)
	waitTurns(t, &signals(short).beat, 5*time.Second, func() bool { ttl, _, _ := short.fleet.mem.longest(); return ttl == 8*time.Second },
		"the short worker learns the long one's TTL from its heartbeat")

	drain(beats)
	<-beats // the long worker just beat: its next heartbeat is 4 s away
	restarted := time.Now()
	srv.Restart()

	// Both heartbeats back twice: the long one's second comes ~8 s after
	// the restart, past the hold, so verdicts were taken meanwhile.
	<-beats
	<-beats
	waitScans(t, short, 3)
	reset := 0
	for id := int64(1); id <= 5; id++ {
		if s, o := rowState(t, db, id); s != "inprog" || o == nil || *o != "long" {
			reset++
		}
	}
	assert.Zero(t, reset, "rows of the live long-TTL worker reset after the restart (%v ago), of 5", time.Since(restarted).Round(100*time.Millisecond))
	assert.Zero(t, short.Stats().RowsRecovered, "the short worker reset nothing")
	assert.NoError(t, long.CheckLease())
}

// drain empties a buffered channel.
func drain(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// waitScans waits for n more scans of w.
func waitScans(t *testing.T, w *Worker, n uint64) {
	t.Helper()
	before := w.Stats().Scans
	waitTurns(t, &signals(w).scan, 10*time.Second, func() bool { return w.Stats().Scans >= before+n })
}

// The fleet memory keeps the longest timing announced; a shorter one
// replaces it only once the longer has gone unrepeated for three of it.
func TestFleetMemoryKeepsTheLongestTimingUntilItLapses(t *testing.T) {
	var m fleetMemory
	t0 := time.Unix(1000, 0)
	m.learn(store.Announcement{TTL: 8 * time.Second, Claim: 3 * time.Second, Wait: time.Second}, t0)
	m.learn(store.Announcement{TTL: time.Second, Claim: time.Second, Wait: time.Second}, t0.Add(time.Second))
	ttl, claim, _ := m.longest()
	assert.Equal(t, 8*time.Second, ttl, "a restart's empty record does not shorten it")
	assert.Equal(t, 3*time.Second, claim)
	m.learn(store.Announcement{TTL: time.Second, Claim: time.Second}, t0.Add(25*time.Second))
	ttl, _, _ = m.longest()
	assert.Equal(t, time.Second, ttl, "lapsed after three of itself unrepeated")
	m.learn(store.Announcement{TTL: 100 * maxDuration}, t0)
	ttl, _, _ = m.longest()
	assert.Equal(t, maxAnnounced, ttl, "a garbage announcement is capped")
}

// Issue 20, item 3, the claim TTL and the recovery interval: a worker
// whose lease comes back holds it for the longest claim TTL any member
// announced (a recoverer with a longer reset timeout may still be
// resetting its rows), and its rows set lives long enough for the slowest
// member's first scan after its death.
func TestMixedTimingsTheRegainHoldAndTheRowsTTLFollowTheSlowestMember(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	prefix := testutil.Name("T3c")
	slow, _ := startWorker(t, srv.Client(t), &fakeResetter{}, "slow", WithKeyPrefix(prefix),
		WithTimings(Timings{
			ResetTimeout:     3 * time.Second,
			RecoveryInterval: 6 * time.Second,
			RowsTTL:          30 * time.Second,
		}))
	longClaim := slow.opts.claimTTL()
	f := &freezer{}
	c := srv.Client(t)
	c.AddHook(f)
	w, logs := startWorker(t, c, &fakeResetter{}, "w", WithKeyPrefix(prefix),
		WithTimings(Timings{ResetTimeout: 600 * time.Millisecond, OperationTimeout: 50 * time.Millisecond}))
	require.Less(t, w.opts.claimTTL(), longClaim/2)
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { _, claim, _ := w.fleet.mem.longest(); return claim == longClaim },
		"w learns the slow member's claim TTL (its heartbeat reads the fleet record)")

	// Rows TTL: w's own is 4 s; the slow member's wait for a scan is
	// longer than w's by as much as its recovery interval and scan turn.
	require.NoError(t, w.Track(ctx, 1))
	extra := (slow.opts.detectionWindow() - slow.opts.heartbeatTTL) - (w.opts.detectionWindow() - w.opts.heartbeatTTL)
	require.Positive(t, extra)
	left := c.PTTL(ctx, store.InstanceKeys(prefix, "w").Rows).Val()
	assert.Greater(t, left, w.opts.rowsTTL+extra-time.Second, "w's rows set outlives the slow member's first scan")

	f.freeze()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease lost") == 1 })
	f.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	regained := time.Now()
	// poll: the hold ends with the clock alone and no turn marks its end;
	// checked at each heartbeat (every 500ms), its measured length would be
	// rounded up by as much as an interval, and a hold that much too short
	// would pass.
	require.Eventually(t, func() bool { return w.CheckLease() == nil }, 10*time.Second, 5*time.Millisecond)
	held := time.Since(regained)
	assert.GreaterOrEqual(t, held, longClaim-100*time.Millisecond,
		"held for the slow member's claim TTL (%v), not w's own (%v)", longClaim, w.opts.claimTTL())
}

// A heartbeat that finds the prefix's record naming another table (a
// second application recorded it first after Redis restarted empty) says
// so at Error, once.
func TestHeartbeatLogsASecondFleetOnThePrefixOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 5, "F2h")
	r, err := pgxreset.New(db)
	require.NoError(t, err)
	w, logs := startWorker(t, rdb, r, "w", WithKeyPrefix(prefix))
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "serves", "database=x schema=y table=z").Err())
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("the key prefix serves another fleet") == 1 })
	beats := w.Stats().Heartbeats
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().Heartbeats >= beats+3 })
	assert.Equal(t, 1, logs.Count("the key prefix serves another fleet"), "once")
	assert.Contains(t, logs.String(), `"recorded":"database=x schema=y table=z"`)
}

// Every resetter implementation, through every Go database API, tells the
// same identity: the database, the table's schema as the server resolves
// it (search_path or WithSchema), and the table; a missing table is named
// as configured.
func TestResettersTellWhatTheyServe(t *testing.T) {
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	var dbName, schema string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT current_database(), current_schema()`).Scan(&dbName, &schema))
	want := "database=" + dbName + " schema=" + schema + " table=batchrows"
	var sysID string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysID))
	for _, impl := range resetterImpls {
		t.Run(impl.Name, func(t *testing.T) {
			ctx := context.Background()
			got, err := impl.Must(t, db).Check(ctx, false)
			require.NoError(t, err)
			assert.Equal(t, want, got.Serves)
			assert.Equal(t, "system_identifier="+sysID, got.Server, "the server's identifier")
			got, err = impl.Must(t, db, postgres.WithSchema(schema)).Check(ctx, false)
			require.NoError(t, err)
			assert.Equal(t, want, got.Serves)
			got, err = impl.Must(t, db, postgres.WithTable("nope")).Check(ctx, false)
			require.NoError(t, err)
			assert.Equal(t, "database="+dbName+" schema= table=nope", got.Serves)
		})
	}
}

// A fleet key that is not a hash stops no heartbeat; the worker says once
// that its timings are not announced.
func TestAFleetKeyOfTheWrongTypeIsLoggedOnceAndStopsNoHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("F2w")
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w", WithKeyPrefix(prefix))
	require.NoError(t, rdb.Del(ctx, store.FleetKey(prefix)).Err())
	require.NoError(t, rdb.Set(ctx, store.FleetKey(prefix), "x", 0).Err())
	const msg = "cannot write the fleet record"
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count(msg) == 1 })
	beats := w.Stats().Heartbeats
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().Heartbeats >= beats+3 },
		"heartbeats go on")
	assert.Equal(t, 1, logs.Count(msg), "once per outage")
	assert.NoError(t, w.CheckLease())
}

// Start reads the fleet record once: the script that records what the
// fleet serves returns the whole record, and Start learns the members'
// timings from that reply, lapsed announcements too (a record restored
// from an old snapshot; it read it again with HGETALL before).
func TestStartReadsTheFleetRecordOnce(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 1, "FS1")
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "m:slow", fmt.Sprintf("9000 9000 9000 owner %d", time.Now().Add(-time.Minute).UnixMilli())).Err())
	counter := &commandCounter{}
	rdb.AddHook(counter)
	w, _ := newWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix))
	require.NoError(t, w.Start(ctx))
	trips, cmds := counter.snapshot()
	t.Logf("Start: %d round trips: %v", trips, cmds)
	assert.NotContains(t, cmds, "hgetall", "the record is not read a second time")
	assert.Equal(t, 9*time.Second, w.fleet.ttl(), "the lapsed member's TTL learnt from the script's reply (the first heartbeat dropped it)")
}

// A role that may not call pg_control_system() (a managed service that
// revokes it) records no server: the fleet is checked by its names, as
// before the server field, and Start succeeds.
func TestAServerThatWillNotTellItsIdentifierIsCheckedByNames(t *testing.T) {
	testutil.PostgresURL(t) // skips under -short, or without PostgreSQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := privatePostgres(ctx, t, `
CREATE ROLE app LOGIN;
GRANT ALL ON ALL TABLES IN SCHEMA public TO app;
REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC;`)
	cfg := admin.Config().Copy()
	cfg.ConnConfig.User = "app"
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)

	r, err := pgxreset.New(db)
	require.NoError(t, err)
	info, err := r.Check(ctx, false)
	require.NoError(t, err)
	assert.Empty(t, info.Server, "permission denied: no server")
	rdb := testutil.Redis(t)
	prefix := testutil.Name("FSN")
	startWorker(t, rdb, r, "w", WithKeyPrefix(prefix))
	f, err := store.NewRedis(rdb, prefix, time.Second).ReadFleet(ctx)
	require.NoError(t, err)
	assert.Empty(t, f.Server)
	assert.Contains(t, f.Serves, "table=batchrows")
}
