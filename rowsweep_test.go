package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// jobsTable creates <schema>.jobs as the new user had it: no owner
// column, states 'pending', 'running', 'finished', 'error', as text or as
// an enum, in a schema other than the pool's own. Rows 1..n are pending.
func jobsTable(t *testing.T, db *pgxpool.Pool, enum bool, n int) (schema string, opts []postgres.Option) {
	t.Helper()
	ctx := context.Background()
	schema = testutil.Name("batch_")
	typ := "text"
	stmts := []string{"CREATE SCHEMA " + schema}
	if enum {
		typ = schema + ".state"
		stmts = append(stmts, fmt.Sprintf("CREATE TYPE %s AS ENUM ('pending', 'running', 'finished', 'error')", typ))
	}
	stmts = append(stmts,
		fmt.Sprintf("CREATE TABLE %s.jobs (id bigint PRIMARY KEY, state %s NOT NULL DEFAULT 'pending')", schema, typ),
		fmt.Sprintf("INSERT INTO %s.jobs (id) SELECT g FROM generate_series(1, %d) g", schema, n))
	for _, s := range stmts {
		_, err := db.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	return schema, []postgres.Option{postgres.WithSchema(schema), postgres.WithTable("jobs"), postgres.WithIDColumn("id"),
		postgres.WithStatusColumn("state"), postgres.WithStatuses("running", "pending"), postgres.WithDoneStatuses("finished", "error"),
		postgres.WithoutResetLedger()}
}

// setJobs sets the state of rows, as a fetch or a finish would commit it.
func setJobs(t *testing.T, db *pgxpool.Pool, schema, state string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), fmt.Sprintf("UPDATE %s.jobs SET state = $1 WHERE id = ANY($2)", schema), state, ids)
	require.NoError(t, err)
}

func jobStates(t *testing.T, db *pgxpool.Pool, schema string) map[int64]string {
	t.Helper()
	return pgtest.ByRow[string](t, db, fmt.Sprintf("SELECT id, state::text FROM %s.jobs", schema))
}

// backstopWorld is a Redis old enough for the sweep to trust and a jobs
// table of n pending rows (text states) with its pgxreset.Resetter.
func backstopWorld(t *testing.T, n int) (*redis.Client, *pgxpool.Pool, string, *pgxreset.Resetter) {
	t.Helper()
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second)
	db := testutil.Postgres(t)
	schema, ropts := jobsTable(t, db, false, n)
	r, err := pgxreset.New(db, ropts...)
	require.NoError(t, err)
	return rdb, db, schema, r
}

// rowsSweepTimings: a rows TTL of a second, so two looks a gap apart take
// about a second. The operation timeout is the longest these timings
// allow (the interval; half of it by default), for Redis calls on a loaded
// machine: the tests that use these timings run in parallel.
func rowsSweepTimings(extra ...Option) []Option {
	// A 600 ms TTL, Redis given 150 ms a command: tighter, and a loaded
	// machine loses the live workers' leases mid-test. Rows TTL 1.5 s: a
	// look finds a row committed untracked when it comes within rows TTL
	// - TTL (900 ms) of the look before.
	return append([]Option{WithTimings(Timings{
		HeartbeatTTL:      600 * time.Millisecond,
		HeartbeatInterval: 150 * time.Millisecond,
		OperationTimeout:  150 * time.Millisecond,
		RecoveryInterval:  100 * time.Millisecond,
		RowsTTL:           1500 * time.Millisecond,
	})}, extra...)
}

