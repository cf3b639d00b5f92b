package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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
// ops.RecoverNow calls it (ops.go).
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
	deps    // the settings, the store, the log and the shared parts (worker.go)
	peers   *peerRecoverer
	expired chan string // peers whose heartbeat just expired (recovery.go)

	// untracked takes this worker's note in the untracked-rows hash
	// (rowtrack.go). The judge (deps) reads the registry and judges which
	// registered peers are dead.
	untracked *untrackedAlarm
	// keep lists the dead peers a scan leaves alone: only
	// recoverNowKeeping sets it, on a Worker never started (ops.go).
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
			r.sig.expired.Signal(peer) // test signal: an expiry message acted on
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
		r.sig.scan.Signal(struct{}{}) // test signal: a recovery turn ended
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

// How a scan orders its dead peers, so that a fresh death is recovered
// within the bound however many peers died before it (a zone outage
// leaves thousands of registry entries without a heartbeat):
//
//   - one pipelined read of every dead peer's record (store.Records) and
//     one renewal of every rows set and incarnation found that might not
//     outlive two more scans (store.KeepRows), in batches, before any
//     recovery: no set waits in the queue long enough to expire, whatever
//     its place in it;
//   - the peers that left something to recover (a rows set, an
//     incarnation, a claim key) go first, those this worker has not seen
//     dead before ahead of the rest, each group in the order its records
//     were last written (newest first);
//   - the peers that left nothing (a registry entry alone; in owner mode,
//     also no row in progress under their ID in the table) are removed
//     from the registry in pipelined batches (store.DeregisterIdle: the
//     same check as one deregistration) when there are more than
//     idleOneByOne of them; fewer go down the one path like any other;
//   - a scan starts no recovery once scanBudget has passed, and no bulk
//     removal half a budget after that (at least one of each): the rest
//     is left to the next scan, which orders them again, behind any newer
//     death.

// idleOneByOne is how many dead peers with nothing to recover a scan
// hands one by one to the dead-peer path; more are deregistered in bulk.
const idleOneByOne = 32

// idleBatch is how many registry entries one bulk deregistration sends
// in one pipeline, under one operation timeout.
const idleBatch = 1000

// scanBudget is how long a scan may start recoveries: half the recovery
// interval. With the next scan starting a recovery interval after this
// one started (recoverer.run), scans never queue behind each other.
func (o *options) scanBudget() time.Duration {
	return max(o.recoveryInterval/2, time.Millisecond)
}

// deadSeen is what this worker remembers of the dead peers its scans
// found: when it first saw each dead, and how many rows its rows set held
// when last seen (0: none), by this worker's scans or, once the set is
// gone, as the rows-seen key a scan of any worker wrote says. A peer found alive or gone from the registry
// is forgotten at the next scan.
type deadSeen struct {
	mu    sync.Mutex
	peers map[string]seenPeer
}

type seenPeer struct {
	first  time.Time
	rows   int64
	at     time.Time // when rows was read; zero when the rows-seen key gave it
	failed bool      // a recovery of it failed: it holds rows it could not reset yet
}

// rowsSeen returns how many rows peer's rows set held when a scan last
// saw it, and when; 0 when none was seen.
func (d *deadSeen) rowsSeen(peer string) (int64, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.peers[peer]
	return s.rows, s.at
}

// failedBefore reports whether a recovery of peer failed since a scan
// first saw it dead.
func (d *deadSeen) failedBefore(peer string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peers[peer].failed
}

// boolFirst orders true before false.
func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// failedOnce notes that a recovery of peer failed.
func (d *deadSeen) failedOnce(peer string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.peers[peer]; ok {
		s.failed = true
		d.peers[peer] = s
	}
}

// heldRows reports whether a scan saw peer's rows set hold rows.
func (d *deadSeen) heldRows(peer string) bool {
	rows, _ := d.rowsSeen(peer)
	return rows > 0
}

// forget drops peer (recovered, or deregistered).
func (d *deadSeen) forget(peer string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.peers, peer)
}

// scanPlan is what a scan does with its dead peers: one by one, in
// order, then the idle ones in bulk.
type scanPlan struct {
	order []string
	idle  []string
	lives map[string][]string // owner mode: per-life owner values in progress, by peer
}

// scanEntry is one dead peer whose record a scan read, with what orders
// it in the plan.
type scanEntry struct {
	peer  string
	fresh bool
	first time.Time
	ttl   time.Duration
	retry bool // its last recovery failed: it holds rows for sure
	rows  bool // a scan saw its rows set hold rows
}

