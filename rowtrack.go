package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// Track (untrackedAlarm.untrackCall, below).
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
	// mode (the untracked-rows note, untrackedAlarm); owner mode counts none.
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
	deps     // the settings, the store, the log and the shared parts (worker.go)
	rows     *inflight
	id       string // the instance ID
	resetter Resetter
	state    *atomic.Int32 // the Worker's lifecycle state
	lease    *lease
	checker  *selfChecker
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
	// flusher removes deferred Untracks from the rows set
	// (WithDeferredUntrack); nil without it.
	flusher *untrackFlusher
	// calls counts Track calls (the untracked-rows note, untrackedAlarm).
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
func newRowsSetTracker(core trackerCore, byVersion bool) *rowsSetTracker {
	t := &rowsSetTracker{trackerCore: core, byVersion: byVersion}
	if t.opts.untrackLinger > 0 {
		t.flusher = newUntrackFlusher(t)
	}
	return t
}

func (t *rowsSetTracker) track(ctx context.Context, ids []int64) error {
	t.calls.Add(1)
	if err := t.lease.checkTrack(ctx, t.state); err != nil {
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

// The untrack flusher serves WithDeferredUntrack: Untrack forgets rows in
// memory and returns; the flusher removes them from the rows set in one
// SREM shortly after. A failed flush is retried by the next heartbeat
// (its script removes the rows still pending); Shutdown flushes what is
// left.
type untrackFlusher struct {
	set  *rowsSetTracker
	due  chan struct{} // a deferred Untrack is waiting
	wait time.Duration // the linger
}

func newUntrackFlusher(set *rowsSetTracker) *untrackFlusher {
	return &untrackFlusher{set: set, due: make(chan struct{}, 1), wait: set.opts.untrackLinger}
}

// kick tells the flusher rows are waiting; it never blocks.
func (f *untrackFlusher) kick() {
	select {
	case f.due <- struct{}{}:
	default: // a flush is already due
	}
}

// run waits, after the first Untrack of a batch, for the linger, then
// flushes every row untracked meanwhile, until ctx is done.
func (f *untrackFlusher) run(ctx context.Context) {
	linger := time.NewTimer(0)
	<-linger.C
	defer linger.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.due:
		}
		linger.Reset(f.wait)
		select {
		case <-ctx.Done():
			return
		case <-linger.C:
		}
		f.runOnce(ctx)
	}
}

// runOnce removes the rows waiting for their SREM, in one command.
func (f *untrackFlusher) runOnce(ctx context.Context) {
	defer f.set.sig.flush.Signal(struct{}{}) // test signal: a flush turn ended
	t := f.set
	t.rows.assert.Lock()
	defer t.rows.assert.Unlock()
	pending := t.rows.pendingRemovals()
	if len(pending) == 0 {
		return
	}
	opCtx, cancel := t.opts.opContext(ctx)
	defer cancel()
	if err := t.store.UntrackRows(opCtx, t.id, pending); err == nil {
		t.rows.forgetUnremoved(pending)
		t.retrack(opCtx, pending)
	}
}

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
	reset(ctx context.Context, req RowsReset) (ResetResult, error)
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
	req := RowsReset{InstanceID: c.id, Incarnation: c.rows.currentIncarnation(), RowIDs: rowIDs}
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

func (t *rowsSetTracker) reset(ctx context.Context, req RowsReset) (ResetResult, error) {
	return t.resetter.ResetRows(ctx, req)
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
func (t *ownerTracker) reset(ctx context.Context, req RowsReset) (ResetResult, error) {
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
		res, err := t.resetter.ResetRows(ctx, RowsReset{InstanceID: owner, RowIDs: ids})
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
		res, err := t.resetter.ResetRows(ctx, RowsReset{InstanceID: t.id, Incarnation: req.Incarnation, RowIDs: bare})
		if err != nil {
			return total, err
		}
		add(res)
	}
	return total, nil
}

