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
	deps  // the settings, the store, the log and the shared parts (worker.go)
	lease *lease
	rows  *inflight
	// tracker looks after a lost lease (checkLoss), gives the rows set a
	// new incarnation (rotateLocked, the caller holding the rows-set
	// lock), begins a new life before a late heartbeat (lateBeat), says
	// which rows the heartbeat writes (beatRows), writes back the rows
	// among those removed that are tracked again (retrack), and names the
	// current owner value for a log line (rowtrack.go); ousted records
	// that another process took the instance ID (twin.noteOusted). The
	// judge (deps) records the outcome of the registry SADD.
	tracker tracker
	ousted  func()
	giver   *giver // wakes to give back rows held at a loss (lease.go)
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
		Value: h.beatValue, TTL: h.opts.heartbeatTTL,
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
			h.sig.beat.Signal(nil) // test signal: a heartbeat turn ended
			continue
		}
		h.failed(err)
		t.Reset(h.retryDelay(h.failures))
		h.sig.beat.Signal(err) // test signal: a heartbeat turn ended
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

// Telling a live twin from a dead predecessor (issue 10, F3).
//
// Two processes may heartbeat one instance ID: two Workers given the same
// WithInstanceID, or a pod of a StatefulSet restarted under its name while
// the crashed process's heartbeat still lives. Every Worker writes a token
// of its own into its heartbeat (store.HeartbeatOf), and only ever writes
// over an absent key or its own value (store.Beat). Before its first
// heartbeat, Start looks at the key:
//
//   - absent, or our own value (a retried Start): go on;
//   - another value: watch it. A live process refreshes it within one
//     heartbeat interval + operation timeout (its PTTL jumps up, or the
//     value changes): that is a twin, and Start returns ErrInstanceIDInUse
//     having written nothing. A predecessor that died (or is stalled)
//     stops refreshing it: Start waits for the key to expire, watching for
//     a refresh all along, which ends the predecessor's lease;
//   - then, if the ID still has a rows set or an incarnation, they are the
//     predecessor's: Start recovers them as any peer would (recoverDead,
//     the one recovery path: claim, reset under the predecessor's
//     incarnation, finish) before its own first heartbeat, so they are
//     never kept alive, nor taken for this incarnation's.

// twin is Start's claim on the instance ID (claimInstanceID), and what
// the heartbeat does when another process took it (noteOusted).
type twin struct {
	deps  // the settings, the store, the log and the shared parts (worker.go)
	lease *lease
	rows  *inflight
	// nodes tells whether the server's evictions hold the recovery of a
	// predecessor whose heartbeat an EXISTS found absent (predecessorHeld,
	// registry.go); peers is the one recovery path every peer runs
	// (recoverDead, deadpeer.go).
	nodes *nodeWatch
	// ownedRows: the table may name this instance ID the owner of rows
	// in progress (owner mode, or the backstop sweep by owner), so Start
	// recovers a predecessor of a fixed ID even when Redis remembers
	// nothing of it.
	ownedRows bool
	peers     *peerRecoverer
}

// errOusted is what a Worker whose instance ID another process took over
// reports, for good: its lease is lost and the ID in use.
var errOusted = fmt.Errorf("%w: %w", ErrLeaseLost, ErrInstanceIDInUse)

// readOwn reads the heartbeat, its TTL and whether a rows set or an
// incarnation exists, in one transaction on the instance's slot.
func (tw *twin) readOwn(ctx context.Context) (store.Own, error) {
	opCtx, cancel := tw.opts.opContext(ctx)
	defer cancel()
	k, err := tw.store.ReadOwn(opCtx, tw.opts.instanceID)
	if err != nil {
		return k, &readError{err}
	}
	return k, nil
}

// readError is a failure to read the instance's keys at Start: Start
// explains it as it explains a failed first heartbeat (the address, the
// cause).
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// twinWatch is how long a live process can leave its heartbeat without a
// refresh: one interval from send to send, plus the operation timeout for
// the write to land, plus a tenth of the interval for timers and
// scheduling. It assumes the process runs with this Worker's timings, as a
// fleet sharing one configuration does. It is shorter than the TTL
// (interval + operation timeout < 0.9 × TTL).
func (tw *twin) twinWatch() time.Duration {
	return satAdd(satAdd(tw.opts.heartbeatInterval, tw.opts.opTimeout), tw.opts.heartbeatInterval/10)
}

// lockedRowsPoll is how often Start tries again to reset rows its
// predecessor left locked by another session.
const lockedRowsPoll = 250 * time.Millisecond

// twinPoll is how often Start looks at a foreign heartbeat.
func (tw *twin) twinPoll() time.Duration {
	return min(max(tw.opts.heartbeatInterval/20, time.Millisecond), 500*time.Millisecond)
}

