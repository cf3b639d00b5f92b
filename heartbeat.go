package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/scripts"
)

// lease is the worker's own view of its liveness. A heartbeat written at
// time t (taken before the write is sent) makes the key live until at least
// t + heartbeat TTL on the server, so until then no peer can find it dead.
// The lease ends a safety margin earlier, to allow for clock-rate
// differences and for the host to react.
type lease struct {
	// until is the end of the lease, in nanoseconds since Worker.epoch on the
	// monotonic clock; 0 before the first heartbeat.
	until atomic.Int64
	// lost is set when the loss has been logged, so it is logged once.
	lost atomic.Bool
	// ousted is set, for good, when a heartbeat found the key holding
	// another process's value (twin.go): the instance ID is not ours any
	// more, and neither are the rows tracked under it.
	ousted atomic.Bool
}

func (l *lease) renew(w *Worker, sentAt time.Time) {
	l.until.Store(int64(sentAt.Sub(w.epoch) + w.opts.leaseLength()))
}

func (l *lease) valid(w *Worker) bool {
	return int64(time.Since(w.epoch)) < l.until.Load()
}

// sinceRefresh is how long ago the last successful heartbeat was sent.
func (l *lease) sinceRefresh(w *Worker) time.Duration {
	sent := time.Duration(l.until.Load()) - w.opts.leaseLength()
	return time.Since(w.epoch) - sent
}

// check reports ErrLeaseLost while the lease has ended, and after it was
// renewed for as long as rows tracked at the loss are still tracked: peers
// may have recovered those, and a host that went on with them would process
// them twice. The host clears it by untracking or releasing them.
func (l *lease) check(w *Worker) error {
	if l.ousted.Load() {
		return errOusted
	}
	if !l.valid(w) || w.rows.staleRows() > 0 {
		return ErrLeaseLost
	}
	return nil
}

// CheckLease reports whether the worker may go on processing rows: it
// returns nil while the last successful heartbeat is recent enough that no
// peer can consider this worker dead, ErrLeaseLost when it is not (the
// host should stop taking new rows and release the ones it has not
// finished), ErrNotStarted before Start and ErrShutdown after Shutdown.
//
// With owner fencing (see Release), a lost lease stays lost after the
// heartbeat is back for as long as the rows tracked when it was lost are
// tracked: peers may have recovered them meanwhile (a worker resuming from
// a long pause sees its heartbeat succeed within milliseconds). Untrack or
// Release them and the lease is valid again. Without owner fencing nothing
// safe can be done with those rows, and the lease is valid again with the
// next heartbeat.
func (w *Worker) CheckLease() error {
	switch w.state.Load() {
	case stateNew:
		return ErrNotStarted
	case stateShutdown:
		return ErrShutdown
	}
	return w.lease.check(w)
}

// beat refreshes the heartbeat in one round trip: a script on the
// instance's slot (scripts.Beat) sets the heartbeat key with its TTL and
// the incarnation, removes rows whose Untrack could not reach Redis,
// writes every tracked row back into the rows set (Redis may have lost it)
// and refreshes the set's TTL, all only if the heartbeat key is absent or
// holds this Worker's own value; the registry SADD goes in the same
// pipeline (another slot on Cluster). It renews the lease when the script
// wrote. If the key holds another process's value, nothing is written and
// beat returns errOusted: that process has the instance ID now.
func (w *Worker) beat(parent context.Context) error {
	if w.lease.ousted.Load() {
		return errOusted // for good: the ID is another process's
	}
	ctx, cancel := w.opContext(parent)
	defer cancel()

	w.rows.assert.Lock()
	defer w.rows.assert.Unlock()
	if err := w.rotateLocked(ctx); err != nil {
		// A released row is tracked again: writing it under the old
		// incarnation would hide it from recovery.
		w.stats.heartbeatFailures.Add(1)
		return fmt.Errorf("new incarnation: %w", err)
	}
	tracked, unremoved, incarnation := w.rows.snapshot()

	args := make([]any, 0, 6+len(unremoved)+len(tracked))
	args = append(args, w.beatValue, w.opts.heartbeatTTL.Milliseconds(), incarnation,
		w.incarnationTTL().Milliseconds(), w.opts.rowsTTL.Milliseconds(), len(unremoved))
	args = append(args, unremoved...)
	args = append(args, tracked...)

	sentAt := time.Now()
	pipe := w.rdb.Pipeline()
	// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT, and the
	// server caches the script by its hash either way.
	script := scripts.Beat.Eval(ctx, pipe, []string{w.keys.Heartbeat, w.keys.Incarnation, w.keys.Rows, w.keys.Claim}, args...)
	reg := pipe.SAdd(ctx, w.registry, w.opts.instanceID)
	cmds, err := pipe.Exec(ctx)
	wrote, scriptErr := script.Int()
	if scriptErr == nil && wrote == scripts.BeatForeign {
		// Nothing of ours was written; the registry entry is the ID's
		// whoever holds it.
		w.stats.heartbeatFailures.Add(1)
		return errOusted
	}
	if scriptErr == nil {
		// The key is live for a TTL whatever happened to the rest (on
		// Cluster the registry may sit on a node that is down).
		w.lease.renew(w, sentAt)
	}
	w.noteRegistry(reg.Err())
	if err != nil && failedOnlyOnWrongTypeRegistry(cmds, reg) {
		// A registry key of the wrong type is the fleet's outage, logged
		// once by noteRegistry; this worker's heartbeat and rows are written.
		err = nil
	}
	if err != nil {
		w.stats.heartbeatFailures.Add(1)
		return err
	}
	w.stats.heartbeats.Add(1)
	w.stats.lastHeartbeat.Store(sentAt.UnixNano())
	w.emit(Event{Kind: EventHeartbeat})
	if len(unremoved) > 0 {
		w.rows.forgetUnremoved(unremoved)
		w.retrack(ctx, unremoved)
	}
	return nil
}

