package recovery

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testsignal"
)

// EventKind says what happened.
type EventKind int

// The events a Worker reports to its observer (WithObserver).
const (
	// EventHeartbeat: a heartbeat refresh succeeded.
	EventHeartbeat EventKind = iota + 1
	// EventHeartbeatFailed: a heartbeat refresh failed. Attempt is 1 for the
	// first failure of an outage (the one that is logged) and counts up.
	EventHeartbeatFailed
	// EventHeartbeatRestored: a heartbeat succeeded after an outage;
	// Duration is the outage's length, Attempt the failures in it.
	EventHeartbeatRestored
	// EventLeaseLost: the worker may now be presumed dead by its peers;
	// Duration is the time since the last successful heartbeat.
	EventLeaseLost
	// EventLeaseRegained: a heartbeat succeeded after the lease was lost.
	EventLeaseRegained
	// EventPeerDead: PeerID was found without a heartbeat, by a scan
	// (FoundBy "registry"), an expiry notification ("expiry") or the
	// backstop sweep ("sweep"); or one of its lives was judged dead by the
	// liveness witness ("witness", WithLivenessWitness).
	EventPeerDead
	// EventRowsRecovered: the rows of dead PeerID were reset. Duration runs
	// from the death being noticed to the reset's commit. FoundBy is
	// "registry", "expiry", "sweep" or "witness".
	EventRowsRecovered
	// EventRecoveryFailed: recovering PeerID failed (Err) and will be tried
	// again by a later scan; PeerID is empty when the scan itself failed.
	EventRecoveryFailed
	// EventScanFinished: a recovery scan ended; PeersChecked, PeersDead
	// and Duration describe it.
	EventScanFinished
	// EventRowsReleased: Release handed Rows of this worker's rows back.
	EventRowsReleased
	// EventRowsNotReset: recovering PeerID found RowsNotReset of its Rows
	// neither reset nor settled (see ResetResult.NotReset), usually because
	// a status is misconfigured. The peer's rows set is kept and the
	// recovery is tried again; an EventRecoveryFailed follows.
	EventRowsNotReset
	// EventRegistryWrongType: the fleet's registry key holds something
	// other than a set (Err is Redis's WRONGTYPE reply), so no scan can find
	// a dead peer and no worker can register until the key is deleted;
	// expiry notifications and the backstop sweep still recover peers.
	// Emitted once per outage, when a registry command first fails this
	// way; Stats.RegistryBroken says whether it lasts.
	EventRegistryWrongType
	// EventMisconfigured: the self-check found Rows of this worker's own
	// tracked rows not in progress by it, as the resetter sees them, at
	// two reads a self-check window apart (Err says which and why).
	// Emitted once; Healthy fails from then on.
	EventMisconfigured
	// EventInstanceIDTaken: this worker's heartbeat found its key holding
	// another process's value (Err wraps ErrInstanceIDInUse): a process
	// with the same instance ID took it over while this one could not
	// refresh it. The lease is lost for good; emitted once.
	EventInstanceIDTaken
	// EventPeerClaimed: this worker took the recovery claim on dead PeerID
	// (found by FoundBy) and recovers it now; no other worker does.
	// Duration runs from the death being noticed to the claim.
	EventPeerClaimed
	// EventRowsReset: the reset of dead PeerID's rows committed (Rows
	// found, RowsReset of them reset, RowsQuarantined quarantined); the
	// finish (deleting its rows set, deregistering it) comes next, then
	// EventRowsRecovered or EventRecoveryFailed. Duration runs from the
	// death being noticed to the commit.
	EventRowsReset
	// EventStrayRowsReset: the backstop sweep without an owner column
	// reset RowsReset of Rows rows in progress that no rows set had held
	// for Duration (RowsQuarantined quarantined); the others had changed
	// meanwhile. PeerID is empty: no record says whose they were. The
	// backstop sweep with an owner column emits it too, with PeerID, when
	// it reset RowsReset rows in progress under an ended life of PeerID, a
	// live worker (committed after that life ended, or left by its host);
	// Rows counts them and the rows left locked.
	EventStrayRowsReset
	// EventUntrackedRows: the backstop sweep found Rows rows committed in
	// progress by a worker that had not tracked them (Err wraps
	// ErrUntrackedRows).
	EventUntrackedRows
)

var eventNames = map[EventKind]string{
	EventHeartbeat:         "heartbeat",
	EventHeartbeatFailed:   "heartbeat_failed",
	EventHeartbeatRestored: "heartbeat_restored",
	EventLeaseLost:         "lease_lost",
	EventLeaseRegained:     "lease_regained",
	EventPeerDead:          "peer_dead",
	EventRowsRecovered:     "rows_recovered",
	EventRecoveryFailed:    "recovery_failed",
	EventScanFinished:      "scan_finished",
	EventRowsReleased:      "rows_released",
	EventRowsNotReset:      "rows_not_reset",
	EventMisconfigured:     "misconfigured",
	EventRegistryWrongType: "registry_wrong_type",
	EventInstanceIDTaken:   "instance_id_taken",
	EventPeerClaimed:       "peer_claimed",
	EventRowsReset:         "rows_reset",
	EventStrayRowsReset:    "stray_rows_reset",
	EventUntrackedRows:     "untracked_rows",
}

