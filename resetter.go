package recovery

import (
	"context"
	"fmt"

	"github.com/alya/recovery/internal/contract"
)

// A Resetter is everything a Worker needs from the store its rows live
// in. New takes nothing else; a wrapper that embeds a Resetter keeps every
// guarantee, because what the resetter guarantees travels in Info's value,
// not in the wrapper's method set. pgxreset.Resetter (pgx) and
// sqlreset.Resetter (database/sql) are the implementations for PostgreSQL;
// hosts with another store implement their own.
//
// Every method must return soon after ctx ends: recovery runs them under a
// claim that expires, and Shutdown cancels them.
type Resetter interface {
	// Info says what the resetter guarantees. New calls it once; it must
	// not do I/O.
	Info() ResetterInfo
	// Check compares the configuration with the store and reads what it
	// serves (ResetterInfo's Serves, Server, OwnerWidth,
	// IdleInTxTimeout) and the pool of its handle (PoolSize, PoolInUse:
	// Start warns about a pool with fewer than 2 connections free). Start calls it before writing to Redis. With
	// schema false (WithoutSchemaCheck) only the identity is read. Its
	// errors wrap ErrSchema or ErrReadOnly.
	Check(ctx context.Context, schema bool) (ResetterInfo, error)
	// ResetRows returns rows named by ID to the queue: a dead peer's rows
	// set (rows-set recovery) or the rows a worker gives back (Release).
	// It must only change rows that are still in progress (and, with
	// OwnerFencing, still owned by req.InstanceID). A reset should fill
	// ResetResult.ChangedIDs (the fleet's history records the rows).
	ResetRows(ctx context.Context, req RowsReset) (ResetResult, error)
	// ResetOwner returns every row still in progress owned by req.Owner to
	// the queue, whole: owner mode's recovery, the backstop sweep by
	// owner, a Worker's own predecessor at Start. Only a resetter with
	// ResetterInfo.OwnerFencing is asked; another may return an error.
	ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error)
	// ResetVersions returns the rows still in progress at the versions
	// given to the queue, and no other: the backstop sweep without an
	// owner column. Only a resetter with ListsInProgress and without
	// OwnerFencing is asked; another may return an error.
	ResetVersions(ctx context.Context, req VersionsReset) (ResetResult, error)
	// PlanReset says what the one reset plan names would change, changing
	// nothing: ResetResult's ChangedIDs lists the rows. Only a resetter
	// with ResetterInfo.DryRun is asked; another may return an error. A
	// plan with none or several of its fields set must be refused with an
	// error wrapping ErrInvalidConfig.
	PlanReset(ctx context.Context, plan PlanRequest) (ResetResult, error)
	// InProgressOwners returns the distinct owners of rows in progress
	// (with ResetterInfo.OwnerFencing and ListsInProgress).
	InProgressOwners(ctx context.Context) ([]string, error)
	// InProgressRows returns every row in progress with its version
	// (without OwnerFencing, with ListsInProgress).
	InProgressRows(ctx context.Context) ([]RowState, error)
	// RowStates reads the committed state, version and lock of each
	// existing row of ids; a row that does not exist is left out. The
	// Worker's self-check reads its own rows with it. A resetter that
	// cannot read rows returns an error wrapping errors.ErrUnsupported
	// when Start asks it for no row (ids empty, which should do no I/O):
	// the self-check is then off, and Start says so at Warn. Only that
	// first call decides; a later error is a failed look.
	RowStates(ctx context.Context, ids []int64) ([]RowState, error)
}

// ResetterInfo says what a Resetter guarantees and how its rows read.
// Info fills the guarantees; Check also fills what it read from the
// server and its handle's pool. Its fields (each documented in full by
// `go doc github.com/alya/recovery/internal/contract.ResetterInfo`):
//
//   - Name string: the resetter in messages, as "pgxreset.Resetter".
//   - OwnerFencing bool: a row is reset only while the instance named
//     still owns it (owner mode needs it).
//   - Ledger bool: resets are recorded per (InstanceID, Incarnation) and
//     never repeated for the same pair.
//   - DryRun bool: PlanReset works.
//   - ListsInProgress bool: InProgressOwners or InProgressRows work (the
//     backstop sweep needs them).
//   - InProgressStatus, QueuedStatus string: the statuses as
//     RowState.Status reads them.
//
// Filled by Check only:
//
//   - Serves string: the table served, as "schema.table on database db".
//   - Server string: the database server ("system_identifier=<n>").
//   - OwnerWidth int: the owner column's width in characters (0: text or
//     none).
//   - IdleInTxTimeout, StatementTimeout, LockTimeout time.Duration: the
//     session's timeouts (0: off).
//   - PoolSize, PoolInUse int: the handle's connection limit (0: none)
//     and the connections in use when Check began.
type ResetterInfo = contract.ResetterInfo

