package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/store"
)

// Read-only inspection of a fleet, for operator tools (cmd/recoveryctl):
// what Redis holds about each instance, the rows one tracks, and what a
// recovery scan would do. Everything here reads the keys with the same code
// recovery uses and changes nothing.

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

// claimState classifies the value of a claim key ("" when absent).
func claimState(v string) ClaimState {
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

// InstanceState is what Redis holds about one instance.
type InstanceState struct {
	// InstanceID is the instance's ID.
	InstanceID string
	// Registered says whether the ID is in the fleet's registry.
	Registered bool
	// HeartbeatPresent says whether the heartbeat key exists: the instance
	// is alive. HeartbeatTTL is its remaining TTL (-1 without expiry).
	HeartbeatPresent bool
	HeartbeatTTL     time.Duration
	// RowsPresent says whether the rows set exists; Rows is its number of
	// members and RowsTTL its remaining TTL (-1 without expiry).
	RowsPresent bool
	Rows        int64
	RowsTTL     time.Duration
	// Incarnation names the life of the rows set ("" when absent).
	Incarnation string
	// Claim is the state of the recovery claim.
	Claim ClaimState
	// AnnouncedTTL is the heartbeat TTL the instance announced in the
	// fleet record, and Mode its mode ("owner" or "rows-set"); zero and
	// "" when it announced none (a worker of an older version). Inspect
	// fills them in.
	AnnouncedTTL time.Duration
	Mode         string
}

// Alive reports whether the instance's heartbeat key exists.
func (s InstanceState) Alive() bool { return s.HeartbeatPresent }

// Known reports whether Redis holds anything about the instance.
func (s InstanceState) Known() bool {
	return s.Registered || s.HeartbeatPresent || s.RowsPresent || s.Incarnation != "" || s.Claim != ClaimNone
}

// FleetState is what Redis holds about every registered instance.
type FleetState struct {
	// Registry is the registry key read.
	Registry string
	// Instances are the registered instances, sorted by ID.
	Instances []InstanceState
	// InvalidMembers lists registry members that are not valid instance
	// IDs, sorted; recovery ignores them.
	InvalidMembers []string
	// Serves is what the fleet record says the fleet serves
	// ("database=... schema=... table=..."), "" when none is recorded.
	Serves string
	// Server is the PostgreSQL server the record names
	// ("system_identifier=..."), "" when none is recorded.
	Server string
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

// inspectResetter stands in for a resetter in the read-only Worker of
// Inspect and friends, which never resets anything.
type inspectResetter struct{}

func (inspectResetter) ResetRows(context.Context, string, []int64) (int64, error) {
	return 0, errors.New("recovery: inspection resets nothing")
}

// inspector returns a Worker that is never started, under an ID no worker
// has, whose read paths the inspection functions share with recovery.
func inspector(rdb redis.UniversalClient, prefix string) (*Worker, error) {
	return New(rdb, inspectResetter{}, WithKeyPrefix(prefix), WithInstanceID("inspect-"+newToken()),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
}

// Inspect reads what Redis holds about every instance in the registry of
// the fleet under prefix (WithKeyPrefix), changing nothing: the registry
// as a recovery scan reads it, then the keys of every instance in one
// pipeline (one round trip per node on Cluster). Each call is bounded by
// ctx and defaultOperationTimeout.
func Inspect(ctx context.Context, rdb redis.UniversalClient, prefix string) (FleetState, error) {
	w, err := inspector(rdb, prefix)
	if err != nil {
		return FleetState{}, err
	}
	fs := FleetState{Registry: w.store.Registry()}
	ids, invalid, err := w.registeredPeers(ctx)
	if err != nil {
		return fs, err
	}
	slices.Sort(ids)
	slices.Sort(invalid)
	fs.InvalidMembers = invalid
	fs.Instances, err = w.describe(ctx, ids)
	if err != nil {
		return fs, err
	}
	opCtx, cancel := w.opContext(ctx)
	rec, err := w.store.ReadFleet(opCtx)
	cancel()
	if store.IsWrongType(err) {
		err = nil // a key that is not a hash records nothing; the workers log it (Warn)
	}
	fs.Serves, fs.Server = rec.Serves, rec.Server
	announced := make(map[string]store.Member, len(rec.Members))
	for _, m := range rec.Members {
		announced[m.ID] = m
	}
	for i := range fs.Instances {
		fs.Instances[i].Registered = true
		m := announced[fs.Instances[i].InstanceID]
		fs.Instances[i].AnnouncedTTL, fs.Instances[i].Mode = m.TTL, m.Mode
	}
	return fs, err
}

// InspectInstance reads what Redis holds about one instance, registered or
// not, changing nothing. An invalid ID is an error wrapping
// ErrInvalidConfig.
func InspectInstance(ctx context.Context, rdb redis.UniversalClient, prefix, id string) (InstanceState, error) {
	if err := store.ValidateName(id); err != nil {
		return InstanceState{}, fmt.Errorf("%w: instance ID %q %v", ErrInvalidConfig, clip(id), err)
	}
	w, err := inspector(rdb, prefix)
	if err != nil {
		return InstanceState{}, err
	}
	opCtx, cancel := w.opContext(ctx)
	registered, err := w.store.IsRegistered(opCtx, id)
	cancel()
	if err != nil {
		return InstanceState{}, err
	}
	st, err := w.describe(ctx, []string{id})
	if err != nil {
		return InstanceState{}, err
	}
	st[0].Registered = registered
	return st[0], nil
}

// ReadTrackedRows reads an instance's rows set and incarnation the way a
// recovery reads them (SSCAN in pages, each under the operation timeout),
// changing nothing.
func ReadTrackedRows(ctx context.Context, rdb redis.UniversalClient, prefix, id string) (TrackedRows, error) {
	if err := store.ValidateName(id); err != nil {
		return TrackedRows{}, fmt.Errorf("%w: instance ID %q %v", ErrInvalidConfig, clip(id), err)
	}
	w, err := inspector(rdb, prefix)
	if err != nil {
		return TrackedRows{}, err
	}
	return w.trackedRows(ctx, id)
}

func (w *Worker) trackedRows(ctx context.Context, id string) (TrackedRows, error) {
	incarnation, members, err := w.store.ReadRows(ctx, id)
	if err != nil {
		return TrackedRows{}, err
	}
	ids, bad := parseRowIDs(members)
	slices.Sort(bad)
	return TrackedRows{Incarnation: incarnation, RowIDs: ids, InvalidMembers: bad}, nil
}

// describe reads the keys of every instance in ids in one pipeline.
// Registered is left false.
func (w *Worker) describe(ctx context.Context, ids []string) ([]InstanceState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	keys, err := w.store.Describe(opCtx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]InstanceState, len(keys))
	for i, k := range keys {
		out[i] = InstanceState{
			InstanceID:       k.ID,
			HeartbeatPresent: k.HeartbeatTTL != -2,
			HeartbeatTTL:     k.HeartbeatTTL,
			RowsPresent:      k.RowsTTL != -2,
			Rows:             k.Rows,
			RowsTTL:          k.RowsTTL,
			Incarnation:      k.Incarnation,
			Claim:            claimState(k.Claim),
		}
	}
	return out, nil
}

// PlanAction is what a recovery scan would do for one dead peer.
type PlanAction string

// Plan actions.
const (
	// PlanReset: reset the rows in PeerPlan.Reset (possibly none: every
	// tracked row is settled), then delete the rows set and deregister.
	// The other tracked rows are settled: finished, queued, or another
	// worker's.
	PlanReset PlanAction = "reset"
	// PlanKeep: some tracked rows could be neither reset nor shown
	// settled (PeerPlan.NotReset); the recovery would reset the others,
	// keep the rows set and registry entry, and fail with ErrRowsNotReset.
	PlanKeep PlanAction = "keep"
	// PlanDeregister: Redis holds no row IDs of the peer; its keys would
	// be deleted and it would be deregistered.
	PlanDeregister PlanAction = "deregister"
	// PlanLost: an earlier recovery failed and the peer's rows set is gone
	// since; it would be deregistered with ErrRowsSetLost.
	PlanLost PlanAction = "lost"
	// PlanSkip: another worker holds the claim (or just finished).
	PlanSkip PlanAction = "skip"
	// PlanUnknown: the resetter cannot tell what it would change (it is
	// not a ResetPlanner); the tracked rows would be handed to it.
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
	// Reset, Quarantined and NotReset are the resetter's answer
	// (ResetPlanner): the rows a reset would change, those of them it
	// would quarantine, and the rows it could neither reset nor show
	// settled.
	Reset       []int64
	Quarantined []int64
	NotReset    []RowState
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

// PlanRecovery says what RecoverNow would do now, changing nothing: it
// finds the dead peers as a scan does (registry, heartbeats, the age of
// the Redis node), reads each one's claim, incarnation and rows set as a
// recovery does, and asks the resetter, when it is a ResetPlanner, which
// rows a reset would actually change. It takes no claim, so a recovery
// running meanwhile may change the answer. Like RecoverNow it may be
// called before Start; after Shutdown it returns ErrShutdown.
func (w *Worker) PlanRecovery(ctx context.Context) (RecoveryPlan, error) {
	var plan RecoveryPlan
	if w.state.Load() == stateShutdown {
		return plan, ErrShutdown
	}
	peers, invalid, err := w.registeredPeers(ctx)
	if err != nil {
		return plan, err
	}
	slices.Sort(invalid)
	plan.InvalidMembers, plan.PeersChecked = invalid, len(peers)
	dead, err := w.deadPeers(ctx, peers)
	if err != nil {
		return plan, err
	}
	slices.Sort(dead)
	plan.DeadPeers = len(dead)
	states, err := w.describe(ctx, dead)
	if err != nil {
		return plan, err
	}
	planner, canPlan := w.resetter.(ResetPlanner)
	owners, byOwner := w.resetter.(OwnerPlanner)
	byOwner = byOwner && w.ownerMode
	for _, st := range states {
		p := PeerPlan{InstanceID: st.InstanceID, Claim: st.Claim}
		switch {
		case st.Claim == ClaimHeld || st.Claim == ClaimFinished:
			p.Action = PlanSkip
		case !st.RowsPresent && st.Incarnation == "" && !byOwner:
			p.Action = PlanDeregister
			if st.Claim == ClaimFailed {
				p.Action = PlanLost
			}
		default:
			if err := w.planPeer(ctx, &p, st, planner, canPlan); err != nil {
				return plan, err
			}
			if byOwner && p.Action != PlanUnknown && p.Action != PlanKeep {
				// Then every row the peer still owns in progress, under
				// its ID and its current life (owner.go), as the recovery
				// resets them after its rows set.
				values := []string{st.InstanceID}
				if st.Incarnation != "" && store.ValidateName(st.Incarnation) == nil {
					values = append(values, lifeOwner(st.InstanceID, st.Incarnation))
				}
				for _, v := range values {
					resetCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
					op, err := owners.PlanOwnerReset(resetCtx, v)
					cancel()
					if err != nil {
						return plan, fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
					}
					p.Reset = mergeIDs(p.Reset, op.Reset)
					p.Quarantined = mergeIDs(p.Quarantined, op.Quarantined)
				}
				if p.Action == PlanDeregister && len(p.Reset) > 0 {
					p.Action = PlanReset
				}
			}
			plan.RowsToReset += len(p.Reset)
		}
		plan.Peers = append(plan.Peers, p)
	}
	return plan, nil
}

// planPeer plans the recovery of one dead peer from its rows set, as a
// recovery in rows-set mode would do it.
func (w *Worker) planPeer(ctx context.Context, p *PeerPlan, st InstanceState, planner ResetPlanner, canPlan bool) error {
	var err error
	p.Action = PlanDeregister
	if !st.RowsPresent && st.Incarnation == "" {
		return nil
	}
	if p.Tracked, err = w.trackedRows(ctx, st.InstanceID); err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	if len(p.Tracked.RowIDs) == 0 {
		return nil
	}
	if !canPlan {
		p.Action = PlanUnknown
		return nil
	}
	resetCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	rp, err := planner.PlanReset(resetCtx, ResetRequest{InstanceID: st.InstanceID,
		Incarnation: p.Tracked.Incarnation, RowIDs: p.Tracked.RowIDs, FromRowsSet: true})
	cancel()
	if err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	p.Action = PlanReset
	p.Reset, p.Quarantined, p.NotReset = rp.Reset, rp.Quarantined, rp.NotReset
	if len(rp.NotReset) > 0 {
		p.Action = PlanKeep
	}
	return nil
}

// mergeIDs returns the sorted union of two sorted ID lists.
func mergeIDs(a, b []int64) []int64 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