// String returns the event's snake_case name.
func (k EventKind) String() string {
	if n, ok := eventNames[k]; ok {
		return n
	}
	return "unknown"
}

// An Event is something a Worker did or saw. Only the fields its Kind
// documents are set.
type Event struct {
	Kind EventKind
	// Time is when the event happened.
	Time time.Time
	// InstanceID is the reporting worker.
	InstanceID string
	// PeerID is the peer the event concerns, if any.
	PeerID string
	// FoundBy says which mechanism found a dead peer: "registry" (a scan),
	// "expiry" (a keyspace notification), "sweep" (the backstop sweep) or
	// "restart" (Start recovering what a previous process left under its
	// instance ID).
	FoundBy string
	// Rows is how many row IDs were involved (found in the rows set, or
	// released).
	Rows int
	// RowsReset is how many rows were returned to the queue or quarantined.
	RowsReset int64
	// RowsQuarantined is how many rows reached their recovery limit.
	RowsQuarantined int
	// RowsNotReset is how many rows were neither reset nor settled.
	RowsNotReset int
	// RowsLocked and RowsRefused, on EventRowsNotReset and on the
	// EventRecoveryFailed of a peer, tell why rows were left in progress:
	// another session held them locked (RowState.Locked; not counted in
	// RowsNotReset: waiting ends it), or the database refused to change
	// them (RowState.Refused: a BEFORE UPDATE trigger returned NULL; in
	// RowsNotReset).
	RowsLocked, RowsRefused int
	// RowsGone, on the EventRowsRecovered, EventRowsNotReset and
	// EventRecoveryFailed of a peer and on EventStrayRowsReset, is how
	// many rows asked for by ID no longer exist in the table
	// (ResetResult.Gone: deleted since they were taken); neither reset nor
	// stuck, and in none of the counts above.
	RowsGone int
	// PeersChecked and PeersDead describe a scan.
	PeersChecked, PeersDead int
	// Attempt counts heartbeat failures in the current outage.
	Attempt int
	// Duration is the event's length; see each Kind.
	Duration time.Duration
	// StuckFor, on EventRowsReset and EventRowsRecovered when rows were
	// reset, is how long they had been stuck in progress: from the dead
	// peer's last heartbeat to the commit of their reset. Nothing records
	// the last heartbeat, so it is estimated from below as heartbeat TTL +
	// Duration: the peer's key had expired when its death was noticed, so
	// its last heartbeat was at least a TTL earlier. Exact to milliseconds
	// when an expiry notification found the peer; a scan or sweep may
	// notice up to 1.1 × recovery interval + the scan turn after the
	// expiry, which the figure leaves out. A peer that shut down holding
	// rows deleted its key instead: its rows were stuck for up to a TTL
	// less.
	StuckFor time.Duration
	// Err is the failure, for failed events.
	Err error

	// RowIDs, on EventRowsReset, EventRowsRecovered and
	// EventStrayRowsReset, are the rows reset (quarantined ones included),
	// ascending, as the resetter listed them (ResetResult.ChangedIDs: the
	// PostgreSQL resetters list every row; a resetter that lists none
	// leaves it empty). On EventUntrackedRows they are the rows found.
	// QuarantinedIDs are the rows quarantined. The fleet's history
	// records them (WithHistory). Each event has slices of its own.
	RowIDs, QuarantinedIDs []int64
}

// eventBuffer is how many events wait for a slow observer before new ones
// are dropped.
const eventBuffer = 1024

// dispatcher hands events to the observer on a goroutine of its own,
// started with the first event and stopped by Shutdown.
type dispatcher struct {
	id      string // the worker's instance ID, stamped on every event
	obs     func(Event)
	hist    *historian   // nil without history (events.go)
	mu      sync.RWMutex // guards closed and the send on ch
	closed  bool
	started bool
	ch      chan Event
	done    chan struct{}
	dropped atomic.Uint64
	sig     *testsignal.Signal[struct{}] // the test hooks' deliver signal (testSignals)
}

// emit stamps an event with the time and the instance ID, and dispatches
// it.
func (d *dispatcher) emit(e Event) {
	e.Time = time.Now()
	e.InstanceID = d.id
	if d.hist != nil {
		d.hist.offer(e)
	}
	if d.obs == nil {
		return
	}
	for {
		d.mu.RLock()
		switch {
		case d.closed:
			d.mu.RUnlock()
			d.dropped.Add(1)
			return
		case d.started:
			select {
			case d.ch <- e:
			default:
				d.dropped.Add(1)
			}
			d.mu.RUnlock()
			return
		}
		d.mu.RUnlock()
		d.start()
	}
}

