package recovery

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/alya/recovery/internal/bridge"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The backstop sweep on demand, for an operator's tool (ops.SweepNow,
// recoveryctl recover): the sweep's own looks (rowSweep.rowsLook,
// ownerSweep.look), run by a Worker that is never started, so no loop
// shares its memory of the looks.

// sweepNow takes a look of the backstop sweep by row version and, unless
// dryRun, a second one a gap later, which resets the rows no rows set held
// at either, with their version in the statement as the sweep does; with
// an owner column, sweepOwners. It
// waits for the second look only when ctx leaves time for it; otherwise
// the rows found are reported stuck. A started Worker's sweep is its
// loop's: sweepNow refuses it (ErrAlreadyStarted).
func (w *Worker) sweepNow(ctx context.Context, dryRun bool) (report.SweepReport, error) {
	var rep report.SweepReport
	switch w.state.Load() {
	case stateShutdown:
		return rep, ErrShutdown
	case stateRunning:
		return rep, fmt.Errorf("%w: a sweep on demand needs a Worker that is never started; a started one sweeps in its loop", ErrAlreadyStarted)
	}
	var rs *rowSweep
	switch by := w.sweeper.strategy().(type) {
	case *rowSweep:
		rs = by
	case *ownerSweep:
		return w.sweepOwners(ctx, by, dryRun)
	}
	switch {
	case rs != nil:
	case !w.info.ListsInProgress:
		rep.Why = fmt.Sprintf("the resetter (%T) cannot list the rows in progress", w.resetter)
		return rep, nil
	default:
		rep.Why = "the backstop sweep is off (WithBackstopSweep(false))"
		return rep, nil
	}
	rep.Swept = true
	w.fleet.learnRecord(ctx)
	rs.forget()
	defer rs.forget()
	gap, err := firstRowsLook(ctx, rs, &rep)
	if err != nil {
		return rep, err
	}
	if dryRun || rep.NodeHeld || len(rep.Stray) == 0 {
		return rep, nil
	}
	if waited, err := waitGap(ctx, gap); !waited {
		return rep, err
	}
	return rep, secondRowsLook(ctx, rs, &rep)
}

