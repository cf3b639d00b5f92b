package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Track records that this worker is processing rowIDs: call it inside the
// transaction of FetchBlockOfRows, after the UPDATE that marks them in
// progress and before its COMMIT. A crash after the commit then always
// finds the rows tracked, and a crash before it leaves them queued;
// tracking after the commit leaves a moment in which a crash strands them
// in progress, untracked (docs/safety.md, section 2). If the worker dies
// before it calls Untrack, a peer returns the rows to the queue. It adds the IDs to the worker's rows set and refreshes the set's
// TTL in one round trip, bounded by ctx.
//
// Track returns ErrNotStarted before Start, ErrShutdown after Shutdown and
// ErrLeaseLost while the heartbeat lease is lost; in those cases nothing is
// recorded. If only the Redis write fails, the IDs are kept in memory and
// written with the next heartbeat, so a row the host goes on to process is
// still protected; call Untrack for rows the host will not process.
func (w *Worker) Track(ctx context.Context, rowIDs ...int64) error {
	switch w.state.Load() {
	case stateNew:
		return ErrNotStarted
	case stateShutdown:
		return ErrShutdown
	}
	if err := w.lease.check(w); err != nil {
		return err
	}
	if len(rowIDs) == 0 {
		return nil
	}
	if w.rows.add(rowIDs) {
		if err := w.rotateIncarnation(ctx); err != nil {
			return fmt.Errorf("track %d rows of %s: new incarnation: %w", len(rowIDs), w.opts.instanceID, err)
		}
	}
	pipe := w.rdb.Pipeline()
	pipe.SAdd(ctx, w.keys.Rows, idArgs(rowIDs)...)
	pipe.PExpire(ctx, w.keys.Rows, w.opts.rowsTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("track %d rows of %s: %w", len(rowIDs), w.opts.instanceID, err)
	}
	return nil
}

// Untrack records that this worker has finished rowIDs, successfully or not:
// call it after each row's outcome is committed. It removes the IDs from the
// rows set with its own background context and the operation timeout, never
// the caller's, so a cancelled processing context cannot leave a finished
// row tracked (recovery would put it back in the queue). It works before
// Start and after Shutdown too.
//
// If the removal fails, the rows are forgotten in memory all the same and
// the next heartbeat removes them from Redis; the error is returned for
// logging.
//
// With WithDeferredUntrack, a running worker returns at once and removes
// the rows from Redis in a batch shortly after (see that option).
func (w *Worker) Untrack(rowIDs ...int64) error {
	if len(rowIDs) == 0 {
		return nil
	}
	if w.opts.untrackLinger > 0 && w.state.Load() == stateRunning {
		w.rows.forget(rowIDs)
		if w.state.Load() != stateRunning { // Shutdown began: its clean-up may have run
			ctx, cancel := w.opContext(context.Background())
			defer cancel()
			w.flushUntracked(ctx)
			return nil
		}
		select {
		case w.untrackKick <- struct{}{}:
		default: // a flush is already due
		}
		return nil
	}
	w.rows.assert.RLock()
	defer w.rows.assert.RUnlock()
	w.rows.remove(rowIDs)
	return w.sremUntracked(rowIDs)
}

// sremUntracked removes rows just untracked in memory from the rows set;
// the caller holds the rows-set lock shared. A Track of one of them that
// Redis answered before the SREM is written back (retrack).
func (w *Worker) sremUntracked(ids []int64) error {
	ctx, cancel := w.opContext(context.Background())
	defer cancel()
	args := idArgs(ids)
	if err := w.rdb.SRem(ctx, w.keys.Rows, args...).Err(); err != nil {
		w.rows.markUnremoved(ids)
		return fmt.Errorf("untrack %d rows of %s: %w", len(ids), w.opts.instanceID, err)
	}
	w.retrack(ctx, args)
	return nil
}

// untrackUnchanged untracks the rows of gens that were not tracked again
// since gens was taken (Release), as Untrack would.
func (w *Worker) untrackUnchanged(gens map[int64]uint64) error {
	if w.opts.untrackLinger > 0 && w.state.Load() == stateRunning {
		if len(w.rows.removeUnchanged(gens, true)) > 0 {
			select {
			case w.untrackKick <- struct{}{}:
			default:
			}
		}
		return nil
	}
	w.rows.assert.RLock()
	defer w.rows.assert.RUnlock()
	ids := w.rows.removeUnchanged(gens, false)
	if len(ids) == 0 {
		return nil
	}
	return w.sremUntracked(ids)
}

