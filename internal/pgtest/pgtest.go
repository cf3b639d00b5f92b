// Package pgtest holds the PostgreSQL test helpers the resetter's
// packages share: database/sql handles through lib/pq and through pgx's
// stdlib on a test's schema, roles with chosen grants, and small reads.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// LibpqDB opens a database/sql handle through lib/pq to the server,
// database, role and schema (search_path) of db, with extra connection
// parameters, closed when the test ends.
func LibpqDB(t testing.TB, db *pgxpool.Pool, extra url.Values) *sql.DB {
	t.Helper()
	cc := db.Config().ConnConfig
	u := url.URL{Scheme: "postgres", Path: "/" + cc.Database, User: url.User(cc.User)}
	if cc.Password != "" {
		u.User = url.UserPassword(cc.User, cc.Password)
	}
	q := url.Values{"search_path": {cc.RuntimeParams["search_path"]}, "sslmode": {"require"}}
	if cc.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	for k, v := range extra {
		q[k] = v
	}
	if strings.HasPrefix(cc.Host, "/") { // a Unix socket's directory
		q.Set("host", cc.Host)
		q.Set("port", strconv.Itoa(int(cc.Port)))
	} else {
		u.Host = net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
	}
	u.RawQuery = q.Encode()
	c, err := pq.NewConnector(u.String())
	require.NoError(t, err, "lib/pq connector")
	h := sql.OpenDB(c)
	h.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// StdlibDB opens a database/sql handle through pgx's stdlib on db's pool
// (its schema included), closed when the test ends.
func StdlibDB(t testing.TB, db *pgxpool.Pool) *sql.DB {
	t.Helper()
	h := stdlib.OpenDBFromPool(db)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// CurrentSchema returns the schema testutil.Postgres made for the test.
func CurrentSchema(t testing.TB, db *pgxpool.Pool) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s))
	return s
}

// AuditTrigger adds to batchrows an AFTER UPDATE trigger that records
// every change of status in batchrows_audit, and spends CPU in proportion
// to work on each row changed (0: an ordinary audit trigger; 600: 0.1 to
// 0.5 ms a row on a loaded 2-core machine).
func AuditTrigger(t testing.TB, db *pgxpool.Pool, work int) {
	t.Helper()
	_, err := db.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE batchrows_audit (rowid bigint NOT NULL, old_status text, new_status text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION batchrows_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO batchrows_audit (rowid, old_status, new_status) VALUES (NEW.rowid, OLD.status, NEW.status);
	IF %d > 0 THEN PERFORM count(*) FROM generate_series(1, %d); END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER batchrows_audit AFTER UPDATE ON batchrows FOR EACH ROW
	WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION batchrows_audit();`, work, work))
	require.NoError(t, err)
}

// ByRow runs sql, which selects (rowid, value), and returns rowid -> value.
func ByRow[T any](t testing.TB, db *pgxpool.Pool, sql string) map[int64]T {
	t.Helper()
	rows, err := db.Query(context.Background(), sql)
	require.NoError(t, err)
	out := map[int64]T{}
	for rows.Next() {
		var id int64
		var v T
		require.NoError(t, rows.Scan(&id, &v))
		out[id] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// PoolAsNewRole returns a pool on db's schema for a new role (with
// password, if any) given grants, a format with %[1]s for the role and
// %[2]s for the schema, and the role's name. The role is dropped when the
// test ends.
func PoolAsNewRole(t testing.TB, db *pgxpool.Pool, password, grants string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	s := CurrentSchema(t, db)
	role := testutil.Name("r_")
	create := `CREATE ROLE ` + role + ` LOGIN`
	if password != "" {
		create += ` PASSWORD '` + password + `'`
	}
	_, err := db.Exec(ctx, create)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = db.Exec(ctx, `DROP ROLE `+role)
	})
	_, err = db.Exec(ctx, fmt.Sprintf(grants, role, s))
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(testutil.PostgresURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	cfg.ConnConfig.RuntimeParams["search_path"] = s
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close) // before the role is dropped
	return pool, role
}

// PoolAsReadOnlyRole returns a pool on db's schema for a new role that may
// read and write the batch tables but whose transactions are read-only by
// default (ALTER ROLE ... SET default_transaction_read_only = on: what a
// replica or a read endpoint gives its users).
func PoolAsReadOnlyRole(t testing.TB, db *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	pool, _ := PoolAsNewRole(t, db, "", `GRANT USAGE ON SCHEMA %[2]s TO %[1]s;
		GRANT SELECT, UPDATE ON batchrows TO %[1]s;
		GRANT SELECT, INSERT, DELETE ON recovery_ledger TO %[1]s;
		ALTER ROLE %[1]s SET default_transaction_read_only = on`)
	return pool
}

// OtherSession runs sql in a transaction of a session of its own on db's
// database, and leaves the transaction open, holding the locks sql took,
// until the returned function or the test's end rolls it back.
func OtherSession(t testing.TB, db *pgxpool.Pool, sql string, args ...any) (end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	done := false
	end = func() {
		if done {
			return
		}
		done = true
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}
	t.Cleanup(end)
	return end
}
