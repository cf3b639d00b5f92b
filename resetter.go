package recovery

import "context"

// A RowResetter returns a dead worker's rows to the queue. PgxResetter is
// the implementation for PostgreSQL; hosts with another store implement
// their own.
type RowResetter interface {
	// ResetRows returns the given rows of a dead instance to the queue. It must only change rows that are still in progress.
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
