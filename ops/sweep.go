package ops

import (
	"context"
	"errors"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/bridge"
	"github.com/alya/recovery/internal/report"
)

// SweepReport says what SweepNow found and did.
// Its fields are documented on internal/report.SweepReport (go doc
// github.com/alya/recovery/internal/report.SweepReport).
type SweepReport = report.SweepReport

// SweepNow runs the backstop sweep of w, a Worker that is never started,
// now, with the sweep's own looks. Without an owner column (by row
// version) it looks for the rows in progress that no rows set holds (the
// database's rows in progress with their versions, every registered
// instance's rows set, the age of every Redis master) and, unless dryRun,
// waits the sweep's gap (SweepReport.Gap: the fleet's longest rows or
// heartbeat TTL) and looks again; the rows found unheld at both looks at
// the same version are reset with their version in the statement, as the
// sweep resets them. With an owner column (SweepReport.ByOwner) it looks
// for the owners of rows in progress without a heartbeat and, a fleet's
// heartbeat TTL later, hands those still without one to the dead-peer
// path, which resets their rows by owner. When ctx does not leave time for
// the wait, nothing is reset and SweepReport.Stuck (StuckOwners) lists
// what was found. Without a sweep (a resetter that cannot list the rows
// in progress, or the sweep off) nothing is read and SweepReport.Why says
// why. A started Worker is refused with recovery.ErrAlreadyStarted; after
// its Shutdown it returns recovery.ErrShutdown.
func SweepNow(ctx context.Context, w *recovery.Worker, dryRun bool) (SweepReport, error) {
	return bridge.SweepNow(ctx, w, dryRun)
}

// RecoverNowKeeping is RecoverNow, except that the dead peers listed in
// keep are left registered and untouched (listed in the report's
// Skipped). recoveryctl keeps a dead instance that left no rows set while
// rows in progress no worker holds remain, so that it is not forgotten
// while rows that may be its are stuck. w must never be started when keep
// is not empty (recovery.ErrAlreadyStarted).
func RecoverNowKeeping(ctx context.Context, w *recovery.Worker, keep []string) (RecoveryReport, error) {
	return bridge.RecoverNowKeeping(ctx, w, keep)
}

// ErrRowsStuck is what recoveryctl recover fails with when rows in
// progress that no live worker holds remain after it ran (SweepNow's
// SweepReport.Stuck), or cannot be told.
var ErrRowsStuck = errors.New("rows in progress that no live worker holds are stuck")
