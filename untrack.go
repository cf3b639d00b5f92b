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
	defer f.set.opts.sig.flush.Signal(struct{}{}) // test signal: a flush turn ended
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