// ErrBlockClosed is returned by a Block's calls after its Close.
var ErrBlockClosed = errors.New("recovery: block closed")

// A Block is one block of rows a host takes and processes: the host's part
// of the protocol in one handle, as database/sql's Tx is for a
// transaction. Begin one per fetch, and defer its Close at once:
//
//	b, err := w.Begin()
//	if err != nil { ... } // the lease is lost or the worker is not running: wait and retry
//	defer b.Close()       // gives back what the host did not finish: on an error, a panic, a lost lease
//	// fetch: UPDATE ... SET status = 'inprog', owner = b.OwnerValue() ... RETURNING id;
//	//        b.Track(ctx, ids...) before the COMMIT
//	for _, id := range ids {
//		if b.Check() != nil { return } // the lease was lost: Close gives the rest back
//		// process; complete: UPDATE ... WHERE id = $id AND owner = b.OwnerValue() AND status = 'inprog'
//		b.Done(id)
//	}
//
// A Block carries the owner value the block is fetched under (read once,
// at Begin), so a goroutine's completions name the value its own fetch
// wrote: goroutines that fetch concurrently each Begin their own Block.
// Check stays failed, for good, once the lease was lost after Begin: the
// block's rows may have been recovered, even if the worker's lease is back
// (then the next Begin succeeds). Close releases the rows tracked and not
// Done (Release); after every row is Done it does nothing. In rows-set
// mode the worker gives back no rows held at a loss while a Block begun
// before it is open: Close every Block. A Block is used
// by one goroutine; Close may be called any number of times.
type Block struct {
	w      *Worker
	owner  string
	losses uint64 // the worker's lease losses at Begin
	mu     sync.Mutex
	rows   map[int64]struct{} // tracked, not Done
	closed bool
}

// Begin returns a handle for the next block of rows, carrying the owner
// value to fetch it under (Block.OwnerValue). It fails, beginning nothing,
// with CheckLease's error: ErrNotStarted, ErrShutdown, or one wrapping
// ErrLeaseLost while peers may consider this worker dead (wait and call
// Begin again: a lost lease comes back with Redis). Begin sends nothing.
func (w *Worker) Begin() (*Block, error) {
	b := &Block{w: w, rows: make(map[int64]struct{})}
	// Open before the check, with the losses so far: a loss after it fails
	// the block, and the give-back waits for its Close.
	b.losses = w.lease.blocks.open(b, &w.stats.leaseLosses)
	if err := w.lease.checkTrack(context.Background(), &w.state); err != nil { // CheckLease; the host has moved on
		w.lease.blocks.close(b)
		return nil, fmt.Errorf("begin a block: %w", err)
	}
	b.owner = w.OwnerValue()
	return b, nil
}

// OwnerValue returns the value the block's fetch writes into the owner
// column and its completions match (Worker.OwnerValue, read at Begin).
func (b *Block) OwnerValue() string { return b.owner }

// Track records the rows the block's fetch took (Worker.TrackAs under the
// block's owner value): call it inside the fetch's transaction, as the last
// step before its COMMIT. Close gives back what Track took if the COMMIT
// fails, committed or not; an error between Track and a COMMIT never sent
// (the transaction certainly rolled back) wants Done of those rows instead
// in rows-set mode without an owner column, where Close's reset cannot
// tell them from another worker's that took them since. On an error wrapping ErrLeaseLost, ErrShutdown or ErrNotStarted
// nothing is tracked: roll the fetch back. On another (rows-set mode: only
// the Redis write failed) the rows are tracked all the same, in memory, and
// the next heartbeat writes them, as with Worker.Track. It refuses,
// with an error wrapping ErrLeaseLost, once the lease was lost after Begin
// (Begin again and fetch under the new value), and with ErrBlockClosed
// after Close.
func (b *Block) Track(ctx context.Context, rowIDs ...int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBlockClosed
	}
	if err := b.lost(); err != nil {
		return fmt.Errorf("track %d rows: %w", len(rowIDs), err)
	}
	err := b.w.TrackAs(ctx, b.owner, rowIDs...)
	tracked := rowIDs
	if err != nil {
		// Only the Redis write failed (rows-set mode): the worker keeps
		// the rows, and so does the block, for Close.
		tracked = b.w.rows.trackedAmong(rowIDs)
	}
	for _, id := range tracked {
		b.rows[id] = struct{}{}
	}
	return err
}