// start starts the delivery goroutine, once and only before close.
func (d *dispatcher) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.started {
		return
	}
	d.started = true
	d.ch = make(chan Event, eventBuffer)
	d.done = make(chan struct{})
	go d.run()
}

func (d *dispatcher) run() {
	defer close(d.done)
	for e := range d.ch {
		d.deliver(e)
		d.sig.Signal(struct{}{}) // test signal: an event delivered
	}
}

func (d *dispatcher) deliver(e Event) {
	defer func() {
		if recover() != nil {
			d.dropped.Add(1)
		}
	}()
	d.obs(e)
}

// close stops accepting events and waits, within ctx, until the ones
// queued are delivered, and the history's entries sent.
func (d *dispatcher) close(ctx context.Context) error {
	var herr error
	if d.hist != nil {
		herr = d.hist.close(ctx)
	}
	if err := d.closeObserver(ctx); err != nil {
		return err
	}
	return herr
}

func (d *dispatcher) closeObserver(ctx context.Context) error {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		if d.started {
			close(d.ch)
		}
	}
	started, done := d.started, d.done
	d.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recoveryLog logs what recovery does, once per outage: a scan that keeps
// failing, a peer that keeps failing or a garbage registry member is logged
// when it first appears and when it clears, not at every scan. The
// recoverer, the sweeper and the dead-peer path share it; it writes to
// log.
func newRecoveryLog(log *slog.Logger, opTimeout time.Duration) *recoveryLog {
	return &recoveryLog{log: log, opTimeout: opTimeout, failing: make(map[string]string), invalid: make(map[string]bool),
		strangers: make(map[string]string)}
}

type recoveryLog struct {
	log          *slog.Logger
	opTimeout    time.Duration // each Redis call's (redisSlow)
	mu           sync.Mutex
	scanFailing  bool
	sweepFailing bool
	sweepYields  bool              // the sweep by row version leaves the turn to owner-mode members
	failing      map[string]string // peers whose recovery failed last time: the kind of failure
	invalid      map[string]bool   // registry members already reported
	strangers    map[string]string // turn: the stranger last logged taking it over
}

// scanned logs a scan of the recovery loop; the dead-peer path logged each
// peer's outcome.
func (l *recoveryLog) scanned(rep report.RecoveryReport, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	log := l.log
	var peerErrs []*report.PeerError
	var scanErr error
	for _, e := range unjoin(err) {
		var pe *report.PeerError
		if errors.As(e, &pe) {
			peerErrs = append(peerErrs, pe)
		} else {
			scanErr = e
		}
	}
	if errors.Is(scanErr, ErrRegistryWrongType) {
		return // logged once per outage, at Error, by noteRegistry
	}
	if scanErr != nil {
		if !l.scanFailing {
			log.Warn("recovery scan failed; will retry", slog.Any("error", redisSlow(l.opTimeout, scanErr)))
		}
		l.scanFailing = true
		return
	}
	if l.scanFailing {
		log.Info("recovery scan succeeded again")
		l.scanFailing = false
	}
	for _, m := range rep.InvalidMembers {
		if !l.invalid[m] && len(l.invalid) < 1000 {
			l.invalid[m] = true
			log.Warn("ignoring registry member that is not a valid instance ID",
				slog.String("member", clip(m)))
		}
	}
	stillDead := make(map[string]bool, len(rep.Dead))
	for _, peer := range rep.Dead {
		stillDead[peer] = true
	}
	for _, pe := range peerErrs {
		stillDead[pe.InstanceID] = true
	}
	for peer := range l.failing {
		if !stillDead[peer] {
			delete(l.failing, peer) // recovered by another worker, or back
		}
	}
	log.Debug("recovery scan done",
		slog.Int("peers_checked", rep.PeersChecked),
		slog.Int("peers_dead", len(rep.Dead)),
		slog.Int64("rows_reset", rep.RowsReset),
		slog.Duration("duration", rep.Duration))
}