func TestBackstopSweepWithoutOwnerColumnResetsRowsNoSetHoldsAtTwoLooksARowsTTLApart(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second)
	db := testutil.Postgres(t)
	for _, enum := range []bool{false, true} {
		forEachImpl(t, func(t *testing.T, impl resetterImpl) {
			t.Run(fmt.Sprintf("enum=%v", enum), func(t *testing.T) {
				ctx := context.Background()
				schema, ropts := jobsTable(t, db, enum, 8)
				r := impl.Must(t, db, ropts...)
				prefix := testutil.Name("B")
				opts := rowsSweepTimings(WithKeyPrefix(prefix))
				live, _ := startWorker(t, rdb, r, "live", append(opts, WithBackstopSweep(false))...)
				require.NoError(t, live.Track(ctx, 3))
				setJobs(t, db, schema, "running", 1, 2, 3, 4) // 1, 2: a fleet gone; 3: live's; 4: fetched again below
				setJobs(t, db, schema, "finished", 5)
				setJobs(t, db, schema, "error", 6)
				w, logs := newWorker(t, rdb, r, "sweeper", opts...)
				require.NotNil(t, w.sweeper, "on by default without an owner column")
				require.True(t, w.sweeper.byVersion())

				first := time.Now()
				rep, err := w.sweeper.runOnce(ctx)
				require.NoError(t, err)
				require.True(t, rep.turnHeld)
				assert.Equal(t, 4, rep.rowsInProgress)
				assert.Equal(t, 3, rep.strayWaiting, "1, 2 and 4: not reset at the first look")
				// Row 4's new version must first be seen 300 ms after the
				// first look, so that its gap ends that much after rows 1
				// and 2's and the looks below reset them first.
				time.Sleep(300 * time.Millisecond)   // real time: a gap is clock time between two looks, and nothing else marks it
				setJobs(t, db, schema, "running", 4) // a new version: its wait starts again, 300ms later

				var swept time.Time
				require.Eventually(t, func() bool {
					rep, err = w.sweeper.runOnce(ctx)
					require.NoError(t, err)
					swept = time.Now()
					return rep.strayReset > 0
				}, 10*time.Second, 50*time.Millisecond)
				assert.GreaterOrEqual(t, swept.Sub(first), time.Second, "not before a rows TTL")
				assert.Equal(t, int64(2), rep.strayReset)
				st := jobStates(t, db, schema)
				assert.Equal(t, map[int64]string{1: "pending", 2: "pending", 3: "running", 4: "running",
					5: "finished", 6: "error", 7: "pending", 8: "pending"}, st,
					"a row a live worker tracks and a row written since the first look stay in progress")
				assert.Equal(t, uint64(2), w.Stats().StrayRowsReset)
				assert.Equal(t, uint64(2), w.Stats().RowsRecovered)
				// Rows 1 and 2, of a fleet gone, are no host's mistake; row 4,
				// committed in progress again by no tracking worker, is.
				assert.Equal(t, uint64(1), w.Stats().UntrackedRows)
				assert.Contains(t, logs.String(), `"first_row":4`)
				// The history says which rows came back, and which were
				// committed untracked (w has no loops: it appends at once).
				rowsOf := map[string]string{}
				for _, e := range readHistory(t, rdb, prefix) {
					rowsOf[e.Kind] = e.RowIDs
				}
				assert.Equal(t, map[string]string{"stray_rows_reset": "1,2", "untracked_rows": "4"}, rowsOf)

				// The same versions again change nothing: no double reset.
				again, err := r.ResetVersions(ctx, VersionsReset{Versions: []RowState{{ID: 1, Version: "1"}, {ID: 4, Version: "1"}}})
				require.NoError(t, err)
				assert.Zero(t, again.Changed)
			})
		})
	}
}

// TestBackstopSweepCountsARowDeletedBetweenItsLooksAsGone: a row due for
// the sweep's reset that was deleted since its first look is neither
// reset, locked nor refused: the sweep counts it gone (Stats.RowsGone,
// Event.RowsGone on EventStrayRowsReset).
func TestBackstopSweepCountsARowDeletedBetweenItsLooksAsGone(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 3)
	ctx := context.Background()
	setJobs(t, db, schema, "running", 1, 2)
	events := &recorder{}
	w, logs := newWorker(t, rdb, r, "sweeper", rowsSweepTimings(WithKeyPrefix(testutil.Name("B")), WithObserver(events.Observe))...)
	// Row 2 is seen at its version, then deleted before the second look.
	due := pgtest.ByRow[string](t, db, fmt.Sprintf("SELECT id, xmin::text FROM %s.jobs WHERE id IN (1, 2)", schema))
	_, err := db.Exec(ctx, fmt.Sprintf("DELETE FROM %s.jobs WHERE id = 2", schema))
	require.NoError(t, err)
	var rep sweepReport
	require.NoError(t, w.sweeper.strategy().(*rowSweep).resetDue(ctx, &rep, []RowState{{ID: 1, Version: due[1]}, {ID: 2, Version: due[2]}}, nil, time.Second))
	w.sweeper.rlog.swept(rep, nil)
	assert.Equal(t, int64(1), rep.strayReset)
	assert.Equal(t, 1, rep.strayGone)
	assert.EqualValues(t, 1, w.Stats().RowsGone)
	assert.Contains(t, logs.String(), `"rows_gone":1,"rows_changed":0`)
	require.NoError(t, w.Shutdown(ctx)) // delivers the queued events
	if reset := events.of(EventStrayRowsReset); assert.Len(t, reset, 1) {
		assert.Equal(t, 1, reset[0].RowsGone)
		assert.Equal(t, []int64{1}, reset[0].RowIDs)
	}
}