// Check reports whether the host may process the block's next row: nil
// while the worker's lease is valid and has not been lost since Begin;
// CheckLease's error, or one wrapping ErrLeaseLost for good once the lease
// was lost after Begin (peers may have recovered the block's rows), and
// ErrBlockClosed after Close. On an error stop processing the block; Close
// gives the rest back.
func (b *Block) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBlockClosed
	}
	if err := b.lost(); err != nil {
		return err
	}
	return b.w.CheckLease()
}

// lost reports a lease lost since Begin; the caller holds b.mu.
func (b *Block) lost() error {
	if b.w.stats.leaseLosses.Load() != b.losses {
		return fmt.Errorf("%w: lost since the block began; its rows may have been recovered", ErrLeaseLost)
	}
	return nil
}

// Done records that the host has finished rowIDs, successfully or not,
// once each outcome is committed: it untracks them (Worker.Untrack) and
// Close will not give them back. It works after Close too.
func (b *Block) Done(rowIDs ...int64) error {
	b.mu.Lock()
	for _, id := range rowIDs {
		delete(b.rows, id)
	}
	b.mu.Unlock()
	return b.w.Untrack(rowIDs...)
}

// Rows returns the rows tracked by the block and not Done, in no order.
func (b *Block) Rows() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return members(b.rows)
}

// Close gives back the block's rows tracked and not Done (Worker.Release,
// bounded by the reset timeout, not by any context of the host's) and ends
// the block: later calls but Done and Close return ErrBlockClosed. With
// every row Done, or after a first Close, it does nothing and returns nil.
// Rows the worker gave back already (after a lost lease, docs/safety.md
// §3) are not reset again. Its error is Release's: the rows it could not
// give back stay tracked, for a peer to recover should this worker die;
// where Release is safe in any state (owner fencing or the reset ledger)
// the worker tries again to give them back every heartbeat interval until
// it succeeds or they are untracked (heartbeat.go).
//
// After a fetch that rolled back, Close's reset finds the rows queued and
// leaves them so, with owner fencing also once another worker took them.
// Without an owner column it cannot tell them from another worker's: Track
// as the last step before the COMMIT (see Track).
func (b *Block) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ids := b.w.rows.heldAmong(members(b.rows))
	clear(b.rows)
	b.mu.Unlock()
	// Then the give-back may go on without this block (heartbeat.go): its
	// rows are released below or were done.
	defer b.w.giver.wake()
	defer b.w.lease.blocks.close(b)
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.w.opts.resetTimeout)
	defer cancel()
	if err := b.w.Release(ctx, ids...); err != nil {
		b.w.giver.retryLater(ids) // the worker tries again (heartbeat.go)
		return fmt.Errorf("close the block: %w", err)
	}
	return nil
}

// heldAmong returns the rows of ids that are tracked now or were left to
// the backstop sweep at a lost lease: those a Release of ids acts on.
func (s *inflight) heldAmong(ids []int64) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, id := range ids {
		_, tracked := s.ids[id]
		_, left := s.abandoned[id]
		if tracked || left {
			out = append(out, id)
		}
	}
	return out
}

// leaveUnreturned records the rows of ids tracked now as left by the host
// and not given back (Block.Close failed).
func (s *inflight) leaveUnreturned(ids []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if g, ok := s.ids[id]; ok {
			s.unreturned[id] = g
		}
	}
}

