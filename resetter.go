package recovery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A RowResetter returns a dead worker's rows to the queue. PgxResetter is
// the implementation for PostgreSQL; hosts with another store implement
// their own.
type RowResetter interface {
	// ResetRows returns the given rows of a dead instance to the queue. It must only change rows that are still in progress.
	ResetRows(ctx context.Context, deadInstanceID string, rowIDs []int64) (reset int64, err error)
}

// PgxExecer is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx. Given a
// pgx.Tx, the resetter works inside a savepoint of that transaction.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PgxResetter resets rows with a guarded UPDATE:
//
//	UPDATE <table> SET <status> = $queued
//	WHERE <id> = ANY($1::bigint[]) AND <status> = $inprog
//
// Identifiers come from options and are quoted; values are parameters. Rows
// are reset in chunks inside one transaction, so a failure resets none of
// them and the next attempt starts clean. The parent batch is never touched.
// It never closes the handle it was given.
type PgxResetter struct {
	db        PgxExecer
	o         resetterOptions
	updateSQL string
}

type resetterOptions struct {
	schema, table, idColumn, statusColumn string
	inprog, queued                        string
	chunkSize                             int
	errs                                  []error
}

// A ResetterOption configures a PgxResetter.
type ResetterOption interface {
	applyResetter(*resetterOptions)
}

type resetterOptionFunc func(*resetterOptions)

func (f resetterOptionFunc) applyResetter(o *resetterOptions) { f(o) }

// WithTable sets the table that holds the rows; it is quoted as one
// identifier (use WithSchema for a schema). Default: DefaultTable ("batchrows").
func WithTable(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.table = name })
}

// WithSchema sets the schema of the table. Default: none, the connection's
// search_path decides.
func WithSchema(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.schema = name })
}

// WithIDColumn sets the bigint row ID column. Default: DefaultIDColumn ("rowid").
func WithIDColumn(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.idColumn = name })
}

// WithStatusColumn sets the status column. Default: DefaultStatusColumn ("status").
func WithStatusColumn(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.statusColumn = name })
}

// WithStatuses sets the status values of a row in progress and of a queued
// row; they must differ and not be empty. Defaults: DefaultInProgressStatus
// ("inprog") and DefaultQueuedStatus ("queued").
func WithStatuses(inprog, queued string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.inprog, o.queued = inprog, queued })
}

// WithChunkSize sets how many row IDs one UPDATE carries; it must be
// positive. Default: DefaultResetChunkSize (5000).
func WithChunkSize(n int) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.chunkSize = n })
}

// NewPgxResetter returns a PgxResetter over db, or an error wrapping
// ErrInvalidConfig that names the bad option.
func NewPgxResetter(db PgxExecer, opts ...ResetterOption) (*PgxResetter, error) {
	if isNil(db) {
		return nil, fmt.Errorf("%w: database handle is nil", ErrInvalidConfig)
	}
	o := resetterOptions{
		table:        DefaultTable,
		idColumn:     DefaultIDColumn,
		statusColumn: DefaultStatusColumn,
		inprog:       DefaultInProgressStatus,
		queued:       DefaultQueuedStatus,
		chunkSize:    DefaultResetChunkSize,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil resetter option", ErrInvalidConfig)
		}
		opt.applyResetter(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	table := pgx.Identifier{o.table}
	if o.schema != "" {
		table = pgx.Identifier{o.schema, o.table}
	}
	id, status := pgx.Identifier{o.idColumn}.Sanitize(), pgx.Identifier{o.statusColumn}.Sanitize()
	sql := fmt.Sprintf("UPDATE %s SET %s = $3 WHERE %s = ANY($1::bigint[]) AND %s = $2",
		table.Sanitize(), status, id, status)
	return &PgxResetter{db: db, o: o, updateSQL: sql}, nil
}

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, which could make two options name one column.
const maxIdentifierLen = 63

func (o *resetterOptions) validate() error {
	idents := []struct{ role, v string }{
		{"table", o.table}, {"ID column", o.idColumn}, {"status column", o.statusColumn},
	}
	if o.schema != "" {
		idents = append(idents, struct{ role, v string }{"schema", o.schema})
	}
	for _, id := range idents {
		switch {
		case id.v == "":
			return fmt.Errorf("%w: %s name is empty", ErrInvalidConfig, id.role)
		case len(id.v) > maxIdentifierLen:
			return fmt.Errorf("%w: %s name %q is longer than %d bytes", ErrInvalidConfig, id.role, clip(id.v), maxIdentifierLen)
		case strings.ContainsRune(id.v, 0):
			return fmt.Errorf("%w: %s name contains a NUL byte", ErrInvalidConfig, id.role)
		}
	}
	if o.idColumn == o.statusColumn {
		return fmt.Errorf("%w: ID column and status column are both %q", ErrInvalidConfig, o.idColumn)
	}
	if o.inprog == "" || o.queued == "" {
		return fmt.Errorf("%w: statuses must not be empty (in progress %q, queued %q)", ErrInvalidConfig, o.inprog, o.queued)
	}
	if o.inprog == o.queued {
		return fmt.Errorf("%w: in-progress and queued statuses are both %q", ErrInvalidConfig, o.inprog)
	}
	if o.chunkSize <= 0 {
		return fmt.Errorf("%w: chunk size %d must be positive", ErrInvalidConfig, o.chunkSize)
	}
	return nil
}

// resetAttempts is how often a reset that hit a deadlock or a serialization
// failure is tried in all.
const resetAttempts = 4

// rollbackTimeout bounds the rollback after a failed reset, which runs even
// when the reset's context has ended.
const rollbackTimeout = 5 * time.Second

// ResetRows sets the rows among rowIDs that are still in progress back to
// queued and returns how many it changed. All chunks run in one
// transaction, in ascending ID order. A deadlock or serialization failure
// is retried with backoff. deadInstanceID is used for error context only.
func (r *PgxResetter) ResetRows(ctx context.Context, deadInstanceID string, rowIDs []int64) (int64, error) {
	if len(rowIDs) == 0 {
		return 0, nil
	}
	ids := slices.Clone(rowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)

	var err error
	for attempt := 1; ; attempt++ {
		var n int64
		n, err = r.resetOnce(ctx, ids)
		if err == nil {
			return n, nil
		}
		if attempt == resetAttempts || !retryable(err) {
			break
		}
		backoff := time.Duration(attempt*attempt) * 20 * time.Millisecond
		backoff += rand.N(backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("reset rows of %s: %w", deadInstanceID, errors.Join(err, ctx.Err()))
		case <-t.C:
		}
	}
	return 0, fmt.Errorf("reset rows of %s: %w", deadInstanceID, err)
}

func (r *PgxResetter) resetOnce(ctx context.Context, ids []int64) (n int64, err error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rbCtx) // the transaction is void either way
			cancel()
		}
	}()
	for chunk := range slices.Chunk(ids, r.o.chunkSize) {
		tag, err := tx.Exec(ctx, r.updateSQL, chunk, r.o.inprog, r.o.queued)
		if err != nil {
			return 0, err
		}
		n += tag.RowsAffected()
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return n, nil
}

// retryable reports whether err is a PostgreSQL deadlock (40P01) or
// serialization failure (40001), which succeed when tried again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