func TestBackstopSweepTellsAHostThatDoesNotTrackAndThenResetsItsRows(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 6)
	ctx := context.Background()
	opts := rowsSweepTimings(WithKeyPrefix(testutil.Name("U")))
	host, hostLogs := startWorker(t, rdb, r, "host", append(opts, WithBackstopSweep(false))...)
	w, logs := newWorker(t, rdb, r, "sweeper", opts...)
	look := func() sweepReport {
		t.Helper()
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep
	}
	look() // the look before: nothing in progress

	// A correct host: Track, then COMMIT.
	require.NoError(t, host.Track(ctx, 1))
	setJobs(t, db, schema, "running", 1)
	// Track forgotten (row 2); Track after the COMMIT (row 3), the sweep
	// looking in between.
	setJobs(t, db, schema, "running", 2, 3)
	rep := look()
	assert.Equal(t, 2, rep.strayWaiting)
	assert.Empty(t, rep.untracked, "one look is no proof: the row may have been finished and untracked meanwhile")
	require.NoError(t, host.Track(ctx, 3))

	rep = look()
	assert.ElementsMatch(t, []int64{2, 3}, rep.untracked, "in progress at the same version across a look that found them in no set")
	assert.Equal(t, map[string][]int64{"": {2}, "host": {3}}, rep.untrackedBy)
	assert.Equal(t, uint64(2), w.Stats().UntrackedRows)
	assert.Contains(t, logs.String(), `"level":"ERROR"`)
	assert.Contains(t, logs.String(), ErrUntrackedRows.Error())
	assert.Contains(t, logs.String(), `"tracked_late_by":["host"]`)
	assert.Contains(t, logs.String(), `"rows_no_set_held":1`)
	// The host that tracked row 3 after its COMMIT is told, with its scan
	// turn; the sweeper, at fault for nothing, stays healthy.
	waitTurns(t, &signals(host).scan, 2*time.Second, func() bool { return errors.Is(host.Healthy(), ErrUntrackedRows) },
		"the host that tracked after its COMMIT fails Healthy")
	assert.Equal(t, 1, hostLogs.Count(`"level":"ERROR","msg":"this worker tracked rows only after the COMMIT`))
	assert.Contains(t, hostLogs.String(), `"first_row":3`)
	assert.NoError(t, w.untracked.err(), "the sweeper's Healthy does not fail for another worker's fault")
	assert.Equal(t, "running", jobStates(t, db, schema)[2], "told before its rows are reset")

	// The forgotten row goes back to the queue after a rows TTL; the row
	// tracked late, now held, stays with its host.
	require.Eventually(t, func() bool { return look().strayReset > 0 }, 10*time.Second, 50*time.Millisecond)
	st := jobStates(t, db, schema)
	assert.Equal(t, "pending", st[2])
	assert.Equal(t, "running", st[3])
	assert.Equal(t, "running", st[1])
	assert.Equal(t, uint64(2), w.Stats().UntrackedRows, "told once per row")
}

func TestBackstopSweepHoldsWhileTheRowsSetsHoldNoRowInProgress(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second)
	db := testutil.Postgres(t)
	ctx := context.Background()
	schema, ropts := jobsTable(t, db, false, 6)
	// Statuses swapped: 'pending' is what this resetter calls in progress.
	ropts = append(ropts, postgres.WithStatuses("pending", "running"), postgres.WithDoneStatuses("finished"))
	r, err := pgxreset.New(db, ropts...)
	require.NoError(t, err)
	opts := rowsSweepTimings(WithKeyPrefix(testutil.Name("W")))
	host, _ := startWorker(t, rdb, r, "host", append(opts, WithBackstopSweep(false))...)
	require.NoError(t, host.Track(ctx, 1))
	setJobs(t, db, schema, "running", 1)
	w, _ := newWorker(t, rdb, r, "sweeper", opts...)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		_, err := w.sweeper.runOnce(ctx)
		require.ErrorIs(t, err, ErrMisconfigured)
	}
	assert.Equal(t, map[int64]string{1: "running", 2: "pending", 3: "pending", 4: "pending", 5: "pending", 6: "pending"},
		jobStates(t, db, schema), "queued rows are never taken for stuck ones")
}

