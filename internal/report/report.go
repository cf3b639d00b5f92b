package report

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/store"
)

// RecoveryReport says what one recovery scan found and did.
type RecoveryReport struct {
	// PeersChecked is how many registered peers (other than this worker)
	// had their heartbeat checked.
	PeersChecked int
	// Dead lists the peers that had no heartbeat.
	Dead []string
	// Recovered lists the dead peers whose recovery this scan completed.
	Recovered []PeerRecovery
	// Failed lists dead peers whose recovery failed (the error says why),
	// with what was done before the failure: rows reset, and rows found
	// but neither reset nor settled (PeerRecovery.NotReset).
	Failed []PeerRecovery
	// Skipped lists dead peers left alone: another worker held the
	// recovery claim, or the heartbeat came back before the claim.
	Skipped []string
	// InvalidMembers lists registry members that are not valid instance
	// IDs. They are left in the registry and ignored.
	InvalidMembers []string
	// Deferred lists dead peers this scan did not come to within its
	// budget (half the recovery interval); the next scan takes them, after
	// any newer death.
	Deferred []string
	// IdleDeregistered is how many dead peers with nothing to recover (no
	// rows set, incarnation or claim; in owner mode, no row in progress
	// either) this scan removed from the registry in bulk, when there were
	// too many to take one by one.
	IdleDeregistered int
	// RowsReset is the sum of RowsReset over Recovered and Failed.
	RowsReset int64
	// Duration is how long the scan took.
	Duration time.Duration
}

// PeerRecovery says what recovery did for one dead peer.
type PeerRecovery struct {
	// InstanceID is the dead peer's ID.
	InstanceID string
	// RowsFound is how many row IDs its rows set held (for the backstop
	// sweep, which resets by owner: how many rows it reset or quarantined,
	// or found locked).
	RowsFound int
	// RowsReset is how many rows the resetter returned to the queue
	// (rows that had already finished are not counted).
	RowsReset int64
	// Quarantined lists rows that reached their recovery limit and were set
	// to the terminal status instead of queued (see
	// postgres.WithMaxRecoveries).
	Quarantined []int64
	// InvalidMembers lists rows-set members that are not decimal int64 row
	// IDs; they were skipped.
	InvalidMembers []string
	// NotReset lists rows that were neither reset nor shown to be settled
	// (see recovery.ResetResult.NotReset). The peer's rows set and
	// registry entry were kept, and the recovery returned an error
	// wrapping recovery.ErrRowsNotReset (and recovery.ErrRowsLocked when
	// every one was locked by another session, recovery.ErrRowsRefused
	// when the database refused some: RowState.Refused), so it is tried again by
	// the next scan. Locked rows are not counted in Stats.RowsNotReset
	// nor in the rows_not_reset event: they are no misconfiguration.
	NotReset []contract.RowState
	// Gone lists rows of its rows set that no longer exist in the table
	// (deleted since they were taken; ResetResult.Gone): nothing to reset.
	Gone []int64
	// PeerCameBack is set when the peer's heartbeat reappeared during the
	// recovery: its rows set was left as the peer keeps it, and it stays
	// registered.
	PeerCameBack bool
	// NoRecord is set when Redis held neither a rows set nor an
	// incarnation for the peer: it died without rows, or its keys expired
	// or were lost before anyone recovered it. It was deregistered and is
	// not counted as recovered.
	NoRecord bool
}

// PeerError is a recovery failure that concerns one peer. The peer's rows
// set and registry entry are kept, so the next scan tries again.
type PeerError struct {
	// InstanceID is the peer whose recovery failed.
	InstanceID string
	// Err is why.
	Err error
}

// Error returns "recover <peer>: <why>".
func (e *PeerError) Error() string { return "recover " + e.InstanceID + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *PeerError) Unwrap() error { return e.Err }

// ClaimState says what an instance's recovery claim key holds.
type ClaimState string