// hasUnreturned reports whether rows are recorded as left unreturned
// (some may have been untracked since: unreturnedIDs forgets those).
func (s *inflight) hasUnreturned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unreturned) > 0
}

// unreturnedIDs returns, in ID order, the rows left unreturned that are
// still tracked under the generation they had then; it forgets the
// others (tracked again, or no longer tracked).
func (s *inflight) unreturnedIDs() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for id, g := range s.unreturned {
		if cur, ok := s.ids[id]; !ok || cur != g {
			delete(s.unreturned, id)
			continue
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// untrackedAlarm is this worker's ErrUntrackedRows alarm, which Healthy
// reports: set by the sweep by row version (rowSweep.untrackedFound), by
// the note another worker's sweep left for this one (note, read with the
// scan turn), and by an Untrack without any Track (untrackCall).
type untrackedAlarm struct {
	deps // the settings, the store, the log and the shared parts (worker.go)
	// trackCalled reports whether Track was called since New (the
	// tracker's); state is the Worker's lifecycle state.
	trackCalled func() bool
	state       *atomic.Int32
	// off: the rows are held by owner (owner mode), no rows set, so no
	// row can be tracked after its COMMIT unseen; the alarm stays silent.
	off bool
	// at is when the backstop sweep last found rows this worker did not
	// track before their COMMIT, or when it was called to untrack rows
	// without any Track (unix nanoseconds).
	at atomic.Int64
	// lastNote is the last note of the untracked-rows hash logged;
	// called is set once Untrack without any Track has been logged.
	lastNote atomic.Value
	called   atomic.Bool
}

// note reads this worker's note in the untracked-rows hash (read
// with its scan turn): a backstop sweep found rows this worker tracked
// only after their COMMIT. Healthy then fails with ErrUntrackedRows until
// the note's end (a rows TTL after the finding); each note is logged once.
func (u *untrackedAlarm) note(note string) {
	if note == "" || u.off {
		return
	}
	var until, n, first int64
	var sweeper string
	if k, _ := fmt.Sscanf(note, "%d %d %d %s", &until, &n, &first, &sweeper); k != 4 {
		return
	}
	at := time.UnixMilli(until)
	if !time.Now().Before(at) || u.lastNote.Swap(note) == note {
		return
	}
	u.at.Store(at.Add(-u.opts.rowsTTL).UnixNano())
	u.log.Error("this worker tracked rows only after the COMMIT that put them in progress: a crash in between strands them; call Track inside the fetch's transaction, before its COMMIT",
		slog.Int64("rows", n), slog.Int64("first_row", first), slog.String("found_by", sweeper),
		slog.Any("error", fmt.Errorf("%w: %d rows (first %d) were in progress in no rows set after their COMMIT and then in this worker's", ErrUntrackedRows, n, first)))
}

// readNote reads this worker's note in the untracked-rows hash, when
// the scan turn is off and so does not bring it (takeScanTurn), and
// takes it in (note); nothing when the alarm is off.
func (u *untrackedAlarm) readNote(ctx context.Context, st store.Store) {
	if u.off {
		return
	}
	opCtx, cancel := u.opts.opContext(ctx)
	note, _ := st.UntrackedNote(opCtx, u.opts.instanceID)
	cancel()
	u.note(note)
}

// untrackCall is Untrack's check for a host that never calls Track: a
// running worker in rows-set mode asked to untrack rows without any Track
// call since it started. Healthy then fails with ErrUntrackedRows for a
// rows TTL, logged once.
func (u *untrackedAlarm) untrackCall(ids []int64) {
	if u.off || u.trackCalled() || u.state.Load() != stateRunning || !u.called.CompareAndSwap(false, true) {
		return
	}
	u.at.Store(time.Now().UnixNano())
	u.log.Error("Untrack was called, but never Track since this worker started: rows it processes are in no rows set, and a crash strands them; call Track inside the fetch's transaction, before its COMMIT",
		slog.Int("rows", len(ids)), slog.Int64("first_row", ids[0]),
		slog.Any("error", fmt.Errorf("%w: Untrack of %d rows (first %d) that this worker never tracked", ErrUntrackedRows, len(ids), ids[0])))
}

// err returns ErrUntrackedRows while the backstop sweep of this
// worker found untracked rows less than a rows TTL ago.
func (u *untrackedAlarm) err() error {
	at := u.at.Load()
	if at == 0 || time.Since(time.Unix(0, at)) >= u.opts.rowsTTL {
		return nil
	}
	return fmt.Errorf("%w (found %s ago)", ErrUntrackedRows, time.Since(time.Unix(0, at)).Round(time.Second))
}

// inflight is the worker's own record of the rows it is processing. Redis
// holds the copy peers read; this one survives Redis forgetting (a restart
// without persistence, a failover, eviction) and is written back with every
// heartbeat.
type inflight struct {
	mu sync.Mutex
	// ids are the rows tracked and not yet untracked, each with the
	// generation of its last Track: Release untracks only the rows whose
	// generation did not change while it reset them, so a row the host
	// took again meanwhile stays tracked.
	ids map[int64]uint64
	gen uint64
	// unremoved are rows untracked whose SREM failed; the next heartbeat
	// removes them from Redis.
	unremoved map[int64]struct{}
	// stale are the rows that were tracked when the lease was lost: peers
	// may have recovered them. Until the host has untracked or released
	// every one, the lease counts as lost (lease.check).
	stale map[int64]struct{}
	// lossGen is the generation of the last Track before the lease was
	// last lost: rows tracked no later may have been reset by a recoverer,
	// and the self-check does not judge them.
	lossGen uint64
	// incarnation names the life of the rows set (keys.Keys.Incarnation).
	// Resets without owner fencing are recorded under it, and a recorded
	// row is never reset again for it.
	incarnation string
	// released are rows this worker reset itself (Release, without owner
	// fencing) under the current incarnation. Should one be tracked again,
	// the incarnation changes first (rotateIncarnation), or a recovery
	// would find it in the ledger and skip it.
	released map[int64]struct{}
	// retakenIDs are the released rows a Track took again since they were
	// released. A released row the host has not untracked yet is no
	// retaken one: rotating the incarnation under a Release whose reset is
	// still running (or whose reply was lost, and which the host repeats)
	// would hide the ledger's record of it from the repeat, which would
	// then reset the row again, under whichever worker took it since.
	retakenIDs map[int64]struct{}
	// unreturned are rows a Block's Close failed to give back, each with
	// its generation then: the host has left them, and the give-back loop
	// tries again (giver.retryClosed) while they are tracked under that
	// generation.
	unreturned map[int64]uint64
	// abandoned are stale rows this worker left to the backstop sweep by
	// row version: its rows set was gone when its heartbeat came back, so
	// the sweep may have reset them, out of the ledger's sight, and peers
	// taken them again. Release of one only forgets it.
	abandoned map[int64]struct{}
	// lossChecked is set once the first heartbeat after the last loss has
	// looked for the rows set (abandonStale).
	lossChecked bool
	// owners is, in owner mode, the owner value each tracked row was
	// fetched under (TrackAs): Release resets it under that value, and the
	// self-check expects it. Rows tracked under the current value are not
	// in it (ownerOf returns the default the caller gives).
	owners map[int64]string
	// written is the incarnation the last heartbeat wrote: in owner mode a
	// row is tracked only under a life Redis has recorded (owner.go).
	written string
	// marks say when generations began, for the age of the oldest row
	// (oldestTracked): one per Track at least trackMarkEvery after the
	// last, so a generation's time is known to within that, from below.
	marks []trackMark

	// assert orders the writes of the rows set. Writers of a snapshot (the
	// heartbeat, which re-adds ids and removes unremoved, Shutdown's
	// clean-up and the deferred Untrack flusher) hold it exclusively from the snapshot until Redis has
	// answered; synchronous Untrack holds it shared from its change in
	// memory until its SREM is answered. So a heartbeat never re-adds a row
	// an Untrack has just removed. Track takes no lock (it must never wait
	// on the heartbeat's I/O, nor make the heartbeat wait on a caller's
	// context); a pending removal that lands after a Track of the same row
	// is undone by retrack.
	assert sync.RWMutex
}

func (s *inflight) init() {
	s.ids = make(map[int64]uint64)
	s.unremoved = make(map[int64]struct{})
	s.stale = make(map[int64]struct{})
	s.released = make(map[int64]struct{})
	s.retakenIDs = make(map[int64]struct{})
	s.abandoned = make(map[int64]struct{})
	s.unreturned = make(map[int64]uint64)
	s.owners = make(map[int64]string)
	s.incarnation = newToken()
}

// newLife begins a new incarnation (owner mode: a new life, owner.go) and
// returns it.
func (s *inflight) newLife() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation = newToken()
	return s.incarnation
}

// wrote records that a heartbeat wrote incarnation.
func (s *inflight) wrote(incarnation string) {
	s.mu.Lock()
	s.written = incarnation
	s.mu.Unlock()
}

// writtenLife returns the current incarnation, and whether a heartbeat has
// written it.
func (s *inflight) writtenLife() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation, s.written == s.incarnation
}

