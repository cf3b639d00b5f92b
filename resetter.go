package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/alya/recovery/internal/contract"
)

// A RowResetter returns a dead worker's rows to the queue. PgxResetter
// (pgx) and SQLResetter (database/sql) are the implementations for
// PostgreSQL; hosts with another store implement their own.
type RowResetter interface {
	// ResetRows returns the given rows of a dead instance to the queue. It must only change rows that are still in progress.
	//
	// It must return soon after ctx ends: recovery runs it under a claim
	// that expires, and Shutdown cancels it.
	ResetRows(ctx context.Context, deadInstanceID string, rowIDs []int64) (reset int64, err error)
}

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
	// IdleInTxTimeout). Start calls it before writing to Redis. With
	// schema false (WithoutSchemaCheck) only the identity is read. Its
	// errors wrap ErrSchema or ErrReadOnly.
	Check(ctx context.Context, schema bool) (ResetterInfo, error)
	// Reset returns rows to the queue: req.RowIDs (rows-set recovery,
	// Release), every row in progress owned by req.Owner (owner mode, the
	// sweep), or req.Versions (the sweep without an owner column). It must
	// only change rows that are still in progress. With req.DryRun it
	// changes nothing and fills ChangedIDs.
	Reset(ctx context.Context, req ResetRequest) (ResetResult, error)
	// InProgressOwners returns the distinct owners of rows in progress
	// (with ResetterInfo.OwnerFencing and ListsInProgress).
	InProgressOwners(ctx context.Context) ([]string, error)
	// InProgressRows returns every row in progress with its version
	// (without OwnerFencing, with ListsInProgress).
	InProgressRows(ctx context.Context) ([]RowState, error)
	// RowStates reads the committed state, version and lock of each
	// existing row of ids; a row that does not exist is left out.
	RowStates(ctx context.Context, ids []int64) ([]RowState, error)
}

// ResetterInfo says what a Resetter guarantees and how its rows read: its
// fields are documented on internal/contract.ResetterInfo. Info fills the
// guarantees; Check also fills what it read from the server (Serves,
// Server, OwnerWidth, IdleInTxTimeout).
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

// An IncarnationResetter is a RowResetter that takes the whole
// ResetRequest, so it can record each reset under the incarnation of the
// rows set and skip rows a committed reset of the same incarnation already
// handled. The Worker prefers it over ResetReporter and RowResetter.
// PgxResetter and SQLResetter implement it.
type IncarnationResetter interface {
	RowResetter
	ResetIncarnation(ctx context.Context, req ResetRequest) (ResetResult, error)
}

// A ResetReporter is a RowResetter that can tell which rows it quarantined.
// The Worker uses ResetRowsReport instead of ResetRows when the resetter
// has it, to log and report quarantined rows. PgxResetter and SQLResetter implement it.
type ResetReporter interface {
	RowResetter
	ResetRowsReport(ctx context.Context, deadInstanceID string, rowIDs []int64) (ResetResult, error)
}

// An OwnerSweeper is a RowResetter that knows which instance owns each row
// in progress. It powers the backstop sweep (WithBackstopSweep), which finds
// rows whose owner is gone even when Redis has forgotten them. PgxResetter
// and SQLResetter implement it when configured WithOwnerColumn.
type OwnerSweeper interface {
	RowResetter
	// InProgressOwners returns the distinct owners of rows in progress.
	InProgressOwners(ctx context.Context) ([]string, error)
	// ResetOwnerRows returns every row still in progress and owned by
	// owner to the queue.
	ResetOwnerRows(ctx context.Context, owner string) (ResetResult, error)
}

// A RowsSweeper is a RowResetter that can list the rows in progress, each
// with a version that changes whenever the row is written, and reset rows
// only while they are still in progress at the version given. It powers
// the backstop sweep in rows-set mode without an owner column: rows in
// progress that no rows set in Redis holds, seen unchanged at two looks a
// rows TTL apart, go back to the queue (docs/design.md, "The backstop
// sweep"). PgxResetter and SQLResetter implement it without
// WithOwnerColumn, the version being the row's xmin.
type RowsSweeper interface {
	RowResetter
	// InProgressRows returns every row in progress with its version.
	InProgressRows(ctx context.Context) ([]RowVersion, error)
	// ResetRowVersions resets to the queue the rows still in progress at
	// the version given, and leaves the others alone without reporting
	// them; rows still at their version that another session held locked
	// it may list in NotReset (Locked), for the sweep to try again at its
	// next look. Resetting the same versions again changes nothing.
	ResetRowVersions(ctx context.Context, rows []RowVersion) (ResetResult, error)
}

// RowVersion is a row in progress as a RowsSweeper saw it: its ID and
// Version (RowState.Version, which changes whenever the row is written;
// PostgreSQL: xmin).
type RowVersion = RowState

// resetRows calls the resetter, preferring the richest interface it has.
func resetRows(ctx context.Context, r RowResetter, req ResetRequest) (ResetResult, error) {
	switch rr := r.(type) {
	case IncarnationResetter:
		return rr.ResetIncarnation(ctx, req)
	case ResetReporter:
		return rr.ResetRowsReport(ctx, req.InstanceID, req.RowIDs)
	}
	n, err := r.ResetRows(ctx, req.InstanceID, req.RowIDs)
	return ResetResult{Changed: n}, err
}

