package ops

import "github.com/alya/recovery/internal/report"

// The report types are defined in internal/report, where the Worker builds
// them; these aliases are their public names. Being aliases, not copies,
// errors.As(err, &pe) with a *ops.PeerError matches what a Worker returns.

// RecoveryReport says what one recovery scan found and did (RecoverNow).
// Its fields are documented on internal/report.RecoveryReport (go doc
// github.com/alya/recovery/internal/report.RecoveryReport).
type RecoveryReport = report.RecoveryReport

// PeerRecovery says what recovery did for one dead peer.
// Its fields are documented on internal/report.PeerRecovery (go doc
// github.com/alya/recovery/internal/report.PeerRecovery).
type PeerRecovery = report.PeerRecovery

// PeerError is a recovery failure that concerns one peer. The peer's rows
// set and registry entry are kept, so the next scan tries again.
type PeerError = report.PeerError

// RecoveryPlan is what a recovery scan would do now (PlanRecovery).
// Its fields are documented on internal/report.RecoveryPlan (go doc
// github.com/alya/recovery/internal/report.RecoveryPlan).
type RecoveryPlan = report.RecoveryPlan

// PeerPlan is what a recovery scan would do for one dead peer.
// Its fields are documented on internal/report.PeerPlan (go doc
// github.com/alya/recovery/internal/report.PeerPlan).
type PeerPlan = report.PeerPlan

// PlanAction is what a recovery scan would do for one dead peer.
type PlanAction = report.PlanAction

// Plan actions (PeerPlan.Action).
const (
	// PlanReset: reset the rows in PeerPlan.WouldReset (possibly none:
	// every tracked row is settled), then delete the rows set and
	// deregister. The other tracked rows are settled: finished, queued, or
	// another worker's.
	PlanReset = report.PlanReset
	// PlanKeep: some tracked rows could be neither reset nor shown
	// settled (PeerPlan.NotReset); the recovery would reset the others,
	// keep the rows set and registry entry, and fail with
	// recovery.ErrRowsNotReset.
	PlanKeep = report.PlanKeep
	// PlanDeregister: Redis holds no row IDs of the peer; its keys would
	// be deleted and it would be deregistered.
	PlanDeregister = report.PlanDeregister
	// PlanLost: an earlier recovery failed and the peer's rows set is gone
	// since; it would be deregistered with recovery.ErrRowsSetLost.
	PlanLost = report.PlanLost
	// PlanSkip: another worker holds the claim (or just finished).
	PlanSkip = report.PlanSkip
	// PlanUnknown: the resetter cannot tell what it would change (it
	// cannot do a dry run); the tracked rows would be handed to it.
	PlanUnknown = report.PlanUnknown
)

// ClaimState says what an instance's recovery claim key holds.
type ClaimState = report.ClaimState

// Claim states (InstanceState.Claim, PeerPlan.Claim).
const (
	// ClaimNone: no recovery of the instance is under way.
	ClaimNone = report.ClaimNone
	// ClaimHeld: a recoverer holds the claim and is recovering it now.
	ClaimHeld = report.ClaimHeld
	// ClaimFailed: the last recovery failed (PostgreSQL down, rows not
	// reset); the next scan tries again.
	ClaimFailed = report.ClaimFailed
	// ClaimFinished: a recovery has just finished; the claim's short
	// tombstone is left for a retry of its last step.
	ClaimFinished = report.ClaimFinished
)

// TrackedRows are the members of an instance's rows set, read with SSCAN
// as recovery reads them (ReadTrackedRows, PeerPlan.Tracked).
// Its fields are documented on internal/report.TrackedRows (go doc
// github.com/alya/recovery/internal/report.TrackedRows).
type TrackedRows = report.TrackedRows
