package recovery

import (
	"errors"
	"log/slog"
)

// recoveryLog logs what the recovery loop does, once per outage: a scan that
// keeps failing, a peer that keeps failing or a garbage registry member is
// logged when it first appears and when it clears, not at every scan.
func newRecoveryLog(w *Worker) *recoveryLog {
	return &recoveryLog{w: w, failing: make(map[string]bool), invalid: make(map[string]bool)}
}

type recoveryLog struct {
	w            *Worker
	scanFailing  bool
	sweepFailing bool
	failing      map[string]bool // peers whose recovery failed last time
	invalid      map[string]bool // registry members already reported
}

func (l *recoveryLog) report(rep RecoveryReport, err error) {
	log := l.w.log
	var peerErrs []*PeerError
	var scanErr error
	for _, e := range unjoin(err) {
		var pe *PeerError
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
			log.Warn("recovery scan failed; will retry", slog.Any("error", scanErr))
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
	for _, peer := range rep.Dead {
		if !l.failing[peer] {
			log.Info("dead peer found: heartbeat expired", slog.String("peer_id", peer))
		}
	}
	for _, pe := range peerErrs {
		l.peerFailed(pe.InstanceID, pe.Err)
	}
	stillDead := make(map[string]bool, len(rep.Dead))
	for _, peer := range rep.Dead {
		stillDead[peer] = true
	}
	for _, pr := range rep.Recovered {
		l.peerRecovered(pr, "registry")
		l.recovered(pr, "registry")
	}
	for peer := range l.failing {
		if !stillDead[peer] {
			delete(l.failing, peer) // recovered by another worker, or back
		}
	}
	log.Debug("recovery scan done",
		slog.Int("peers_checked", rep.PeersChecked),
		slog.Int("peers_dead", rep.DeadPeers),
		slog.Int64("rows_reset", rep.RowsReset),
		slog.Duration("duration", rep.Duration))
}

// peerFailed logs a failed recovery of peer, once until it succeeds. Rows
// that could not be reset or were lost are at risk: Error; anything else
// (PostgreSQL down) is retried: Warn.
func (l *recoveryLog) peerFailed(peer string, err error) {
	if l.failing[peer] {
		return
	}
	l.failing[peer] = true
	switch {
	case errors.Is(err, ErrRowsSetLost):
		l.w.log.Error("rows set of dead peer vanished after its recovery failed: rows it held may stay in progress; the backstop sweep (owner column) recovers them",
			slog.String("peer_id", peer), slog.Any("error", err))
	case errors.Is(err, ErrRowsNotReset):
		l.w.log.Error("recovery of dead peer found rows it could neither reset nor show finished; its rows set is kept and retried: check the resetter's statuses and owner column",
			slog.String("peer_id", peer), slog.Any("error", err))
	default:
		l.w.log.Warn("recovery of dead peer failed; will retry",
			slog.String("peer_id", peer), slog.Any("error", err))
	}
}

// peerRecovered notes that peer's recovery succeeded.
func (l *recoveryLog) peerRecovered(pr PeerRecovery, source string) {
	if l.failing[pr.InstanceID] {
		l.w.log.Info("recovery of dead peer succeeded after failing", slog.String("peer_id", pr.InstanceID),
			slog.String("found_by", source))
		delete(l.failing, pr.InstanceID)
	}
}

// recovered logs the rows reset for one dead peer, and each row
// quarantined; source says which mechanism found the peer.
func (l *recoveryLog) recovered(pr PeerRecovery, source string) {
	attrs := []any{
		slog.String("peer_id", pr.InstanceID),
		slog.String("found_by", source),
		slog.Int("rows_found", pr.RowsFound),
		slog.Int64("rows_reset", pr.RowsReset),
		slog.Int("rows_quarantined", len(pr.Quarantined)),
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
		l.w.log.Debug("deregistered dead peer with no rows", attrs...)
		return
	}
	l.w.log.Info("recovered rows of dead peer", attrs...)
	for _, id := range pr.Quarantined {
		l.w.log.Warn("row quarantined: it reached its recovery limit",
			slog.Int64("row_id", id), slog.String("peer_id", pr.InstanceID))
	}
}

// sweepReport logs a backstop sweep.
func (l *recoveryLog) sweepReport(rep SweepReport, err error) {
	for _, e := range unjoin(err) {
		var pe *PeerError
		if errors.As(e, &pe) {
			l.w.log.Warn("backstop sweep: reset of absent owner failed; will retry",
				slog.String("peer_id", pe.InstanceID), slog.Any("error", pe.Err))
			continue
		}
		if !l.sweepFailing {
			l.w.log.Warn("backstop sweep failed; will retry", slog.Any("error", e))
		}
		l.sweepFailing = true
		return
	}
	l.sweepFailing = false
	for _, pr := range rep.Recovered {
		l.recovered(pr, "sweep")
	}
	l.w.log.Debug("backstop sweep done", slog.Bool("lease_held", rep.LeaseHeld),
		slog.Int("owners", rep.Owners), slog.Int("owners_absent", len(rep.Absent)))
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