// firstRowsLook is the first look of a sweep on demand by row version:
// it reports the rows in progress in no rows set, and returns the gap to
// wait before the second look may reset them.
func firstRowsLook(ctx context.Context, rs *rowSweep, rep *report.SweepReport) (time.Duration, error) {
	if err := ownerPeersLive(ctx, rs); err != nil {
		return 0, err
	}
	var first sweepReport
	if err := rs.rowsLook(ctx, &first); err != nil {
		return 0, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.RowsInProgress = first.rowsInProgress
	rep.Stray = slices.Sorted(maps.Keys(rs.mem.stray))
	held, gap, _, err := rs.heldRows(ctx)
	if err != nil {
		return 0, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.Gap = gap
	if first.nodeHeld {
		// The look judged nothing. Rows in progress that every one is in
		// a set need no judging; the others are reported unjudged.
		if rep.Stray, err = unheld(ctx, rs, held); err != nil {
			return 0, fmt.Errorf("backstop sweep: %w", err)
		}
		rep.NodeHeld = len(rep.Stray) > 0
	}
	rep.Stuck = rep.Stray
	return gap, nil
}

// secondRowsLook is the second look of a sweep on demand by row version,
// a gap after the first: it resets the rows still in no rows set and
// reports those still stuck.
func secondRowsLook(ctx context.Context, rs *rowSweep, rep *report.SweepReport) error {
	if err := ownerPeersLive(ctx, rs); err != nil {
		return err
	}
	var second sweepReport
	err := rs.rowsLook(ctx, &second)
	rep.Waited = true
	rep.RowsReset, rep.Quarantined, rep.Locked = second.strayReset, second.strayQuarantined, second.strayLocked
	if second.nodeHeld {
		rep.NodeHeld = true
	}
	// A row the database refused is still in progress: stuck, though the
	// sweep's memory tries it again only a gap later, as a new stray row.
	rep.Refused = slices.Sorted(slices.Values(second.refusedIDs))
	stuck := maps.Clone(rs.mem.stray)
	for _, id := range rep.Refused {
		stuck[id] = strayRow{}
	}
	rep.Stuck = slices.Sorted(maps.Keys(stuck))
	if err != nil {
		return fmt.Errorf("backstop sweep: %w", err)
	}
	return nil
}

// sweepOwners is sweepNow by owner: a look of the sweep by owner
// (ownerSweep.look) finds the owners of rows in progress without a
// heartbeat, and, unless dryRun, a second one a fleet's heartbeat TTL
// later hands those still without one to the dead-peer path, which resets
// their rows by owner, as the sweep does.
func (w *Worker) sweepOwners(ctx context.Context, s *ownerSweep, dryRun bool) (report.SweepReport, error) {
	rep := report.SweepReport{Swept: true, ByOwner: true}
	w.fleet.learnRecord(ctx)
	s.forget()
	defer s.forget()
	var first sweepReport
	if err := s.look(ctx, &first); err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	rep.Owners = slices.Sorted(maps.Keys(s.absentSince))
	rep.StuckOwners = rep.Owners
	rep.Gap = w.fleet.ttl()
	if dryRun || len(rep.Owners) == 0 {
		return rep, nil
	}
	if waited, err := waitGap(ctx, rep.Gap); !waited {
		return rep, err
	}
	var second sweepReport
	err := s.look(ctx, &second)
	rep.Waited = true
	for _, pr := range second.recovered {
		rep.RowsReset += pr.RowsReset
		rep.Quarantined += len(pr.Quarantined)
	}
	rep.StuckOwners = slices.Sorted(maps.Keys(s.absentSince))
	if err != nil {
		return rep, fmt.Errorf("backstop sweep: %w", err)
	}
	return rep, nil
}

// ownerPeersLive is the sweep's yield (rowSweep.yield): live members
// that announce owner mode (an owner-column rollout) hold rows no rows set
// lists, which a sweep by row version would take for stray rows, so it
// judges nothing then.
func ownerPeersLive(ctx context.Context, rs *rowSweep) error {
	var rep sweepReport
	yield, err := rs.yield(ctx, &rep)
	switch {
	case err != nil:
		return fmt.Errorf("backstop sweep: %w", err)
	case yield:
		return fmt.Errorf("backstop sweep by row version not run: live members announce owner mode (%s), and their rows are in no rows set; run it with the fleet's owner column",
			strings.Join(rep.ownerPeers, ", "))
	}
	return nil
}

// waitGap waits the sweep's gap and a tenth more (a TTL left that grew
// meanwhile, a live worker's set renewed, may lengthen the gap the second
// look computes), and reports whether it did: not when ctx would end
// first (then at once, with no error), nor when ctx ended meanwhile.
func waitGap(ctx context.Context, gap time.Duration) (bool, error) {
	wait := gap + gap/10
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
		return false, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return true, nil
	}
}

// unheld lists, sorted, the rows in progress that no set of held holds.
func unheld(ctx context.Context, rs *rowSweep, held map[int64]string) ([]int64, error) {
	dbCtx, cancel := context.WithTimeout(ctx, rs.opts.resetTimeout)
	rows, err := rs.resetter.InProgressRows(dbCtx)
	cancel()
	var ids []int64
	for _, r := range rows {
		if _, ok := held[r.ID]; !ok {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	return ids, err
}

// recoverNowKeeping is recoverNow, leaving the dead peers of keep
// registered and untouched (in the report's Skipped): recoveryctl keeps a
// dead instance that left no rows set while rows in progress that no
// worker holds are not accounted for, so the operator still sees it.
// Only a Worker never started has no loop that scans meanwhile.
func (w *Worker) recoverNowKeeping(ctx context.Context, keep []string) (report.RecoveryReport, error) {
	if w.state.Load() == stateRunning && len(keep) > 0 {
		return report.RecoveryReport{}, fmt.Errorf("%w: a scan keeping peers needs a Worker that is never started", ErrAlreadyStarted)
	}
	w.recov.keep = make(map[string]bool, len(keep))
	for _, id := range keep {
		w.recov.keep[id] = true
	}
	defer func() { w.recov.keep = nil }()
	return w.recoverNow(ctx)
}

// Package ops reaches the Worker's recovery through internal/bridge: the
// functions below are the only route from ops into the Worker's
// unexported code.
func init() {
	bridge.RecoverNow = func(ctx context.Context, w any) (report.RecoveryReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryReport{}, err
		}
		return wk.recoverNow(ctx)
	}
	bridge.PlanRecovery = func(ctx context.Context, w any) (report.RecoveryPlan, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryPlan{}, err
		}
		return wk.planRecovery(ctx)
	}
	bridge.SweepNow = func(ctx context.Context, w any, dryRun bool) (report.SweepReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.SweepReport{}, err
		}
		return wk.sweepNow(ctx, dryRun)
	}
	bridge.RecoverNowKeeping = func(ctx context.Context, w any, keep []string) (report.RecoveryReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryReport{}, err
		}
		return wk.recoverNowKeeping(ctx, keep)
	}
}

// bridged returns the Worker ops passed, refusing a nil one.
func bridged(w any) (*Worker, error) {
	wk, ok := w.(*Worker)
	if !ok || wk == nil {
		return nil, fmt.Errorf("%w: worker is nil", ErrInvalidConfig)
	}
	return wk, nil
}

// The dry run of a recovery scan (ops.PlanRecovery): what a scan would do
// now, changing nothing.

// planRecovery says what recoverNow would do now, changing nothing: it
// finds the dead peers as a scan does (registry, heartbeats, the age of
// the Redis node), reads each one's claim, incarnation and rows set as a
// recovery does, and asks the resetter, when it can do a dry run
// (ResetterInfo.DryRun), which rows a reset would actually change. It takes no claim, so a recovery
// running meanwhile may change the answer. Like recoverNow it may be
// called before Start; after Shutdown it returns ErrShutdown.
// ops.PlanRecovery calls it (ops.go).
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
	canPlan := p.info.DryRun
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
					op, err := p.resetter.PlanReset(resetCtx, PlanRequest{Owner: &OwnerReset{Owner: v}})
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
	rp, err := p.resetter.PlanReset(resetCtx, PlanRequest{Rows: &RowsReset{InstanceID: st.InstanceID,
		Incarnation: pp.Tracked.Incarnation, RowIDs: pp.Tracked.RowIDs, FromRowsSet: true}})
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