// Release hands rows this worker took but will not finish back to the queue
// at once, instead of leaving them for a peer to recover after the worker
// dies: call it when the host abandons a block (CheckLease said
// ErrLeaseLost, or the shutdown deadline is near: call it before
// Shutdown). The rows go through the resetter like any reset, then they are
// untracked.
//
// With owner fencing (a resetter whose FencesByOwner reports true, such as
// a PgxResetter WithOwnerColumn) a row another worker holds now is left
// alone, so Release is safe in any state, also with the lease lost and
// after Shutdown. Without it the status guard alone cannot tell this
// worker's rows from a peer's that were recovered and fetched again, so
// Release refuses with ErrLeaseLost while the lease is lost and with
// ErrShutdown after Shutdown: in those states peers may already have
// recovered the rows.
//
// The error says the rows could not be returned to the queue; they are
// then still tracked, for a peer to recover should this worker die. Once
// they are back in the queue Release succeeds even if Redis cannot be
// reached to untrack them (a worker that lost its lease often cannot): the
// next heartbeat removes them from the rows set.
func (w *Worker) Release(ctx context.Context, rowIDs ...int64) error {
	if len(rowIDs) == 0 {
		return nil
	}
	if !fencesByOwner(w.resetter) {
		switch {
		case w.state.Load() == stateShutdown:
			return fmt.Errorf("release %d rows of %s without owner fencing: %w", len(rowIDs), w.opts.instanceID, ErrShutdown)
		case w.state.Load() == stateRunning && w.lease.check(w) != nil:
			return fmt.Errorf("release %d rows of %s without owner fencing: %w", len(rowIDs), w.opts.instanceID, ErrLeaseLost)
		}
	}
	// The host may take a row again as soon as the reset commits, and
	// Track it before this Release untracks it: only rows tracked now, and
	// not tracked again by then, are untracked below.
	gens := w.rows.generations(rowIDs)
	req := ResetRequest{InstanceID: w.opts.instanceID, Incarnation: w.rows.currentIncarnation(), RowIDs: rowIDs}
	fenced := fencesByOwner(w.resetter)
	if !fenced {
		// The reset is recorded under this incarnation: a row taken again,
		// even before this call returns, must be tracked under a new one
		// (Track rotates it).
		w.rows.markReleased(rowIDs)
	}
	res, err := resetRows(ctx, w.resetter, req)
	if err != nil {
		if !fenced {
			w.rows.unmarkReleased(rowIDs)
		}
		return fmt.Errorf("release %d rows of %s: %w", len(rowIDs), w.opts.instanceID, err)
	}
	attrs := []any{slog.Int("rows", len(rowIDs)), slog.Int64("rows_reset", res.Reset),
		slog.Int("rows_quarantined", len(res.Quarantined))}
	if err := w.untrackUnchanged(gens); err != nil {
		attrs = append(attrs, slog.String("untrack_error", err.Error()))
	}
	w.log.Info("released rows", attrs...)
	w.stats.rowsReleased.Add(uint64(len(rowIDs)))
	w.emit(Event{Kind: EventRowsReleased, Rows: len(rowIDs), RowsReset: res.Reset, RowsQuarantined: len(res.Quarantined)})
	return nil
}

// TrackedRows returns how many rows the worker is tracking now.
func (w *Worker) TrackedRows() int { return w.rows.len() }

// runUntrackFlusher sends the SREMs of deferred Untracks: after the first
// Untrack of a batch it waits the linger, then removes every row untracked
// meanwhile in one command. A failed flush is retried by the next
// heartbeat; Shutdown flushes what is left.
func (w *Worker) runUntrackFlusher(ctx context.Context) {
	linger := time.NewTimer(0)
	<-linger.C
	defer linger.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.untrackKick:
		}
		linger.Reset(w.opts.untrackLinger)
		select {
		case <-ctx.Done():
			return
		case <-linger.C:
		}
		w.flushUntracked(ctx)
	}
}

// flushUntracked removes the rows waiting for their SREM, in one command.
func (w *Worker) flushUntracked(ctx context.Context) {
	w.rows.assert.Lock()
	defer w.rows.assert.Unlock()
	pending := w.rows.pendingRemovals()
	if len(pending) == 0 {
		return
	}
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	if err := w.rdb.SRem(opCtx, w.keys.Rows, pending...).Err(); err == nil {
		w.rows.forgetUnremoved(pending)
		w.retrack(opCtx, pending)
	}
}

// rotateIncarnation gives the rows set a new incarnation, in one
// transaction with the removal of the released rows not tracked again:
// under the new incarnation every member is a row this worker holds, none
// recorded in the ledger. The rows tracked again are written back after
// (retrack), in case a Track of one was answered before the SREM. It takes
// the rows-set lock; rotateLocked is for a caller that holds it.
func (w *Worker) rotateIncarnation(ctx context.Context) error {
	w.rows.assert.Lock()
	defer w.rows.assert.Unlock()
	return w.rotateLocked(ctx)
}

func (w *Worker) rotateLocked(ctx context.Context) error {
	if !w.rows.retaken() {
		return nil // done meanwhile
	}
	gone, next := w.rows.rotation()
	pipe := w.rdb.TxPipeline()
	if len(gone) > 0 {
		pipe.SRem(ctx, w.keys.Rows, gone...)
	}
	pipe.Set(ctx, w.keys.Incarnation, next, w.incarnationTTL())
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	w.rows.rotated(next, gone)
	w.retrack(ctx, gone)
	return nil
}

// incarnationTTL outlives the rows set by a heartbeat interval: the
// heartbeat writes both, Track renews only the set.
func (w *Worker) incarnationTTL() time.Duration {
	return satAdd(w.opts.rowsTTL, w.opts.heartbeatInterval)
}

// retrack writes back the rows among removed that are tracked again: a
// Track of one of them may have reached Redis before the SREM that removed
// it. A Track that comes later sends its own SADD after the SREM.
func (w *Worker) retrack(ctx context.Context, removed []any) {
	again := w.rows.trackedAmong(removed)
	if len(again) == 0 {
		return
	}
	// On failure the next heartbeat writes them back.
	_ = w.rdb.SAdd(ctx, w.keys.Rows, again...).Err()
}