// runHeartbeat refreshes the heartbeat every interval until ctx, which only
// Shutdown cancels, is done. It never sees the caller's processing context:
// a worker finishing its block during shutdown must keep its heartbeat. A
// failed refresh is retried after a short, growing backoff rather than a
// whole interval later; an outage is logged when it starts and when it ends,
// not at every try.
func (w *Worker) runHeartbeat(ctx context.Context) {
	w.log.Debug("heartbeat loop started", slog.Duration("interval", w.opts.heartbeatInterval))
	defer w.log.Debug("heartbeat loop stopped")

	t := time.NewTimer(w.opts.heartbeatInterval)
	defer t.Stop()
	var (
		failures    int
		outageStart time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.noteLeaseLoss(nil) // a stopped process finds out here when it resumes
		sent := time.Now()
		err := w.beat(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			if failures > 0 {
				outage := time.Since(outageStart)
				w.log.Info("heartbeat restored", slog.Duration("outage", outage), slog.Int("attempts", failures))
				w.emit(Event{Kind: EventHeartbeatRestored, Duration: outage, Attempt: failures})
			}
			if w.lease.lost.Swap(false) {
				w.log.Info("heartbeat lease regained; worker re-registered",
					slog.Int("stale_rows", w.rows.staleRows()))
				w.emit(Event{Kind: EventLeaseRegained})
			}
			failures = 0
			// The period runs from send to send: a slow answer must not
			// push the next heartbeat past the end of the lease.
			t.Reset(max(0, w.opts.heartbeatInterval-time.Since(sent)))
			continue
		}
		if failures == 0 {
			outageStart = time.Now()
			w.log.Warn("heartbeat failed; retrying", slog.Any("error", err))
		}
		failures++
		w.emit(Event{Kind: EventHeartbeatFailed, Attempt: failures, Err: err})
		if errors.Is(err, ErrInstanceIDInUse) {
			w.noteOusted()
		}
		w.noteLeaseLoss(err)
		t.Reset(w.retryDelay(failures))
	}
}

// noteLeaseLoss logs, once per loss, that the lease has ended.
func (w *Worker) noteLeaseLoss(cause error) {
	if w.lease.valid(w) || w.lease.lost.Swap(true) {
		return
	}
	since := w.lease.sinceRefresh(w)
	if fencesByOwner(w.resetter) {
		// Only an owner-fenced host can do something safe with rows peers
		// may have taken (Release them); without fencing the loss is not
		// sticky, or such a host could never work again.
		w.rows.markStale()
	}
	w.stats.leaseLosses.Add(1)
	w.emit(Event{Kind: EventLeaseLost, Duration: since, Err: cause})
	attrs := []any{slog.Duration("since_last_heartbeat", since)}
	if cause != nil {
		attrs = append(attrs, slog.Any("error", cause))
	}
	w.log.Error("heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones", attrs...)
}

// retryDelay is the wait before heartbeat retry n (from 1): a tenth of the
// interval doubled per failure, capped at the interval, with ±20% jitter.
func (w *Worker) retryDelay(n int) time.Duration {
	d := w.opts.heartbeatInterval / 10
	for i := 1; i < n && d < w.opts.heartbeatInterval; i++ {
		d *= 2
	}
	d = min(d, w.opts.heartbeatInterval)
	return jitter(d, 0.2)
}

// jitter returns d changed by a random fraction in [-frac, +frac].
func jitter(d time.Duration, frac float64) time.Duration {
	if d <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + frac*(2*rand.Float64()-1)))
}

// warnIfEvicting logs once, at Start, when the server may evict keys under
// memory pressure: an evicted heartbeat makes a live worker look dead, an
// evicted rows set or registry hides a dead one. Servers that refuse CONFIG
// (managed offerings often do) are not an error.
func (w *Worker) warnIfEvicting(ctx context.Context) {
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	cfg, err := w.rdb.ConfigGet(opCtx, "maxmemory-policy").Result()
	if err != nil {
		w.log.Debug("cannot read maxmemory-policy", slog.Any("error", err))
		return
	}
	if p := cfg["maxmemory-policy"]; p != "" && p != "noeviction" {
		w.log.Warn("redis may evict keys under memory pressure; use maxmemory-policy noeviction for the recovery keys",
			slog.String("maxmemory_policy", p))
	}
}