func TestBackstopSweepJudgesNothingFromARedisRestartedLessThanAHeartbeatTTLAgo(t *testing.T) {
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	db := testutil.Postgres(t)
	ctx := context.Background()
	schema, ropts := jobsTable(t, db, false, 3)
	r, err := pgxreset.New(db, ropts...)
	require.NoError(t, err)
	setJobs(t, db, schema, "running", 1)
	w, _ := newWorker(t, rdb, r, "sweeper", WithKeyPrefix(testutil.Name("Y")),
		WithTimings(Timings{
			HeartbeatTTL:      3 * time.Second,
			HeartbeatInterval: time.Second,
			RecoveryInterval:  time.Second,
			RowsTTL:           5 * time.Second,
		}))
	rep, err := w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.True(t, rep.nodeHeld, "a server up for less than a heartbeat TTL may have lost live rows sets")
	assert.Zero(t, rep.strayWaiting)
}

// TestBackstopSweepBringsBackTheRowsOfAFleetKilledForLongerThanTheRowsTTL
// is the whole fleet killed together, down past the rows TTL, then one
// worker started again with the defaults of its mode: the sweep is on.
func TestBackstopSweepBringsBackTheRowsOfAFleetKilledForLongerThanTheRowsTTL(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 30)
	ctx := context.Background()
	prefix := testutil.Name("F")
	opts := rowsSweepTimings(WithKeyPrefix(prefix))
	for i := range 3 {
		w, _ := startWorker(t, rdb, r, fmt.Sprintf("w%d", i), opts...)
		ids := []int64{int64(10*i + 1), int64(10*i + 2), int64(10*i + 3)}
		require.NoError(t, w.Track(ctx, ids...))
		setJobs(t, db, schema, "running", ids...)
		w.crash()
	}
	// Down past the rows TTL: every rows set is gone, and every other key
	// that 1.2 s would have ended (heartbeats, incarnations, turns).
	expireWithin(t, rdb, prefix, 1200*time.Millisecond)
	start := time.Now()
	back, _ := startWorker(t, rdb, r, "back", opts...)
	waitTurns(t, &signals(back).sweep, 10*time.Second, func() bool {
		for _, s := range jobStates(t, db, schema) {
			if s == "running" {
				return false
			}
		}
		return true
	}, "the sweep brings every row back")
	t.Logf("9 rows back in the queue %v after the fleet came back (rows TTL 1s, recovery interval 100ms)", time.Since(start).Round(10*time.Millisecond))
}

// TestBackstopSweepCostPerLook prints what one look costs with 10, 1,000
// and 100,000 rows in progress, half of them tracked by a live worker and
// half held by no set (the worst case: every row is read from PostgreSQL,
// every tracked one from Redis, every stray one remembered). Not run with
// -short.
func TestBackstopSweepCostPerLook(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement")
	}
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second)
	db := testutil.Postgres(t)
	ctx := context.Background()
	for _, n := range []int{10, 1000, 100000} {
		schema, ropts := jobsTable(t, db, false, n)
		r, err := pgxreset.New(db, ropts...)
		require.NoError(t, err)
		prefix := testutil.Name("C")
		opts := []Option{WithKeyPrefix(prefix), WithBackstopSweep(false), WithTimings(Timings{RowsTTL: time.Hour})}
		live, _ := startWorker(t, rdb, r, "live", opts...)
		tracked := make([]int64, 0, n/2)
		for id := int64(1); id <= int64(n/2); id++ {
			tracked = append(tracked, id)
		}
		for chunk := range slices.Chunk(tracked, 5000) {
			require.NoError(t, live.Track(ctx, chunk...))
		}
		_, err = db.Exec(ctx, fmt.Sprintf("UPDATE %s.jobs SET state = 'running'", schema))
		require.NoError(t, err)
		counter := &commandCounter{}
		c := redis.NewClient(rdb.Options())
		c.AddHook(counter)
		t.Cleanup(func() { c.Close() })
		w, _ := newWorker(t, c, r, "sweeper", WithKeyPrefix(prefix), WithTimings(Timings{RowsTTL: time.Hour}))
		for look := 1; look <= 2; look++ {
			counter.reset()
			start := time.Now()
			rep, err := w.sweeper.runOnce(ctx)
			require.NoError(t, err)
			took := time.Since(start)
			trips, cmds := counter.snapshot()
			t.Logf("rows in progress %d (tracked %d), look %d: %d Redis round trips, %d commands, 1 SQL statement reading %d rows, %d rows unheld, %v",
				n, len(tracked), look, trips, len(cmds), rep.rowsInProgress, rep.strayWaiting, took.Round(time.Millisecond))
		}
		require.NoError(t, live.Shutdown(ctx))
	}
}

