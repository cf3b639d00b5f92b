package recovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// selfCheckTimings check every 300ms.
func selfCheckTimings(prefix string) []Option {
	return []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      time.Second,
		HeartbeatInterval: 300 * time.Millisecond,
		RecoveryInterval:  time.Second,
		RowsTTL:           3 * time.Second,
	})}
}

// takeBlock marks rows in progress with the given status and owner, as a
// host's fetch would, and tracks them.
func takeBlock(t *testing.T, db *pgxpool.Pool, w *Worker, status, owner string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE batchrows SET status = $1, owner = $2 WHERE rowid = ANY($3)`, status, owner, ids)
	require.NoError(t, err)
	require.NoError(t, w.Track(context.Background(), ids...))
}

func TestSelfCheckFindsMisconfigurationsWithinTwoIntervalsOfTheFirstBlock(t *testing.T) {
	cases := []struct {
		name   string
		opts   []postgres.Option
		status string
		owner  func(w *Worker) string
	}{
		{"statuses swapped", []postgres.Option{postgres.WithStatuses("queued", "inprog")}, "inprog",
			func(*Worker) string { return "" }},
		{"misspelt in-progress status", []postgres.Option{postgres.WithStatuses("in_progress", "queued")}, "inprog",
			func(*Worker) string { return "" }},
		{"owner column filled with the hostname", []postgres.Option{postgres.WithOwnerColumn("owner")}, "inprog",
			func(*Worker) string { return "host-7" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 10)
			r, err := pgxreset.New(db, c.opts...)
			require.NoError(t, err)
			rec := &recorder{}
			w, logs := startWorker(t, rdb, r, "w", append(selfCheckTimings(testutil.Name("SC")), WithObserver(rec.Observe))...)
			require.NoError(t, w.Healthy())
			start := time.Now()
			takeBlock(t, db, w, c.status, c.owner(w), 1, 2, 3)

			waitTurns(t, &signals(w).look, 3*time.Second, func() bool { return w.Healthy() != nil },
				"Healthy fails within about two heartbeat intervals")
			t.Logf("found %v after the block was taken", time.Since(start).Round(time.Millisecond))
			err = w.Healthy()
			assert.ErrorIs(t, err, ErrMisconfigured)
			assert.Contains(t, err.Error(), `has status "inprog"`)
			assert.True(t, w.Stats().Misconfigured)
			assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"self-check: the rows this worker tracks do not look like its rows in progress`))
			require.NoError(t, w.Shutdown(context.Background()))
			require.Len(t, rec.of(EventMisconfigured), 1)
			assert.ErrorIs(t, rec.of(EventMisconfigured)[0].Err, ErrMisconfigured)
		})
	}
}

func TestSelfCheckVerifiesACorrectConfigurationAndStops(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	w, _ := startWorker(t, rdb, r, "w", selfCheckTimings(testutil.Name("SC"))...)
	takeBlock(t, db, w, "inprog", w.InstanceID(), 1, 2, 3)

	waitTurns(t, &signals(w).look, 3*time.Second, func() bool { return w.checker.verdict.Load() == 1 })
	checks := w.checker.checks.Load()
	beats := w.Stats().Heartbeats // the check would run beside each
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().Heartbeats >= beats+3 })
	assert.Equal(t, checks, w.checker.checks.Load(), "no more reads once verified")
	assert.NoError(t, w.Healthy())
	assert.False(t, w.Stats().Misconfigured)
}

