package sqlreset

import (
	"context"
	"database/sql"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgcore"
	"github.com/alya/recovery/postgres"
)

// Execer is what a Resetter calls on its database/sql handle: *sql.DB,
// *sql.Conn and *sql.Tx satisfy it, and so do sqlx's DB and Tx and the
// DBTX interface sqlc generates. The driver must speak to PostgreSQL:
// lib/pq, or pgx through github.com/jackc/pgx/v5/stdlib.
//
// A handle with a BeginTx method (*sql.DB, *sql.Conn, *sqlx.DB) gets a
// transaction of its own for every reset. Any other handle is taken to
// be a transaction already (*sql.Tx, *sqlx.Tx): the resetter then works
// inside a savepoint of it, which the caller's COMMIT or ROLLBACK
// decides.
//
// Give a Worker a *sql.DB: its recovery loop, ops.RecoverNow and Release
// may reset concurrently, which a *sql.Conn or a *sql.Tx does not allow,
// and recovery deletes a dead peer's rows set once ResetRows returns, which
// with a *sql.Tx is before the caller's transaction commits. A Conn or Tx
// suits a Resetter used on its own, by one goroutine.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Resetter is pgxreset.Resetter for database/sql: the same options, the
// same statements and the same guarantees (the status guard, owner
// fencing, the recovery count and quarantine, the reset ledger, the sweep
// by owner or by row version, the dry run, the schema check and the row
// states of the self-check), over an Execer. A Worker given a Resetter
// with postgres.WithOwnerColumn runs in owner mode as it would with a
// pgxreset.Resetter.
//
// Array parameters and results (row IDs, statuses, enum labels) travel in
// PostgreSQL's text form, which every driver passes through, so no
// driver-specific array type is needed.
//
// It never closes the handle it was given.
type Resetter struct {
	core *pgcore.Resetter
}

// New returns a Resetter over db, or an error wrapping
// recovery.ErrInvalidConfig that names the bad option. It takes the
// options of pgxreset.New and does not contact the database.
func New(db Execer, opts ...postgres.Option) (*Resetter, error) {
	core, err := pgcore.New(db, pgcore.SQLDB(db), "sqlreset.Resetter", opts)
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
