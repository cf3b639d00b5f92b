package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/alya/recovery/internal/store"
)

// tracker is how this worker records the rows it holds: Track, TrackAs,
// Untrack, Release and OwnerValue are calls into it. New picks one of two
// once, by mode (decisions, worker.go), and nothing else branches on the mode:
// ownerTracker (owner.go) keeps the rows in memory and sends nothing to
// Redis, the owner column says it all; rowsSetTracker (below) mirrors them
// in the worker's rows set (SADD and SREM, the incarnation, retrack and
// the deferred-untrack flusher).
type tracker interface {
	// track is Track; trackAs is TrackAs.
	track(ctx context.Context, ids []int64) error
	trackAs(ctx context.Context, owner string, ids []int64) error
	// untrack is Untrack, after its check for a host that never calls
	// Track (untrackedAlarm.untrackCall, rowsweep.go).
	untrack(ids []int64) error
	// release is Release of rows the host passed (not none).
	release(ctx context.Context, ids []int64) error
	// ownerValue is OwnerValue; currentOwner is the same value for the
	// library's own use, which leaves alone the one a plain Track takes.
	ownerValue() string
	currentOwner() string
	// rotateLocked gives the rows set a new incarnation if a released row
	// was tracked again (the heartbeat, under the rows-set lock; owner
	// mode never marks rows released, so nothing to do). retrack writes
	// back the rows among removed that are tracked again (after a removal
	// the heartbeat sent).
	rotateLocked(ctx context.Context) error
	retrack(ctx context.Context, removed []int64)
	// trackCalled reports whether Track was called since New in rows-set
	// mode (the untracked-rows note, rowsweep.go); owner mode counts none.
	trackCalled() bool
	// loop is the deferred-untrack flusher for Start to run, or nil.
	loop() func(context.Context)

	// checkLoss is the heartbeat's look, after a lost lease and before
	// it writes anything, at what became of the rows held at the loss.
	// lateBeat, under the rows-set lock, handles a heartbeat sent so late
	// it may land on an expired key. beatRows returns, of the rows
	// tracked and those whose removal failed, what a heartbeat or a
	// departure writes to the rows set and removes from it.
	checkLoss(ctx context.Context) error
	lateBeat()
	beatRows(tracked, unremoved []int64) (add, remove []int64)

	holdings
}

// holdings is what the rest of the worker asks the mode about the rows
// workers hold: the dead-peer path, the scan's order and the plan of a
// recovery. Each tracker answers for its mode.
type holdings interface {
	// heldByOwner reports whether the owner column, not a rows set, says
	// which rows a worker holds (owner mode): a dead peer's rows are then
	// reset by owner, found whether or not Redis remembers them.
	heldByOwner() bool
	// owningPeers asks the table which of peers own rows in progress,
	// with the per-life owner values of each; nil maps and no error when
	// the mode keeps no owner in the table (rows-set mode).
	owningPeers(ctx context.Context, peers []string) (owning map[string]bool, lives map[string][]string, err error)
}

// trackerCore is what both trackers share: the worker's own record of its
// rows and what Release reports to.
type trackerCore struct {
	rows     *inflight
	id       string // the instance ID
	resetter Resetter
	info     ResetterInfo
	state    *atomic.Int32 // the Worker's lifecycle state
	lease    *lease
	checker  *selfChecker
	log      *slog.Logger
	stats    *counters
	events   *dispatcher
	// releaseLock, a channel of capacity 1 shared by the copies of the
	// core, serializes the releases of the worker (releaseBy); a channel,
	// not a mutex, so that a release waiting for another is durably
	// blocked in the simulator's synctest bubble, and gives up with its
	// context.
	releaseLock chan struct{}
}

// checkTracked tells the self-check about rows just tracked.
func (c *trackerCore) checkTracked(ctx context.Context, ids []int64) {
	if c.checker != nil {
		c.checker.preImages(ctx, ids)
		c.checker.tracked()
	}
}

