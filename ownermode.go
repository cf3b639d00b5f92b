package recovery

import (
	"context"
	"fmt"
	"log/slog"
)

// Owner mode. When the resetter fences by owner and can reset by owner (a
// PgxResetter WithOwnerColumn), PostgreSQL knows which rows each worker
// holds, atomically with the fetch that set the owner column: the worker
// mirrors nothing into Redis. Track and Untrack keep the worker's own view
// (Release, the lease, the self-check) and send nothing; the heartbeat
// writes no rows; a dead peer goes down the one dead-peer path as ever
// (claim, reset, finish, deregister), its reset being
//
//	UPDATE ... SET status = queued, owner = NULL WHERE owner = $dead AND status = inprog
//
// (chunked, lock-ordered, with the recovery count and quarantine), which is
// idempotent (a second one finds nothing the dead peer owns) and which no
// Redis expiry can undo. The backstop sweep is always on: the owners of rows
// in progress in PostgreSQL are part of what recovery looks at, so a Redis
// that forgets its registry cannot strand a row.
//
// WithRowsSets keeps the design's rows sets instead, as releases before
// owner mode did.

// WithRowsSets keeps the design's rows-set mode even when the resetter
// fences by owner: Track and Untrack write the worker's rows set in Redis,
// recovery resets the rows a dead peer's set lists, and the backstop sweep
// runs only WithBackstopSweep, as in releases before owner mode. Without a
// resetter that fences by owner the worker is in rows-set mode anyway.
// Workers of both modes recover each other (docs/integration.md, "Rolling
// out owner mode"). Default: off (owner mode whenever the resetter allows
// it).
func WithRowsSets() Option {
	return optionFunc(func(o *options) { o.rowsSets = true })
}

// ownerModeOf reports whether a Worker with resetter r and options o runs
// in owner mode: r fences by owner and can reset and list rows by owner.
func ownerModeOf(r RowResetter, o options) bool {
	if o.rowsSets || !fencesByOwner(r) {
		return false
	}
	_, ok := r.(OwnerSweeper)
	return ok
}

// OwnerMode reports whether the worker runs in owner mode: its resetter
// fences by owner (a PgxResetter WithOwnerColumn) and WithRowsSets is not
// set. In owner mode no row costs a Redis command and recovery resets a
// dead peer's rows by owner.
func (w *Worker) OwnerMode() bool { return w.ownerMode }

// resetOwnRows runs at Start in owner mode (and with the backstop sweep),
// before the first heartbeat,
// once no other live process holds the instance ID: rows that still name
// this ID as their owner are a predecessor's (a process that crashed under
// the same WithInstanceID), whose Redis record may have expired long ago.
// Nobody else will recover them while this process heartbeats the ID, and
// this process never fetched them, so they go back to the queue now.
func (w *Worker) resetOwnRows(ctx context.Context) error {
	sw := w.resetter.(OwnerSweeper)
	resetCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	defer cancel()
	res, err := sw.ResetOwnerRows(resetCtx, w.opts.instanceID)
	if err != nil {
		return fmt.Errorf("reset the rows a previous process left under this instance ID: %w", err)
	}
	if res.Reset > 0 { // quarantined rows included
		w.countRows(PeerRecovery{RowsReset: res.Reset, Quarantined: res.Quarantined})
		w.log.Info("reset rows a previous process left under this instance ID",
			slog.Int64("rows_reset", res.Reset), slog.Int("rows_quarantined", len(res.Quarantined)))
	}
	return nil
}