// peerFailed logs a failed recovery of peer, once until it succeeds or
// fails differently. Rows
// that could not be reset or were lost are at risk: Error; anything else
// (PostgreSQL down) is retried: Warn.
func (l *recoveryLog) peerFailed(peer string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kind := "retry"
	switch {
	case errors.Is(err, ErrRowsSetLost):
		kind = "lost"
	case errors.Is(err, ErrRowsRefused):
		kind = "refused"
	case errors.Is(err, ErrRowsLocked):
		kind = "locked"
	case errors.Is(err, ErrRowsNotReset):
		kind = "not_reset"
	case errors.Is(err, contract.ErrPoolExhausted):
		kind = "starved"
	case errors.Is(err, ErrMisconfigured):
		kind = "misconfigured"
	case errors.Is(err, errUnverified):
		kind = "unverified"
	}
	if l.failing[peer] == kind {
		return // logged when this kind of failure began
	}
	l.failing[peer] = kind
	switch {
	case errors.Is(err, ErrRowsSetLost):
		l.log.Error("rows set of dead peer vanished before its rows were reset (an earlier recovery failed, or it expired or was evicted first): rows it held stay in progress until the backstop sweep, if on, recovers them",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, ErrRowsRefused):
		l.log.Error("recovery of dead peer left rows the database refused to change (a BEFORE UPDATE trigger returning NULL, a rule, a constraint, a trigger raising an error); it is retried at every scan, and fails until the trigger, rule or constraint lets the reset through",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, ErrRowsLocked):
		l.log.Warn("recovery of dead peer left rows another session holds locked (a transaction left open, perhaps on a host that vanished); it is retried at every scan until that session ends",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, ErrRowsNotReset):
		l.log.Error("recovery of dead peer found rows it could neither reset nor show finished; its rows set is kept and retried: check the resetter's statuses and owner column",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, contract.ErrPoolExhausted):
		l.log.Warn("recovery of dead peer found no free connection in the resetter's pool before its reset timeout; will retry: every connection was in use (the host's, when it shares the pool); give the resetter a pool of its own",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, ErrMisconfigured):
		l.log.Error("recovery of dead peer held: this worker's self-check found its own statuses or owner column wrong, so it would take the peer's rows for settled; the peer and its rows set are left to a worker configured right",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, errUnverified):
		l.log.Warn("recovery of dead peer held until this worker has seen a row of its own in progress: the peer's rows read as the queued status, which swapped statuses would show; the peer and its rows set are left to a worker whose configuration is verified",
			slog.String("peer_id", peer), slog.Any("error", err))
	default:
		l.log.Warn("recovery of dead peer failed; will retry",
			slog.String("peer_id", peer), slog.Any("error", err))
	}
}

// recovered logs the recovery of one dead peer this worker claimed: the
// rows reset, each row quarantined, and the end of a run of failures;
// source says which mechanism found the peer.
func (l *recoveryLog) recovered(pr report.PeerRecovery, source string, stuck time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, failed := l.failing[pr.InstanceID]; failed {
		l.log.Info("recovery of dead peer succeeded after failing", slog.String("peer_id", pr.InstanceID),
			slog.String("found_by", source))
		delete(l.failing, pr.InstanceID)
	} else {
		how := "dead peer found: heartbeat expired"
		if source == foundByWitness {
			how = "dead peer found: its connection closed (liveness witness)"
		}
		l.log.Info(how, slog.String("peer_id", pr.InstanceID), slog.String("found_by", source))
	}
	attrs := []any{
		slog.String("peer_id", pr.InstanceID),
		slog.String("found_by", source),
		slog.Int("rows_found", pr.RowsFound),
		slog.Int64("rows_reset", pr.RowsReset),
		slog.Int("rows_quarantined", len(pr.Quarantined)),
	}
	if stuck > 0 {
		attrs = append(attrs, slog.Duration("rows_stuck", stuck))
	}
	if len(pr.Gone) > 0 {
		attrs = append(attrs, slog.Int("rows_gone", len(pr.Gone)), slog.Int64("first_gone", pr.Gone[0]))
	}
	if len(pr.InvalidMembers) > 0 {
		attrs = append(attrs, slog.Int("invalid_members", len(pr.InvalidMembers)),
			slog.String("first_invalid_member", clip(pr.InvalidMembers[0])))
	}
	if pr.PeerCameBack {
		attrs = append(attrs, slog.Bool("peer_came_back", true))
	}
	if pr.RowsFound == 0 && pr.RowsReset == 0 && len(pr.Quarantined) == 0 && len(pr.InvalidMembers) == 0 {
		// Nothing was left to recover: its set expired, or another worker
		// recovered it between our liveness check and our claim.
		l.log.Debug("deregistered dead peer with no rows", attrs...)
		return
	}
	l.log.Info("recovered rows of dead peer", attrs...)
	for _, id := range pr.Quarantined {
		l.log.Warn("row quarantined: it reached its recovery limit",
			slog.Int64("row_id", id), slog.String("peer_id", pr.InstanceID))
	}
}

