package recovery

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The recoverer is the recovery loop: at Start and then every recovery
// interval (±10%) it takes the fleet's scan turn and, if it got it, scans
// the registry for dead peers; in between it recovers the peers the expiry
// watcher hands it. Every dead peer goes down the one path (deadpeer.go).

// recoverNow runs one recovery scan now, bounded by ctx: it finds the
// registered peers whose heartbeat has expired and, for each, resets the
// rows in its rows set, then deletes the set and removes the peer from the
// registry. It may be called before Start (an operator tool that never
// heartbeats can use it) and concurrently with the background scans: a
// claim in Redis makes sure one dead peer is recovered by one worker.
// ops.RecoverNow calls it (bridge.go).
//
// Before Start it first reads the timings the fleet's members announce
// (the fleet record), which a started Worker learns from its heartbeats,
// so that verdicts after a Redis restart wait for the fleet's longest TTL,
// not this Worker's.
//
// The error is nil when every dead peer was handled; otherwise it joins a
// *report.PeerError for each peer that failed, or reports why the scan
// itself failed. The report describes what was done either way.
func (w *Worker) recoverNow(ctx context.Context) (report.RecoveryReport, error) {
	switch w.state.Load() {
	case stateShutdown:
		return report.RecoveryReport{}, ErrShutdown
	case stateNew:
		w.fleet.learnRecord(ctx)
	}
	return w.recov.scan(ctx)
}

// scan is one recovery pass: the registry, the heartbeats, and the one
// path for every dead peer.
func (r *recoverer) scan(ctx context.Context) (rep report.RecoveryReport, err error) {
	start := time.Now()
	defer func() { r.scanned(ctx, start, &rep, err) }()

	dead, noticed, err := r.findDead(ctx, &rep)
	if err != nil {
		return rep, err
	}
	plan := r.planScan(ctx, dead, noticed)
	deadline := start.Add(r.opts.scanBudget())
	errs := r.recoverPlan(ctx, &rep, plan.order, plan.lives, noticed, deadline)
	if len(plan.idle) > 0 {
		r.removeIdle(ctx, &rep, plan.idle, deadline)
	}
	return rep, errors.Join(errs...)
}

// scanned counts a scan begun at start, and emits its events.
func (r *recoverer) scanned(ctx context.Context, start time.Time, rep *report.RecoveryReport, err error) {
	rep.Duration = time.Since(start)
	r.stats.scans.Add(1)
	if err != nil && len(rep.Dead) == 0 && r.stats.countFailure(ctx) {
		// The scan itself failed; peer failures are counted by recoverDead.
		r.events.emit(Event{Kind: EventRecoveryFailed, Err: err})
	}
	r.events.emit(Event{Kind: EventScanFinished, PeersChecked: rep.PeersChecked,
		PeersDead: len(rep.Dead), Duration: rep.Duration, Err: err})
}