// An OwnerFencer is a RowResetter that can say whether its resets are
// guarded by owner: a row is only reset while the instance named in the
// call still owns it. Release relies on it to decide whether it is safe
// after the lease was lost. PgxResetter and SQLResetter implement it.
type OwnerFencer interface {
	FencesByOwner() bool
}

func fencesByOwner(r RowResetter) bool {
	f, ok := r.(OwnerFencer)
	return ok && f.FencesByOwner()
}

// recordsResets reports whether r records every reset under the instance
// and incarnation of the rows set and skips rows already recorded for the
// pair (the reset ledger of PgxResetter and SQLResetter).
func recordsResets(r RowResetter) bool {
	_, inc := r.(IncarnationResetter)
	l, ok := r.(interface{ UsesLedger() bool })
	return inc && ok && l.UsesLedger()
}

// releaseSafeAfterLoss reports whether Release can give rows back after
// the lease was lost: a row a peer recovered and someone took since is
// then left alone, by its owner (owner fencing) or because the ledger
// holds its reset under this worker's incarnation (the reset ledger).
func releaseSafeAfterLoss(r RowResetter) bool { return fencesByOwner(r) || recordsResets(r) }

// A capability is an optional interface the Worker finds on its resetter
// by type assertion, and what a resetter without it loses. A host type
// that wraps a PgxResetter or SQLResetter and exposes only RowResetter
// loses all of them, silently but for New's warning (warnMissingCapabilities).
type capability struct {
	name string
	has  func(RowResetter) bool
	loss string
}

// capabilities are what the Worker looks for, in the order of their cost.
var capabilities = []capability{
	{"IncarnationResetter", is[IncarnationResetter],
		"no reset ledger and no incarnation: a recoverer dying after its COMMIT can have the same rows reset twice, under a live worker; rows without an owner in a dead rows-set worker's set are reported, not reset"},
	{"ResetReporter", func(r RowResetter) bool { return is[IncarnationResetter](r) || is[ResetReporter](r) },
		"no report of a reset: rows neither reset nor settled count as settled and their worker's rows set is deleted; quarantined rows go unreported"},
	{"OwnerFencer", is[OwnerFencer],
		"no owner fencing: no owner mode, and Release refuses after a lost lease or Shutdown unless the resetter records its resets"},
	{"UsesLedger() bool", is[interface{ UsesLedger() bool }],
		"the reset ledger unseen: without owner fencing, Release refuses after a lost lease or Shutdown"},
	{"OwnerSweeper", is[OwnerSweeper],
		"no reset by owner: no owner mode and no backstop sweep by owner, so with an owner column a Redis that forgets a rows set strands its rows"},
	{"RowsSweeper", is[RowsSweeper],
		"no backstop sweep by row version: without an owner column, rows whose rows set Redis lost (the fleet down past the rows TTL, a flush, an eviction) stay in progress for good"},
	{"SchemaChecker", is[SchemaChecker],
		"no schema check: Start accepts a wrong table, column or status, found at the first failed recovery"},
	{"RowStateReader", is[RowStateReader],
		"no self-check: Healthy does not catch a host whose rows the resetter would not recover (owner not set, status misspelt)"},
	{"OwnerPlanner", is[OwnerPlanner],
		"no dry run by owner: PlanRecovery (recoveryctl recover --dry-run) cannot say what a reset by owner would change"},
	{"ResetPlanner", is[ResetPlanner],
		"no dry run: PlanRecovery cannot say what a reset of a rows set would change"},
}

// is reports whether r implements T.
func is[T any](r RowResetter) bool {
	_, ok := r.(T)
	return ok
}

// missingCapabilities returns the capabilities r lacks; none for the
// bundled resetters, which have them all.
func missingCapabilities(r RowResetter) []capability {
	switch r.(type) {
	case *PgxResetter, *SQLResetter:
		return nil
	}
	var missing []capability
	for _, c := range capabilities {
		if !c.has(r) {
			missing = append(missing, c)
		}
	}
	return missing
}

// warnMissingCapabilities logs once, at Warn, which optional interfaces a
// resetter that is not one of ours lacks and what each loss costs, until
// the Worker's contract with its resetter is one interface the compiler
// checks. A wrapper keeps them by forwarding these methods.
func (w *Worker) warnMissingCapabilities() {
	missing := missingCapabilities(w.resetter)
	if len(missing) == 0 {
		return
	}
	names := make([]string, len(missing))
	losses := make([]string, len(missing))
	for i, c := range missing {
		names[i] = c.name
		losses[i] = c.name + ": " + c.loss
	}
	w.log.Warn("the resetter lacks optional interfaces the Worker finds by type assertion; a type wrapping a PgxResetter or SQLResetter must forward their methods to keep what they provide",
		slog.String("resetter_type", fmt.Sprintf("%T", w.resetter)),
		slog.String("missing", strings.Join(names, ", ")),
		slog.String("lost", strings.Join(losses, "; ")))
}
