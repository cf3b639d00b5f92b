package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The heartbeater keeps the worker alive in Redis: every heartbeat interval
// one script on the instance's slot writes the heartbeat key with its TTL
// and the incarnation, writes every tracked row back into the rows set (Redis
// may have lost it) and removes rows whose Untrack could not reach Redis;
// the registry SADD goes in the same round trip. Each success renews the
// lease (lease.go).
type heartbeater struct {
	store  store.Store
	log    *slog.Logger
	opts   *options // read-only after New
	lease  *lease
	rows   *inflight
	fleet  *fleetView
	stats  *counters
	events *dispatcher
	// tracker looks after a lost lease (checkLoss), gives the rows set a
	// new incarnation (rotateLocked, the caller holding the rows-set
	// lock), begins a new life before a late heartbeat (lateBeat), says
	// which rows the heartbeat writes (beatRows), writes back the rows
	// among those removed that are tracked again (retrack), and names the
	// current owner value for a log line (rowtrack.go); judge records the outcome
	// of the registry SADD (registry.go); ousted records that another
	// process took the instance ID (twin.noteOusted).
	tracker tracker
	judge   *judge
	ousted  func()
	giver   *giver // wakes to give back rows held at a loss (giveback.go)
	// failures counts the heartbeats failed in a row; outageStart is when
	// the first of them failed. Only run touches them.
	failures    int
	outageStart time.Time
}

// runOnce sends one heartbeat (store.Beat). It writes only over an absent
// key or this Worker's own value; if the key holds another process's
// value, nothing is written and runOnce returns errOusted: that process has
// the instance ID now.
func (h *heartbeater) runOnce(parent context.Context) error {
	if h.lease.ousted.Load() {
		return errOusted // for good: the ID is another process's
	}
	ctx, cancel := h.opts.opContext(parent)
	defer cancel()

	if err := h.tracker.checkLoss(ctx); err != nil {
		return err
	}

	h.rows.assert.Lock()
	defer h.rows.assert.Unlock()
	if err := h.tracker.rotateLocked(ctx); err != nil {
		// A released row is tracked again: writing it under the old
		// incarnation would hide it from recovery.
		h.stats.heartbeatFailures.Add(1)
		return fmt.Errorf("new incarnation: %w", err)
	}
	h.tracker.lateBeat()
	tracked, unremoved, incarnation := h.rows.snapshot()
	tracked, unremoved = h.tracker.beatRows(tracked, unremoved)
	res, sentAt, err := h.beat(ctx, tracked, unremoved, incarnation)
	if res.Foreign {
		// Nothing of ours was written; the registry entry is the ID's
		// whoever holds it.
		h.stats.heartbeatFailures.Add(1)
		return errOusted
	}
	if res.Wrote {
		h.wrote(sentAt, incarnation)
	}
	h.judge.noteRegistry(res.RegistryErr)
	if err != nil {
		h.stats.heartbeatFailures.Add(1)
		return err
	}
	h.stats.heartbeats.Add(1)
	h.stats.lastHeartbeat.Store(sentAt.UnixNano())
	h.events.emit(Event{Kind: EventHeartbeat})
	if len(unremoved) > 0 {
		h.rows.forgetUnremoved(unremoved)
		h.tracker.retrack(ctx, unremoved)
	}
	return nil
}

// beat sends the heartbeat script (store.Beat) with the rows to add to
// and remove from the rows set, and notes the fleet record it returned;
// it returns when it was sent.
func (h *heartbeater) beat(ctx context.Context, tracked, unremoved []int64, incarnation string) (store.BeatResult, time.Time, error) {
	oldest, holds := h.rows.oldestTracked()
	sentAt := time.Now()
	serves, server := h.fleet.mem.served()
	res, err := h.store.Beat(ctx, h.opts.instanceID, store.Heartbeat{
		Value: h.opts.beatValue, TTL: h.opts.heartbeatTTL,
		Incarnation: incarnation, IncarnationTTL: h.fleet.incarnationTTL(),
		Remove: unremoved, Add: tracked, RowsTTL: h.fleet.rowsTTL(),
		Serves: serves, Server: server, Announce: h.fleet.announcement(),
		HoldsRows: holds, OldestRowAge: sentAt.Sub(oldest),
	})
	h.fleet.note(res.Fleet, res.FleetErr)
	return res, sentAt, err
}

// wrote renews the lease after a heartbeat sent at sentAt wrote the key.
// A write whose reply came after the lease had ended (sent before its
// end, delivered late: a server restarting, a network stall) may have
// found the key expired and a peer's claim taken, which it cancelled.
// The loss is noted before renewing, so that the regain is held
// (restored) as any other. Without this the lease went from lost to
// valid with no hold, and the loop noted nothing. (Start's first
// heartbeat has no lease to lose.)
func (h *heartbeater) wrote(sentAt time.Time, incarnation string) {
	if h.lease.until.Load() > 0 {
		h.lease.noteLeaseLoss(nil)
	}
	// The key is live for a TTL whatever happened to the rest (on
	// Cluster the registry may sit on a node that is down).
	h.lease.renew(sentAt)
	h.rows.wrote(incarnation)
}