// checkUntracking tells the self-check about rows about to be untracked.
func (c *trackerCore) checkUntracking(ids []int64) {
	if c.checker != nil {
		c.checker.untracking(ids)
	}
}

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
	return w.tracker.track(ctx, rowIDs)
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
	return w.tracker.trackAs(ctx, owner, rowIDs)
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
	w.untracked.untrackCall(rowIDs)
	return w.tracker.untrack(rowIDs)
}

// rowsSetTracker is the tracker of rows-set mode: every row tracked is a
// member of the worker's rows set in Redis, which recovery reads.
type rowsSetTracker struct {
	trackerCore
	store store.Store
	fleet *fleetView // the rows set's TTLs
	opts  *options   // read-only: the operation timeout
	// flusher removes deferred Untracks from the rows set
	// (WithDeferredUntrack); nil without it.
	flusher *untrackFlusher
	// calls counts Track calls (the untracked-rows note, rowsweep.go).
	calls atomic.Uint64
	// byVersion: the backstop sweep resets by row version (sweepOf), so a
	// rows set lost during a lost lease leaves its rows to the sweep
	// (checkLoss).
	byVersion bool
}

// heldByOwner is false: the rows set says which rows a worker holds.
func (t *rowsSetTracker) heldByOwner() bool { return false }

// owningPeers asks nothing: no owner is kept in the table.
func (t *rowsSetTracker) owningPeers(context.Context, []string) (map[string]bool, map[string][]string, error) {
	return nil, nil, nil
}

// beatRows is what the rows set must hold and lose.
func (t *rowsSetTracker) beatRows(tracked, unremoved []int64) (add, remove []int64) {
	return tracked, unremoved
}

// lateBeat has nothing to do: a late heartbeat renews the one rows set.
func (t *rowsSetTracker) lateBeat() {}

// checkLoss looks, after a lost lease, for this worker's rows set when
// the backstop sweep resets by row version. That sweep resets rows no
// set held at two looks a gap apart, and records that in no ledger. If
// this worker's rows set is gone, the sweep may have reset the rows held
// at the loss and peers taken them again: written back, a Release of
// them (or a recovery of this worker) would reset them under their new
// holder. They are left to the sweep instead. The set is only ever
// created by this worker, so a set still there has held them throughout.
func (t *rowsSetTracker) checkLoss(ctx context.Context) error {
	if !t.rows.needsLossCheck() || !t.byVersion {
		return nil
	}
	own, err := t.store.ReadOwn(ctx, t.id)
	if err != nil {
		t.stats.heartbeatFailures.Add(1)
		return fmt.Errorf("look for the rows set after a lost lease: %w", err)
	}
	if ids := t.rows.abandonStale(!own.RowsSet); len(ids) > 0 {
		t.log.Warn("rows held when the lease was lost are left to the backstop sweep: this worker's rows set was gone when its heartbeat came back, so the sweep may have reset them and peers taken them again; they are not written back, and Release of them only forgets them",
			slog.Int("rows", len(ids)))
	}
	return nil
}

// newRowsSetTracker returns the tracker of rows-set mode; with
// WithDeferredUntrack it has a flusher, which Start runs (loop).
func newRowsSetTracker(core trackerCore, st store.Store, fleet *fleetView, opts *options, byVersion bool) *rowsSetTracker {
	t := &rowsSetTracker{trackerCore: core, store: st, fleet: fleet, opts: opts, byVersion: byVersion}
	if opts.untrackLinger > 0 {
		t.flusher = newUntrackFlusher(t)
	}
	return t
}

func (t *rowsSetTracker) track(ctx context.Context, ids []int64) error {
	t.calls.Add(1)
	if err := t.lease.checkTrack(t.state); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	retaken := t.rows.add(ids)
	t.checkTracked(ctx, ids)
	if retaken {
		if err := t.rotateIncarnation(ctx); err != nil {
			return fmt.Errorf("track %d rows of %s: new incarnation: %w", len(ids), t.id, err)
		}
	}
	if err := t.store.TrackRows(ctx, t.id, ids, t.fleet.rowsTTL()); err != nil {
		return fmt.Errorf("track %d rows of %s: %w", len(ids), t.id, err)
	}
	return nil
}