// RowsReset asks ResetRows to return rows named by ID to the queue. Its
// fields (each documented in full by
// `go doc github.com/alya/recovery/internal/contract.RowsReset`):
//
//   - InstanceID string: the instance the rows belong to (a dead peer, or
//     the worker itself for Release).
//   - Incarnation string: the life of that instance's rows set; "" when
//     unknown.
//   - RowIDs []int64: the rows to reset.
//   - FromRowsSet bool: RowIDs were read from a dead instance's rows set
//     under a recovery claim (not a Release).
//
// A wrapper that overrides ResetRows sees every reset by ID, and nothing
// else: no reset by owner or by version, and no plan.
type RowsReset = contract.RowsReset

// OwnerReset asks ResetOwner to return every row in progress owned by
// Owner to the queue. Its fields (each documented in full by
// `go doc github.com/alya/recovery/internal/contract.OwnerReset`):
//
//   - Owner string: the owner column's value (an instance ID, or a
//     per-life owner value); needs OwnerFencing.
type OwnerReset = contract.OwnerReset

// VersionsReset asks ResetVersions to return the rows still in progress
// at the versions given to the queue. Its fields (each documented in full
// by `go doc github.com/alya/recovery/internal/contract.VersionsReset`):
//
//   - Versions []RowState: the rows to reset, each with the version it
//     must still have (the sweep without an owner column).
type VersionsReset = contract.VersionsReset

// PlanRequest asks PlanReset what one reset would change, changing nothing.
// Exactly one of its fields is set. Its fields (each documented in full
// by `go doc github.com/alya/recovery/internal/contract.PlanRequest`):
//
//   - Rows *RowsReset: plan a ResetRows.
//   - Owner *OwnerReset: plan a ResetOwner.
//   - Versions *VersionsReset: plan a ResetVersions.
type PlanRequest = contract.PlanRequest

// ResetResult says what a reset changed, or what a plan would change. Its
// fields (each documented in full by
// `go doc github.com/alya/recovery/internal/contract.ResetResult`):
//
//   - Changed int64: rows queued again or quarantined.
//   - ChangedIDs []int64: the rows changed (a plan's rows that would be);
//     recovery records them in the fleet's history.
//   - Quarantined []int64: rows that reached their recovery limit and
//     took the terminal status.
//   - NotReset []RowState: rows neither reset nor shown settled
//     (RowState.Locked, RowState.Refused say why when known); recovery
//     tries them again.
//   - Gone []int64: rows asked for that no longer exist.
type ResetResult = contract.ResetResult

// RowState is a row as a Resetter found it. Its fields (each documented
// in full by `go doc github.com/alya/recovery/internal/contract.RowState`):
//
//   - ID int64: the row's ID.
//   - Status string: its status, as text.
//   - Owner string: its owner, when the resetter knows owners.
//   - Version string: changes whenever the row is written (PostgreSQL:
//     xmin).
//   - Locked bool: another session held the row locked; a reset left it.
//   - Refused bool: the database would not change it (a BEFORE UPDATE
//     trigger returned NULL).
type RowState = contract.RowState

// releaseSafeAfterLoss reports whether Release can give rows back after
// the lease was lost: a row a peer recovered and someone took since is
// then left alone, by its owner (owner fencing) or because the ledger
// holds its reset under this worker's incarnation (the reset ledger).
func releaseSafeAfterLoss(info ResetterInfo) bool { return info.OwnerFencing || info.Ledger }

// inProgress reports whether a row in state s is one the resetter would
// reset as in progress for owner: its in-progress status and, when it
// fences by owner, owned by owner.
func inProgress(info ResetterInfo, s RowState, owner string) bool {
	return s.Status == info.InProgressStatus && (!info.OwnerFencing || s.Owner == owner)
}

// checkInfo returns an error wrapping ErrInvalidConfig when what r says of
// itself cannot work: no in-progress or queued status, or the same status
// for both.
func checkInfo(r Resetter, info ResetterInfo) error {
	switch {
	case info.InProgressStatus == "":
		return fmt.Errorf("%w: resetter %T: Info().InProgressStatus is empty", ErrInvalidConfig, r)
	case info.QueuedStatus == "":
		return fmt.Errorf("%w: resetter %T: Info().QueuedStatus is empty", ErrInvalidConfig, r)
	case info.QueuedStatus == info.InProgressStatus:
		return fmt.Errorf("%w: resetter %T: Info().QueuedStatus %q equals InProgressStatus", ErrInvalidConfig, r, clip(info.QueuedStatus))
	}
	return nil
}
