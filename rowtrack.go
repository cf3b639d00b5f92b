package recovery

import (
	"context"
	"fmt"
)

// Track records that this worker is processing rowIDs: call it inside the
// transaction of FetchBlockOfRows, after the UPDATE that marks them in
// progress and before its COMMIT. A crash after the commit then always
// finds the rows tracked, and a crash before it leaves them queued;
// tracking after the commit leaves a moment in which a crash strands them
// in progress, untracked (docs/safety.md, section 2). If the worker dies
// before it calls Untrack, a peer returns the rows to the queue. In
// rows-set mode it adds the IDs to the worker's rows set and refreshes the
// set's TTL in one round trip, bounded by ctx. In owner mode (OwnerMode) it
// only records them in the worker's own view (for Release, the lease and
// the self-check) and sends nothing: the owner column the fetch set is what
// recovery reads.
//
// While the self-check has not yet verified the configuration (usually the
// first block only), Track also reads the state of up to 8 of the rows
// before it returns: one indexed statement, given up after a tenth of the
// self-check window (50 ms by default) (docs/design.md, "Self-check").
//
// Track returns ErrNotStarted before Start, ErrShutdown after Shutdown and
// ErrLeaseLost while the heartbeat lease is lost; in those cases nothing is
// recorded. If only the Redis write fails (rows-set mode), the IDs are kept
// in memory and written with the next heartbeat: a row the host goes on to
// process is protected from then on, but a crash before that heartbeat
// strands it unless the backstop sweep is on. The safe reaction to any
// Track error is to roll the fetch back (and Untrack the IDs).
//
// In owner mode Track takes the rows for fetched under the value Owner
// last returned, and refuses them (ErrLeaseLost) if that life has ended
// since. Hosts that fetch blocks concurrently, each under its own read of
// Owner, must call TrackAs with each block's value instead: the last value
// read may be another goroutine's, read after the loss.
func (w *Worker) Track(ctx context.Context, rowIDs ...int64) error {
	if w.ownerMode {
		return w.TrackAs(ctx, w.trackOwner(), rowIDs...)
	}
	w.trackCalls.Add(1)
	if err := w.CheckLease(); err != nil {
		return err
	}
	if len(rowIDs) == 0 {
		return nil
	}
	retaken := w.rows.add(rowIDs)
	if w.checker != nil {
		w.checker.preImages(ctx, rowIDs)
		w.checker.tracked()
	}
	if retaken {
		if err := w.rotateIncarnation(ctx); err != nil {
			return fmt.Errorf("track %d rows of %s: new incarnation: %w", len(rowIDs), w.opts.instanceID, err)
		}
	}
	if err := w.store.TrackRows(ctx, w.opts.instanceID, rowIDs, w.fleet.rowsTTL()); err != nil {
		return fmt.Errorf("track %d rows of %s: %w", len(rowIDs), w.opts.instanceID, err)
	}
	return nil
}

