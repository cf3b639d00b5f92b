package recovery

import (
	"context"
	"database/sql"
)

// SQLExecer is what an SQLResetter calls on its database/sql handle:
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
// Give a Worker a *sql.DB: its recovery loop, ops.RecoverNow and Release may
// reset concurrently, which a *sql.Conn or a *sql.Tx does not allow, and
// recovery deletes a dead peer's rows set once ResetRows returns, which
// with a *sql.Tx is before the caller's transaction commits. A Conn or Tx
// suits an SQLResetter used on its own, by one goroutine.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLResetter is PgxResetter for database/sql: the same options, the same
// statements and the same guarantees (the status guard, owner fencing,
// the recovery count and quarantine, the reset ledger, the sweep by owner,
// the plan, the schema check and the row states of the self-check), over
// an SQLExecer instead of a PgxExecer. It implements every interface
// PgxResetter implements, so a Worker given an SQLResetter WithOwnerColumn
// runs in owner mode as it would with a PgxResetter.
//
// Array parameters and results (row IDs, statuses, enum labels) travel in
// PostgreSQL's text form, which every driver passes through, so no
// driver-specific array type is needed.
//
// It never closes the handle it was given.
type SQLResetter struct {
	pgResetter
	db SQLExecer
}

// NewSQLResetter returns an SQLResetter over db, or an error wrapping
// ErrInvalidConfig that names the bad option. It takes the options of
// NewPgxResetter and does not contact the database.
func NewSQLResetter(db SQLExecer, opts ...ResetterOption) (*SQLResetter, error) {
	r := &SQLResetter{db: db}
	if err := r.init(db, sqlDB{db}, "SQLResetter", opts); err != nil {
		return nil, err
	}
	return r, nil
}

// sqlBeginner is a database/sql handle that begins transactions.
type sqlBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// savepoint is the name of the savepoint the resetter works in when its
// handle is a transaction. The resetter never nests its own transactions,
// so one name is enough; PostgreSQL allows the caller to use it too.
const savepoint = "recovery_reset"

// sqlDB is pgDB over database/sql.
type sqlDB struct{ db SQLExecer }

func (d sqlDB) begin(ctx context.Context) (pgTx, error) {
	if b, ok := d.db.(sqlBeginner); ok {
		tx, err := b.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return sqlTx{ex: tx, tx: tx}, nil
	}
	if _, err := d.db.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return nil, err
	}
	return sqlTx{ex: d.db}, nil
}

func (d sqlDB) query(ctx context.Context, sql string, args ...any) (pgRows, error) {
	return sqlQuery(ctx, d.db, sql, args)
}

func (d sqlDB) exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.ExecContext(ctx, sql, sqlArgs(args)...)
	return err
}

// sqlTx is pgTx over a *sql.Tx, or over a savepoint of the caller's
// transaction when tx is nil.
type sqlTx struct {
	ex SQLExecer
	tx *sql.Tx
}

func (t sqlTx) query(ctx context.Context, sql string, args ...any) (pgRows, error) {
	return sqlQuery(ctx, t.ex, sql, args)
}

func (t sqlTx) exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.ex.ExecContext(ctx, sql, sqlArgs(args)...)
	return err
}

func (t sqlTx) nested() bool { return t.tx == nil }

func (t sqlTx) commit(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Commit()
	}
	_, err := t.ex.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint)
	return err
}

// rollback rolls the transaction back, or the savepoint, which it then
// releases so that the caller's transaction is left as it was.
func (t sqlTx) rollback(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Rollback()
	}
	if _, err := t.ex.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return err
	}
	_, err := t.ex.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint)
	return err
}

func sqlQuery(ctx context.Context, ex SQLExecer, query string, args []any) (pgRows, error) {
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

// sqlRows is pgRows over *sql.Rows.
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
