package pgcore

import (
	"context"
	"database/sql"
	"time"
)

// SQLExecer is sqlreset.Execer: what an sqlreset.Resetter calls on its database/sql handle:
// *sql.DB, *sql.Conn and *sql.Tx satisfy it, and so do sqlx's DB and Tx
// and the DBTX interface sqlc generates. The driver must speak to
// PostgreSQL: lib/pq, or pgx through github.com/jackc/pgx/v5/stdlib.
//
// A handle with a BeginTx method (*sql.DB, *sql.Conn, *sqlx.DB) gets a
// transaction of its own for every reset. Any other handle is taken to
// be a transaction already (*sql.Tx, *sqlx.Tx): the resetter then works
// inside a savepoint of it, which the caller's COMMIT or ROLLBACK
// decides.
//
// Give a Worker a *sql.DB: its recovery loop, RecoverNow and Release may
// reset concurrently, which a *sql.Conn or a *sql.Tx does not allow, and
// recovery deletes a dead peer's rows set once ResetRows returns, which
// with a *sql.Tx is before the caller's transaction commits. A Conn or Tx
// suits a resetter used on its own, by one goroutine.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLDB returns db as the DB the resetter runs over: statements through
// ExecContext and QueryContext, with array parameters and results in
// PostgreSQL's text form, and a transaction of its own for every reset
// when db has BeginTx, else a savepoint of the transaction db is.
func SQLDB(db SQLExecer) DB { return sqlDB{db} }

// sqlBeginner is a database/sql handle that begins transactions.
type sqlBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// savepoint is the name of the savepoint the resetter works in when its
// handle is a transaction. The resetter never nests its own transactions,
// so one name is enough; PostgreSQL allows the caller to use it too.
const savepoint = "recovery_reset"

// sqlDB is DB over database/sql.
type sqlDB struct{ db SQLExecer }

// sqlStats is a database/sql pool (*sql.DB, *sqlx.DB, a host's type
// embedding one).
type sqlStats interface{ Stats() sql.DBStats }

// PoolStats reads d's pool, when its handle is one. It implements
// Pooled.
func (d sqlDB) PoolStats() (PoolStats, bool) {
	p, ok := d.db.(sqlStats)
	if !ok {
		return PoolStats{}, false
	}
	st := p.Stats()
	return PoolStats{InUse: st.InUse, Max: st.MaxOpenConnections}, true
}

// explain returns err, the failure of a call on d's handle begun at
// start, as a wait for a connection (PoolWait) when the pool has every
// connection in use after the call's deadline: database/sql waits for one
// inside the call and reports only the context's error. The call runs on
// the host's handle as the host gave it, so that a type wrapping
// *sql.DB keeps its methods.
func (d sqlDB) explain(err error, start time.Time) error {
	if err == nil {
		return nil
	}
	if st, ok := d.PoolStats(); ok {
		return PoolWait(err, time.Since(start), st)
	}
	return err
}

func (d sqlDB) Begin(ctx context.Context) (Tx, error) {
	if b, ok := d.db.(sqlBeginner); ok {
		start := time.Now()
		tx, err := b.BeginTx(ctx, nil)
		if err != nil {
			return nil, d.explain(err, start)
		}
		return sqlTx{ex: tx, tx: tx}, nil
	}
	if _, err := d.db.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return nil, err
	}
	return sqlTx{ex: d.db}, nil
}

func (d sqlDB) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	start := time.Now()
	rows, err := sqlQuery(ctx, d.db, sql, args)
	return rows, d.explain(err, start)
}

func (d sqlDB) Exec(ctx context.Context, sql string, args ...any) error {
	start := time.Now()
	_, err := d.db.ExecContext(ctx, sql, sqlArgs(args)...)
	return d.explain(err, start)
}

// sqlTx is Tx over a *sql.Tx, or over a savepoint of the caller's
// transaction when tx is nil.
type sqlTx struct {
	ex SQLExecer
	tx *sql.Tx
}

func (t sqlTx) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return sqlQuery(ctx, t.ex, sql, args)
}

func (t sqlTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.ex.ExecContext(ctx, sql, sqlArgs(args)...)
	return err
}

func (t sqlTx) Nested() bool { return t.tx == nil }

func (t sqlTx) Commit(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Commit()
	}
	_, err := t.ex.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint)
	return err
}

// rollback rolls the transaction back, or the savepoint, which it then
// releases so that the caller's transaction is left as it was.
func (t sqlTx) Rollback(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Rollback()
	}
	if _, err := t.ex.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return err
	}
	_, err := t.ex.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint)
	return err
}

func sqlQuery(ctx context.Context, ex SQLExecer, query string, args []any) (Rows, error) {
	rows, err := ex.QueryContext(ctx, query, sqlArgs(args)...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

// sqlArgs turns the array arguments the shared statements use ([]int64,
// []string) into PostgreSQL's text form; the statements cast them.
func sqlArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case []int64:
			out[i] = formatInt64Array(v)
		case []string:
			out[i] = formatTextArray(v)
		default:
			out[i] = a
		}
	}
	return out
}

// sqlRows is Rows over *sql.Rows.
type sqlRows struct {
	rows     *sql.Rows
	closeErr error
}

func (r *sqlRows) Next() bool { return r.rows.Next() }

// Scan scans into dest, reading bigint[] and text[] columns from their
// text form into *[]int64 and *[]string.
func (r *sqlRows) Scan(dest ...any) error {
	conv := make([]any, len(dest))
	for i, d := range dest {
		switch v := d.(type) {
		case *[]int64:
			conv[i] = int64Array{v}
		case *[]string:
			conv[i] = textArray{v}
		default:
			conv[i] = d
		}
	}
	return r.rows.Scan(conv...)
}

func (r *sqlRows) Err() error {
	if err := r.rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

func (r *sqlRows) Close() {
	if err := r.rows.Close(); err != nil && r.closeErr == nil {
		r.closeErr = err
	}
}
