package recovery

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	"github.com/alya/recovery/postgres/sqlreset"
)

// bouncedResetter returns a resetter of impl whose connections go through
// PgBouncer at addr, configured as a user would: the pgx pool in pgx's
// default mode (it caches named prepared statements), pgx's stdlib with
// default_query_exec_mode=exec and lib/pq with binary_parameters=yes, as
// docs/operations.md says.
func bouncedResetter(t *testing.T, impl resetterImpl, db *pgxpool.Pool, addr string, opts ...postgres.Option) pgResetterAPI {
	t.Helper()
	via := testutil.PoolVia(t, db, addr)
	opts = append([]postgres.Option{postgres.WithSchema(pgtest.CurrentSchema(t, db))}, opts...)
	switch impl.Name {
	case "pgx":
		r, err := pgxreset.New(via, opts...)
		require.NoError(t, err)
		return r
	case "stdlib":
		cfg := via.Config().Copy()
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // default_query_exec_mode=exec
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		h := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = h.Close() })
		r, err := sqlreset.New(h, opts...)
		require.NoError(t, err)
		return r
	}
	// lib/pq parses and runs a statement with arguments in two round
	// trips, between which PgBouncer may switch server connections
	// outside a transaction; binary_parameters=yes sends them in one.
	r, err := sqlreset.New(pgtest.LibpqDB(t, via, url.Values{"binary_parameters": {"yes"}}), opts...)
	require.NoError(t, err)
	return r
}

// The resetters work through PgBouncer in transaction pooling mode (issue
// 20): every transaction may run on another server connection, so a named
// prepared statement made in one is gone in the next. A worker starts
// (schema and session checks) and recovers three dead peers by owner
// through it, and a resetter with the reset ledger resets a rows set,
// statement after statement on server connections handed out round robin.
func TestRecoveryThroughPgBouncerInTransactionPoolingMode(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		rdb := testutil.Redis(t)
		db := testutil.Postgres(t)
		b := testutil.PgBouncer(t, db)
		t.Logf("pgbouncer %s at %s", b.Version, b.Addr)
		testutil.CreateBatch(t, db, 15)
		ctx := context.Background()
		prefix := testutil.Name("B")
		for i := range 3 {
			peer := fmt.Sprintf("dead-%d", i+1)
			take(t, db, peer, int64(4*i+1), int64(4*i+2), int64(4*i+3), int64(4*i+4))
			require.NoError(t, rdb.SAdd(ctx, prefix+"_WORKER_REGISTRY", peer).Err())
		}

		r := bouncedResetter(t, impl, db, b.Addr, postgres.WithOwnerColumn("owner"))
		w, logs := startWorker(t, rdb, r, "bounced", WithKeyPrefix(prefix))
		require.True(t, w.Stats().OwnerMode)
		waitTurns(t, &signals(w).scan, 10*time.Second, func() bool { // the first scan runs at Start
			return w.Stats().PeersRecovered == 3 || w.Stats().Errors > 0
		})
		require.Zero(t, w.Stats().Errors, logs.String())
		assert.Equal(t, uint64(12), w.Stats().RowsRecovered)
		assertRequeued(t, db, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)

		// The ledger's path: advisory lock, ledger read, reset, record.
		setStatus(t, db, "inprog", 13, 14, 15)
		lr := bouncedResetter(t, impl, db, b.Addr)
		for i, ids := range [][]int64{{13}, {14}, {15}} {
			res, err := lr.ResetRows(ctx, RowsReset{InstanceID: "dead-4", Incarnation: fmt.Sprint(i), RowIDs: ids})
			require.NoError(t, err, "reset %d", i)
			assert.Equal(t, int64(1), res.Changed)
		}
		owners, err := r.InProgressOwners(ctx)
		require.NoError(t, err)
		assert.Empty(t, owners)
	})
}