// swept logs a backstop sweep; the dead-peer path logged each owner's
// outcome.
func (l *recoveryLog) swept(rep sweepReport, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range unjoin(err) {
		var pe *report.PeerError
		if errors.As(e, &pe) {
			continue
		}
		switch {
		case l.sweepFailing:
		case errors.Is(e, ErrMisconfigured):
			l.log.Error("backstop sweep held: the resetter's statuses do not match the rows the workers track; fix them, and the rows stuck meanwhile come back", slog.Any("error", e))
		default:
			l.log.Warn("backstop sweep failed; will retry", slog.Any("error", e))
		}
		l.sweepFailing = true
		return
	}
	l.sweepFailing = false
	if len(rep.ownerPeers) > 0 != l.sweepYields {
		l.sweepYields = len(rep.ownerPeers) > 0
		if l.sweepYields {
			l.log.Info("backstop sweep by row version left to the fleet's owner-mode workers: their rows are in no rows set, so this worker (no owner column) does not judge rows in progress while they are alive (an owner-column rollout; give this worker WithOwnerColumn too)",
				slog.Any("owner_mode_workers", rep.ownerPeers))
		} else {
			l.log.Info("backstop sweep by row version resumed: no owner-mode worker is alive in the fleet")
		}
	}
	if rep.strayFound > 0 {
		l.log.Warn("backstop sweep reset rows in progress that no rows set had held for a rows TTL: their worker died and its rows set is gone (the fleet was down, or Redis lost it)",
			slog.Int("rows_found", rep.strayFound), slog.Int64("rows_reset", rep.strayReset),
			slog.Int("rows_quarantined", rep.strayQuarantined), slog.Int("rows_locked", rep.strayLocked),
			slog.Int("rows_refused", rep.strayRefused), slog.Int("rows_gone", rep.strayGone),
			slog.Int("rows_changed", rep.strayFound-int(rep.strayReset)-rep.strayLocked-rep.strayRefused-rep.strayGone))
	}
	l.log.Debug("backstop sweep done", slog.Bool("turn_held", rep.turnHeld),
		slog.Int("rows_in_progress", rep.rowsInProgress), slog.Int("rows_unheld", rep.strayWaiting),
		slog.Bool("redis_too_young", rep.nodeHeld),
		slog.Int("owners", rep.owners), slog.Int("owners_absent", len(rep.absent)))
}

// turnFromStranger logs a turn this worker took from a key no live worker
// held (t.Stranger says why), at Error: left alone, it would have stopped
// that turn fleet-wide. Logged once per stranger: one that keeps writing
// the same is not logged at every take.
func (l *recoveryLog) turnFromStranger(turn, key string, t store.TurnTake) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := t.Stranger + "\x00" + t.Was
	if l.strangers[turn] == seen {
		return
	}
	l.strangers[turn] = seen
	l.log.Error("took a turn from a key no live worker held: something other than a worker wrote it (a stray write, a tool, another application under the same prefix); left alone it would have stopped that turn fleet-wide",
		slog.String("turn", turn), slog.String("key", key), slog.String("reason", t.Stranger), slog.String("found", clip(t.Was)))
}

// invalidOwner logs an owner of rows in progress that the sweep cannot use
// as an instance ID: its rows are never recovered by the sweep.
func (l *recoveryLog) invalidOwner(owner string, why error) {
	l.log.Warn("rows in progress have an owner that is not a valid instance ID; the backstop sweep leaves them alone (does the owner column hold what OwnerValue() returns?)",
		slog.String("owner", clip(owner)), slog.String("reason", why.Error()))
}

// claimNotReleased logs a claim whose release failed; it expires by
// itself.
func (l *recoveryLog) claimNotReleased(peer string, err error) {
	l.log.Warn("release recovery claim; it expires by itself",
		slog.String("peer_id", peer), slog.Any("error", err))
}

// unjoin returns the errors joined in err, or err alone.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// The fleet's history: every worker appends what an operator wants to read
// after a bad night (which peer died, who recovered it, how many rows, how
// long it took, what failed, who lost its lease) to one capped Redis stream
// per prefix, <prefix>_HISTORY. `recoveryctl history` and `recoveryctl
// watch` read it, as does ops.ReadHistory.
//
// Appending is never on the hot path: dispatcher.emit hands the few events the
// history records to a bounded queue, and a goroutine of its own (the
// historian, started with the first such event, stopped by Shutdown)
// sends the XADDs. A full queue or a failed XADD drops the entry and
// counts it (Stats.HistoryDropped); a recovery never waits for Redis on
// its account, and never fails because of it.

// historyKind returns the kind of history entry an event makes, and false
// for the events the history does not record.
func historyKind(e Event) (string, bool) {
	switch e.Kind {
	case EventPeerClaimed:
		return store.HistoryKindPeerDead, true
	case EventRowsRecovered:
		return store.HistoryKindRowsRecovered, true
	case EventRecoveryFailed:
		// A scan that failed (PeerID empty) is no recovery; its cause is
		// usually Redis itself.
		return store.HistoryKindRecoveryFailed, e.PeerID != ""
	case EventLeaseLost:
		return store.HistoryKindLeaseLost, true
	case EventLeaseRegained:
		return store.HistoryKindLeaseRegained, true
	case EventRowsNotReset:
		return store.HistoryKindRowsNotReset, true
	case EventStrayRowsReset:
		if e.PeerID != "" { // the owner-column sweep's, of a live worker's ended life
			return store.HistoryKindEndedLifeReset, true
		}
		return store.HistoryKindStrayRowsReset, true
	case EventUntrackedRows:
		return store.HistoryKindUntrackedRows, true
	}
	return "", false
}

// newUID returns an entry's uid: 16 random hex digits.
func newUID() string { return newToken()[:16] }