// A host marks a row done, then untracks it: in between, the row is
// tracked and not in progress. That must never raise the alarm, even when
// the host takes longer than a heartbeat interval to untrack it and a
// check reads it in that state.
func TestSelfCheckRaisesNoAlarmForRowsFinishedJustBeforeTheirUntrack(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 200)
	r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	w, _ := startWorker(t, rdb, r, "w", selfCheckTimings(testutil.Name("SC"))...)
	ctx := context.Background()

	for id := int64(1); id <= 8; id++ {
		takeBlock(t, db, w, "inprog", w.InstanceID(), id)
		_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'done' WHERE rowid = $1`, id)
		require.NoError(t, err)
		checks := w.checker.checks.Load() // finished, not yet untracked, until a check has read it so
		waitTurns(t, &signals(w).look, 5*time.Second, func() bool {
			return w.checker.checks.Load() > checks || w.checker.verdict.Load() != 0
		})
		require.NoError(t, w.Untrack(id))
		if w.checker.verdict.Load() == 1 {
			// A look (the quick one after Track, on a loaded machine) read
			// the row before the test marked it done: verified, and no
			// look reads rows any more. No alarm is what still holds.
			t.Logf("verified at row %d: a look saw it in progress", id)
			require.NoError(t, w.Healthy())
			return
		}
	}
	assert.NotZero(t, w.checker.checks.Load(), "checks read rows in the finished-not-untracked state")
	assert.NoError(t, w.Healthy())
	assert.Equal(t, int32(0), w.checker.verdict.Load(), "neither verified nor alarmed: no row was ever seen in progress")
}

// TestAMisconfiguredWorkerLeavesADeadPeersRowsSetAlone: with statuses
// swapped, a dead peer's rows in progress show what this worker calls
// queued; its recovery would count them settled, log rows_reset=0 at Info
// and delete the set (issue 21's third case: 22 rows stuck for good). Once
// its own self-check has raised the alarm, it takes no verdict: the peer,
// its rows set and its rows stay for a worker configured right.
func TestAMisconfiguredWorkerLeavesADeadPeersRowsSetAlone(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	ctx := context.Background()
	testutil.CreateBatch(t, db, 6)
	prefix := testutil.Name("MC")
	r, err := pgxreset.New(db, postgres.WithStatuses("queued", "inprog")) // swapped
	require.NoError(t, err)
	w, logs := startWorker(t, rdb, r, "w", selfCheckTimings(prefix)...)
	takeBlock(t, db, w, "inprog", "", 5, 6)
	waitTurns(t, &signals(w).look, 3*time.Second, func() bool { return errors.Is(w.Healthy(), ErrMisconfigured) })

	// A peer dies holding rows 1-4 (no heartbeat, its rows set left).
	keys := store.InstanceKeys(prefix, "dead")
	_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead' WHERE rowid <= 4`)
	require.NoError(t, err)
	require.NoError(t, rdb.SAdd(ctx, keys.Rows, 1, 2, 3, 4).Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "dead").Err())

	_, err = w.recoverNow(ctx)
	require.ErrorIs(t, err, ErrMisconfigured, "the recovery is held")
	assert.Equal(t, int64(4), rdb.SCard(ctx, keys.Rows).Val(), "the dead peer's rows set is kept")
	assert.True(t, rdb.SIsMember(ctx, store.RegistryKey(prefix), "dead").Val(), "and its registry entry")
	var inprog int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status = 'inprog' AND owner = 'dead'`).Scan(&inprog))
	assert.Equal(t, 4, inprog)
	// recoverNow held the recovery and logged it before it returned (or a
	// scan of w's loop did first: the log is written once per peer).
	assert.Equal(t, 1, logs.Count("recovery of dead peer held"))
}

// Issue 21: a peer found dead before this worker's own alarm. With
// statuses swapped, a worker that has not fetched yet (its self-check has
// no verdict) finds a dead peer whose rows in progress read as what it
// calls queued: before, it counted them settled and dropped the peer's
// rows set (rows stuck until the statuses were fixed and the backstop
// sweep came by). Now it holds the recovery until it has seen a row of its
// own in progress; its first block raises the alarm, which holds it for
// good; a worker configured right then recovers the peer. A worker
// configured right holds nothing once it has fetched.
func TestAPeerFoundDeadBeforeTheSelfChecksVerdictIsLeftAlone(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	ctx := context.Background()
	testutil.CreateBatch(t, db, 8)
	prefix := testutil.Name("MV")
	swapped, err := pgxreset.New(db, postgres.WithStatuses("queued", "inprog"))
	require.NoError(t, err)
	// Recoveries by hand only: a scan of w's own loop holding the claim
	// would make RecoverNow skip the peer.
	w, logs := startWorker(t, rdb, swapped, "w", append(selfCheckTimings(prefix), WithTimings(Timings{RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}))...)
	// The loop's first scan, at Start, is over before the peer dies: one
	// delayed past that (a loaded machine) claimed the peer, and RecoverNow
	// skipped it.
	signals(w).scan.WaitOrTimeout(t)

	// A peer died holding rows 1-4 (no heartbeat, its rows set left).
	keys := store.InstanceKeys(prefix, "dead")
	_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid <= 4`)
	require.NoError(t, err)
	require.NoError(t, rdb.SAdd(ctx, keys.Rows, 1, 2, 3, 4).Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "dead").Err())

	_, err = w.recoverNow(ctx)
	require.ErrorIs(t, err, errUnverified, "held before any block of its own")
	assert.Equal(t, int64(4), rdb.SCard(ctx, keys.Rows).Val(), "the dead peer's rows set is kept")
	assert.True(t, rdb.SIsMember(ctx, store.RegistryKey(prefix), "dead").Val(), "and its registry entry")
	assert.Equal(t, 1, logs.Count("recovery of dead peer held until this worker has seen a row of its own in progress"))

	takeBlock(t, db, w, "inprog", "", 5, 6) // its first block: the alarm
	waitTurns(t, &signals(w).look, 3*time.Second, func() bool { return errors.Is(w.Healthy(), ErrMisconfigured) })
	_, err = w.recoverNow(ctx)
	require.ErrorIs(t, err, ErrMisconfigured)

	right, err := pgxreset.New(db)
	require.NoError(t, err)
	c, _ := startWorker(t, rdb, right, "c", selfCheckTimings(prefix)...)
	takeBlock(t, db, c, "inprog", "", 7, 8)
	waitTurns(t, &signals(c).look, 3*time.Second, func() bool { return c.checker.verdict.Load() == 1 })
	require.Eventually(t, func() bool {
		_, _ = c.recoverNow(ctx)
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE rowid <= 4 AND status = 'queued'`).Scan(&n))
		return n == 4
	}, 5*time.Second, 50*time.Millisecond, "a worker configured right recovers the peer")
}