func (t *rowsSetTracker) trackAs(ctx context.Context, owner string, ids []int64) error {
	if owner != t.id {
		return fmt.Errorf("track %d rows of %s under owner %q: %w: in rows-set mode the owner column holds the instance ID (OwnerValue())",
			len(ids), t.id, clip(owner), ErrInvalidConfig)
	}
	return t.track(ctx, ids)
}

func (t *rowsSetTracker) untrack(ids []int64) error {
	t.checkUntracking(ids)
	if t.flusher != nil && t.state.Load() == stateRunning {
		t.rows.forget(ids)
		if t.state.Load() != stateRunning { // Shutdown began: its clean-up may have run
			ctx, cancel := t.opts.opContext(context.Background())
			defer cancel()
			t.flusher.runOnce(ctx)
			return nil
		}
		t.flusher.kick()
		return nil
	}
	t.rows.assert.RLock()
	defer t.rows.assert.RUnlock()
	t.rows.remove(ids)
	return t.sremUntracked(ids)
}

// sremUntracked removes rows just untracked in memory from the rows set;
// the caller holds the rows-set lock shared. A Track of one of them that
// Redis answered before the SREM is written back (retrack).
func (t *rowsSetTracker) sremUntracked(ids []int64) error {
	ctx, cancel := t.opts.opContext(context.Background())
	defer cancel()
	if err := t.store.UntrackRows(ctx, t.id, ids); err != nil {
		t.rows.markUnremoved(ids)
		return fmt.Errorf("untrack %d rows of %s: %w", len(ids), t.id, err)
	}
	t.retrack(ctx, ids)
	return nil
}

// untrackUnchanged untracks the rows of gens that were not tracked again
// since gens was taken (Release), as Untrack would.
func (t *rowsSetTracker) untrackUnchanged(gens map[int64]uint64) error {
	if t.flusher != nil && t.state.Load() == stateRunning {
		if len(t.rows.removeUnchanged(gens, true)) > 0 {
			t.flusher.kick()
		}
		return nil
	}
	t.rows.assert.RLock()
	defer t.rows.assert.RUnlock()
	ids := t.rows.removeUnchanged(gens, false)
	if len(ids) == 0 {
		return nil
	}
	return t.sremUntracked(ids)
}

// rotateIncarnation gives the rows set a new incarnation, in one
// transaction with the removal of the released rows not tracked again:
// under the new incarnation every member is a row this worker holds, none
// recorded in the ledger. The rows tracked again are written back after
// (retrack), in case a Track of one was answered before the SREM. It takes
// the rows-set lock; rotateLocked is for a caller that holds it.
func (t *rowsSetTracker) rotateIncarnation(ctx context.Context) error {
	t.rows.assert.Lock()
	defer t.rows.assert.Unlock()
	return t.rotateLocked(ctx)
}

func (t *rowsSetTracker) rotateLocked(ctx context.Context) error {
	if !t.rows.retaken() {
		return nil // done meanwhile
	}
	gone, next := t.rows.rotation()
	if err := t.store.RotateIncarnation(ctx, t.id, gone, next, t.fleet.incarnationTTL()); err != nil {
		return err
	}
	t.rows.rotated(next, gone)
	t.retrack(ctx, gone)
	return nil
}

// retrack writes back the rows among removed that are tracked again: a
// Track of one of them may have reached Redis before the SREM that removed
// it. A Track that comes later sends its own SADD after the SREM.
func (t *rowsSetTracker) retrack(ctx context.Context, removed []int64) {
	again := t.rows.trackedAmong(removed)
	if len(again) == 0 {
		return
	}
	// On failure the next heartbeat writes them back.
	_ = t.store.RetrackRows(ctx, t.id, again)
}

// ownerValue is the instance ID: rows-set workers write bare instance IDs
// into the owner column (owner.go).
func (t *rowsSetTracker) ownerValue() string   { return t.id }
func (t *rowsSetTracker) currentOwner() string { return t.id }

func (t *rowsSetTracker) trackCalled() bool { return t.calls.Load() > 0 }

func (t *rowsSetTracker) loop() func(context.Context) {
	if t.flusher == nil {
		return nil
	}
	return t.flusher.run
}