// maxHistoryError bounds the error message an entry carries.
const maxHistoryError = 1024

// historyFields turns an event into an entry's field-value pairs.
func historyFields(kind, uid string, e Event) []string {
	f := []string{store.HistoryFieldKind, kind, store.HistoryFieldTime, e.Time.UTC().Format(time.RFC3339Nano),
		store.HistoryFieldInstance, e.InstanceID, store.HistoryFieldUID, uid}
	if e.PeerID != "" {
		f = append(f, store.HistoryFieldPeer, e.PeerID)
	}
	if e.FoundBy != "" {
		f = append(f, store.HistoryFieldFoundBy, e.FoundBy)
	}
	switch kind {
	case store.HistoryKindRowsRecovered, store.HistoryKindStrayRowsReset, store.HistoryKindEndedLifeReset:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows), store.HistoryFieldRowsReset, strconv.FormatInt(e.RowsReset, 10),
			store.HistoryFieldQuarantined, strconv.Itoa(e.RowsQuarantined))
	case store.HistoryKindRowsQuarantined:
		f = append(f, store.HistoryFieldQuarantined, strconv.Itoa(e.RowsQuarantined))
	case store.HistoryKindUntrackedRows:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows))
	case store.HistoryKindRowsNotReset:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows), store.HistoryFieldRowsReset, strconv.FormatInt(e.RowsReset, 10),
			store.HistoryFieldNotReset, strconv.Itoa(e.RowsNotReset))
	}
	if ids := historyRowIDs(kind, e); len(ids) > 0 {
		f = append(f, store.HistoryFieldRowIDs, joinIDs(ids[:min(len(ids), store.HistoryRowIDsMax)]),
			store.HistoryFieldRowIDsTotal, strconv.Itoa(len(ids)))
	}
	if e.Duration > 0 {
		f = append(f, store.HistoryFieldDurationMs, strconv.FormatFloat(float64(e.Duration)/float64(time.Millisecond), 'f', -1, 64))
	}
	if e.Err != nil {
		msg := e.Err.Error()
		if len(msg) > maxHistoryError {
			msg = msg[:maxHistoryError] + "..."
		}
		f = append(f, store.HistoryFieldError, msg)
	}
	return f
}

// historyRowIDs returns the rows an entry of kind lists (ascending).
func historyRowIDs(kind string, e Event) []int64 {
	switch kind {
	case store.HistoryKindRowsRecovered, store.HistoryKindStrayRowsReset, store.HistoryKindUntrackedRows, store.HistoryKindEndedLifeReset:
		return e.RowIDs
	case store.HistoryKindRowsQuarantined:
		return e.QuarantinedIDs
	}
	return nil
}

// joinIDs writes ids as decimals separated by commas.
func joinIDs(ids []int64) string {
	b := make([]byte, 0, 8*len(ids))
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(b)
}

// historyQueue is how many entries wait for Redis before new ones are
// dropped: an outage's worth of deaths and lease changes of one worker.
const historyQueue = 256

// historyAttempts is how many times an entry is sent while Redis does not
// take it (a heartbeat interval apart, at least a second) before it is
// dropped: 5 minutes at the default interval, so the lease loss that a
// Redis outage caused reaches the stream once Redis is back.
const historyAttempts = 10

// historian appends the history's entries from a goroutine of its own,
// started with the first entry and stopped by close.
type historian struct {
	store  store.Store
	log    *slog.Logger
	maxLen int64
	// running reports whether the Worker's loops run: only then is there
	// a Shutdown to stop the historian's goroutine. A Worker used without
	// Start (ops.RecoverNow from an operator tool) appends inline instead.
	running func() bool
	// opTimeout bounds each XADD; retry is the wait before sending again
	// an entry Redis did not answer.
	opTimeout, retry time.Duration
	sig              *testsignal.Signal[error] // the test hooks' history signal (testSignals)

	mu      sync.Mutex        // guards the fields below and the send on ch
	failing map[string]string // peer → the cause of its last failed recovery, written once
	started bool
	closed  bool
	ch      chan historyItem
	quit    chan struct{} // closed by close: send what is queued once, then end
	abort   context.CancelFunc
	done    chan struct{}

	dropped atomic.Uint64
}

type historyItem struct {
	kind string
	uid  string // the entry's own: every send of it carries the same
	e    Event
}

// newHistorian returns the historian that appends to st with the history
// options of o, or nil when the history is off. running reports whether
// the Worker's loops run (historian.running).
func newHistorian(st store.Store, log *slog.Logger, o *options, sig *testSignals, running func() bool) *historian {
	if o.historyLen == 0 {
		return nil
	}
	// Retried like a heartbeat, but not more than once a second: the
	// entries are for people, later.
	return &historian{store: st, log: log, maxLen: int64(o.historyLen),
		opTimeout: o.opTimeout, retry: max(o.heartbeatInterval, time.Second),
		running: running, sig: &sig.history}
}

