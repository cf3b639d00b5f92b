package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

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
	// incarnation names the life of the rows set (keys.Keys.Incarnation).
	// Resets without owner fencing are recorded under it, and a recorded
	// row is never reset again for it.
	incarnation string
	// released are rows this worker reset itself (Release, without owner
	// fencing) under the current incarnation. Should one be tracked again,
	// the incarnation changes first (rotateIncarnation), or a recovery
	// would find it in the ledger and skip it.
	released map[int64]struct{}

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
	s.incarnation = newToken()
}

func (s *inflight) add(ids []int64) {
	s.mu.Lock()
	s.gen++
	for _, id := range ids {
		s.ids[id] = s.gen
		delete(s.unremoved, id)
	}
	s.mu.Unlock()
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
		if cur, ok := s.ids[id]; ok && cur == g {
			delete(s.ids, id)
			delete(s.stale, id)
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
	}
	s.mu.Unlock()
}

func (s *inflight) remove(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		delete(s.ids, id)
		delete(s.stale, id)
	}
	s.mu.Unlock()
}

// markStale records the rows tracked now as stale (the lease was lost).
func (s *inflight) markStale() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.ids {
		s.stale[id] = struct{}{}
	}
	return len(s.stale)
}

// staleRows returns how many stale rows are still tracked.
func (s *inflight) staleRows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stale)
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
		delete(s.ids, id)
		delete(s.stale, id)
		s.unremoved[id] = struct{}{}
	}
	s.mu.Unlock()
}

// trackedAmong returns the members of ms that are tracked now.
func (s *inflight) trackedAmong(ms []any) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []any
	for _, m := range ms {
		id, _ := strconv.ParseInt(m.(string), 10, 64)
		if _, ok := s.ids[id]; ok {
			out = append(out, m)
		}
	}
	return out
}

// pendingRemovals returns the rows waiting for their SREM.
func (s *inflight) pendingRemovals() []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.unremoved)
}

// snapshot returns the tracked and the unremoved rows as Redis arguments,
// and the incarnation.
func (s *inflight) snapshot() (tracked, unremoved []any, incarnation string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.ids), members(s.unremoved), s.incarnation
}

// sampleSettled returns up to n tracked rows (all if n < 0) that are not
// stale.
func (s *inflight) sampleSettled(n int) map[int64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]bool)
	for id := range s.ids {
		if n >= 0 && len(out) >= n {
			break
		}
		if _, stale := s.stale[id]; !stale {
			out[id] = true
		}
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
// incarnation.
func (s *inflight) markReleased(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		s.released[id] = struct{}{}
	}
	s.mu.Unlock()
}

// retaken reports whether a row released under the current incarnation is
// tracked again (among ids, or among all tracked rows if ids is nil).
func (s *inflight) retaken(ids []int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.released) == 0 {
		return false
	}
	if ids == nil {
		for id := range s.released {
			if _, ok := s.ids[id]; ok {
				return true
			}
		}
		return false
	}
	for _, id := range ids {
		if _, ok := s.released[id]; ok {
			return true
		}
	}
	return false
}

// rotation returns the released rows not tracked again, which must leave
// the rows set with the old incarnation, and a new incarnation.
func (s *inflight) rotation() (gone []any, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.released {
		if _, ok := s.ids[id]; !ok {
			gone = append(gone, strconv.FormatInt(id, 10))
		}
	}
	return gone, newToken()
}

// rotated records that Redis now holds incarnation next and none of gone.
func (s *inflight) rotated(next string, gone []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation = next
	clear(s.released)
	for _, m := range gone {
		id, _ := strconv.ParseInt(m.(string), 10, 64)
		delete(s.unremoved, id)
	}
}

// forgetUnremoved drops rows whose SREM has now succeeded.
func (s *inflight) forgetUnremoved(done []any) {
	s.mu.Lock()
	for _, m := range done {
		id, _ := strconv.ParseInt(m.(string), 10, 64)
		delete(s.unremoved, id)
	}
	s.mu.Unlock()
}

func (s *inflight) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func members[V any](set map[int64]V) []any {
	if len(set) == 0 {
		return nil
	}
	out := make([]any, 0, len(set))
	for id := range set {
		out = append(out, strconv.FormatInt(id, 10))
	}
	return out
}

func idArgs(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}

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
	w.rows.add(rowIDs)
	if w.rows.retaken(rowIDs) {
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
	if !w.rows.retaken(nil) {
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
