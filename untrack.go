package recovery

import (
	"context"
	"time"
)

// The untrack flusher serves WithDeferredUntrack: Untrack forgets rows in
// memory and returns; the flusher removes them from the rows set in one
// SREM shortly after. A failed flush is retried by the next heartbeat
// (its script removes the rows still pending); Shutdown flushes what is
// left.
type untrackFlusher struct {
	w    *Worker
	due  chan struct{} // a deferred Untrack is waiting
	wait time.Duration // the linger
}

func newUntrackFlusher(w *Worker) *untrackFlusher {
	return &untrackFlusher{w: w, due: make(chan struct{}, 1), wait: w.opts.untrackLinger}
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
	defer f.w.opts.sig.flush.Signal(struct{}{}) // test signal: a flush turn ended
	w := f.w
	w.rows.assert.Lock()
	defer w.rows.assert.Unlock()
	pending := w.rows.pendingRemovals()
	if len(pending) == 0 {
		return
	}
	opCtx, cancel := w.opts.opContext(ctx)
	defer cancel()
	if err := w.store.UntrackRows(opCtx, w.opts.instanceID, pending); err == nil {
		w.rows.forgetUnremoved(pending)
		w.retrack(opCtx, pending)
	}
}
