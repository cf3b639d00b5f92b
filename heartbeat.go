package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The heartbeater keeps the worker alive in Redis: every heartbeat interval
// one script on the instance's slot writes the heartbeat key with its TTL
// and the incarnation, writes every tracked row back into the rows set (Redis
// may have lost it) and removes rows whose Untrack could not reach Redis;
// the registry SADD goes in the same round trip. Each success renews the
// lease (heartbeat.go).
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
	giver   *giver // wakes to give back rows held at a loss (heartbeat.go)
	// kicked asks for a heartbeat now (kick); nil without the witness.
	kicked chan struct{}
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
		case <-h.kicked: // a life the witness ended: record the next one now
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

// kick asks the loop for a heartbeat now, without waiting.
func (h *heartbeater) kick() {
	select {
	case h.kicked <- struct{}{}:
	default:
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

// The lease is the worker's own view of its liveness (docs/safety.md). A
// heartbeat written at time t (taken before the write is sent) makes the
// key live until at least t + heartbeat TTL on the server, so until then no
// peer can find it dead. The lease ends a margin earlier, a tenth of the
// TTL, to allow for clock-rate differences and for the host to react.
//
// It is not to be confused with the fleet's two turns (the scan turn and
// the sweep turn, one worker at a time), nor with the claim a recoverer
// holds on a dead peer.

// leaseLength is how long after a heartbeat is sent the lease lasts: the
// TTL less the margin (a tenth of it). The one place the margin is written.
func leaseLength(ttl time.Duration) time.Duration { return ttl - ttl/10 }

// lease measures time on the monotonic clock from its epoch.
type lease struct {
	epoch  time.Time
	length time.Duration
	// until is the end of the lease, in nanoseconds since epoch; 0 before
	// the first heartbeat.
	until atomic.Int64
	// lost is set when the loss has been noted, so it is noted once.
	lost atomic.Bool
	// ousted is set, for good, when a heartbeat found the key holding
	// another process's value (heartbeat.go): the instance ID is not ours any
	// more, and neither are the rows tracked under it.
	ousted atomic.Bool
	// heldUntil, in nanoseconds since epoch, ends the hold after a lost
	// lease was regained (hold); regainedAt is when that regain was.
	heldUntil  atomic.Int64
	regainedAt atomic.Int64
	// movedOn is set when the host took rows (checkTrack) while rows held
	// at the last loss were still its own and no Block begun before that
	// loss was open: it has left them (heartbeat.go). Each loss clears it
	// (markLeaseLost).
	movedOn atomic.Bool
	// blocks are the Blocks open now (rowtrack.go): the give-back waits for
	// those begun before the last loss.
	blocks openBlocks
	// perLife is set while the rows this worker takes carry per-life owner
	// values (owner mode, the host writing OwnerValue()): a recovery of a life
	// judged dead reaches none of the rows of a later life, so a regain
	// needs no hold (check). Cleared for good once the worker learns that
	// its host writes the bare instance ID (noteBareOwners).
	perLife atomic.Bool

	// What noting a loss touches (noteLeaseLoss, markLeaseLost), set by
	// New: the rows tracked, the counters, the events and the log.
	// releaseSafe is set when the host's Release is safe after a loss
	// (releaseSafeAfterLoss: owner fencing or the reset ledger), which
	// makes the loss sticky; newLives when a loss begins a new life
	// (owner mode).
	rows        *inflight
	stats       *counters
	events      *dispatcher
	log         *slog.Logger
	releaseSafe bool
	newLives    bool
	// witness is the liveness witness's fence, set by Start when it runs
	// (witness.go).
	witness *lifeWitness
}

func newLease(ttl time.Duration) lease {
	return lease{epoch: time.Now(), length: leaseLength(ttl)}
}

// renew extends the lease after a heartbeat sent at sentAt was written.
func (l *lease) renew(sentAt time.Time) {
	l.until.Store(int64(sentAt.Sub(l.epoch) + l.length))
}

// valid reports whether the lease has not ended.
func (l *lease) valid() bool {
	return int64(time.Since(l.epoch)) < l.until.Load()
}

// remaining is how long the lease has left (negative once it ended).
func (l *lease) remaining() time.Duration {
	return time.Duration(l.until.Load()) - time.Since(l.epoch)
}

// sinceRefresh is how long ago the last successful heartbeat was sent.
func (l *lease) sinceRefresh() time.Duration {
	sent := time.Duration(l.until.Load()) - l.length
	return time.Since(l.epoch) - sent
}

// hold keeps the lease counted as lost for d after a lost lease was
// regained. A recoverer may have claimed this worker while its heartbeat
// was gone; the heartbeat that came back cancels the claim, but a reset
// that recoverer already has under way still runs, for at most the claim
// TTL, and would reset rows this worker took meanwhile under its owner
// (model hole H1, docs/model.md). Taking no new rows for a claim TTL lets
// every such reset end first. With per-life owner values (perLife) the
// reset names the life it judged dead and never reaches rows of the new
// one: the hold is recorded but not counted, except for rows tracked under
// the bare instance ID (TrackAs).
func (l *lease) hold(d time.Duration) {
	now := time.Since(l.epoch)
	l.regainedAt.Store(int64(now))
	l.heldUntil.Store(int64(now + d))
}

// held reports whether the lease is held after a regain.
func (l *lease) held() bool {
	return int64(time.Since(l.epoch)) < l.heldUntil.Load()
}

// check reports errOusted for good once another process took the ID, and
// ErrLeaseLost while the lease has ended or its loss is noted and not yet
// followed by the hold (a heartbeat renews the lease just before
// heartbeater.restored holds it), while it is held after a regain,
// or while heldAtLoss rows (tracked when it was lost, or left to the sweep) are the host's:
// peers may have recovered those, and a host that went on with them would
// process them twice.
func (l *lease) check(heldAtLoss int) error {
	if l.ousted.Load() {
		return errOusted
	}
	if !l.valid() || l.lost.Load() || (l.held() && !l.perLife.Load()) || heldAtLoss > 0 {
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
// With owner fencing or the reset ledger (see Release), a lost lease stays
// lost after the heartbeat is back for as long as the rows tracked when it
// was lost are tracked: peers may have recovered them meanwhile (a worker
// resuming from a long pause sees its heartbeat succeed within
// milliseconds). Untrack or Release them (a Block's Close does) and the
// lease is valid again; the error names them. A host that does neither does
// not idle the worker: it gives them back itself, as Release would, half a
// heartbeat interval after the regain in owner mode with per-life owner
// values; otherwise once the hold below has ended and the host has moved
// on (it called Track, TrackAs or Begin for new rows since the loss) and
// every Block begun before the loss is closed (docs/safety.md §3).
// Rows a worker without an owner column left to the backstop sweep (its
// rows set was gone when its heartbeat came back, docs/safety.md §3) count
// among them: they are no longer written back, but the lease stays lost
// until the host releases or untracks them.
// With neither nothing safe can be done with those rows, and the lease is
// valid again with the next heartbeat.
//
// In rows-set mode, and in owner mode once the host was seen writing the
// bare instance ID instead of OwnerValue(), a lost lease that comes back is held
// for one recovery claim TTL (reset timeout + 3 × operation timeout) before
// CheckLease reports nil again: a peer that claimed this worker while it
// looked dead may still be resetting its rows, and rows taken meanwhile
// would be reset under it. In owner mode with per-life owner values the
// new life's rows are out of that reset's reach, and CheckLease reports nil
// as soon as a heartbeat has recorded the new life (docs/safety.md §3).
//
// With the liveness witness (WithLivenessWitness, owner mode) CheckLease
// may wait: when Redis has not answered the worker's witness ping for
// Timings.WitnessFence (a pause just ended, a Redis outage, a cut
// connection), it waits for an answer, since a peer that still reaches
// Redis could judge this worker dead meanwhile; it returns nil once
// Redis answers and the life was not judged, and ErrLeaseLost if the life
// was judged or the lease ended first (docs/safety.md §14). Healthy does
// not wait.
func (w *Worker) CheckLease() error { return w.lease.checkIn(context.Background(), &w.state, true) }

// checkIn is CheckLease for a worker in lifecycle state; without wait
// (Healthy) it does not wait for the liveness witness (witness.go), and
// ctx bounds the wait.
func (l *lease) checkIn(ctx context.Context, state *atomic.Int32, wait bool) error {
	_, err := l.checkHeld(ctx, state, wait)
	return err
}

// checkTrack is checkIn for a host that takes rows (Track, TrackAs,
// Begin): one that does so while rows held at the last loss are still its
// own has moved on from them (movedOn), which lets the worker give them
// back (heartbeat.go); not while a Block begun before the loss is open (a
// goroutine may still be in one of its rows).
func (l *lease) checkTrack(ctx context.Context, state *atomic.Int32) error {
	held, err := l.checkHeld(ctx, state, true)
	if held && !l.blocks.openBefore(l.stats.leaseLosses.Load()) {
		l.movedOn.Store(true)
	}
	return err
}

// checkHeld is checkIn; held reports that the lease is back but for the
// rows held at the loss.
func (l *lease) checkHeld(ctx context.Context, state *atomic.Int32, wait bool) (held bool, err error) {
	switch state.Load() {
	case stateNew:
		return false, ErrNotStarted
	case stateShutdown:
		return false, ErrShutdown
	}
	if n := l.rows.heldAtLoss(); n > 0 && !l.ousted.Load() && l.valid() && !l.lost.Load() {
		return true, l.heldErr(n) // back, but for the rows held at the loss: it names them
	}
	if err := l.check(0); err != nil {
		return false, err
	}
	if _, written := l.rows.writtenLife(); l.newLives && !written {
		return false, ErrLeaseLost // a new life no heartbeat has recorded yet (TrackAs refuses it)
	}
	return false, l.witness.fresh(ctx, wait) // the witness's fence (witness.go)
}

// Healthy returns nil while the worker holds a valid heartbeat lease, and
// the reason otherwise (ErrNotStarted, ErrLeaseLost, ErrShutdown). It is
// meant for a readiness probe, not liveness: a worker that keeps failing it
// cannot reach Redis and its rows are being recovered by peers, and a
// restart brings Redis back no sooner. A pod exits on ErrMisconfigured
// (docs/integration.md, "What a batch-worker pod does with Healthy()"). It also
// fails, with an error wrapping ErrMisconfigured, once the self-check found
// that the rows this worker tracks would not be recovered should it crash
// (statuses or owner column misconfigured), and with an error wrapping
// ErrUntrackedRows for a rows TTL after this worker was found to track
// rows after their COMMIT, or not at all (see ErrUntrackedRows). When
// several hold at once it returns them joined (errors.Join), lease first,
// so that errors.Is finds each: a lease lost during an outage does not
// hide a misconfiguration. A single reason is returned as it is.
func (w *Worker) Healthy() error {
	var errs []error
	for _, err := range []error{w.lease.checkIn(context.Background(), &w.state, false), w.checker.alarmErr(), w.untracked.err()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...) // nil when none
}

// noteBareOwners notes that this worker's rows carry its bare instance ID
// (the host writes InstanceID(), not OwnerValue()): from now on a regained lease
// is held (lease.hold). Logged once.
func (l *lease) noteBareOwners() {
	if !l.perLife.Swap(false) {
		return
	}
	l.log.Warn("the host writes the bare instance ID into the owner column, not OwnerValue(): every regained lease is held for a claim TTL (docs/safety.md §3); fetch and complete under OwnerValue() and pass it to TrackAs")
}

// The give-back: a worker whose lease was lost and came back gives the rows
// it held at the loss back itself, as Release would, once that is safe and
// the host has had its chance to do it. A host that abandons a block on
// ErrLeaseLost without Release (or whose goroutine holding the block
// returned early) would otherwise keep the lease lost, and the worker idle,
// for good: the rows held at the loss keep it lost (lease.check) until
// they are given back.
//
// It runs only where Release is safe after a loss (owner fencing or the
// reset ledger, releaseSafeAfterLoss): only there is a loss sticky and are
// rows held at it. When it is due:
//
//   - with per-life owner values (owner mode), half a heartbeat interval
//     after the regain: the reset names the ended life, so a completion the
//     host still commits under it is refused by the owner guard, a crash
//     leaves none of them in progress under it, and rows of the new life
//     are out of its reach;
//   - otherwise once the hold after the regain has ended (a claim TTL:
//     every recovery that claimed the worker while it looked dead has
//     ended) and the host has moved on: it called Track, TrackAs or Begin
//     (lease.checkTrack). A host still in the old block, one long row past
//     the hold, would otherwise go on with the next row once CheckLease
//     said nil, a row given back (its completion guarded by the status
//     only) or left to the backstop sweep (untracked: a crash would strand
//     it past the crash bound). The simulator found the latter (seed 721)
//     with a give-back at the end of the hold alone.
//
// The reset is Release's (the ledger skips a row a recovery already reset;
// owner fencing leaves a row someone else holds); rows left to the backstop
// sweep are only forgotten, as Release does.
type giver struct {
	deps    // the settings, the store, the log and the shared parts (worker.go)
	lease   *lease
	rows    *inflight
	tracker tracker
	// kick wakes the loop after a heartbeat that succeeded with rows held
	// at a loss (note), and after a Block's Close.
	kick chan struct{}
	// closeFailing is set while the last try at rows a Close left failed
	// (retryClosed); only the loop touches it.
	closeFailing bool
}

func newGiver(d deps, l *lease, rows *inflight, t tracker) *giver {
	return &giver{deps: d, lease: l, rows: rows, tracker: t, kick: make(chan struct{}, 1)}
}

// note wakes the loop if rows held at a loss are still held: the heartbeat
// calls it after each success. It never blocks.
func (g *giver) note() {
	if g == nil {
		return
	}
	if g.rows.heldAtLoss() == 0 {
		return
	}
	g.wake()
}

// wake wakes the loop; it never blocks.
func (g *giver) wake() {
	if g == nil {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run gives back the rows held at a loss when they are due, and the rows
// a Block's Close failed to give back a heartbeat interval after the
// failure, until ctx is done. A give-back that fails is tried again a
// heartbeat interval later.
func (g *giver) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	retry := time.NewTimer(time.Hour) // the next try at rows a Close left (retryClosed)
	retry.Stop()
	defer retry.Stop()
	retrying := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-t.C:
		case <-retry.C:
			retrying = false
			g.retryClosed(ctx)
		}
		if !retrying && g.rows.hasUnreturned() {
			retrying = true
			retry.Reset(g.opts.jitter("giveback", g.opts.heartbeatInterval, 0.1))
		}
		wait, due := g.due()
		if !due {
			continue // nothing held, or the lease is lost again: a heartbeat kicks
		}
		if wait > 0 {
			t.Reset(wait)
			continue
		}
		err := g.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			g.log.Warn("giving back the rows held when the lease was lost failed; retrying", slog.Any("error", err))
			t.Reset(g.opts.jitter("giveback", g.opts.heartbeatInterval, 0.1))
		}
		g.sig.gave.Signal(err) // test signal: a give-back ended
	}
}

// due reports whether rows held at a loss wait for the give-back, and how
// long until it is due (0 or less: now). Not while the lease is lost, nor
// once another process took the instance ID.
func (g *giver) due() (time.Duration, bool) {
	l := g.lease
	if g.rows.heldAtLoss() == 0 || l.ousted.Load() || l.lost.Load() || !l.valid() {
		return 0, false
	}
	end := l.heldUntil.Load()
	switch {
	case l.perLife.Load():
		end = l.regainedAt.Load() + int64(g.opts.heartbeatInterval/2)
	case !l.movedOn.Load() || l.blocks.openBefore(l.stats.leaseLosses.Load()):
		// The host may still be in the old block: a Track or Begin says
		// it left, and Close of every Block begun before the loss (which
		// wakes the loop).
		return 0, false
	}
	return time.Duration(end) - time.Since(l.epoch), true
}

// runOnce gives back the rows held at the last loss (Release's reset),
// bounded by the reset timeout.
func (g *giver) runOnce(ctx context.Context) error {
	ids := g.rows.heldAtLossIDs(0)
	if len(ids) == 0 {
		return nil
	}
	g.log.Warn("giving back rows held when the lease was lost: the host did not release them (defer Block.Close, or Release the rows of an abandoned block)",
		slog.Int("rows", len(ids)))
	ctx, cancel := context.WithTimeout(ctx, g.opts.resetTimeout)
	defer cancel()
	if err := g.tracker.release(ctx, ids); err != nil {
		return fmt.Errorf("give back %d rows held at a lost lease: %w", len(ids), err)
	}
	return nil
}

// retryLater records rows a Block's Close failed to give back, for the
// loop to try again (retryClosed); Close wakes it. Nothing where the
// loop does not run: there Release is not safe in every state.
func (g *giver) retryLater(ids []int64) {
	if g == nil {
		return
	}
	g.rows.leaveUnreturned(ids)
}

// retryClosed gives back the rows a Block's Close failed to give back
// (Release's reset, bounded by the reset timeout), as Close would have:
// by owner value in owner mode, and with owner fencing or the reset
// ledger otherwise, so it is safe in any state of the lease. The host
// has left those rows: Close ended their block. A failure is logged once
// until a try succeeds. Not once another process took the instance ID:
// the rows are its own.
func (g *giver) retryClosed(ctx context.Context) {
	ids := g.rows.unreturnedIDs()
	if len(ids) == 0 || g.lease.ousted.Load() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, g.opts.resetTimeout)
	defer cancel()
	err := g.tracker.release(rctx, ids)
	if ctx.Err() != nil {
		return
	}
	if err != nil && !g.closeFailing {
		g.log.Warn("trying again to give back the rows of a failed Block.Close failed; retrying every heartbeat interval",
			slog.Int("rows", len(ids)), slog.Any("error", err))
	}
	g.closeFailing = err != nil
	g.sig.gave.Signal(err) // test signal: a give-back ended
}

// heldAtLossIDs returns, in ID order, the rows heldAtLoss counts: at most
// n of them, or all with n 0.
func (s *inflight) heldAtLossIDs(n int) []int64 {
	s.mu.Lock()
	ids := append(members(s.stale), members(s.abandoned)...)
	s.mu.Unlock()
	slices.Sort(ids)
	if n > 0 && len(ids) > n {
		ids = ids[:n]
	}
	return ids
}

// heldErr is the lease's error while n rows held at the last loss are not
// given back: it names them and what gives them back.
func (l *lease) heldErr(n int) error {
	ids := l.rows.heldAtLossIDs(8)
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	list := strings.Join(s, ", ")
	if n > len(ids) {
		list += ", ..."
	}
	return fmt.Errorf("%w: %d rows held when it was lost are not given back yet (rows %s): Release them (Block.Close does); otherwise the worker gives them back itself once safe (rows-set mode: after your next Track or Begin); docs/safety.md §3",
		ErrLeaseLost, n, list)
}

// openBlocks are the Blocks open now, each with the worker's lease losses
// at its Begin.
type openBlocks struct {
	mu    sync.Mutex
	began map[*Block]uint64
}

// open registers b, begun now, and returns the lease losses so far.
func (o *openBlocks) open(b *Block, losses *atomic.Uint64) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := losses.Load()
	if o.began == nil {
		o.began = make(map[*Block]uint64)
	}
	o.began[b] = n
	return n
}

// close forgets b.
func (o *openBlocks) close(b *Block) {
	o.mu.Lock()
	delete(o.began, b)
	o.mu.Unlock()
}

// openBefore reports whether a Block begun before the losses-th lease loss
// is open.
func (o *openBlocks) openBefore(losses uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, n := range o.began {
		if n < losses {
			return true
		}
	}
	return false
}