// planScan reads the dead peers' records, renews their rows sets, and
// orders them. Peers whose records could not be read go down the one
// path after those whose could.
func (r *recoverer) planScan(ctx context.Context, dead []string, now time.Time) scanPlan {
	if len(dead) == 0 {
		return scanPlan{}
	}
	recs, unread, kept := r.readRecords(ctx, dead)
	r.keepRows(ctx, kept)
	first := r.peers.seen.note(dead, recs, now)
	var rec, idle []scanEntry
	var later []string
	for i, p := range dead {
		e := scanEntry{peer: p, first: first[i], fresh: first[i].Equal(now), ttl: max(recs[i].RowsTTL, recs[i].IncarnationTTL),
			retry: r.peers.seen.failedBefore(p), rows: recs[i].Rows > 0 || r.peers.seen.heldRows(p)}
		switch {
		case unread[p]:
			later = append(later, p)
		case recs[i].Empty() && !r.peers.seen.heldRows(p):
			// A peer whose set a scan saw holding rows is not idle: its
			// set is lost, which its recovery reports (ErrRowsSetLost).
			idle = append(idle, e)
		default:
			rec = append(rec, e)
		}
	}
	if len(rec) > idleOneByOne {
		r.markOwning(ctx, rec)
	}
	sortScanEntries(rec)
	plan := scanPlan{order: make([]string, 0, len(dead))}
	for _, e := range rec {
		plan.order = append(plan.order, e.peer)
	}
	plan.order = append(plan.order, later...)
	idleIDs := make([]string, 0, len(idle))
	for _, e := range idle {
		idleIDs = append(idleIDs, e.peer)
	}
	if len(idleIDs) > idleOneByOne {
		idleIDs = r.owningIdle(ctx, &plan, idleIDs)
	}
	if len(idleIDs) <= idleOneByOne {
		plan.order = append(plan.order, idleIDs...)
	} else {
		plan.idle = idleIDs
	}
	return plan
}

// readRecords reads the dead peers' records, in batches, each under its
// own operation timeout: one pipeline of 10,000 peers' reads outlasts a
// short timeout on a loaded machine. It returns the records (an unread
// one counts as not idle), the peers whose records could not be read,
// and those whose rows set or incarnation needs renewing: a set is
// renewed when it might not outlive the next two scans. One comes within
// the longest recovery wait, so a set renewed when it gets shorter than
// two is never lost in the queue, and a backlog of thousands costs a
// renewal every other scan or so, not every scan.
func (r *recoverer) readRecords(ctx context.Context, dead []string) (recs []store.Record, unread map[string]bool, kept []string) {
	renewBelow := 2 * r.opts.longestRecoveryWait()
	recs = make([]store.Record, len(dead))
	unread = map[string]bool{}
	for from := 0; from < len(dead); from += idleBatch {
		batch := dead[from:min(from+idleBatch, len(dead))]
		opCtx, cancel := r.opts.opContext(ctx)
		got, err := r.store.Records(opCtx, batch)
		cancel()
		if err != nil {
			if len(unread) == 0 {
				r.log.Warn("reading the records of dead peers failed; they are recovered after the others",
					slog.Int("peers_dead", len(batch)), slog.Any("error", err))
			}
			for i, p := range batch {
				unread[p] = true
				recs[from+i] = store.Record{Claim: true, RowsTTL: -2, IncarnationTTL: -2} // unknown: not idle
			}
			continue
		}
		copy(recs[from:], got)
		for i, rec := range got {
			if rec.RowsTTL != -2 && rec.RowsTTL < renewBelow || rec.IncarnationTTL != -2 && rec.IncarnationTTL < renewBelow {
				kept = append(kept, batch[i])
			}
		}
	}
	return recs, unread, kept
}

// keepRows renews the rows sets and incarnations of kept, in batches,
// before any recovery; it stops at the first failure.
func (r *recoverer) keepRows(ctx context.Context, kept []string) {
	for from := 0; from < len(kept); from += idleBatch {
		opCtx, cancel := r.opts.opContext(ctx)
		kerr := r.store.KeepRows(opCtx, kept[from:min(from+idleBatch, len(kept))], r.peers.fleet.rowsTTL())
		cancel()
		if kerr != nil {
			r.log.Warn("renewing the rows sets of dead peers before their recovery failed; each claim renews its own",
				slog.Int("peers_dead", len(kept)), slog.Any("error", kerr))
			return
		}
	}
}

