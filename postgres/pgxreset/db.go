package pgxreset

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/alya/recovery/internal/pgcore"
)

// pgxDB is pgcore.DB over pgx.
type pgxDB struct{ db Execer }

func (d pgxDB) Begin(ctx context.Context) (pgcore.Tx, error) {
	tx, err := d.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	_, nested := d.db.(pgx.Tx)
	return pgxTx{tx: tx, inTx: nested}, nil
}

func (d pgxDB) Query(ctx context.Context, sql string, args ...any) (pgcore.Rows, error) {
	return pgxQuery(ctx, d.db, sql, args)
}

func (d pgxDB) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.Exec(ctx, sql, execMode(args)...)
	return err
}

// pgxTx is pgcore.Tx over a pgx.Tx (a savepoint when the handle was a
// pgx.Tx).
type pgxTx struct {
	tx   pgx.Tx
	inTx bool // a savepoint of the caller's transaction
}

func (t pgxTx) Nested() bool { return t.inTx }

func (t pgxTx) Query(ctx context.Context, sql string, args ...any) (pgcore.Rows, error) {
	return pgxQuery(ctx, t.tx, sql, args)
}

func (t pgxTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, execMode(args)...)
	return err
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func pgxQuery(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args []any) (pgcore.Rows, error) {
	rows, err := q.Query(ctx, sql, execMode(args)...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// execMode returns args behind pgx.QueryExecModeExec, which pgx reads as
// the mode of this one call: the statement goes out unnamed, parsed and
// run in one round trip, whatever the pool's DefaultQueryExecMode. pgx's
// default mode prepares named statements and caches them per connection,
// which PgBouncer in transaction pooling mode breaks: the next
// transaction may run on another server connection, where the statement
// does not exist. A statement without arguments goes out in the simple
// protocol either way.
func execMode(args []any) []any {
	return append([]any{pgx.QueryExecModeExec}, args...)
}
