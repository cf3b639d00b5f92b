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
	var plan report.RecoveryPlan
	if w.state.Load() == stateShutdown {
		return plan, ErrShutdown
	}
	peers, invalid, err := w.judge.registeredPeers(ctx)
	if err != nil {
		return plan, err
	}
	slices.Sort(invalid)
	plan.InvalidMembers, plan.PeersChecked = invalid, len(peers)
	dead, err := w.judge.deadPeers(ctx, peers)
	if err != nil {
		return plan, err
	}
	slices.Sort(dead)
	plan.DeadPeers = len(dead)
	states, err := w.peerKeys(ctx, dead)
	if err != nil {
		return plan, err
	}
	canPlan := w.info.DryRun
	byOwner := canPlan && w.ownerMode
	for _, st := range states {
		p := report.PeerPlan{InstanceID: st.InstanceID, Claim: st.Claim}
		switch {
		case st.Claim == report.ClaimHeld || st.Claim == report.ClaimFinished:
			p.Action = report.PlanSkip
		case !st.RowsPresent && st.Incarnation == "" && !byOwner:
			p.Action = report.PlanDeregister
			if st.Claim == report.ClaimFailed {
				p.Action = report.PlanLost
			}
		default:
			if err := w.planPeer(ctx, &p, st, canPlan); err != nil {
				return plan, err
			}
			if byOwner && p.Action != report.PlanUnknown && p.Action != report.PlanKeep {
				// Then every row the peer still owns in progress, under
				// its ID and its current life (owner.go), as the recovery
				// resets them after its rows set.
				values := []string{st.InstanceID}
				if st.Incarnation != "" && store.ValidateName(st.Incarnation) == nil {
					values = append(values, lifeOwner(st.InstanceID, st.Incarnation))
				}
				for _, v := range values {
					resetCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
					op, err := w.resetter.Reset(resetCtx, ResetRequest{Owner: v, DryRun: true})
					cancel()
					if err != nil {
						return plan, fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
					}
					p.WouldReset = mergeIDs(p.WouldReset, op.ChangedIDs)
					p.Quarantined = mergeIDs(p.Quarantined, op.Quarantined)
				}
				if p.Action == report.PlanDeregister && len(p.WouldReset) > 0 {
					p.Action = report.PlanReset
				}
			}
			plan.RowsToReset += len(p.WouldReset)
		}
		plan.Peers = append(plan.Peers, p)
	}
	return plan, nil
}

// planPeer plans the recovery of one dead peer from its rows set, as a
// recovery in rows-set mode would do it.
func (w *Worker) planPeer(ctx context.Context, p *report.PeerPlan, st peerKeys, canPlan bool) error {
	p.Action = report.PlanDeregister
	if !st.RowsPresent && st.Incarnation == "" {
		return nil
	}
	incarnation, members, err := w.store.ReadRows(ctx, st.InstanceID)
	if err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	if p.Tracked = report.Tracked(incarnation, members); len(p.Tracked.RowIDs) == 0 {
		return nil
	}
	if !canPlan {
		p.Action = report.PlanUnknown
		return nil
	}
	resetCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	rp, err := w.resetter.Reset(resetCtx, ResetRequest{InstanceID: st.InstanceID,
		Incarnation: p.Tracked.Incarnation, RowIDs: p.Tracked.RowIDs, FromRowsSet: true, DryRun: true})
	cancel()
	if err != nil {
		return fmt.Errorf("plan recovery of %s: %w", st.InstanceID, err)
	}
	p.Action = report.PlanReset
	p.WouldReset, p.Quarantined, p.NotReset = rp.ChangedIDs, rp.Quarantined, rp.NotReset
	if len(rp.NotReset) > 0 {
		p.Action = report.PlanKeep
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
func (w *Worker) peerKeys(ctx context.Context, ids []string) ([]peerKeys, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	opCtx, cancel := w.opts.opContext(ctx)
	defer cancel()
	keys, err := w.store.Describe(opCtx, ids)
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