// markOwning marks the entries whose peer owns rows in progress, where
// the table says who holds rows (owner mode, which keeps no rows in
// Redis): which of many queued peers hold rows, so that a fresh death's
// rows are not queued behind a mass death's empty records (one query).
// Without the answer the order stays by age.
func (r *recoverer) markOwning(ctx context.Context, rec []scanEntry) {
	ids := make([]string, len(rec))
	for i, e := range rec {
		ids[i] = e.peer
	}
	if owning, _, err := r.peers.held.owningPeers(ctx, ids); err == nil {
		for i := range rec {
			rec[i].rows = rec[i].rows || owning[rec[i].peer]
		}
	}
}

// sortScanEntries orders the peers to recover: those not seen dead
// before first, newest record first; then those known to hold rows; then
// the rest, the one waiting longest first.
func sortScanEntries(rec []scanEntry) {
	slices.SortStableFunc(rec, func(a, b scanEntry) int {
		switch {
		case a.fresh != b.fresh:
			if a.fresh {
				return -1
			}
			return 1
		case a.fresh:
			return cmp.Compare(b.ttl, a.ttl) // newest record first
		case a.retry != b.retry, a.rows != b.rows:
			// Peers known to hold rows before those that may hold none:
			// a peer whose reset a lock held up is not queued behind a
			// mass death's empty records once the lock is gone.
			return cmp.Or(boolFirst(a.retry, b.retry), boolFirst(a.rows, b.rows))
		}
		return a.first.Compare(b.first) // waited longest first
	})
}

// owningIdle sends down the one path, with the lives the table lists,
// the idle peers that own rows in progress, where the table says who
// holds rows: nothing in Redis, but rows in progress may carry the ID.
// It returns the peers left idle; when the owners cannot be listed,
// every idle peer goes down the one path.
func (r *recoverer) owningIdle(ctx context.Context, plan *scanPlan, idleIDs []string) []string {
	owning, lives, err := r.peers.held.owningPeers(ctx, idleIDs)
	if owning == nil && err == nil {
		return idleIDs // the table keeps no owners
	}
	if err != nil {
		r.log.Warn("listing the owners of rows in progress failed; dead peers with nothing in Redis are recovered one by one",
			slog.Int("peers_dead", len(idleIDs)), slog.Any("error", err))
		plan.order = append(plan.order, idleIDs...)
		return nil
	}
	plan.lives = lives
	var rest []string
	for _, p := range idleIDs {
		if owning[p] {
			plan.order = append(plan.order, p)
		} else {
			rest = append(rest, p)
		}
	}
	return rest
}

// note records the peers of this scan's dead list (with their records)
// and forgets the others; it returns when each was first seen dead (now
// for a peer not seen before).
func (d *deadSeen) note(dead []string, recs []store.Record, now time.Time) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := make(map[string]seenPeer, len(dead))
	first := make([]time.Time, len(dead))
	for i, p := range dead {
		s, ok := d.peers[p]
		if !ok {
			s.first = now
		}
		switch {
		case recs[i].Rows > 0:
			s.rows, s.at = recs[i].Rows, now
		case s.rows == 0 && recs[i].RowsSeen > 0:
			// Its set is gone, and a scan (of any worker) renewed it
			// while the peer was dead: its recovery reports the loss.
			s.rows = recs[i].RowsSeen
		}
		if s.rows > 0 || s.failed || !recs[i].Empty() {
			next[p] = s // an idle entry is not remembered: nothing to lose
		}
		first[i] = s.first
	}
	d.peers = next
	return first
}

// deregisterIdle removes the idle dead peers from the registry in
// batches, until half a scan budget after the scan's budget (from now, if
// later) or ctx ends; it returns how many it removed, and the first
// error.
func (r *recoverer) deregisterIdle(ctx context.Context, idle []string, deadline time.Time) (int, error) {
	removed := 0
	if d := time.Now().Add(r.opts.scanBudget() / 2); d.After(deadline) {
		deadline = d
	}
	for len(idle) > 0 && ctx.Err() == nil && time.Now().Before(deadline) {
		n := min(len(idle), idleBatch)
		opCtx, cancel := r.opts.opContext(ctx)
		got, err := r.store.DeregisterIdle(opCtx, idle[:n])
		cancel()
		r.judge.noteRegistry(err)
		if err != nil {
			return removed, err
		}
		removed += got
		idle = idle[n:]
	}
	return removed, nil
}

