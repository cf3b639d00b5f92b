package testutil

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alya/recovery/internal/servers"
)

var (
	pgOnce sync.Once
	pgURL  string
	pgErr  error
)

// PostgresURL returns the URL of a PostgreSQL for tests: DATABASE_URL when
// set, otherwise a throwaway cluster started once per test binary from the
// local binaries (as the postgres user when running as root: PostgreSQL
// refuses root) and stopped by Main. It ends the test when none can be had.
func PostgresURL(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url
	}
	pgOnce.Do(func() {
		pgURL, pgErr = startPostgres()
		if errors.Is(pgErr, errNoPostgresBinaries) && dockerReachable() {
			pgURL, pgErr = containerPostgresURL()
		}
	})
	if pgErr != nil {
		Unavailable(t, "cannot start PostgreSQL: %v", pgErr)
	}
	return pgURL
}

// Postgres returns a pool whose search_path is a fresh schema of its own,
// dropped (with everything in it) when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		Unavailable(t, "connect to PostgreSQL: %v", redactErr(err, url))
	}
	defer admin.Close(context.Background())
	schema := Name("t_")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse database URL: %v", redactErr(err, url))
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open pool: %v", redactErr(err, url))
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, url); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			c.Close(ctx)
		}
	})
	return pool
}

// BatchSchema is the host schema of the design: batches of rows, each row
// with a status, plus the owner column the safety options use and a ledger
// that records every processing of a row.
const BatchSchema = `
CREATE TABLE batches (
	batchid bigint PRIMARY KEY,
	status  text NOT NULL DEFAULT 'inprog'
);
CREATE TABLE batchrows (
	rowid      bigint PRIMARY KEY,
	batchid    bigint NOT NULL REFERENCES batches,
	status     text NOT NULL DEFAULT 'queued',
	owner      text,
	recoveries int NOT NULL DEFAULT 0
);
CREATE INDEX batchrows_status ON batchrows (status);
CREATE TABLE recovery_ledger (
	instance_id text        NOT NULL,
	incarnation text        NOT NULL,
	row_id      bigint      NOT NULL,
	reset_at    timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (instance_id, incarnation, row_id)
);
`

// CreateBatch creates the BatchSchema tables in pool's schema and one batch
// (id 1, status inprog) of rows 1..n, all queued.
func CreateBatch(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, BatchSchema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO batches (batchid) VALUES (1)`); err != nil {
		t.Fatalf("insert batch: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO batchrows (rowid, batchid) SELECT g, 1 FROM generate_series(1, $1::bigint) g`, n); err != nil {
		t.Fatalf("insert rows: %v", err)
	}
}

// startPostgres starts a throwaway PostgreSQL (see servers.StartPostgres),
// stopped by Main.
func startPostgres() (string, error) {
	pg, err := servers.StartPostgres(context.Background())
	if err != nil {
		return "", err
	}
	onExit(pg.Stop)
	return pg.URL, nil
}

var errNoPostgresBinaries = servers.ErrNoPostgresBinaries

// PoolVia returns a pool like pool (same database, user and search_path)
// that connects through addr, a proxy in front of the same server; it is
// closed when the test ends.
func PoolVia(t testing.TB, pool *pgxpool.Pool, addr string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("proxy address %q: %v", addr, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatalf("proxy port %q: %v", port, err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	via, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open pool through %s: %v", addr, err)
	}
	t.Cleanup(via.Close)
	return via
}

// EnumItemsSchema is the user schema of issue 11: a table of the user's
// own with an enum status and none of the library's default names
// (statuses running and pending, owner column worker).
const EnumItemsSchema = `
CREATE TYPE job_state AS ENUM ('pending', 'running', 'done');
CREATE TABLE items (item_id bigint PRIMARY KEY, state job_state NOT NULL DEFAULT 'pending', worker text, retries int NOT NULL DEFAULT 0);`

// PgBouncer starts a PgBouncer in transaction pooling mode in front of the
// PostgreSQL behind pool (servers.StartPgBouncer), stopped when the test
// ends. Without a pgbouncer binary the test is skipped, saying so (failed
// under RECOVERY_REQUIRE_INTEGRATION=1). Connect with PoolVia(t, pool,
// b.Addr); search_path does not pass through a pooler in transaction
// mode, so name the schema in the statements (WithSchema).
func PgBouncer(t testing.TB, pool *pgxpool.Pool) *servers.PgBouncer {
	t.Helper()
	if _, err := servers.PgBouncerBinary(); err != nil {
		Unavailable(t, "PgBouncer: %v", err)
	}
	c := pool.Config().ConnConfig
	if c.Host == "" || c.Host[0] == '/' {
		Unavailable(t, "PgBouncer: the test PostgreSQL listens on a Unix socket (%s), not TCP", c.Host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := servers.StartPgBouncer(ctx, c.Host, int(c.Port), c.User)
	if err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	t.Cleanup(b.Stop)
	// Open its three server connections now, three transactions at once,
	// so round robin hands consecutive transactions different ones from
	// the first.
	via := PoolVia(t, pool, b.Addr)
	var txs []pgx.Tx
	for range 3 {
		tx, err := via.Begin(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, "SELECT 1")
		}
		if err != nil {
			t.Fatalf("open pgbouncer's server connections: %v", err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		_ = tx.Rollback(ctx)
	}
	via.Close()
	return b
}
