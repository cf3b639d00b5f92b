package recovery

import "context"

// A RowResetter returns a dead worker's rows to the queue. PgxResetter is
// the implementation for PostgreSQL; hosts with another store implement
// their own.
type RowResetter interface {
	// ResetRows returns the given rows of a dead instance to the queue. It must only change rows that are still in progress.
	//
	// It must return soon after ctx ends: recovery runs it under a claim
	// that expires, and Shutdown cancels it.
	ResetRows(ctx context.Context, deadInstanceID string, rowIDs []int64) (reset int64, err error)
}

// ResetResult says what a reset changed.
type ResetResult struct {
	// Reset is how many rows changed: queued again or quarantined.
	Reset int64
	// Quarantined lists the rows that reached their recovery limit and were
	// set to the terminal status instead of queued (see WithMaxRecoveries).
	Quarantined []int64
}

// A ResetReporter is a RowResetter that can tell which rows it quarantined.
// The Worker uses ResetRowsReport instead of ResetRows when the resetter
// has it, to log and report quarantined rows. PgxResetter implements it.
type ResetReporter interface {
	RowResetter
	ResetRowsReport(ctx context.Context, deadInstanceID string, rowIDs []int64) (ResetResult, error)
}

// An OwnerSweeper is a RowResetter that knows which instance owns each row
// in progress. It powers the backstop sweep (WithBackstopSweep), which finds
// rows whose owner is gone even when Redis has forgotten them. PgxResetter
// implements it when configured WithOwnerColumn.
type OwnerSweeper interface {
	RowResetter
	// InProgressOwners returns the distinct owners of rows in progress.
	InProgressOwners(ctx context.Context) ([]string, error)
	// ResetOwnerRows returns every row still in progress and owned by
	// owner to the queue.
	ResetOwnerRows(ctx context.Context, owner string) (ResetResult, error)
}

// resetRows calls the resetter, preferring the detailed report.
func resetRows(ctx context.Context, r RowResetter, owner string, ids []int64) (ResetResult, error) {
	if rr, ok := r.(ResetReporter); ok {
		return rr.ResetRowsReport(ctx, owner, ids)
	}
	n, err := r.ResetRows(ctx, owner, ids)
	return ResetResult{Reset: n}, err
}

// An OwnerFencer is a RowResetter that can say whether its resets are
// guarded by owner: a row is only reset while the instance named in the
// call still owns it. Release relies on it to decide whether it is safe
// after the lease was lost. PgxResetter implements it.
type OwnerFencer interface {
	FencesByOwner() bool
}

func fencesByOwner(r RowResetter) bool {
	f, ok := r.(OwnerFencer)
	return ok && f.FencesByOwner()
}