// offer queues the entry e makes, if it makes one, without waiting.
func (h *historian) offer(e Event) {
	kind, ok := historyKind(e)
	if !ok {
		return
	}
	items := []historyItem{{kind, newUID(), e}}
	if (kind == store.HistoryKindRowsRecovered || kind == store.HistoryKindStrayRowsReset || kind == store.HistoryKindEndedLifeReset) &&
		e.RowsQuarantined > 0 {
		items = append(items, historyItem{store.HistoryKindRowsQuarantined, newUID(), e})
	}
	if inline := h.queue(kind, e, items); inline {
		// No Start, so maybe no Shutdown: no goroutine of ours may be
		// left behind. Append here, once each, without the lock.
		for _, it := range items {
			h.appendOnce(context.Background(), it)
		}
	}
}

// queue hands items to the historian's goroutine, starting it, or drops
// them; it reports whether the caller must append them itself instead
// (a Worker used without Start).
func (h *historian) queue(kind string, e Event, items []historyItem) (inline bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.repeat(kind, e) {
		return false
	}
	if h.closed {
		h.dropped.Add(uint64(len(items)))
		return false
	}
	if !h.started && h.running != nil && !h.running() {
		return true
	}
	if !h.started {
		h.start()
	}
	for _, it := range items {
		select {
		case h.ch <- it:
		default:
			h.dropped.Add(1)
		}
	}
	return false
}

// maxFailing bounds the peers whose failures repeat remembers.
const maxFailing = 1024

// repeat reports whether the entry only repeats what this worker wrote at
// its last attempt on the same peer: a recovery that keeps failing for the
// same cause is written once (its peer_dead and recovery_failed), not at
// every scan, until it succeeds or the cause changes. h.mu is held.
func (h *historian) repeat(kind string, e Event) bool {
	cause, failed := h.failing[e.PeerID]
	switch kind {
	case store.HistoryKindPeerDead, store.HistoryKindRowsNotReset:
		return failed
	case store.HistoryKindRecoveryFailed:
		msg := ""
		if e.Err != nil {
			msg = e.Err.Error()
		}
		if failed && cause == msg {
			return true
		}
		if h.failing == nil || len(h.failing) >= maxFailing {
			h.failing = make(map[string]string)
		}
		h.failing[e.PeerID] = msg
		if failed { // a new cause: the attempt's peer_dead was held back
			return false
		}
	case store.HistoryKindRowsRecovered:
		delete(h.failing, e.PeerID)
	}
	return false
}

// start starts the goroutine; h.mu is held.
func (h *historian) start() {
	h.started = true
	h.ch = make(chan historyItem, historyQueue)
	h.quit = make(chan struct{})
	h.done = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	h.abort = cancel
	go h.run(ctx)
}

// run appends the queued entries in order until close, then drains.
func (h *historian) run(ctx context.Context) {
	defer close(h.done)
	failing := false
	for {
		select { // close first: a backlog must not be retried at Shutdown
		case <-h.quit:
			h.drain(ctx, failing)
			return
		default:
		}
		select {
		case it := <-h.ch:
			failing = !h.append(ctx, it, failing)
		case <-h.quit:
			h.drain(ctx, failing)
			return
		}
	}
}

// drain sends what is left once each, in order, and drops the rest at the
// first failure: Shutdown waits for at most one failed send here.
func (h *historian) drain(ctx context.Context, failing bool) {
	for {
		select {
		case it := <-h.ch:
			if failing {
				h.dropped.Add(1)
				continue
			}
			failing = !h.appendOnce(ctx, it)
		default:
			return
		}
	}
}

// append sends one entry, again every retry interval while it fails, up
// to historyAttempts times or until close. failing says whether the entry before failed: an outage is
// logged once, at its first failure. It reports whether the entry was
// appended.
func (h *historian) append(ctx context.Context, it historyItem, failing bool) bool {
	for attempt := 1; ; attempt++ {
		err := h.send(ctx, it)
		h.sig.Signal(err) // test signal: a history entry sent
		if err == nil {
			if failing {
				h.log.Info("fleet history appended again", slog.Uint64("history_dropped", h.dropped.Load()))
			}
			return true
		}
		if !failing {
			h.log.Warn("fleet history not appended; entries are kept a while, then dropped",
				slog.String("kind", it.kind), slog.Any("error", err))
			failing = true
		}
		if attempt == historyAttempts {
			h.dropped.Add(1)
			return false
		}
		t := time.NewTimer(h.retry)
		select {
		case <-t.C:
		case <-h.quit:
			t.Stop()
			return h.appendOnce(ctx, it)
		}
	}
}

// appendOnce sends one entry once, dropping it if that fails.
func (h *historian) appendOnce(ctx context.Context, it historyItem) bool {
	if err := h.send(ctx, it); err != nil {
		h.dropped.Add(1)
		return false
	}
	return true
}

