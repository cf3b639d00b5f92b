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
	// Reset returns rows to the queue: req.RowIDs (rows-set recovery,
	// Release), every row in progress owned by req.Owner (owner mode, the
	// sweep), or req.Versions (the sweep without an owner column). It must
	// only change rows that are still in progress. With req.DryRun it
	// changes nothing and fills ChangedIDs; a reset should fill it too
	// (the fleet's history records the rows).
	Reset(ctx context.Context, req ResetRequest) (ResetResult, error)
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

// ResetterInfo says what a Resetter guarantees and how its rows read: its
// fields are documented on internal/contract.ResetterInfo. Info fills the
// guarantees; Check also fills what it read from the server (Serves,
// Server, OwnerWidth, IdleInTxTimeout) and its handle's pool (PoolSize,
// PoolInUse).
type ResetterInfo = contract.ResetterInfo

// ResetRequest asks a Resetter to return rows to the queue: RowIDs of one
// instance (and incarnation), every row in progress of an Owner, or rows
// at given Versions; DryRun asks what would change. Its fields are
// documented on internal/contract.ResetRequest.
type ResetRequest = contract.ResetRequest

// ResetResult says what a reset changed (Changed, Quarantined), what it
// could not settle (NotReset), or what a dry run would change
// (ChangedIDs). Its fields are documented on internal/contract.ResetResult.
type ResetResult = contract.ResetResult

// RowState is a row as a Resetter found it: ID, Status, Owner, Version and
// whether another session held it Locked. Its fields are documented on
// internal/contract.RowState.
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