// A rolling upgrade: a worker of the first protocol version (rows set,
// heartbeat and registry entry written by hand as it wrote them, no
// incarnation) keeps its rows; the new workers' sweep reads the same keys.
// Every version writes its tracked rows back at each heartbeat, and none
// before this one takes the sweep turn without an owner column.
func TestBackstopSweepLeavesTheRowsOfAnOldVersionWorker(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	ctx := context.Background()
	prefix := testutil.Name("O")
	k := store.InstanceKeys(prefix, "old-1")
	setJobs(t, db, schema, "running", 1, 2)
	beat := func() {
		require.NoError(t, rdb.Set(ctx, k.Heartbeat, "alive", 2*time.Second).Err())
		require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "old-1").Err())
		require.NoError(t, rdb.SAdd(ctx, k.Rows, "1").Err())
		require.NoError(t, rdb.PExpire(ctx, k.Rows, 3*time.Second).Err())
	}
	beat()
	w, _ := newWorker(t, rdb, r, "new-1", rowsSweepTimings(WithKeyPrefix(prefix))...)
	first := time.Now()
	var rep sweepReport
	require.Eventually(t, func() bool {
		beat()
		var err error
		rep, err = w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep.strayReset > 0
	}, 10*time.Second, 50*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(first), 3*time.Second, "the gap is the longest TTL seen on a fleet member's keys")
	st := jobStates(t, db, schema)
	assert.Equal(t, "running", st[1], "the old worker's row")
	assert.Equal(t, "pending", st[2], "a row no set holds")
}

// TestBackstopSweepByRowVersionLeavesTheTurnToOwnerModeWorkers: during an
// owner-column rollout, a worker whose resetter has no owner column runs
// beside owner-mode workers, whose rows are in no rows set. Its sweep by
// row version must not take their rows for stray ones: while an owner-mode
// member is alive it leaves the sweep turn alone, and it takes it again
// once none is.
func TestBackstopSweepByRowVersionLeavesTheTurnToOwnerModeWorkers(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second)
	db := testutil.Postgres(t)
	ctx := context.Background()
	schema, ropts := jobsTable(t, db, false, 4)
	_, err := db.Exec(ctx, "ALTER TABLE "+schema+".jobs ADD COLUMN owner text")
	require.NoError(t, err)
	owned, err := pgxreset.New(db, append(ropts, postgres.WithOwnerColumn("owner"))...)
	require.NoError(t, err)
	plain, err := pgxreset.New(db, ropts...)
	require.NoError(t, err)
	prefix := testutil.Name("R")

	// The worker without the column holds the turn first.
	w, logs := newWorker(t, rdb, plain, "rows-1", rowsSweepTimings(WithKeyPrefix(prefix))...)
	require.NotNil(t, w.sweeper)
	require.True(t, w.sweeper.byVersion(), "no owner column: the sweep by row version")
	rep, err := w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.turnHeld)

	ow, _ := startWorker(t, rdb, owned, "owner-1", rowsSweepTimings(WithKeyPrefix(prefix))...)
	require.True(t, ow.Stats().OwnerMode)
	_, err = db.Exec(ctx, "UPDATE "+schema+".jobs SET state = 'running', owner = $1 WHERE id IN (1, 2)", ow.InstanceID())
	require.NoError(t, err)
	// Three rows TTLs: w's sweeps, called by hand for their reports, are
	// paced by the owner-mode worker's own sweep turns (the same recovery
	// interval), so the two contend for the turn throughout the window.
	window := 3 * time.Second
	deadline := time.Now().Add(window)
	owSweeps := &signals(ow).sweep
	owSweeps.Clear()
	turns := 0
	for time.Now().Before(deadline) {
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		w.peers.rlog.swept(rep, err)
		assert.False(t, rep.turnHeld, "the turn is left to the owner-mode worker")
		assert.Equal(t, []string{"owner-1"}, rep.ownerPeers)
		owSweeps.WaitOrTimeout(t)
		turns++
	}
	// About one turn a recovery interval, the fleet's timing (30 in the
	// window); a quarter of them leaves room for a loaded machine.
	require.GreaterOrEqual(t, turns, int(window/w.opts.recoveryInterval)/4, "w swept throughout the window, between the owner-mode worker's sweeps")
	st := jobStates(t, db, schema)
	assert.Equal(t, "running", st[1], "the owner-mode worker's rows stay in progress")
	assert.Equal(t, "running", st[2])
	assert.Contains(t, logs.String(), "left to the fleet's owner-mode workers")

	require.NoError(t, ow.Shutdown(ctx)) // its announcement goes with it
	require.Eventually(t, func() bool {
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return len(rep.ownerPeers) == 0 && rep.turnHeld
	}, 5*time.Second, 50*time.Millisecond, "no owner-mode member left: the sweep takes its turn again")
}