// TrackAs is Track for rows the host fetched under owner, the value Owner
// returned when it began the fetch (and wrote into the owner column). In
// owner mode it refuses, with an error wrapping ErrLeaseLost and tracking
// nothing, rows fetched under a life of this worker that has ended since
// (the lease was lost meanwhile, docs/safety.md §2): a recovery of that
// life may reset them at any time. Roll the fetch back and fetch again
// under the new OwnerValue(). A bare instance ID (a host that writes
// InstanceID()) is accepted, but such rows belong to every life of the
// worker, so a regained lease is then held for a claim TTL (CheckLease).
// In rows-set mode owner must be the instance ID, and TrackAs is Track.
func (w *Worker) TrackAs(ctx context.Context, owner string, rowIDs ...int64) error {
	if !w.ownerMode {
		if owner != w.opts.instanceID {
			return fmt.Errorf("track %d rows of %s under owner %q: %w: in rows-set mode the owner column holds the instance ID (OwnerValue())",
				len(rowIDs), w.opts.instanceID, clip(owner), ErrInvalidConfig)
		}
		return w.Track(ctx, rowIDs...)
	}
	if err := w.CheckLease(); err != nil {
		return err
	}
	life, written := w.rows.writtenLife()
	switch id, l, ok := parseOwner(owner); {
	case !ok || id != w.opts.instanceID:
		return fmt.Errorf("track %d rows of %s under owner %q: %w: not a value of this worker's OwnerValue()",
			len(rowIDs), w.opts.instanceID, clip(owner), ErrInvalidConfig)
	case l == "":
		// A bare ID names every life: a recovery of a life judged dead
		// resets such rows whenever its statements run.
		w.lease.noteBareOwners()
		if w.lease.held() {
			return fmt.Errorf("track %d rows of %s under its bare instance ID: %w: held after a regained lease (write OwnerValue() to resume at once)",
				len(rowIDs), w.opts.instanceID, ErrLeaseLost)
		}
	case l != life:
		return fmt.Errorf("track %d rows of %s fetched under %q: %w: that life ended (the lease was lost since); roll the fetch back and fetch under OwnerValue()",
			len(rowIDs), w.opts.instanceID, clip(owner), ErrLeaseLost)
	}
	if !written {
		// Recorded by the next heartbeat: until then a recoverer could
		// not tell this life from an ended one.
		return fmt.Errorf("track %d rows of %s: %w: the new life is not recorded in Redis yet", len(rowIDs), w.opts.instanceID, ErrLeaseLost)
	}
	if len(rowIDs) == 0 {
		return nil
	}
	if !w.rows.addOwned(rowIDs, owner, life) {
		return fmt.Errorf("track %d rows of %s fetched under %q: %w: the lease was lost meanwhile", len(rowIDs), w.opts.instanceID, clip(owner), ErrLeaseLost)
	}
	if w.checker != nil {
		w.checker.preImages(ctx, rowIDs)
		w.checker.tracked()
	}
	return nil // the owner column says it all: nothing is sent to Redis
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
// the rows from Redis in a batch shortly after (see that option). In owner
// mode Untrack only updates the worker's own view and sends nothing.
func (w *Worker) Untrack(rowIDs ...int64) error {
	if len(rowIDs) == 0 {
		return nil
	}
	w.untrackedCall(rowIDs)
	if w.checker != nil {
		w.checker.untracking(rowIDs)
	}
	if w.ownerMode {
		w.rows.remove(rowIDs)
		return nil
	}
	if w.opts.untrackLinger > 0 && w.state.Load() == stateRunning {
		w.rows.forget(rowIDs)
		if w.state.Load() != stateRunning { // Shutdown began: its clean-up may have run
			ctx, cancel := w.opts.opContext(context.Background())
			defer cancel()
			w.flusher.runOnce(ctx)
			return nil
		}
		w.flusher.kick()
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
	ctx, cancel := w.opts.opContext(context.Background())
	defer cancel()
	if err := w.store.UntrackRows(ctx, w.opts.instanceID, ids); err != nil {
		w.rows.markUnremoved(ids)
		return fmt.Errorf("untrack %d rows of %s: %w", len(ids), w.opts.instanceID, err)
	}
	w.retrack(ctx, ids)
	return nil
}

// untrackUnchanged untracks the rows of gens that were not tracked again
// since gens was taken (Release), as Untrack would.
func (w *Worker) untrackUnchanged(gens map[int64]uint64) error {
	if w.ownerMode {
		w.rows.removeUnchanged(gens, false)
		return nil
	}
	if w.opts.untrackLinger > 0 && w.state.Load() == stateRunning {
		if len(w.rows.removeUnchanged(gens, true)) > 0 {
			w.flusher.kick()
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
	if err := w.store.RotateIncarnation(ctx, w.opts.instanceID, gone, next, w.fleet.incarnationTTL()); err != nil {
		return err
	}
	w.rows.rotated(next, gone)
	w.retrack(ctx, gone)
	return nil
}

// retrack writes back the rows among removed that are tracked again: a
// Track of one of them may have reached Redis before the SREM that removed
// it. A Track that comes later sends its own SADD after the SREM.
func (w *Worker) retrack(ctx context.Context, removed []int64) {
	again := w.rows.trackedAmong(removed)
	if len(again) == 0 {
		return
	}
	// On failure the next heartbeat writes them back.
	_ = w.store.RetrackRows(ctx, w.opts.instanceID, again)
}