// claimInstanceID runs in Start before the first heartbeat: it returns an
// error wrapping ErrInstanceIDInUse if another live process heartbeats this
// instance ID; it waits out a dead predecessor's heartbeat and recovers
// the rows it left. It writes nothing to Redis but the recovery's own keys.
//
// In owner mode a fixed ID's predecessor (WithInstanceID; the default ID
// is new with every Worker) is recovered even when Redis holds no record of
// it (its keys may have expired long ago while PostgreSQL still names the
// ID as the owner of rows in progress): nobody else would recover those
// rows while this process heartbeats the ID. It goes through the
// claim like every recovery, so a peer's sweep recovering the same ID at
// that moment is waited for, not raced.
func (tw *twin) claimInstanceID(ctx context.Context) error {
	recovered, warnedLocked := false, false
	for {
		sent := time.Now()
		k, err := tw.readOwn(ctx)
		if err != nil {
			return err
		}
		switch {
		case k.Value == tw.beatValue:
			return nil // written by an earlier try of this Start
		case k.Value != "":
			if err := tw.awaitPredecessor(ctx, k); err != nil {
				return err
			}
		case k.Record || (tw.ownedRows && tw.opts.instanceIDSet && !recovered):
			if tw.nodes.predecessorHeld(ctx, sent) {
				// The server evicts keys: the absent heartbeat may be a
				// live twin's (registry.go). Look again after a poll.
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait for the Redis server's evictions to stop before recovering this instance ID's previous process: %w", ctx.Err())
				case <-time.After(tw.twinPoll()):
				}
				continue
			}
			if recovered, err = tw.recoverPredecessor(ctx, &warnedLocked); err != nil {
				// A twin may have taken the ID meanwhile (its recovery
				// waited for ours, ours outlived its claim): say so.
				if k, rerr := tw.readOwn(ctx); rerr == nil && k.Value != "" && k.Value != tw.beatValue {
					return fmt.Errorf("%w: another process took it while this one recovered its predecessor (%v)", ErrInstanceIDInUse, err)
				}
				return err
			}
		default:
			return nil
		}
	}
}

// awaitPredecessor watches a heartbeat that holds another process's value
// until it expires. A refresh seen meanwhile means a live process holds
// the ID.
func (tw *twin) awaitPredecessor(ctx context.Context, first store.Own) error {
	start := time.Now()
	prev := first
	warned := false
	t := time.NewTimer(tw.twinPoll())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the heartbeat of a previous process with this instance ID to expire (%s left): %w",
				prev.PTTL.Round(time.Millisecond), ctx.Err())
		case <-t.C:
		}
		k, err := tw.readOwn(ctx)
		if err != nil {
			return err
		}
		switch {
		case k.Value == "":
			if warned {
				tw.log.Info("heartbeat of the previous process with this instance ID expired; recovering the rows it left",
					slog.Duration("waited", time.Since(start)))
			}
			return nil
		case k.Value != prev.Value || k.PTTL > prev.PTTL:
			return fmt.Errorf("%w: %s was refreshed by another process %s after Start found it",
				ErrInstanceIDInUse, tw.store.Keys(tw.opts.instanceID).Heartbeat, time.Since(start).Round(time.Millisecond))
		case k.PTTL < 0 && time.Since(start) > tw.twinWatch():
			return fmt.Errorf("%w: %s holds another process's value and has no TTL: delete it if no process runs as %s",
				ErrInstanceIDInUse, tw.store.Keys(tw.opts.instanceID).Heartbeat, tw.opts.instanceID)
		}
		if !warned && time.Since(start) > tw.twinWatch() {
			warned = true
			tw.log.Warn("a previous process with this instance ID stopped refreshing its heartbeat; waiting for it to expire before starting",
				slog.Duration("heartbeat_ttl_left", k.PTTL))
		}
		prev = k
		t.Reset(min(tw.twinPoll(), max(k.PTTL, time.Millisecond)))
	}
}

// recoverPredecessor recovers the rows set a previous process left under
// this instance ID, through the recovery every peer runs. While another
// worker holds the claim it waits and tries again.
//
// Rows of the predecessor another session holds locked (its host vanished
// with a transaction open, and its session lives on until the server ends
// it) are waited for, within ctx, trying again every lockedRowsPoll: the
// rows PostgreSQL names this ID the owner of must be reset before this
// process heartbeats under it. warnedLocked says whether that wait was
// logged already.
func (tw *twin) recoverPredecessor(ctx context.Context, warnedLocked *bool) (done bool, err error) {
	pr, claimed, err := tw.peers.recoverDead(ctx, tw.opts.instanceID, foundByRestart, time.Now())
	if err != nil && errors.Is(err, ErrRowsLocked) && ctx.Err() == nil {
		if !*warnedLocked {
			*warnedLocked = true
			tw.log.Warn("Start waits for rows a previous process left under this instance ID: another session holds them locked (its host vanished with a transaction open?); they are reset once that session ends (idle_in_transaction_session_timeout)",
				slog.Any("error", err))
		}
		tw.sig.locked.Signal(struct{}{}) // test signal: a try at the locked rows ended
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("recover the rows a previous process left under this instance ID: %w (%w)", err, ctx.Err())
		case <-time.After(lockedRowsPoll):
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recover the rows a previous process left under this instance ID: %w", err)
	}
	if !claimed {
		// Another worker is recovering it, or a heartbeat appeared: look
		// again after a poll.
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("wait for a peer's recovery of this instance ID's previous process: %w", ctx.Err())
		case <-time.After(tw.twinPoll()):
		}
		return false, nil
	}
	if pr.RowsFound > 0 || pr.RowsReset > 0 {
		tw.log.Info("recovered rows a previous process left under this instance ID",
			slog.Int("rows_found", pr.RowsFound), slog.Int64("rows_reset", pr.RowsReset),
			slog.Int("rows_quarantined", len(pr.Quarantined)))
	}
	return true, nil
}

// noteOusted records, for good, that another process holds this Worker's
// instance ID, and says so once.
func (tw *twin) noteOusted() {
	if tw.lease.ousted.Swap(true) {
		return
	}
	if !tw.lease.lost.Swap(true) {
		tw.stats.leaseLosses.Add(1)
		tw.events.emit(Event{Kind: EventLeaseLost, Duration: tw.lease.sinceRefresh(), Err: errOusted})
	}
	tw.events.emit(Event{Kind: EventInstanceIDTaken, Err: errOusted})
	tw.log.Error("another process heartbeats this instance ID: it started while this worker could not refresh its heartbeat, and has taken over its rows; stop processing and shut this worker down",
		slog.Int("rows_tracked", tw.rows.len()))
}