// TestBackstopSweepIsNotHeldByFinishedRowsLeftInASet: an Untrack whose
// reply was lost leaves a finished row in a live worker's set (§7). Rows
// sets that hold only such rows, while a stuck row is in progress in no
// set, are no sign of swapped statuses: the stuck row comes back (found by
// simulator seed 721, where the hold kept a dead worker's row in progress
// for good).
func TestBackstopSweepIsNotHeldByFinishedRowsLeftInASet(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	ctx := context.Background()
	opts := rowsSweepTimings(WithKeyPrefix(testutil.Name("S")))
	host, _ := startWorker(t, rdb, r, "host", append(opts, WithBackstopSweep(false))...)
	require.NoError(t, host.Track(ctx, 1))
	setJobs(t, db, schema, "finished", 1) // finished; its Untrack never arrived
	setJobs(t, db, schema, "running", 2)  // a dead worker's, its set gone
	w, _ := newWorker(t, rdb, r, "sweeper", opts...)
	require.Eventually(t, func() bool {
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err, "a finished row in a set is no misconfiguration")
		return rep.strayReset == 1
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, map[int64]string{1: "finished", 2: "pending", 3: "pending", 4: "pending"}, jobStates(t, db, schema))
}

// Issue 21, statuses swapped over an idle fleet (documented, not fixed:
// docs/safety.md §5b). No worker tracks anything and no worker's
// self-check has a block to judge, so nothing tells the sweeping worker
// that what it calls in progress is the table's queued status: it takes
// the queue for stuck rows and "resets" them to what it calls queued, the
// table's in-progress status. The queue stalls; nothing is lost: once the
// statuses are fixed, those rows are in progress in no set, and the sweep
// brings them back within its bound (a gap and two looks).
func TestSwappedStatusesOverAnIdleFleetStallTheQueueUntilFixed(t *testing.T) {
	rdb, db, schema, _ := backstopWorld(t, 5)
	ctx := context.Background()
	opts := []postgres.Option{postgres.WithSchema(schema), postgres.WithTable("jobs"), postgres.WithIDColumn("id"), postgres.WithStatusColumn("state"),
		postgres.WithDoneStatuses("finished", "error"), postgres.WithoutResetLedger()}
	swapped, err := pgxreset.New(db, append(opts, postgres.WithStatuses("pending", "running"))...)
	require.NoError(t, err)
	prefix := testutil.Name("SW")
	w, _ := newWorker(t, rdb, swapped, "swapped", rowsSweepTimings(WithKeyPrefix(prefix))...)
	require.Eventually(t, func() bool {
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep.strayReset > 0
	}, 10*time.Second, 50*time.Millisecond)
	for id, s := range jobStates(t, db, schema) {
		assert.Equal(t, "running", s, "row %d: the queue stalls, every row in the table's in-progress status", id)
	}

	right, err := pgxreset.New(db, append(opts, postgres.WithStatuses("running", "pending"))...)
	require.NoError(t, err)
	fixed, _ := newWorker(t, rdb, right, "fixed", rowsSweepTimings(WithKeyPrefix(prefix))...)
	start := time.Now()
	require.Eventually(t, func() bool {
		_, err := fixed.sweeper.runOnce(ctx)
		require.NoError(t, err)
		for _, s := range jobStates(t, db, schema) {
			if s != "pending" {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "once fixed, the rows come back")
	took := time.Since(start)
	t.Logf("5 rows back in the queue %v after the fix (rows TTL 1 s)", took.Round(10*time.Millisecond))
	assert.Less(t, took, time.Second+3*100*time.Millisecond+time.Second, "within the bound: gap + 2.2 × recovery interval (+ slack)")
}
