package pgxreset

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alya/recovery/internal/pgcore"
)

// pgxDB is pgcore.DB over pgx. Over a *pgxpool.Pool each call acquires
// its connection itself, so that a call the pool kept waiting past its
// deadline says so (pgcore.PoolWait) instead of "context deadline
// exceeded".
type pgxDB struct{ db Execer }

// acquire returns the handle one call runs on and the function that
// gives it back: a connection of d's pool, or d's handle itself.
func (d pgxDB) acquire(ctx context.Context) (Execer, func(), error) {
	p, ok := d.db.(*pgxpool.Pool)
	if !ok {
		return d.db, func() {}, nil
	}
	start := time.Now()
	c, err := p.Acquire(ctx)
	if err != nil {
		st, _ := d.PoolStats()
		return nil, nil, pgcore.PoolWait(err, time.Since(start), st)
	}
	return c, c.Release, nil
}

// PoolStats reads d's pool, when its handle is a *pgxpool.Pool. It
// implements pgcore.Pooled.
func (d pgxDB) PoolStats() (pgcore.PoolStats, bool) {
	p, ok := d.db.(*pgxpool.Pool)
	if !ok {
		return pgcore.PoolStats{}, false
	}
	st := p.Stat()
	return pgcore.PoolStats{InUse: int(st.AcquiredConns()), Max: int(st.MaxConns())}, true
}

func (d pgxDB) Begin(ctx context.Context) (pgcore.Tx, error) {
	db, release, err := d.acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		release()
		return nil, err
	}
	_, nested := d.db.(pgx.Tx)
	return pgxTx{tx: tx, inTx: nested, release: release}, nil
}

func (d pgxDB) Query(ctx context.Context, sql string, args ...any) (pgcore.Rows, error) {
	db, release, err := d.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := pgxQuery(ctx, db, sql, args)
	if err != nil {
		release()
		return nil, err
	}
	return &releasingRows{Rows: rows, release: release}, nil
}

func (d pgxDB) Exec(ctx context.Context, sql string, args ...any) error {
	db, release, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	_, err = db.Exec(ctx, sql, execMode(args)...)
	return err
}

// releasingRows are rows read on an acquired connection, given back when
// the rows are closed or read to their end.
type releasingRows struct {
	pgcore.Rows
	release func()
}

func (r *releasingRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *releasingRows) Close() {
	r.Rows.Close()
	r.release() // pgxpool.Conn.Release does nothing the second time
}

// pgxTx is pgcore.Tx over a pgx.Tx (a savepoint when the handle was a
// pgx.Tx).
type pgxTx struct {
	tx      pgx.Tx
	inTx    bool   // a savepoint of the caller's transaction
	release func() // gives back the connection tx runs on
}

func (t pgxTx) Nested() bool { return t.inTx }

func (t pgxTx) Query(ctx context.Context, sql string, args ...any) (pgcore.Rows, error) {
	return pgxQuery(ctx, t.tx, sql, args)
}

func (t pgxTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, execMode(args)...)
	return err
}

func (t pgxTx) Commit(ctx context.Context) error {
	defer t.release()
	return t.tx.Commit(ctx)
}

func (t pgxTx) Rollback(ctx context.Context) error {
	defer t.release()
	return t.tx.Rollback(ctx)
}

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
