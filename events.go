package recovery

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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
	// backstop sweep ("sweep").
	EventPeerDead
	// EventRowsRecovered: the rows of dead PeerID were reset. Duration runs
	// from the death being noticed to the reset's commit. FoundBy is
	// "registry", "expiry" or "sweep".
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
	hist    *historian   // nil without history (history.go)
	mu      sync.RWMutex // guards closed and the send on ch
	closed  bool
	started bool
	ch      chan Event
	done    chan struct{}
	dropped atomic.Uint64
	sig     *testsignal.Signal[struct{}] // the options' deliver test signal (testsignals.go)
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