// addOwned tracks ids fetched under owner value owner (owner mode), if the
// current incarnation is still life: it reports false, tracking nothing,
// when a new life began since the caller looked.
func (s *inflight) addOwned(ids []int64, owner, life string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.incarnation != life {
		return false
	}
	s.gen++
	s.mark()
	for _, id := range ids {
		s.ids[id] = s.gen
		delete(s.unremoved, id)
		s.owners[id] = owner
	}
	return true
}

// ownersOf groups the tracked rows among ids by the owner value they were
// fetched under; rows not tracked go under def.
func (s *inflight) ownersOf(ids []int64, def string) map[string][]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]int64)
	for _, id := range ids {
		o, ok := s.owners[id]
		if !ok {
			o = def
		}
		out[o] = append(out[o], id)
	}
	return out
}

// ownerOf returns the owner value row id was fetched under, or def.
func (s *inflight) ownerOf(id int64, def string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.owners[id]; ok {
		return o
	}
	return def
}

// add tracks ids. It reports whether one of them was released under the
// current incarnation (the incarnation must change before it is written).
func (s *inflight) add(ids []int64) (retaken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	s.mark()
	for _, id := range ids {
		s.ids[id] = s.gen
		delete(s.unremoved, id)
		if _, ok := s.released[id]; ok {
			s.retakenIDs[id] = struct{}{}
			retaken = true
		}
	}
	return retaken
}

