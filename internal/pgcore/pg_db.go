package pgcore

import (
	"context"
	"errors"
	"strings"
)

// The resetter's SQL (pgx_sql.go) and its flows (the reset, the plan, the
// ledger, the owner sweep and the schema check) are written once, on
// Resetter, over DB: a handle that runs statements and begins
// transactions. It has one implementation per Go database API: pgx's
// (in package pgxreset) and database/sql's (sqlDB, SQLDB).
// Both speak to PostgreSQL; what differs is how a statement is sent and
// how its rows come back.

// DB is a database handle as the shared resetter uses it.
type DB interface {
	Querier
	// begin starts a transaction, or a savepoint when the handle is a
	// transaction already.
	Begin(ctx context.Context) (Tx, error)
	// exec runs sql, which may hold several statements when args is empty.
	Exec(ctx context.Context, sql string, args ...any) error
}

// Tx is a transaction (or savepoint) begun by DB.begin.
type Tx interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) error
	Commit(ctx context.Context) error
	// nested reports whether this is a savepoint of the caller's
	// transaction rather than a transaction of the resetter's own.
	Nested() bool
	// rollback undoes the transaction; the caller bounds ctx, which may
	// outlive the transaction's own.
	Rollback(ctx context.Context) error
}

// Querier runs a query. args may hold []int64 and []string for
// parameters the statement casts to bigint[] and text[].
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows are a query's rows, read as pgx.Rows reads them. Scan takes
// *[]int64 and *[]string for bigint[] and text[] columns.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// errNoRow is queryRow's error for a query that returned no row.
var errNoRow = errors.New("no row")

// queryRow runs sql and scans its first row into dest: errNoRow when
// there is none. It reads the result to its end, so an error the server
// sends after the first row is returned too.
func queryRow(ctx context.Context, q Querier, sql string, args []any, dest ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return errNoRow
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// collect runs sql and returns scan's value of each row.
func collect[T any](ctx context.Context, q Querier, sql string, args []any, scan func(Rows) (T, error)) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// scanOne scans a row of one column.
func scanOne[T any](rows Rows) (T, error) {
	var v T
	err := rows.Scan(&v)
	return v, err
}

// sqlState returns the SQLSTATE code PostgreSQL sent with err, or "" when
// err carries none. pgx (*pgconn.PgError, native and through its stdlib)
// and lib/pq (*pq.Error) both name it SQLState().
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// serverMessage returns the message of the server's error in err, without
// the driver's decoration where the driver writes it as pgx does
// ("<severity>: <message> (SQLSTATE <code>)", pgx natively and through its
// stdlib driver), else err's text.
func serverMessage(err error) string {
	var se interface {
		error
		SQLState() string
	}
	if errors.As(err, &se) {
		text, suffix := se.Error(), " (SQLSTATE "+se.SQLState()+")"
		if i := strings.Index(text, ": "); i > 0 && strings.HasSuffix(text, suffix) {
			return text[i+2 : len(text)-len(suffix)]
		}
	}
	return err.Error()
}
