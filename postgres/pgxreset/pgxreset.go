package pgxreset

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgcore"
	"github.com/alya/recovery/postgres"
)

// Execer is what a Resetter calls on its database handle: Begin for every
// reset (in a transaction), Query for reads outside one (the owners of
// rows in progress, the self-check's row states) and Exec for
// CreateLedger. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it. Given a
// pgx.Tx, the resetter works inside a savepoint of that transaction.
//
// Give a Worker a *pgxpool.Pool: its recovery loop, ops.RecoverNow and
// Release may reset concurrently, which a *pgx.Conn or a pgx.Tx does not
// allow, and recovery deletes a dead peer's rows set once ResetRows returns,
// which with a pgx.Tx is before the caller's transaction commits. A Conn
// or Tx suits a Resetter used on its own, by one goroutine.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Resetter is the recovery.Resetter for PostgreSQL through pgx. It resets
// rows with a guarded UPDATE, in effect:
//
//	UPDATE <table> SET <status> = $queued
//	WHERE <id> = ANY($1::bigint[]) AND <status> = $inprog
//
// The rows are locked first in ascending ID order with SKIP LOCKED: a reset
// never waits for a row another session holds locked (a transaction left
// open on a host that vanished holds its locks until the server notices,
// hours later), it reports the row as not reset (RowState.Locked) and the
// next attempt tries it again. Rows are reset in chunks inside one
// transaction: a failure resets none of them, and the next attempt starts
// clean. The parent batch is never touched. Identifiers come from options
// and are quoted; values are parameters. Statements are sent without named
// prepared statements (pgx.QueryExecModeExec), so the resetter works
// through PgBouncer in transaction pooling mode.
//
// With postgres.WithOwnerColumn the reset also requires <owner> = the dead
// instance and clears it; with postgres.WithRecoveryCountColumn and
// postgres.WithMaxRecoveries it counts resets and quarantines rows that
// keep killing their workers.
//
// It never closes the handle it was given.
type Resetter struct {
	core *pgcore.Resetter
}

// New returns a Resetter over db, or an error wrapping
// recovery.ErrInvalidConfig that names the bad option. It does not contact
// the database.
func New(db Execer, opts ...postgres.Option) (*Resetter, error) {
	core, err := pgcore.New(db, pgxDB{db}, "pgxreset.Resetter", opts)
	if err != nil {
		return nil, err
	}
	return &Resetter{core: core}, nil
}

// Info says what the resetter guarantees: owner fencing with
// postgres.WithOwnerColumn, the reset ledger without it (unless
// postgres.WithoutResetLedger), plans (PlanReset), the lists of rows in progress,
// and its statuses. It does no I/O. It implements recovery.Resetter.
func (r *Resetter) Info() contract.ResetterInfo { return r.core.Info() }

// Check compares the options with the PostgreSQL catalogue and the
// session (with schema: errors wrapping recovery.ErrSchema, or
// recovery.ErrReadOnly for a session that cannot write), and reads the
// database, table and server it serves. It implements recovery.Resetter.
func (r *Resetter) Check(ctx context.Context, schema bool) (contract.ResetterInfo, error) {
	return r.core.Check(ctx, schema)
}

// ResetRows returns req.RowIDs to the queue (or quarantine), under
// req.InstanceID and req.Incarnation, and lists them in ChangedIDs. It
// implements recovery.Resetter.
func (r *Resetter) ResetRows(ctx context.Context, req contract.RowsReset) (contract.ResetResult, error) {
	return r.core.ResetRows(ctx, req)
}

// ResetOwner returns every row in progress owned by req.Owner to the
// queue (or quarantine), and lists them in ChangedIDs. It needs
// postgres.WithOwnerColumn. It implements recovery.Resetter.
func (r *Resetter) ResetOwner(ctx context.Context, req contract.OwnerReset) (contract.ResetResult, error) {
	return r.core.ResetOwner(ctx, req)
}

// ResetVersions returns the rows still in progress at the versions (xmin)
// req.Versions gives to the queue (or quarantine), and lists them in
// ChangedIDs. It needs a resetter without postgres.WithOwnerColumn. It
// implements recovery.Resetter.
func (r *Resetter) ResetVersions(ctx context.Context, req contract.VersionsReset) (contract.ResetResult, error) {
	return r.core.ResetVersions(ctx, req)
}

// PlanReset runs the reset plan names in a transaction it rolls back, and
// lists the rows it would change in ChangedIDs. A plan naming none or
// several resets is refused with an error wrapping
// recovery.ErrInvalidConfig. It implements recovery.Resetter.
func (r *Resetter) PlanReset(ctx context.Context, plan contract.PlanRequest) (contract.ResetResult, error) {
	return r.core.PlanReset(ctx, plan)
}

// InProgressOwners returns the distinct owners of rows in progress. It
// needs postgres.WithOwnerColumn. It implements recovery.Resetter.
func (r *Resetter) InProgressOwners(ctx context.Context) ([]string, error) {
	return r.core.InProgressOwners(ctx)
}

// InProgressRows returns every row in progress with its version (xmin).
// It needs a resetter without postgres.WithOwnerColumn. It implements
// recovery.Resetter.
func (r *Resetter) InProgressRows(ctx context.Context) ([]contract.RowState, error) {
	return r.core.InProgressRows(ctx)
}

// RowStates returns the committed status, owner and version of each of
// ids that exists, and whether another session held it locked, without
// waiting for such a lock. It implements recovery.Resetter.
func (r *Resetter) RowStates(ctx context.Context, ids []int64) ([]contract.RowState, error) {
	return r.core.RowStates(ctx, ids)
}

// LedgerDDL returns the statements that create the reset ledger's table
// and index, for a migration tool.
func (r *Resetter) LedgerDDL() string { return r.core.LedgerDDL() }

// CreateLedger creates the reset ledger's table and index if they do not
// exist (LedgerDDL). It needs the privilege to create tables in the
// schema.
func (r *Resetter) CreateLedger(ctx context.Context) error { return r.core.CreateLedger(ctx) }
