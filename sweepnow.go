package recovery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/alya/recovery/internal/report"
)

// The backstop sweep on demand, for an operator's tool (ops.SweepNow,
// recoveryctl recover): the sweep's own looks (rowSweep.rowsLook,
// ownerSweep.look), run by a Worker that is never started, so no loop
// shares its memory of the looks.

// sweepNow takes a look of the backstop sweep by row version and, unless
// dryRun, a second one a gap later, which resets the rows no rows set held
// at either, with their version in the statement as the sweep does; with
// an owner column, sweepOwners. It
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
	switch by := w.sweeper.strategy().(type) {
	case *rowSweep:
		rs = by
	case *ownerSweep:
		return w.sweepOwners(ctx, by, dryRun)
	}
	switch {
	case rs != nil:
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
	gap, err := firstRowsLook(ctx, rs, &rep)
	if err != nil {
		return rep, err
	}
	if dryRun || rep.NodeHeld || len(rep.Stray) == 0 {
		return rep, nil
	}
	if waited, err := waitGap(ctx, gap); !waited {
		return rep, err
	}
	return rep, secondRowsLook(ctx, rs, &rep)
}

// firstRowsLook is the first look of a sweep on demand by row version:
// it reports the rows in progress in no rows set, and returns the gap to
// wait before the second look may reset them.
func firstRowsLook(ctx context.Context, rs *rowSweep, rep *report.SweepReport) (time.Duration, error) {
	if err := ownerPeersLive(ctx, rs); err != nil {
		return 0, err
	}
	var first sweepReport
	if err := rs.rowsLook(ctx, &first); err != nil {
		return 0, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.RowsInProgress = first.rowsInProgress
	rep.Stray = slices.Sorted(maps.Keys(rs.mem.stray))
	held, gap, _, err := rs.heldRows(ctx)
	if err != nil {
		return 0, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.Gap = gap
	if first.nodeHeld {
		// The look judged nothing. Rows in progress that every one is in
		// a set need no judging; the others are reported unjudged.
		if rep.Stray, err = unheld(ctx, rs, held); err != nil {
			return 0, fmt.Errorf("backstop sweep: %w", err)
		}
		rep.NodeHeld = len(rep.Stray) > 0
	}
	rep.Stuck = rep.Stray
	return gap, nil
}

// secondRowsLook is the second look of a sweep on demand by row version,
// a gap after the first: it resets the rows still in no rows set and
// reports those still stuck.
func secondRowsLook(ctx context.Context, rs *rowSweep, rep *report.SweepReport) error {
	if err := ownerPeersLive(ctx, rs); err != nil {
		return err
	}
	var second sweepReport
	err := rs.rowsLook(ctx, &second)
	rep.Waited = true
	rep.RowsReset, rep.Quarantined, rep.Locked = second.strayReset, second.strayQuarantined, second.strayLocked
	if second.nodeHeld {
		rep.NodeHeld = true
	}
	// A row the database refused is still in progress: stuck, though the
	// sweep's memory tries it again only a gap later, as a new stray row.
	rep.Refused = slices.Sorted(slices.Values(second.refusedIDs))
	stuck := maps.Clone(rs.mem.stray)
	for _, id := range rep.Refused {
		stuck[id] = strayRow{}
	}
	rep.Stuck = slices.Sorted(maps.Keys(stuck))
	if err != nil {
		return fmt.Errorf("backstop sweep: %w", err)
	}
	return nil
}

// sweepOwners is sweepNow by owner: a look of the sweep by owner
// (ownerSweep.look) finds the owners of rows in progress without a
// heartbeat, and, unless dryRun, a second one a fleet's heartbeat TTL
// later hands those still without one to the dead-peer path, which resets
// their rows by owner, as the sweep does.
func (w *Worker) sweepOwners(ctx context.Context, s *ownerSweep, dryRun bool) (report.SweepReport, error) {
	rep := report.SweepReport{Swept: true, ByOwner: true}
	w.fleet.learnRecord(ctx)
	s.forget()
	defer s.forget()
	var first sweepReport
	if err := s.look(ctx, &first); err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.Owners = slices.Sorted(maps.Keys(s.absentSince))
	rep.StuckOwners = rep.Owners
	rep.Gap = w.fleet.ttl()
	if dryRun || len(rep.Owners) == 0 {
		return rep, nil
	}
	if waited, err := waitGap(ctx, rep.Gap); !waited {
		return rep, err
	}
	var second sweepReport
	err := s.look(ctx, &second)
	rep.Waited = true
	for _, pr := range second.recovered {
		rep.RowsReset += pr.RowsReset
		rep.Quarantined += len(pr.Quarantined)
	}
	rep.StuckOwners = slices.Sorted(maps.Keys(s.absentSince))
	if err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	return rep, nil
}

// ownerPeersLive is the sweep's yield (rowSweep.yield): live members
// that announce owner mode (an owner-column rollout) hold rows no rows set
// lists, which a sweep by row version would take for stray rows, so it
// judges nothing then.
func ownerPeersLive(ctx context.Context, rs *rowSweep) error {
	var rep sweepReport
	yield, err := rs.yield(ctx, &rep)
	switch {
	case err != nil:
		return fmt.Errorf("backstop sweep: %w", err)
	case yield:
		return fmt.Errorf("backstop sweep by row version not run: live members announce owner mode (%s), and their rows are in no rows set; run it with the fleet's owner column",
			strings.Join(rep.ownerPeers, ", "))
	}
	return nil
}

// waitGap waits the sweep's gap and a tenth more (a TTL left that grew
// meanwhile, a live worker's set renewed, may lengthen the gap the second
// look computes), and reports whether it did: not when ctx would end
// first (then at once, with no error), nor when ctx ended meanwhile.
func waitGap(ctx context.Context, gap time.Duration) (bool, error) {
	wait := gap + gap/10
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
		return false, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return true, nil
	}
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