// findDead reads the registry and returns the dead peers to recover
// (those RecoverNowKeeping keeps left out), and when they were found.
func (r *recoverer) findDead(ctx context.Context, rep *report.RecoveryReport) ([]string, time.Time, error) {
	peers, invalid, err := r.judge.registeredPeers(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	rep.InvalidMembers = invalid
	rep.PeersChecked = len(peers)
	dead, err := r.judge.deadPeers(ctx, peers)
	if err != nil {
		return nil, time.Time{}, err
	}
	noticed := time.Now()
	rep.Dead = dead
	if len(r.keep) > 0 { // ops.RecoverNowKeeping: left registered, untouched
		dead = slices.DeleteFunc(slices.Clone(dead), func(peer string) bool {
			if r.keep[peer] {
				rep.Skipped = append(rep.Skipped, peer)
			}
			return r.keep[peer]
		})
	}
	return dead, noticed, nil
}

// recoverPlan sends the peers of order down the one path, in order,
// until the deadline (at least one): the rest is deferred to the next
// scan. It returns the peers' errors.
func (r *recoverer) recoverPlan(ctx context.Context, rep *report.RecoveryReport, order []string, lives map[string][]string, noticed, deadline time.Time) []error {
	var errs []error
	for i, peer := range order {
		if err := ctx.Err(); err != nil {
			errs = append(errs, &report.PeerError{InstanceID: peer, Err: err})
			continue
		}
		if i > 0 && !time.Now().Before(deadline) {
			rep.Deferred = append(rep.Deferred, order[i:]...) // the next scan, newer deaths first
			break
		}
		pr, claimed, err := r.peers.recoverDeadLives(ctx, peer, foundByScan, noticed, lives[peer])
		switch {
		case err != nil:
			r.peers.seen.failedOnce(peer) // tried first among the peers seen before
			errs = append(errs, &report.PeerError{InstanceID: peer, Err: err})
			rep.Failed = append(rep.Failed, pr)
			rep.RowsReset += pr.RowsReset
		case !claimed:
			rep.Skipped = append(rep.Skipped, peer)
		default:
			rep.Recovered = append(rep.Recovered, pr)
			rep.RowsReset += pr.RowsReset
		}
	}
	return errs
}

// removeIdle deregisters the idle dead peers in bulk, and logs what it
// did: not returned, the scan's other results stand.
func (r *recoverer) removeIdle(ctx context.Context, rep *report.RecoveryReport, idle []string, deadline time.Time) {
	n, err := r.deregisterIdle(ctx, idle, deadline)
	rep.IdleDeregistered = n
	r.stats.peersDead.Add(uint64(n))
	if n > 0 {
		r.log.Info("removed dead peers with nothing to recover from the registry",
			slog.Int("peers_removed", n), slog.Int("peers_left", len(idle)-n))
	}
	if err != nil && ctx.Err() == nil {
		r.log.Warn("removing dead peers with nothing to recover from the registry failed; the next scan tries again",
			slog.Int("peers_left", len(idle)-n), slog.Any("error", err))
	}
}

// recoverer is the recovery loop. New builds it; it hands every dead peer
// to peers.
type recoverer struct {
	store   store.Store
	log     *slog.Logger
	opts    *options // read-only after New
	peers   *peerRecoverer
	stats   *counters
	events  *dispatcher
	rlog    *recoveryLog
	expired chan string // peers whose heartbeat just expired (expiry.go)

	// judge reads the registry and judges which registered peers are
	// dead (registry.go); untracked takes this worker's note in the
	// untracked-rows hash (rowsweep.go).
	judge     *judge
	untracked *untrackedAlarm
	// keep lists the dead peers a scan leaves alone: only
	// recoverNowKeeping sets it, on a Worker never started (sweepnow.go).
	keep map[string]bool
}

// expiredQueue is how many expired peers can wait for the loop (the
// capacity of recoverer.expired); hand drops a peer that finds it full.
const expiredQueue = 256

// run scans at once and then every recovery interval (±10%), and recovers
// the peers the expiry watcher hands it, until ctx, which only Shutdown
// cancels, is done.
func (r *recoverer) run(ctx context.Context) {
	r.log.Debug("recovery loop started", slog.Duration("interval", r.opts.recoveryInterval))
	defer r.log.Debug("recovery loop stopped")

	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case peer := <-r.expired:
			// Every subscribed worker hears of it; the claim lets one act.
			_, _, _ = r.peers.recoverDead(ctx, peer, foundByExpiry, time.Now())
			r.opts.sig.expired.Signal(peer) // test signal: an expiry message acted on
			continue
		case <-t.C:
		}
		began := time.Now()
		r.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		// The next scan starts an interval after this one began (at once
		// if this one took longer): a scan's own duration does not add to
		// the wait for the next (scanBudget).
		t.Reset(max(r.opts.jitter("scan", r.opts.recoveryInterval, 0.1)-time.Since(began), 0))
		r.opts.sig.scan.Signal(struct{}{}) // test signal: a recovery turn ended
	}
}

// runOnce is one turn of the loop: the scan, if this worker gets the scan
// turn.
func (r *recoverer) runOnce(ctx context.Context) {
	if !r.takeScanTurn(ctx) {
		return
	}
	rep, err := r.scan(ctx)
	if ctx.Err() != nil {
		return
	}
	r.rlog.scanned(rep, err)
}

// hand passes a peer whose heartbeat expired to the loop, without waiting:
// a busy loop leaves it to the next scan.
func (r *recoverer) hand(peer string) {
	select {
	case r.expired <- peer:
	default:
	}
}

// takeScanTurn reports whether this worker should scan now. With the scan
// turn on (WithScanTurn, the default), one worker of the fleet scans per
// recovery interval: the first whose tick finds <prefix>_SCAN_LEASE free
// takes it for the scan turn's TTL, so the fleet's scan load stays that of
// one worker instead of growing with the square of its size. The key holds
// the instance ID, so a retry after a lost reply finds this worker holding
// it instead of skipping the scan. If Redis cannot be asked, the worker
// scans anyway: the scan reports the outage. A turn key held by no live
// worker (another type, no TTL, a value not the ID of an instance with a
// heartbeat) is taken over and logged at Error.
//
// The turn adds to the detection bound: see options.scanTurnTTL and
// options.detectionWindow.
func (r *recoverer) takeScanTurn(ctx context.Context) bool {
	if !r.opts.scanLease {
		r.untracked.readNote(ctx, r.store)
		return true
	}
	opCtx, cancel := r.opts.opContext(ctx)
	defer cancel()
	turn, note, err := r.store.TakeScanTurn(opCtx, r.opts.instanceID, r.opts.scanTurnTTL())
	r.untracked.note(note)
	if turn.Stranger != "" {
		r.stats.turnsFromStrangers.Add(1)
		r.rlog.turnFromStranger("scan", store.ScanTurnKey(r.opts.keyPrefix), turn)
	}
	return turn.Held || err != nil
}