// generations returns the generation of each of ids that is tracked.
func (s *inflight) generations(ids []int64) map[int64]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]uint64, len(ids))
	for _, id := range ids {
		if g, ok := s.ids[id]; ok {
			out[id] = g
		}
	}
	return out
}

// removeUnchanged removes the rows of gens still tracked with the same
// generation, and returns them; with forget they are also marked for
// removal from Redis (deferred Untrack).
func (s *inflight) removeUnchanged(gens map[int64]uint64, forget bool) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for id, g := range gens {
		// A row left to the sweep is no longer tracked; the host is done
		// with it all the same (heldAtLoss).
		delete(s.abandoned, id)
		if cur, ok := s.ids[id]; ok && cur == g {
			s.dropLocked(id)
			if forget {
				s.unremoved[id] = struct{}{}
			}
			out = append(out, id)
		}
	}
	return out
}

// unmarkReleased forgets that ids were released (their reset failed).
func (s *inflight) unmarkReleased(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		delete(s.released, id)
		delete(s.retakenIDs, id)
	}
	s.mu.Unlock()
}

func (s *inflight) remove(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		s.dropLocked(id)
	}
	s.mu.Unlock()
}

// dropLocked forgets everything kept about row id; s.mu is held.
func (s *inflight) dropLocked(id int64) {
	delete(s.ids, id)
	delete(s.owners, id)
	delete(s.stale, id)
	delete(s.abandoned, id)
	delete(s.unreturned, id)
}