func (h *historian) send(ctx context.Context, it historyItem) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	opCtx, cancel := context.WithTimeout(ctx, h.opTimeout)
	defer cancel()
	return h.store.AppendHistory(opCtx, historyFields(it.kind, it.uid, it.e), h.maxLen)
}

// close stops accepting entries and waits, within ctx, until the queued
// ones are sent (once each, the first failure dropping the rest). If ctx
// ends first, the send under way is abandoned and the rest dropped; close
// returns ctx.Err() once the goroutine has ended, which is at once.
func (h *historian) close(ctx context.Context) error {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		if h.started {
			close(h.quit)
		}
	}
	started, done, abort := h.started, h.done, h.abort
	h.mu.Unlock()
	if !started {
		return nil
	}
	defer abort()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		abort()
		<-done
		return ctx.Err()
	}
}

// The package's test hooks: the loops' test signals, and the store
// wrapper (withStore). Nothing outside the package's tests sets them.

// testSignals are the loops' notes to the package's tests that they did
// something, so a test waits for the turn it needs instead of sleeping or
// polling a log or Stats (River's test signals). The test hooks hold them; in
// production they are never initialised and each emission is a nil check.
// Every loop emits once at the end of its turn, through the deps it
// holds; deliver, heard and locked are emitted once per event or try, as
// their fields say; preread once per read.
type testSignals struct {
	beat    testsignal.Signal[error]    // a heartbeat turn ended, with its error (heartbeat.go)
	scan    testsignal.Signal[struct{}] // a recovery turn ended, scanned or not (recovery.go)
	expired testsignal.Signal[string]   // the recovery loop acted on an expiry message for this peer (recovery.go)
	sweep   testsignal.Signal[error]    // a sweep turn ended, with its error (sweep.go)
	look    testsignal.Signal[lookTurn] // a self-check turn ended (selfcheck.go)
	flush   testsignal.Signal[struct{}] // a deferred-Untrack flush turn ended (rowtrack.go)
	history testsignal.Signal[error]    // a history entry was sent, with the send's error (events.go)
	deliver testsignal.Signal[struct{}] // the event dispatcher handed an event to the observer, which returned or panicked (events.go)
	masters testsignal.Signal[struct{}] // the expiry watcher's check of the masters ended (recovery.go)
	heard   testsignal.Signal[string]   // the expiry watcher judged an expiry event of this peer's heartbeat (recovery.go)
	locked  testsignal.Signal[struct{}] // Start's try at rows its predecessor left locked ended; it tries again (heartbeat.go)
	preread testsignal.Signal[bool]     // Track's read of the rows being fetched ended: true if it answered in time (selfcheck.go)
	gave    testsignal.Signal[error]    // a give-back of the rows held at a lost lease, or of those a Block's Close left, ended, with its error (heartbeat.go)
	witness testsignal.Signal[struct{}] // a turn of the liveness witness's own loop ended (witness.go)
}

// lookTurn is a self-check turn, as its test signal tells it.
type lookTurn struct {
	began time.Time // when the turn began
	read  bool      // it read the rows it looked for, none locked
	over  bool      // the self-check is over: no turn follows
}

// testHooks are what the package's tests set through their own options
// (hookFunc): not settings, so apart from the options.
type testHooks struct {
	// wrapStore, set only by withStore, wraps the Redis store before New
	// hands it to the Worker's parts.
	wrapStore func(store.Store) store.Store
	// sig holds the loops' test signals, off unless withTestSignals
	// turns them on.
	sig testSignals
}

// hookFunc is an Option of the package's tests: New applies it to the
// test hooks; it sets nothing in the options.
type hookFunc func(*testHooks)

func (hookFunc) apply(*options) {}

// withStore wraps the Worker's Redis store in what wrap returns: the
// package's tests use it to inject faults and the simulation's store.
func withStore(wrap func(store.Store) store.Store) Option {
	return hookFunc(func(o *testHooks) { o.wrapStore = wrap })
}

// withTestSignals turns the loops' test signals on (testSignals); the
// package's test helpers set it on every Worker they build.
func withTestSignals() Option {
	return hookFunc(func(o *testHooks) {
		o.sig.beat.Init()
		o.sig.scan.Init()
		o.sig.expired.Init()
		o.sig.sweep.Init()
		o.sig.look.Init()
		o.sig.flush.Init()
		o.sig.history.Init()
		o.sig.deliver.Init()
		o.sig.masters.Init()
		o.sig.heard.Init()
		o.sig.locked.Init()
		o.sig.preread.Init()
		o.sig.gave.Init()
		o.sig.witness.Init()
	})
}

// looked signals the end of c's turn begun at began, when c had made
// checks reads; *done is the turn's result. The turn defers it only when
// the signal is on, so an off signal costs no clock read.
func (s *testSignals) looked(c *selfChecker, began time.Time, checks uint64, done *bool) {
	s.look.Signal(lookTurn{began: began, read: c.checks.Load() > checks && !c.skipped, over: *done || c.off.Load()})
}