// run refreshes the heartbeat every interval until ctx, which only
// Shutdown cancels, is done. It never sees the caller's processing context:
// a worker finishing its block during shutdown must keep its heartbeat. A
// failed refresh is retried after a short, growing backoff rather than a
// whole interval later; an outage is logged when it starts and when it ends,
// not at every try.
func (h *heartbeater) run(ctx context.Context) {
	h.log.Debug("heartbeat loop started", slog.Duration("interval", h.opts.heartbeatInterval))
	defer h.log.Debug("heartbeat loop stopped")

	t := time.NewTimer(h.opts.heartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.lease.noteLeaseLoss(nil) // a stopped process finds out here when it resumes
		sent := time.Now()
		err := h.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			h.restored()
			h.giver.note()
			// The period runs from send to send: a slow answer must not
			// push the next heartbeat past the end of the lease.
			next := max(0, h.opts.heartbeatInterval-time.Since(sent))
			if _, written := h.rows.writtenLife(); !written {
				next = 0 // a life begun while this one was in flight: record it now
			}
			t.Reset(next)
			h.opts.sig.beat.Signal(nil) // test signal: a heartbeat turn ended
			continue
		}
		h.failed(err)
		t.Reset(h.retryDelay(h.failures))
		h.opts.sig.beat.Signal(err) // test signal: a heartbeat turn ended
	}
}

// restored notes a heartbeat that succeeded: the end of an outage, and a
// lease regained.
func (h *heartbeater) restored() {
	if h.failures > 0 {
		outage := time.Since(h.outageStart)
		h.log.Info("heartbeat restored", slog.Duration("outage", outage), slog.Int("attempts", h.failures))
		h.events.emit(Event{Kind: EventHeartbeatRestored, Duration: outage, Attempt: h.failures})
	}
	if h.lease.lost.Load() {
		// The hold before the flag: CheckLease counts either as lost, so
		// the lease renewed by this heartbeat is never valid in between.
		if !mutantNoRegainHold {
			h.lease.hold(h.fleet.claimTTL())
		}
		h.lease.lost.Store(false)
		if h.lease.perLife.Load() {
			// The held time is counted only for rows under the bare ID.
			h.log.Info("heartbeat lease regained; worker re-registered in a new life; rows of the ended life must be given back",
				slog.Int("stale_rows", h.rows.heldAtLoss()), slog.String("owner", h.tracker.currentOwner()))
		} else {
			h.log.Info("heartbeat lease regained; worker re-registered; taking no rows until a recovery that claimed it meanwhile must have ended",
				slog.Int("stale_rows", h.rows.heldAtLoss()), slog.Duration("held_for", h.fleet.claimTTL()))
		}
		h.events.emit(Event{Kind: EventLeaseRegained})
	}
	h.failures = 0
}

// failed notes a heartbeat that failed.
func (h *heartbeater) failed(err error) {
	err = redisSlow(h.opts.opTimeout, err)
	if h.failures == 0 {
		h.outageStart = time.Now()
		h.log.Warn("heartbeat failed; retrying", slog.Any("error", err))
	}
	h.failures++
	h.events.emit(Event{Kind: EventHeartbeatFailed, Attempt: h.failures, Err: err})
	if errors.Is(err, ErrInstanceIDInUse) {
		h.ousted()
	}
	h.lease.noteLeaseLoss(err)
}

// retryDelay is the wait before heartbeat retry n (from 1): a tenth of the
// interval doubled per failure, with ±20% jitter, never more than the
// interval: once Redis is back, an owner-mode worker whose lease was lost
// takes rows again within one interval (docs/safety.md §3).
func (h *heartbeater) retryDelay(n int) time.Duration {
	iv := h.opts.heartbeatInterval
	d := iv / 10
	for i := 1; i < n && d < iv; i++ {
		d *= 2
	}
	return min(h.opts.jitter("heartbeat", min(d, iv), 0.2), iv)
}

// noteLeaseLoss notes, once per loss, that the lease has ended.
func (l *lease) noteLeaseLoss(cause error) {
	if l.valid() {
		return
	}
	l.markLeaseLost(cause)
}

// markLeaseLost notes a loss of the lease, once per loss, also before its
// end (a heartbeat sent too late to renew it in time). In owner mode the
// worker begins a new life: OwnerValue() changes, and rows of the ended one
// are refused by TrackAs.
func (l *lease) markLeaseLost(cause error) {
	if l.lost.Swap(true) {
		return
	}
	l.movedOn.Store(false) // the host has not moved on from this loss's rows yet
	since := l.sinceRefresh()
	// Only a host whose Release is safe now (owner fencing, or the reset
	// ledger) can do something with rows peers may have taken; for any
	// other the loss is not sticky, or it could never work again. The
	// self-check stops judging those rows either way: a recoverer may have
	// reset them.
	l.rows.markLoss(l.releaseSafe && !mutantNoStickyLease, l.newLives && !mutantOneLife)
	l.stats.leaseLosses.Add(1)
	l.events.emit(Event{Kind: EventLeaseLost, Duration: since, Err: cause})
	attrs := []any{slog.Duration("since_last_heartbeat", since)}
	if cause != nil {
		attrs = append(attrs, slog.Any("error", cause))
	}
	l.log.Error("heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones", attrs...)
}

// jitter returns d changed by a random fraction in [-frac, +frac].
func jitter(d time.Duration, frac float64) time.Duration {
	return jitterBy(rand.Float64(), d, frac)
}

// jitter is jitter for one of w's loops ("heartbeat", "scan", "sweep"),
// drawn through jitterSource.
func (o *options) jitter(loop string, d time.Duration, frac float64) time.Duration {
	return jitterBy(jitterSource(o, loop), d, frac)
}

func jitterBy(f float64, d time.Duration, frac float64) time.Duration {
	if d <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + frac*(2*f-1)))
}

// jitterSource draws the random fraction of a loop's jitter. The
// deterministic simulation (sim_test.go) replaces it for the length of a
// run with a seeded stream per worker and loop, so that a seed replays the
// same timings whatever order the loops draw in.
var jitterSource = func(*options, string) float64 { return rand.Float64() }