// markLoss records that the lease was lost: no row tracked now is judged
// by the self-check any more, and with stale they are marked stale too.
// With life a new incarnation begins in the same step (owner mode: a new
// life), so a Track either came before (its rows are marked) or finds the
// life ended (addOwned).
func (s *inflight) markLoss(stale, life bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if life {
		s.incarnation = newToken()
	}
	s.lossGen = s.gen
	s.lossChecked = false
	if !stale {
		return 0
	}
	for id := range s.ids {
		s.stale[id] = struct{}{}
	}
	return len(s.stale)
}

// needsLossCheck reports whether stale rows wait for the first heartbeat
// after the loss to look for the rows set.
func (s *inflight) needsLossCheck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lossChecked && len(s.stale) > 0
}

// abandonStale ends the check after a loss: with setGone, the stale rows
// stop being tracked (the heartbeat does not write them back) and are
// marked abandoned. It returns them.
func (s *inflight) abandonStale(setGone bool) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lossChecked = true
	if !setGone {
		return nil
	}
	out := make([]int64, 0, len(s.stale))
	for id := range s.stale {
		delete(s.ids, id)
		s.abandoned[id] = struct{}{}
		out = append(out, id)
	}
	clear(s.stale)
	return out
}

// takeAbandoned returns ids without the abandoned rows among them, which
// it forgets, and how many those were.
func (s *inflight) takeAbandoned(ids []int64) (rest []int64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.abandoned) == 0 {
		return ids, 0
	}
	rest = make([]int64, 0, len(ids))
	for _, id := range ids {
		if _, ok := s.abandoned[id]; ok {
			delete(s.abandoned, id)
			n++
			continue
		}
		rest = append(rest, id)
	}
	return rest, n
}

// heldAtLoss returns how many rows held at the last loss the host has not
// released or untracked yet: the stale rows still tracked, and the rows
// left to the backstop sweep (abandoned), which the sweep may reset under
// a host that went on processing them. The lease stays lost while there
// are any.
func (s *inflight) heldAtLoss() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mutantAbandonedFreeLease {
		return len(s.stale)
	}
	return len(s.stale) + len(s.abandoned)
}

func (s *inflight) markUnremoved(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		if _, tracked := s.ids[id]; !tracked {
			s.unremoved[id] = struct{}{}
		}
	}
	s.mu.Unlock()
}

// forget removes ids from the tracked rows and marks them for removal from
// Redis, in one step (deferred Untrack).
func (s *inflight) forget(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		s.dropLocked(id)
		s.unremoved[id] = struct{}{}
	}
	s.mu.Unlock()
}

// trackedAmong returns the rows of ids that are tracked now.
func (s *inflight) trackedAmong(ids []int64) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, id := range ids {
		if _, ok := s.ids[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// pendingRemovals returns the rows waiting for their SREM.
func (s *inflight) pendingRemovals() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.unremoved)
}

// snapshot returns the tracked and the unremoved rows, and the
// incarnation.
func (s *inflight) snapshot() (tracked, unremoved []int64, incarnation string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.ids), members(s.unremoved), s.incarnation
}

// settledGeneration returns the generation of id if it is tracked since
// the last loss of the lease.
func (s *inflight) settledGeneration(id int64) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.ids[id]
	return g, ok && g > s.lossGen
}

// lossGeneration returns the generation of the last Track before the
// lease was last lost.
func (s *inflight) lossGeneration() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lossGen
}

