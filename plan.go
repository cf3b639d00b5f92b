package recovery

import (
	"context"
	"fmt"
	"slices"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The dry run of a recovery scan (ops.PlanRecovery): what a scan would do
// now, changing nothing.

// planRecovery says what recoverNow would do now, changing nothing: it
// finds the dead peers as a scan does (registry, heartbeats, the age of
// the Redis node), reads each one's claim, incarnation and rows set as a
// recovery does, and asks the resetter, when it can do a dry run
// (ResetterInfo.DryRun), which rows a reset would actually change. It takes no claim, so a recovery
// running meanwhile may change the answer. Like recoverNow it may be
// called before Start; after Shutdown it returns ErrShutdown.
// ops.PlanRecovery calls it (bridge.go).
func (w *Worker) planRecovery(ctx context.Context) (report.RecoveryPlan, error) {
	if w.state.Load() == stateShutdown {
		return report.RecoveryPlan{}, ErrShutdown
	}
	return w.recov.plan(ctx)
}

// plan is planRecovery's dry run of a scan: it finds the dead peers as
// scan does, and has peers plan the recovery of each.
func (r *recoverer) plan(ctx context.Context) (report.RecoveryPlan, error) {
	var plan report.RecoveryPlan
	peers, invalid, err := r.judge.registeredPeers(ctx)
	if err != nil {
		return plan, err
	}
	slices.Sort(invalid)
	plan.InvalidMembers, plan.PeersChecked = invalid, len(peers)
	dead, err := r.judge.deadPeers(ctx, peers)
	if err != nil {
		return plan, err
	}
	slices.Sort(dead)
	plan.DeadPeers = len(dead)
	err = r.peers.plan(ctx, &plan, dead)
	return plan, err
}

// plan adds to plan what a recovery of each peer of dead would do:
// each one's claim, incarnation and rows set, read as a recovery reads
// them, and the rows the resetter's dry run says a reset would change. It
// stops at the first error, leaving plan as far as it got.
func (p *peerRecoverer) plan(ctx context.Context, plan *report.RecoveryPlan, dead []string) error {
	states, err := p.peerKeys(ctx, dead)
	if err != nil {
		return err
	}
	canPlan := p.opts.info.DryRun
	byOwner := canPlan && p.held.heldByOwner()
	for _, st := range states {
		pp := report.PeerPlan{InstanceID: st.InstanceID, Claim: st.Claim}
		switch {
		case st.Claim == report.ClaimHeld || st.Claim == report.ClaimFinished:
			pp.Action = report.PlanSkip
		case !st.RowsPresent && st.Incarnation == "" && !byOwner:
			pp.Action = report.PlanDeregister
			if st.Claim == report.ClaimFailed {
				pp.Action = report.PlanLost
			}
		default:
			if err := p.planPeer(ctx, &pp, st, canPlan); err != nil {
				return err
			}
			if byOwner && pp.Action != report.PlanUnknown && pp.Action != report.PlanKeep {
				// Then every row the peer still owns in progress, under
				// its ID and its current life (owner.go), as the recovery
				// resets them after its rows set.
				values := []string{st.InstanceID}
				if st.Incarnation != "" && store.ValidateName(st.Incarnation) == nil {
					values = append(values, lifeOwner(st.InstanceID, st.Incarnation))
				}
				for _, v := range values {
					resetCtx, cancel := context.WithTimeout(ctx, p.opts.resetTimeout)
					op, err := p.resetter.Reset(resetCtx, ResetRequest{Owner: v, DryRun: true})
					cancel()
					if err != nil {
						return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
					}
					pp.WouldReset = mergeIDs(pp.WouldReset, op.ChangedIDs)
					pp.Quarantined = mergeIDs(pp.Quarantined, op.Quarantined)
				}
				if pp.Action == report.PlanDeregister && len(pp.WouldReset) > 0 {
					pp.Action = report.PlanReset
				}
			}
			plan.RowsToReset += len(pp.WouldReset)
		}
		plan.Peers = append(plan.Peers, pp)
	}
	return nil
}

// planPeer plans the recovery of one dead peer from its rows set, as a
// recovery in rows-set mode would do it.
func (p *peerRecoverer) planPeer(ctx context.Context, pp *report.PeerPlan, st peerKeys, canPlan bool) error {
	pp.Action = report.PlanDeregister
	if !st.RowsPresent && st.Incarnation == "" {
		return nil
	}
	incarnation, members, err := p.store.ReadRows(ctx, st.InstanceID)
	if err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	if pp.Tracked = report.Tracked(incarnation, members); len(pp.Tracked.RowIDs) == 0 {
		return nil
	}
	if !canPlan {
		pp.Action = report.PlanUnknown
		return nil
	}
	resetCtx, cancel := context.WithTimeout(ctx, p.opts.resetTimeout)
	rp, err := p.resetter.Reset(resetCtx, ResetRequest{InstanceID: st.InstanceID,
		Incarnation: pp.Tracked.Incarnation, RowIDs: pp.Tracked.RowIDs, FromRowsSet: true, DryRun: true})
	cancel()
	if err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	pp.Action = report.PlanReset
	pp.WouldReset, pp.Quarantined, pp.NotReset = rp.ChangedIDs, rp.Quarantined, rp.NotReset
	if len(rp.NotReset) > 0 {
		pp.Action = report.PlanKeep
	}
	return nil
}

// peerKeys is what the plan reads of a dead peer's keys.
type peerKeys struct {
	InstanceID  string
	Claim       report.ClaimState
	RowsPresent bool
	Incarnation string
}

// peerKeys reads the keys of every instance in ids in one pipeline.
func (p *peerRecoverer) peerKeys(ctx context.Context, ids []string) ([]peerKeys, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	opCtx, cancel := p.opts.opContext(ctx)
	defer cancel()
	keys, err := p.store.Describe(opCtx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]peerKeys, len(keys))
	for i, k := range keys {
		out[i] = peerKeys{InstanceID: k.ID, Claim: report.ClaimOf(k.Claim), RowsPresent: k.RowsTTL != -2,
			Incarnation: k.Incarnation}
	}
	return out, nil
}

// mergeIDs returns the sorted union of two sorted ID lists.
func mergeIDs(a, b []int64) []int64 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