// Expiry-driven recovery: instead of waiting for the next scan, a worker
// subscribed to Redis keyspace notifications learns that a peer's heartbeat
// key expired the moment Redis expires it, and recovers that peer at once.
// Detection then takes about the heartbeat TTL instead of TTL + recovery
// interval. Notifications are fire-and-forget (a worker that is
// disconnected when one is sent misses it), so the periodic scan stays as
// the fallback.

// expiryWatcher forwards the peers whose heartbeat expired, as the masters
// announce them, to the recoverer.
//
// A subscription is made on a node and stays on it across reconnections,
// whereas a Cluster failover moves the node's slots to a promoted replica
// that nobody listens to. So the watcher's loop checks the masters every
// heartbeat interval (±10%): it subscribes on a master that has no
// subscription (making it publish expired-key events first with configure:
// a replica does not inherit its master's CONFIG SET) and closes the
// subscription of a node that is no longer a master. Events that the
// promoted master sends before the next check are lost, and the scan finds
// those peers. A single server's or a failover client's one subscription
// follows the server, and the check sends nothing.
type expiryWatcher struct {
	deps             // the settings, the store, the log and the shared parts (worker.go)
	nodes *nodeWatch // reads a node's INFO and remembers its age (registry.go)
	// hand passes a dead peer to the recoverer without waiting; the judge
	// (deps) judges peers' heartbeats.
	hand func(peer string)
	// subs holds the subscription of each master, by node; only Start
	// and then the watcher's loop touch it.
	subs map[string]*watch
	wg   sync.WaitGroup // a goroutine per started watch
	// failing holds the masters a subscription failed on, listFailing
	// whether the masters could not be listed: each outage is logged
	// once, not at every check.
	failing     map[string]bool
	listFailing bool
	running     bool // the loop runs: changes are logged
}

// watch is the subscription of one master and the goroutine reading it.
type watch struct {
	sub    store.Subscription
	cancel context.CancelFunc // nil until the loop starts the goroutine
	done   chan struct{}      // closed when the goroutine closed sub
}

// subscribeExpiry makes the masters publish expired-key events (with
// configure) and subscribes e to them, bounded by Start's ctx. Every
// problem is logged, none is fatal: without a watcher the scan finds dead
// peers. It returns e, or nil if no master could be subscribed to.
func subscribeExpiry(ctx context.Context, e *expiryWatcher) *expiryWatcher {
	e.subs, e.failing = make(map[string]*watch), make(map[string]bool)
	err := e.subscribe(ctx)
	switch {
	case len(e.subs) == 0:
		e.log.Warn("expiry notifications unavailable; dead peers are found by the periodic scan only",
			slog.Any("error", fmt.Errorf("expiry notifications: %w", err)))
		return nil
	case err != nil:
		e.log.Warn("expiry notifications unavailable on some masters; peers whose keys they hold are found by the periodic scan only",
			slog.Any("error", fmt.Errorf("expiry notifications: %w", err)))
	}
	return e
}

// run reads the subscriptions and checks the masters every heartbeat
// interval (±10%) until ctx, which only Shutdown cancels, is done; then it
// closes every subscription and waits for the goroutines reading them.
func (e *expiryWatcher) run(ctx context.Context) {
	e.log.Debug("expiry watcher started", slog.Int("masters", len(e.subs)))
	defer e.log.Debug("expiry watcher stopped")
	defer e.wg.Wait()
	defer e.closeAll()
	e.running = true
	e.startWatches(ctx)
	t := time.NewTimer(jitter(e.opts.heartbeatInterval, 0.1))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.runOnce(ctx)
		t.Reset(jitter(e.opts.heartbeatInterval, 0.1))
		e.sig.masters.Signal(struct{}{}) // test signal: a check of the masters ended
	}
}

// runOnce is one check of the masters (subscribe), then the new
// subscriptions' goroutines started.
func (e *expiryWatcher) runOnce(ctx context.Context) {
	_ = e.subscribe(ctx) // logged there, once per outage
	e.startWatches(ctx)
}

