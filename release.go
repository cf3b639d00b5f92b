package recovery

import (
	"context"
	"fmt"
	"log/slog"
)

// Release hands rows this worker took but will not finish back to the queue
// at once, instead of leaving them for a peer to recover after the worker
// dies: call it when the host abandons a block (CheckLease said
// ErrLeaseLost, or the shutdown deadline is near: call it before
// Shutdown). The rows go through the resetter like any reset, then they are
// untracked.
//
// With owner fencing (a resetter whose Info reports OwnerFencing, such as
// a pgxreset.Resetter with postgres.WithOwnerColumn) a row another worker holds now is left
// alone, so Release is safe in any state, also with the lease lost and
// after Shutdown. So it is with the reset ledger (a pgxreset.Resetter or
// sqlreset.Resetter without an owner column, unless postgres.WithoutResetLedger): the
// release is a reset under this worker's instance ID and incarnation, like
// a recovery of it, and skips the rows a recovery already reset, whoever
// holds them now (docs/safety.md §3). With neither, the status guard alone
// cannot tell this worker's rows from a peer's that were recovered and
// fetched again, so Release refuses with ErrLeaseLost while the lease is
// lost and with ErrShutdown after Shutdown: in those states peers may
// already have recovered the rows.
//
// The error says the rows could not be returned to the queue; they are
// then still tracked, for a peer to recover should this worker die. Rows
// another session holds locked are skipped (the reset does not wait for
// them): the others are released, and the error wraps ErrRowsLocked. Once
// they are back in the queue Release succeeds even if Redis cannot be
// reached to untrack them (a worker that lost its lease often cannot): the
// next heartbeat removes them from the rows set.
func (w *Worker) Release(ctx context.Context, rowIDs ...int64) error {
	if len(rowIDs) == 0 {
		return nil
	}
	return w.tracker.release(ctx, rowIDs)
}

// releaseSteps are the two steps of a release that differ by mode: the
// reset, and the untrack of the rows reset.
type releaseSteps interface {
	reset(ctx context.Context, req ResetRequest) (ResetResult, error)
	untrackUnchanged(gens map[int64]uint64) error
}

// releaseBy is Release, in either mode: by resets and untracks the rows
// as its mode does.
func (c *trackerCore) releaseBy(ctx context.Context, rowIDs []int64, by releaseSteps) error {
	// Rows left to the backstop sweep after a lost lease (heartbeat.go):
	// a reset of them could reach a peer that took them since.
	rowIDs, left := c.rows.takeAbandoned(rowIDs)
	if left > 0 {
		c.log.Info("released rows left to the backstop sweep: nothing reset for them", slog.Int("rows", left))
		c.stats.rowsReleased.Add(uint64(left))
	}
	if len(rowIDs) == 0 {
		return nil
	}
	// One release of this worker at a time: the library releases the same
	// rows from two places (the give-back, Block.Close), and a release that
	// fails must not drop the marks of one that committed (below).
	select {
	case c.releaseLock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("release %d rows of %s: waiting for another release: %w", len(rowIDs), c.id, ctx.Err())
	}
	defer func() { <-c.releaseLock }()
	if err := c.releaseRefused(len(rowIDs)); err != nil {
		return err
	}
	// The host may take a row again as soon as the reset commits, and
	// Track it before this Release untracks it: only rows tracked now, and
	// not tracked again by then, are untracked below.
	gens := c.rows.generations(rowIDs)
	req := ResetRequest{InstanceID: c.id, Incarnation: c.rows.currentIncarnation(), RowIDs: rowIDs}
	if mutantReleaseUnrecorded {
		req.Incarnation = ""
	}
	fenced := c.info.OwnerFencing
	var marked map[int64]struct{}
	if !fenced {
		// The reset is recorded under this incarnation: a row taken again,
		// even before this call returns, must be tracked under a new one
		// (Track rotates it). Only the rows this call marks are unmarked
		// on failure: a mark an earlier release left (its reset committed,
		// the incarnation not rotated yet) stays.
		marked = c.rows.markReleased(rowIDs)
	}
	res, err := by.reset(ctx, req)
	if err != nil {
		if !fenced {
			c.rows.unmarkReleased(members(marked))
		}
		return fmt.Errorf("release %d rows of %s: %w", len(rowIDs), c.id, err)
	}
	lockedErr := c.keepLocked(res, gens, marked, len(rowIDs))
	attrs := []any{slog.Int("rows", len(rowIDs)), slog.Int64("rows_reset", res.Changed),
		slog.Int("rows_quarantined", len(res.Quarantined))}
	if err := by.untrackUnchanged(gens); err != nil {
		attrs = append(attrs, slog.String("untrack_error", err.Error()))
	}
	c.log.Info("released rows", attrs...)
	c.stats.rowsReleased.Add(uint64(len(rowIDs)))
	c.events.emit(Event{Kind: EventRowsReleased, Rows: len(rowIDs), RowsReset: res.Changed, RowsQuarantined: len(res.Quarantined)})
	return lockedErr
}