// newestSettled returns up to n rows tracked since the last loss of the
// lease and not in skip, those of the latest Tracks first.
func (s *inflight) newestSettled(n int, skip map[int64]sighting) []int64 {
	if n <= 0 {
		return nil
	}
	s.mu.Lock()
	type row struct {
		id  int64
		gen uint64
	}
	rows := make([]row, 0, min(len(s.ids), 4*n))
	for id, g := range s.ids {
		if g <= s.lossGen {
			continue
		}
		if _, ok := skip[id]; ok {
			continue
		}
		rows = append(rows, row{id, g})
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.gen, a.gen) })
	out := make([]int64, 0, min(n, len(rows)))
	for _, r := range rows[:min(n, len(rows))] {
		out = append(out, r.id)
	}
	return out
}

// currentIncarnation returns the incarnation of the rows set.
func (s *inflight) currentIncarnation() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation
}

// markReleased records rows this worker reset itself under the current
// incarnation, and returns those not marked yet: the only ones a failed
// reset may unmark.
func (s *inflight) markReleased(ids []int64) (marked map[int64]struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	marked = make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		if _, ok := s.released[id]; !ok {
			s.released[id] = struct{}{}
			marked[id] = struct{}{}
		}
	}
	return marked
}

// retaken reports whether a row released under the current incarnation
// was tracked again since (Track), not merely still tracked because the
// Release that reset it has not untracked it yet.
func (s *inflight) retaken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.retakenIDs {
		if _, ok := s.ids[id]; ok {
			return true
		}
	}
	return false
}

// rotation returns the released rows not tracked again, which must leave
// the rows set with the old incarnation, and a new incarnation.
func (s *inflight) rotation() (gone []int64, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.released {
		if _, ok := s.ids[id]; !ok {
			gone = append(gone, id)
		}
	}
	return gone, newToken()
}

// rotated records that Redis now holds incarnation next and none of gone.
func (s *inflight) rotated(next string, gone []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation = next
	clear(s.released)
	clear(s.retakenIDs)
	for _, id := range gone {
		delete(s.unremoved, id)
	}
}

// forgetUnremoved drops rows whose SREM has now succeeded.
func (s *inflight) forgetUnremoved(done []int64) {
	s.mu.Lock()
	for _, id := range done {
		delete(s.unremoved, id)
	}
	s.mu.Unlock()
}

func (s *inflight) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// trackMarkEvery is the resolution of the oldest row's age: a Track costs
// a clock read, and a mark at most once this often.
const trackMarkEvery = time.Second

// A trackMark says that generations from gen on began at or after at.
type trackMark struct {
	gen uint64
	at  time.Time
}

// mark records when generation s.gen began, unless the last mark is
// recent enough to stand for it; s.mu is held.
func (s *inflight) mark() {
	now := time.Now()
	if n := len(s.marks); n > 0 && now.Sub(s.marks[n-1].at) < trackMarkEvery {
		return
	}
	s.marks = append(s.marks, trackMark{gen: s.gen, at: now})
}

// oldestTracked returns when the oldest row tracked now was tracked (its
// last Track), to within trackMarkEvery earlier, and false when none is.
// It reads every tracked row once (the heartbeat's snapshot does too) and
// drops the marks no tracked row needs any more.
func (s *inflight) oldestTracked() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		s.marks = s.marks[:0]
		return time.Time{}, false
	}
	oldest := uint64(math.MaxUint64)
	for _, g := range s.ids {
		oldest = min(oldest, g)
	}
	// The last mark at or before the oldest generation: every generation
	// has one, the first Track after the marks were emptied makes one.
	i, found := slices.BinarySearchFunc(s.marks, oldest, func(m trackMark, g uint64) int { return cmp.Compare(m.gen, g) })
	if !found {
		i--
	}
	if i < 0 {
		return time.Time{}, false
	}
	s.marks = s.marks[i:]
	return s.marks[0].at, true
}

func members[V any](set map[int64]V) []int64 {
	if len(set) == 0 {
		return nil
	}
	out := make([]int64, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	return out
}
