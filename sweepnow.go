package recovery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/alya/recovery/internal/report"
)

// The backstop sweep by row version on demand, for an operator's tool
// (ops.SweepNow, recoveryctl recover): the sweep's own looks
// (rowSweep.rowsLook), run by a Worker that is never started, so no loop
// shares its memory of the looks.

// sweepNow takes a look of the backstop sweep by row version and, unless
// dryRun, a second one a gap later, which resets the rows no rows set held
// at either, with their version in the statement as the sweep does. It
// waits for the second look only when ctx leaves time for it; otherwise
// the rows found are reported stuck. A started Worker's sweep is its
// loop's: sweepNow refuses it (ErrAlreadyStarted).
func (w *Worker) sweepNow(ctx context.Context, dryRun bool) (report.SweepReport, error) {
	var rep report.SweepReport
	switch w.state.Load() {
	case stateShutdown:
		return rep, ErrShutdown
	case stateRunning:
		return rep, fmt.Errorf("%w: a sweep on demand needs a Worker that is never started; a started one sweeps in its loop", ErrAlreadyStarted)
	}
	var rs *rowSweep
	if w.sweeper != nil {
		rs, _ = w.sweeper.by.(*rowSweep)
	}
	switch {
	case rs != nil:
	case w.opts.ownerMode || w.opts.info.OwnerFencing:
		rep.Why = "the resetter fences by owner: the rows of a dead instance are reset by owner"
		return rep, nil
	case !w.opts.info.ListsInProgress:
		rep.Why = fmt.Sprintf("the resetter (%T) cannot list the rows in progress", w.resetter)
		return rep, nil
	default:
		rep.Why = "the backstop sweep is off (WithBackstopSweep(false))"
		return rep, nil
	}
	rep.Swept = true
	w.fleet.learnRecord(ctx)
	rs.forget()
	defer rs.forget()
	var first sweepReport
	if err := rs.rowsLook(ctx, &first); err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.RowsInProgress = first.rowsInProgress
	rep.Stray = slices.Sorted(maps.Keys(rs.mem.stray))
	held, gap, _, err := rs.heldRows(ctx)
	if err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.Gap = gap
	if first.nodeHeld {
		// The look judged nothing. Rows in progress that every one is in
		// a set need no judging; the others are reported unjudged.
		if rep.Stray, err = unheld(ctx, rs, held); err != nil {
			return rep, fmt.Errorf("backstop sweep: %w", err)
		}
		rep.NodeHeld = len(rep.Stray) > 0
	}
	rep.Stuck = rep.Stray
	if dryRun || rep.NodeHeld || len(rep.Stray) == 0 {
		return rep, nil
	}
	// A rows TTL left that grew since (a live worker's set renewed) may
	// lengthen the gap the second look computes: wait a tenth more.
	wait := gap + gap/10
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
		return rep, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case <-t.C:
	}
	var second sweepReport
	err = rs.rowsLook(ctx, &second)
	rep.Waited = true
	rep.RowsReset, rep.Quarantined, rep.Locked = second.strayReset, second.strayQuarantined, second.strayLocked
	if second.nodeHeld {
		rep.NodeHeld = true
	}
	rep.Stuck = slices.Sorted(maps.Keys(rs.mem.stray))
	if err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	return rep, nil
}

// unheld lists, sorted, the rows in progress that no set of held holds.
func unheld(ctx context.Context, rs *rowSweep, held map[int64]string) ([]int64, error) {
	dbCtx, cancel := context.WithTimeout(ctx, rs.opts.resetTimeout)
	rows, err := rs.resetter.InProgressRows(dbCtx)
	cancel()
	var ids []int64
	for _, r := range rows {
		if _, ok := held[r.ID]; !ok {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	return ids, err
}

// recoverNowKeeping is recoverNow, leaving the dead peers of keep
// registered and untouched (in the report's Skipped): recoveryctl keeps a
// dead instance that left no rows set while rows in progress that no
// worker holds are not accounted for, so the operator still sees it.
// Only a Worker never started has no loop that scans meanwhile.
func (w *Worker) recoverNowKeeping(ctx context.Context, keep []string) (report.RecoveryReport, error) {
	if w.state.Load() == stateRunning && len(keep) > 0 {
		return report.RecoveryReport{}, fmt.Errorf("%w: a scan keeping peers needs a Worker that is never started", ErrAlreadyStarted)
	}
	w.recov.keep = make(map[string]bool, len(keep))
	for _, id := range keep {
		w.recov.keep[id] = true
	}
	defer func() { w.recov.keep = nil }()
	return w.recoverNow(ctx)
}