// releaseRefused returns why a release of n rows is refused: without
// owner fencing or reset ledger, after Shutdown or with the lease lost
// (peers may already have recovered the rows); nil when it may go on.
func (c *trackerCore) releaseRefused(n int) error {
	if releaseSafeAfterLoss(c.info) {
		return nil
	}
	switch {
	case c.state.Load() == stateShutdown:
		return fmt.Errorf("release %d rows of %s without owner fencing or reset ledger: %w", n, c.id, ErrShutdown)
	case c.state.Load() == stateRunning && c.lease.check(c.rows.heldAtLoss()) != nil:
		return fmt.Errorf("release %d rows of %s without owner fencing or reset ledger: %w", n, c.id, ErrLeaseLost)
	}
	return nil
}

// keepLocked keeps tracked the rows of a release of n rows that another
// session held locked: the reset skipped them, they stay tracked for a
// peer to recover should this worker die (dropped from gens, their marks
// undone), and the error it returns says so; nil when none was locked.
func (c *trackerCore) keepLocked(res ResetResult, gens map[int64]uint64, marked map[int64]struct{}, n int) error {
	locks := lockedRows(res.NotReset)
	if locks == 0 {
		return nil
	}
	var locked []int64
	for _, s := range res.NotReset {
		if s.Locked {
			delete(gens, s.ID)
			if _, ok := marked[s.ID]; ok {
				locked = append(locked, s.ID)
			}
		}
	}
	if !c.info.OwnerFencing {
		c.rows.unmarkReleased(locked)
	}
	return fmt.Errorf("release %d rows of %s: %w: %d rows (first: row %d) are held by another session's open transaction; they stay tracked",
		n, c.id, ErrRowsLocked, locks, res.NotReset[0].ID)
}

// release resets the rows under the instance ID and the incarnation, in
// one reset.
func (t *rowsSetTracker) release(ctx context.Context, ids []int64) error {
	return t.releaseBy(ctx, ids, t)
}

func (t *rowsSetTracker) reset(ctx context.Context, req ResetRequest) (ResetResult, error) {
	return t.resetter.Reset(ctx, req)
}

// release resets the rows under the owner value each was fetched under.
func (t *ownerTracker) release(ctx context.Context, ids []int64) error {
	return t.releaseBy(ctx, ids, t)
}

// reset resets the rows of req under the owner value each was fetched
// under (TrackAs), one reset per value: a row of an ended life is matched
// by that life's value, not the current one. A per-life value is the whole
// guard, so those resets use no ledger; rows under the bare instance ID
// are reset as before, under the incarnation.
func (t *ownerTracker) reset(ctx context.Context, req ResetRequest) (ResetResult, error) {
	var total ResetResult
	add := func(res ResetResult) int {
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.NotReset = append(total.NotReset, res.NotReset...)
		return int(res.Changed) + len(res.NotReset) // quarantined rows included
	}
	var bare []int64
	for owner, ids := range t.rows.ownersOf(req.RowIDs, t.currentOwner()) {
		if owner == t.id {
			bare = append(bare, ids...)
			continue
		}
		res, err := t.resetter.Reset(ctx, ResetRequest{InstanceID: owner, RowIDs: ids})
		if err != nil {
			return total, err
		}
		if add(res) < len(ids) {
			// Some were not this life's: a host that wrote the bare ID
			// (before the self-check noticed) holds them under it.
			bare = append(bare, ids...)
		}
	}
	if len(bare) > 0 {
		res, err := t.resetter.Reset(ctx, ResetRequest{InstanceID: t.id, Incarnation: req.Incarnation, RowIDs: bare})
		if err != nil {
			return total, err
		}
		add(res)
	}
	return total, nil
}
