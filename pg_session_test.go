package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// Start refuses a session that cannot write (issue 20, item 7): with
// default_transaction_read_only on for the role, Start returns ErrReadOnly
// naming the setting and where it comes from, and writes nothing to Redis;
// a reset on such a session fails with ErrReadOnly too.
func TestStartRefusesAReadOnlySession(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		rdb := testutil.Redis(t)
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 2)
		take(t, db, "dead", 1, 2)
		ro := pgtest.PoolAsReadOnlyRole(t, db)
		r := impl.Must(t, ro, postgres.WithOwnerColumn("owner"))
		prefix := testutil.Name("RO")
		// Rows sets: a Start in owner mode also resets rows a predecessor
		// left under its ID, which would fail on its own.
		w, _ := newWorker(t, rdb, r, "ro-worker", WithKeyPrefix(prefix), WithRowsSets())

		err := w.Start(context.Background())
		if impl.Name == "libpq" {
			// lib/pq begins every transaction READ WRITE, overriding the
			// role's default: its resets can write, and Start says so.
			require.NoError(t, err)
			res, err := r.ResetOwner(context.Background(), OwnerReset{Owner: "dead"})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			return
		}
		require.ErrorIs(t, err, ErrReadOnly)
		assert.Contains(t, err.Error(), "default_transaction_read_only set by the user")
		assert.False(t, registered(t, rdb, prefix, "ro-worker"), "nothing written to Redis")

		_, err = r.ResetOwner(context.Background(), OwnerReset{Owner: "dead"})
		require.ErrorIs(t, err, ErrReadOnly, "a reset refused as read-only says so")
		assert.Equal(t, "inprog", statuses(t, db)[1])

		// The same role writing: Start succeeds.
		_, err = db.Exec(context.Background(), `ALTER ROLE `+ro.Config().ConnConfig.User+` RESET default_transaction_read_only`)
		require.NoError(t, err)
		ro.Reset() // new sessions read the role's settings again
		w2, _ := newWorker(t, rdb, r, "ro-worker-2", WithKeyPrefix(prefix))
		require.NoError(t, w2.Start(context.Background()))
	})
}

// Start warns once when the session has no
// idle_in_transaction_session_timeout (issue 20, item 5), and not when it
// has one.
func TestStartWarnsWithoutIdleInTransactionSessionTimeout(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	const warning = "the database session has no idle_in_transaction_session_timeout"

	none := poolWithSetting(t, db, "idle_in_transaction_session_timeout", "0")
	_, logs := startWorker(t, rdb, fencedResetter(t, none), "idle-0", WithKeyPrefix(testutil.Name("I")))
	assert.Equal(t, 1, logs.Count(warning), logs.String())
	assert.Contains(t, logs.String(), `"level":"WARN","msg":"`+warning)

	set := poolWithSetting(t, db, "idle_in_transaction_session_timeout", "60000")
	_, logs = startWorker(t, rdb, fencedResetter(t, set), "idle-60", WithKeyPrefix(testutil.Name("I")))
	assert.Zero(t, logs.Count(warning), logs.String())
}

// poolWithSetting returns a pool like db whose sessions set the run-time
// parameter name to value; it is closed when the test ends.
func poolWithSetting(t *testing.T, db *pgxpool.Pool, name, value string) *pgxpool.Pool {
	t.Helper()
	cfg := db.Config().Copy()
	cfg.ConnConfig.RuntimeParams[name] = value
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Start reads the session's statement_timeout and lock_timeout and warns
// when statement_timeout is shorter than the reset timeout (resets then
// size their chunks to fit it), naming both; not when it is off or
// longer.
func TestStartWarnsWhenStatementTimeoutIsShorterThanTheResetTimeout(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	const warning = "the database session's statement_timeout is shorter than the reset timeout"
	timings := WithTimings(Timings{ResetTimeout: 2 * time.Second})

	short := poolWithSetting(t, poolWithSetting(t, db, "statement_timeout", "100"), "lock_timeout", "50")
	_, logs := startWorker(t, rdb, fencedResetter(t, short), "stmt-100", WithKeyPrefix(testutil.Name("S")), timings)
	assert.Equal(t, 1, logs.Count(warning), logs.String())
	assert.Contains(t, logs.String(), `"statement_timeout":100000000,"reset_timeout":2000000000,"lock_timeout":50000000`)

	for _, v := range []string{"0", "2000", "60000"} {
		pool := poolWithSetting(t, db, "statement_timeout", v)
		_, logs := startWorker(t, rdb, fencedResetter(t, pool), "stmt-"+v, WithKeyPrefix(testutil.Name("S")), timings)
		assert.Zero(t, logs.Count(warning), "statement_timeout %s ms: %s", v, logs.String())
	}
}

// Start refuses a hot standby (issue 20, item 7): the resetter's session
// is read-only because the server is in recovery, and the error says so.
// The standby streams from a primary of its own, started for this test.
func TestStartRefusesAStandby(t *testing.T) {
	t.Parallel()
	testutil.PostgresURL(t) // skips under -short, or without PostgreSQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary, err := servers.StartPostgres(ctx)
	if err != nil {
		testutil.Unavailable(t, "start a primary: %v", err)
	}
	t.Cleanup(primary.Stop)
	pdb, err := pgxpool.New(ctx, primary.URL)
	require.NoError(t, err)
	t.Cleanup(pdb.Close)
	_, err = pdb.Exec(ctx, testutil.BatchSchema)
	require.NoError(t, err)
	standby, err := servers.StartStandby(ctx, primary)
	require.NoError(t, err)
	t.Cleanup(standby.Stop)
	sdb, err := pgxpool.New(ctx, standby.URL)
	require.NoError(t, err)
	t.Cleanup(sdb.Close)
	var inRecovery bool
	require.NoError(t, sdb.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery, "a standby")

	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		r := impl.Must(t, sdb, postgres.WithOwnerColumn("owner"))
		prefix := testutil.Name("SB")
		w, _ := newWorker(t, testutil.Redis(t), r, "on-standby", WithKeyPrefix(prefix), WithRowsSets())
		err := w.Start(ctx)
		require.ErrorIs(t, err, ErrReadOnly)
		assert.Contains(t, err.Error(), "the server is a standby in recovery", "lib/pq's BEGIN READ WRITE is refused with this; the others read pg_is_in_recovery()")
	})
}