// Claim states.
const (
	// ClaimNone: no recovery of the instance is under way.
	ClaimNone ClaimState = "none"
	// ClaimHeld: a recoverer holds the claim and is recovering it now.
	ClaimHeld ClaimState = "held"
	// ClaimFailed: the last recovery failed (PostgreSQL down, rows not
	// reset); the next scan tries again.
	ClaimFailed ClaimState = "failed"
	// ClaimFinished: a recovery has just finished; the claim's short
	// tombstone is left for a retry of its last step.
	ClaimFinished ClaimState = "finished"
)

// ClaimOf classifies the value of a claim key ("" when absent).
func ClaimOf(v string) ClaimState {
	switch {
	case v == "":
		return ClaimNone
	case v == store.FailedClaim:
		return ClaimFailed
	case strings.HasPrefix(v, "done:"):
		return ClaimFinished
	default:
		return ClaimHeld
	}
}

// TrackedRows are the members of an instance's rows set, read with SSCAN
// as recovery reads them.
type TrackedRows struct {
	// Incarnation names the life of the rows set ("" when absent).
	Incarnation string
	// RowIDs are the members that are row IDs, in ascending order.
	RowIDs []int64
	// InvalidMembers are the members that are not decimal int64s;
	// recovery skips them.
	InvalidMembers []string
}

// Tracked sorts the members of a rows set (store.ReadRows) into row IDs
// and invalid members, both sorted.
func Tracked(incarnation string, members []string) TrackedRows {
	t := TrackedRows{Incarnation: incarnation, RowIDs: make([]int64, 0, len(members))}
	for _, m := range members {
		id, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			t.InvalidMembers = append(t.InvalidMembers, m)
			continue
		}
		t.RowIDs = append(t.RowIDs, id)
	}
	slices.Sort(t.RowIDs)
	slices.Sort(t.InvalidMembers)
	return t
}

// PlanAction is what a recovery scan would do for one dead peer.
type PlanAction string

// Plan actions.
const (
	// PlanReset: reset the rows in PeerPlan.WouldReset (possibly none:
	// every tracked row is settled), then delete the rows set and
	// deregister. The other tracked rows are settled: finished, queued, or
	// another worker's.
	PlanReset PlanAction = "reset"
	// PlanKeep: some tracked rows could be neither reset nor shown
	// settled (PeerPlan.NotReset); the recovery would reset the others,
	// keep the rows set and registry entry, and fail with
	// recovery.ErrRowsNotReset.
	PlanKeep PlanAction = "keep"
	// PlanDeregister: Redis holds no row IDs of the peer; its keys would
	// be deleted and it would be deregistered.
	PlanDeregister PlanAction = "deregister"
	// PlanLost: an earlier recovery failed and the peer's rows set is gone
	// since; it would be deregistered with recovery.ErrRowsSetLost.
	PlanLost PlanAction = "lost"
	// PlanSkip: another worker holds the claim (or just finished).
	PlanSkip PlanAction = "skip"
	// PlanUnknown: the resetter cannot tell what it would change (it
	// cannot do a dry run); the tracked rows would be handed to it.
	PlanUnknown PlanAction = "unknown"
)

// PeerPlan is what a recovery scan would do for one dead peer.
type PeerPlan struct {
	// InstanceID is the dead peer's ID.
	InstanceID string
	// Action is what the scan would do.
	Action PlanAction
	// Claim is the state of the peer's recovery claim.
	Claim ClaimState
	// Tracked are the rows its rows set holds.
	Tracked TrackedRows
	// WouldReset, Quarantined and NotReset are the resetter's answer to a
	// dry run: the rows a reset would change, those of them it would
	// quarantine, and the rows it could neither reset nor show settled.
	WouldReset  []int64
	Quarantined []int64
	NotReset    []contract.RowState
}

// RecoveryPlan is what a recovery scan would do now.
type RecoveryPlan struct {
	// PeersChecked is how many registered peers had their heartbeat
	// checked; DeadPeers how many of them a scan would find dead.
	PeersChecked int
	DeadPeers    int
	// Peers says what would happen to each dead peer, sorted by ID.
	Peers []PeerPlan
	// InvalidMembers lists registry members that are not valid instance
	// IDs.
	InvalidMembers []string
	// RowsToReset is the number of rows the scan would change.
	RowsToReset int
}
