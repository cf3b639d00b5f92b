package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/alya/recovery/internal/store"
)

// lifecycle states of a Worker.
const (
	stateNew int32 = iota
	stateRunning
	stateShutdown
)

// Shutdown stops the worker: it stops the heartbeat and recovery loops and
// waits for them, then deletes the heartbeat key and removes the worker from
// the registry, so peers see at once that it left. The rows set is left in
// place. If rows are still tracked (there should be none once the host has
// finished its block, or released what it will not finish), the worker
// stays registered, with its heartbeat deleted: the next scan of any peer
// finds it dead and recovers those rows at once.
//
// Call Shutdown after the host has finished its current block, as the
// design's graceful shutdown says. If ctx ends first, Shutdown returns
// ctx.Err(); the loops have been told to stop and end within the operation
// timeout, and a later call with a fresh context finishes the clean-up.
// The clean-up is one round trip bounded by the operation timeout too (an
// Untrack running at the same moment waits for it, as it waits for a
// heartbeat); one Redis did not answer in time is sent again, up to three
// times while ctx lasts (it is idempotent). If it fails, Shutdown returns
// the error and a later call tries again.
//
// A Worker whose instance ID another process took over (CheckLease
// reports ErrInstanceIDInUse) leaves every key to that process.
//
// Shutdown is idempotent, safe to call concurrently and safe to call
// without Start. After it, Start, Track and ops.RecoverNow return ErrShutdown.
// It never closes the Redis client or the database handle it was given.
// With an observer, it also waits for the events already queued to be
// delivered, and for the fleet history's entries queued to be appended
// (once each; see WithHistory).
func (w *Worker) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	w.state.Store(stateShutdown)
	started, stop, done := w.started, w.stopLoops, w.loopsDone
	w.mu.Unlock()
	if !started {
		return w.events.close(ctx)
	}
	stop()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cleaned {
		return w.events.close(ctx)
	}
	if w.lease.ousted.Load() {
		// Another process heartbeats this instance ID: the heartbeat, the
		// registry entry and the rows set are its own now (heartbeat.go).
		w.cleaned = true
		return w.events.close(ctx)
	}
	tracked, err := leave(ctx, w)
	if err != nil {
		// The clean-up is retried by a later call; the events and the
		// history are delivered (or dropped) now, so no goroutine of the
		// Worker outlives a Shutdown that gave up, whatever the caller does.
		_ = w.events.close(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("shut down %s: remove heartbeat and registry entry: %w", w.opts.instanceID, err)
	}
	w.cleaned = true
	if tracked > 0 {
		w.log.Warn("shut down with rows still tracked; peers will recover them",
			slog.Int("rows", tracked))
	}
	w.log.Debug("recovery worker shut down")
	return w.events.close(ctx)
}

// leave deletes the heartbeat and the registry entry (store.Leave); it
// returns how many rows were still tracked. Like the heartbeat, it holds
// the rows set's write lock from the snapshot until Redis has answered: a
// synchronous Untrack running now either finishes its SREM before the
// snapshot (and the row is not written back) or waits and sends it after
// our SADD. Only our own heartbeat is deleted: a process that took the ID
// over since the last heartbeat keeps its. With rows still tracked, they
// are written back (Redis may have lost them) and the worker stays
// registered, or no peer would ever look for them.
func leave(ctx context.Context, w *Worker) (int, error) {
	w.rows.assert.Lock()
	tracked, unremoved, _ := w.rows.snapshot()
	d := store.Departure{Value: w.beatValue, Stay: len(tracked) > 0, RowsTTL: w.fleet.rowsTTL()}
	d.Tracked, d.Unremoved = w.tracker.beatRows(tracked, unremoved)
	// Leave is idempotent (the heartbeat is deleted only while it holds
	// this life's value): a command Redis did not answer within the
	// operation timeout is sent again while the caller's ctx lasts, up to
	// three times, rather than failing a Shutdown the host gave seconds.
	var res store.LeaveResult
	var err error
	for try := 0; try < 3; try++ {
		opCtx, cancel := w.opts.opContext(ctx)
		res, err = w.store.Leave(opCtx, w.opts.instanceID, d)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	w.rows.assert.Unlock()
	if res.Deregistered {
		w.judge.noteRegistry(res.RegistryErr)
	}
	return len(tracked), err
}
