package recovery

import (
	"context"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Worker's state and counters, for health
// endpoints, metrics and tests. Counters start at zero when the Worker is
// created and only grow.
//
// Stats marshals to JSON with fixed snake_case keys (json tags): a field
// renamed in Go keeps its key, and a new field adds one. Durations are
// integer nanoseconds, in keys ending in _ns; LastHeartbeat is an RFC 3339
// time. docs/migrating.md lists the keys v0.1's untagged Stats had.
type Stats struct {
	// InstanceID is the worker's identity.
	InstanceID string `json:"instance_id"`
	// OwnerMode reports whether the worker runs in owner mode: its
	// resetter fences by owner (postgres.WithOwnerColumn) and WithRowsSets
	// is not set. In owner mode no row costs a Redis command and recovery
	// resets a dead peer's rows by owner. It is fixed by New.
	OwnerMode bool `json:"owner_mode"`
	// TrackedRows is how many rows are tracked now.
	TrackedRows int `json:"tracked_rows"`
	// LastHeartbeat is when the last successful heartbeat was sent; zero
	// before the first.
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// LeaseValid reports whether the worker holds a valid lease (see
	// CheckLease).
	LeaseValid bool `json:"lease_valid"`
	// Heartbeats and HeartbeatFailures count refresh attempts.
	Heartbeats        uint64 `json:"heartbeats"`
	HeartbeatFailures uint64 `json:"heartbeat_failures"`
	// LeaseLosses counts the times the lease was lost.
	LeaseLosses uint64 `json:"lease_losses"`
	// Scans counts finished recovery scans (ops.RecoverNow included).
	Scans uint64 `json:"scans"`
	// PeersDead counts dead peers found, once per scan that found them.
	PeersDead uint64 `json:"peers_dead"`
	// PeersRecovered counts dead peers whose rows were reset.
	PeersRecovered uint64 `json:"peers_recovered"`
	// RowsRecovered counts rows reset by recovery and sweep, quarantined
	// ones included.
	RowsRecovered uint64 `json:"rows_recovered"`
	// RowsQuarantined counts rows set to the terminal status.
	RowsQuarantined uint64 `json:"rows_quarantined"`
	// LastStuckFor is how long the rows of the last peer this worker
	// recovered had been stuck in progress, from the peer's last heartbeat
	// to their reset (Event.StuckFor says how it is estimated);
	// MaxStuckFor is the longest since the Worker was created. Zero
	// before the first recovery that reset rows.
	LastStuckFor time.Duration `json:"last_stuck_for_ns"`
	MaxStuckFor  time.Duration `json:"max_stuck_for_ns"`
	// RowsReleased counts rows handed back by Release.
	RowsReleased uint64 `json:"rows_released"`
	// RowsNotReset counts rows recovery found but could neither reset nor
	// show to be settled, once per attempt (see ResetResult.NotReset).
	RowsNotReset uint64 `json:"rows_not_reset"`
	// RowsLocked counts rows recovery or the backstop sweep left in
	// progress because another session held them locked
	// (RowState.Locked), once per attempt; not in RowsNotReset.
	// RowsRefused counts rows they left because the database refused to
	// change them (RowState.Refused: a BEFORE UPDATE trigger returned
	// NULL), once per attempt; recovery's are in RowsNotReset too.
	RowsLocked  uint64 `json:"rows_locked"`
	RowsRefused uint64 `json:"rows_refused"`
	// RowsGone counts rows recovery or the backstop sweep asked to reset
	// by ID that no longer exist in the table (ResetResult.Gone: deleted
	// since they were taken), once per attempt: nothing to reset, nothing
	// stuck. Only rows named by ID are told: an owner-mode peer, which
	// keeps no rows set, has none.
	RowsGone uint64 `json:"rows_gone"`
	// StrayRowsReset counts rows the backstop sweep without an owner
	// column reset: in progress, held by no rows set at two looks a rows
	// TTL apart (also counted in RowsRecovered).
	StrayRowsReset uint64 `json:"stray_rows_reset"`
	// UntrackedRows counts rows that sweep found committed in progress by
	// a worker that had not tracked them (see ErrUntrackedRows).
	UntrackedRows uint64 `json:"untracked_rows"`
	// Misconfigured is set once the self-check found that the rows this
	// worker tracks do not look in progress by it to the resetter (see
	// ErrMisconfigured); Healthy then fails.
	Misconfigured bool `json:"misconfigured"`
	// Errors counts failed scans, failed peer recoveries and failed sweeps;
	// one that Shutdown (or the context of ops.RecoverNow) cut short is none.
	Errors uint64 `json:"errors"`
	// RegistryBroken reports whether the last registry command found the
	// registry key holding something other than a set: scans cannot find
	// dead peers until it is deleted (see EventRegistryWrongType).
	RegistryBroken bool `json:"registry_broken"`
	// RegistryWrongType counts registry commands Redis refused with
	// WRONGTYPE.
	RegistryWrongType uint64 `json:"registry_wrong_type"`
	// TurnsFromStrangers counts the scan and sweep turns this worker took
	// from a key no live worker held: another type than a string, a string
	// without a TTL, or a value no worker writes (a stranger's write). Each
	// would have stopped that turn fleet-wide; the first of each is logged
	// at Error.
	TurnsFromStrangers uint64 `json:"turns_from_strangers"`
	// EventsDropped counts events the observer did not receive.
	EventsDropped uint64 `json:"events_dropped"`
	// HistoryDropped counts entries of the fleet's history (WithHistory)
	// this worker could not append: its queue was full, or Redis did not
	// take them.
	HistoryDropped uint64 `json:"history_dropped"`

	// OldestRowAge is how long this worker has held the oldest row it
	// tracks now, since that row's last Track (up to a second more: the
	// times of Tracks are kept to the second); zero when it tracks none.
	// A row held far longer than a block takes to process is stuck on a
	// live host. Each heartbeat also writes it to Redis, where
	// recoveryctl workers and ops.Inspect read it. Working it out reads
	// every tracked row: 1.2 ms at 100,000 rows, under the lock Track
	// takes.
	OldestRowAge time.Duration `json:"oldest_row_age_ns"`
}

// counters are the Worker's running totals.
type counters struct {
	heartbeats, heartbeatFailures, leaseLosses atomic.Uint64
	scans, peersDead, peersRecovered           atomic.Uint64
	rowsRecovered, rowsQuarantined             atomic.Uint64
	rowsReleased, rowsNotReset, errors         atomic.Uint64
	rowsLocked, rowsRefused, rowsGone          atomic.Uint64
	misconfigured                              atomic.Uint64
	strayRowsReset, untrackedRows              atomic.Uint64
	registryWrongType                          atomic.Uint64
	turnsFromStrangers                         atomic.Uint64
	registryBroken                             atomic.Bool
	lastHeartbeat                              atomic.Int64 // unix nanoseconds
	lastRowsStuck, maxRowsStuck                atomic.Int64 // nanoseconds
}

// noteRowsStuck records how long a recovered peer's rows were stuck
// (zero: none were reset).
func (c *counters) noteRowsStuck(d time.Duration) {
	if d <= 0 {
		return
	}
	c.lastRowsStuck.Store(int64(d))
	for {
		m := c.maxRowsStuck.Load()
		if int64(d) <= m || c.maxRowsStuck.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

// Stats returns a snapshot of the worker's state and counters. It is cheap
// and safe to call at any time, from any goroutine.
func (w *Worker) Stats() Stats {
	s := Stats{
		InstanceID:        w.opts.instanceID,
		OwnerMode:         w.tracker.heldByOwner(),
		TrackedRows:       w.rows.len(),
		LeaseValid:        w.CheckLease() == nil,
		Heartbeats:        w.stats.heartbeats.Load(),
		HeartbeatFailures: w.stats.heartbeatFailures.Load(),
		LeaseLosses:       w.stats.leaseLosses.Load(),
		Scans:             w.stats.scans.Load(),
		PeersDead:         w.stats.peersDead.Load(),
		PeersRecovered:    w.stats.peersRecovered.Load(),
		RowsRecovered:     w.stats.rowsRecovered.Load(),
		RowsQuarantined:   w.stats.rowsQuarantined.Load(),
		LastStuckFor:      time.Duration(w.stats.lastRowsStuck.Load()),
		MaxStuckFor:       time.Duration(w.stats.maxRowsStuck.Load()),
		RowsReleased:      w.stats.rowsReleased.Load(),
		RowsNotReset:      w.stats.rowsNotReset.Load(),
		StrayRowsReset:    w.stats.strayRowsReset.Load(),
		UntrackedRows:     w.stats.untrackedRows.Load(),
		Misconfigured:     w.checker.alarmErr() != nil,
		Errors:            w.stats.errors.Load(),
		RegistryBroken:    w.stats.registryBroken.Load(),
		RegistryWrongType: w.stats.registryWrongType.Load(),
		EventsDropped:     w.events.dropped.Load(),
	}
	s.TurnsFromStrangers = w.stats.turnsFromStrangers.Load()
	s.RowsLocked, s.RowsRefused = w.stats.rowsLocked.Load(), w.stats.rowsRefused.Load()
	s.RowsGone = w.stats.rowsGone.Load()
	if h := w.events.hist; h != nil {
		s.HistoryDropped = h.dropped.Load()
	}
	if ns := w.stats.lastHeartbeat.Load(); ns != 0 {
		s.LastHeartbeat = time.Unix(0, ns)
	}
	if since, ok := w.rows.oldestTracked(); ok {
		s.OldestRowAge = max(time.Since(since), 0)
	}
	return s
}

// countFailure counts a failed scan, sweep or peer recovery in
// Stats.Errors, and reports whether it did: a failure whose context ended
// (Shutdown, or the caller of ops.RecoverNow giving up) is no failure of
// recovery, and is neither counted nor reported.
func (c *counters) countFailure(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	c.errors.Add(1)
	return true
}
