package recovery

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// setStatus sets the status of the given rows.
func setStatus(t *testing.T, db *pgxpool.Pool, status string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE batchrows SET status = $1 WHERE rowid = ANY($2)`, status, ids)
	require.NoError(t, err)
}

// statuses returns rowid -> status of every row.
func statuses(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	return pgtest.ByRow[string](t, db, `SELECT rowid, status FROM batchrows`)
}

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

// assertRequeued asserts that each of ids is queued again with no owner,
// as a reset by an owner-fenced resetter leaves it.
func assertRequeued(t *testing.T, db *pgxpool.Pool, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		s, o := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d", id)
		assert.Nil(t, o, "row %d: owner cleared on reset", id)
	}
}

func fencedResetter(t testing.TB, db *pgxpool.Pool, opts ...postgres.Option) *pgxreset.Resetter {
	t.Helper()
	r, err := pgxreset.New(db, append([]postgres.Option{postgres.WithOwnerColumn("owner")}, opts...)...)
	require.NoError(t, err)
	return r
}

// bothModes are the options of a worker in owner mode (none: a fenced
// resetter's default) and in rows-set mode, for tests run in both.
var bothModes = []struct {
	name string
	opts []Option
}{{"owner mode", nil}, {"rows sets", []Option{WithRowsSets()}}}

// onRealServers returns a real Redis, a fresh PostgreSQL schema holding a
// batch of rows 1..n (testutil.BatchSchema, reset ledger included), and a
// fresh key prefix starting with prefix.
func onRealServers(t *testing.T, n int, prefix string) (*redis.Client, *pgxpool.Pool, string) {
	t.Helper()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, n)
	return rdb, db, testutil.Name(prefix)
}

// pgProxy returns a netfault proxy in front of the PostgreSQL behind db,
// closed when the test ends; testutil.PoolVia connects through it.
func pgProxy(t *testing.T, db *pgxpool.Pool) *netfault.Proxy {
	t.Helper()
	proxy, err := netfault.NewProxy(pgAddr(db))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	return proxy
}

// pgAddr returns host:port of the server behind pool.
func pgAddr(pool *pgxpool.Pool) string {
	c := pool.Config().ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

// recoveries returns rowid -> recovery count.
func recoveries(t *testing.T, db *pgxpool.Pool) map[int64]int {
	t.Helper()
	return pgtest.ByRow[int](t, db, `SELECT rowid, recoveries FROM batchrows`)
}