// subscribe lists the masters, closes the subscriptions of other nodes (and
// of any whose reading ended), and subscribes on every master without
// one. It returns the first error; once the loop runs, it logs each
// failure once per outage and each change.
func (e *expiryWatcher) subscribe(ctx context.Context) error {
	opCtx, cancel := context.WithTimeout(ctx, 2*e.opts.opTimeout)
	defer cancel()
	nodes, err := e.store.Masters(opCtx)
	if err != nil {
		if e.running && !e.listFailing {
			e.log.Warn("expiry notifications: cannot list the masters, so a failover is not followed until they can be",
				slog.Any("error", err))
		}
		e.listFailing = true
		return err
	}
	e.listFailing = false
	for node, wt := range e.subs {
		if slices.Contains(nodes, node) && !wt.ended() {
			continue
		}
		wt.stop()
		delete(e.subs, node)
		e.log.Info("expiry notifications: subscription closed, the node is no longer a master", slog.String("node", node))
	}
	var first error
	for _, node := range nodes {
		if _, ok := e.subs[node]; ok {
			continue
		}
		sub, err := e.subscribeNode(opCtx, node)
		if err != nil {
			if e.running && !e.failing[node] {
				e.log.Warn("expiry notifications unavailable on a master; peers whose keys it holds are found by the periodic scan only",
					slog.String("node", node), slog.Any("error", err))
			}
			e.failing[node] = true
			if first == nil {
				first = err
			}
			continue
		}
		delete(e.failing, node)
		e.subs[node] = &watch{sub: sub}
		if e.running {
			e.observe(opCtx, node)
			e.log.Info("expiry notifications: subscribed on a new master", slog.String("node", node))
		}
	}
	return first
}

// subscribeNode makes node publish expired-key events (with configure)
// and subscribes to them.
func (e *expiryWatcher) subscribeNode(ctx context.Context, node string) (store.Subscription, error) {
	set, err := e.store.EnableExpiredEvents(ctx, node, e.opts.expiryConfigure)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	if set != "" {
		e.log.Warn("enabled keyspace notifications of expired keys on the server (CONFIG SET notify-keyspace-events); set it in the server's configuration to keep it across restarts",
			slog.String("node", node), slog.String("notify_keyspace_events", set))
	}
	sub, err := e.store.SubscribeExpired(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	return sub, nil
}

// observe records a master new to the watcher in the worker's memory of
// node ages (registry.go), as a scan finding a heartbeat absent on it would
// do. A promoted replica's verdicts are held for a TTL from the moment the
// worker first sees it; without this look that moment would be the first
// event from the node, which the hold would waste, leaving the peer to the
// scan. The node answered as a master, so it was promoted before this look
// and the hold covers the promotion, as the rule asks.
func (e *expiryWatcher) observe(ctx context.Context, node string) {
	f, err := e.nodes.nodeInfo(ctx, node)
	if err != nil {
		return // a scan or an event asks again when it needs a verdict
	}
	e.nodes.ages.observe(node, f, time.Now(), e.fleet.ttl(), false)
}

// startWatches starts a goroutine for each subscription without one.
func (e *expiryWatcher) startWatches(ctx context.Context) {
	for _, wt := range e.subs {
		if wt.cancel != nil {
			continue
		}
		var wctx context.Context
		wctx, wt.cancel = context.WithCancel(ctx)
		wt.done = make(chan struct{})
		e.wg.Go(func() {
			defer close(wt.done)
			e.read(wctx, wt.sub)
		})
	}
}

// closeAll closes every subscription: the ones with a goroutine through
// it, the others at once.
func (e *expiryWatcher) closeAll() {
	for node, wt := range e.subs {
		wt.stop()
		delete(e.subs, node)
	}
}

// stop closes the subscription: its goroutine, if started, does so when
// its context ends.
func (wt *watch) stop() {
	if wt.cancel == nil {
		wt.sub.Close()
		return
	}
	wt.cancel()
}

// ended reports whether the goroutine reading the subscription returned.
func (wt *watch) ended() bool {
	if wt.done == nil {
		return false
	}
	select {
	case <-wt.done:
		return true
	default:
		return false
	}
}

// read hands every expired key of one subscription to handle until ctx is
// done or the subscription ends, then closes it.
func (e *expiryWatcher) read(ctx context.Context, sub store.Subscription) {
	defer sub.Close()
	for {
		key, ok := sub.Next(ctx)
		if !ok {
			return
		}
		e.handle(ctx, key)
	}
}

// handle handles one expired key: a peer's heartbeat is handed to the
// recoverer if deadPeers, asked now, finds it dead. The event is a hint;
// the verdict is deadPeers', as for a scan: the key may be back, or the
// server may have restarted too recently for an absent heartbeat to mean
// death.
func (e *expiryWatcher) handle(ctx context.Context, key string) {
	id, ok := store.InstanceOfHeartbeat(e.opts.keyPrefix, key)
	if !ok || id == e.opts.instanceID {
		return
	}
	if dead, err := e.judge.deadPeers(ctx, []string{id}); err == nil && len(dead) > 0 {
		e.hand(id)
	}
	e.sig.heard.Signal(id) // test signal: an expiry event judged
}
