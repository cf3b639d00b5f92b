package recovery

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

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
		l.log.Info("dead peer found: heartbeat expired", slog.String("peer_id", pr.InstanceID),
			slog.String("found_by", source))
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
			slog.Int("rows_refused", rep.strayRefused),
			slog.Int("rows_changed", rep.strayFound-int(rep.strayReset)-rep.strayLocked-rep.strayRefused))
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
