package recovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/alya/recovery/internal/keys"
	"github.com/alya/recovery/internal/scripts"
)

// RecoveryReport says what one recovery scan found and did.
type RecoveryReport struct {
	// PeersChecked is how many registered peers (other than this worker)
	// had their heartbeat checked.
	PeersChecked int
	// DeadPeers is how many of them had no heartbeat.
	DeadPeers int
	// Dead lists them.
	Dead []string
	// Recovered lists the dead peers whose recovery this scan completed.
	Recovered []PeerRecovery
	// Skipped lists dead peers left alone: another worker held the
	// recovery claim, or the heartbeat came back before the claim.
	Skipped []string
	// InvalidMembers lists registry members that are not valid instance
	// IDs. They are left in the registry and ignored.
	InvalidMembers []string
	// RowsReset is the sum of RowsReset over Recovered.
	RowsReset int64
	// Duration is how long the scan took.
	Duration time.Duration
}

// PeerRecovery says what recovery did for one dead peer.
type PeerRecovery struct {
	// InstanceID is the dead peer's ID.
	InstanceID string
	// RowsFound is how many row IDs its rows set held.
	RowsFound int
	// RowsReset is how many rows the RowResetter returned to the queue
	// (rows that had already finished are not counted).
	RowsReset int64
	// Quarantined lists rows that reached their recovery limit and were set
	// to the terminal status instead of queued (see WithMaxRecoveries).
	Quarantined []int64
	// InvalidMembers lists rows-set members that are not decimal int64 row
	// IDs; they were skipped.
	InvalidMembers []string
	// PeerCameBack is set when the peer's heartbeat reappeared during the
	// recovery: its rows set was kept (minus the rows reset) and it stays
	// registered.
	PeerCameBack bool
}

// PeerError is a recovery failure that concerns one peer. The peer's rows
// set and registry entry are kept, so the next scan tries again.
type PeerError struct {
	// InstanceID is the peer whose recovery failed.
	InstanceID string
	// Err is why.
	Err error
}

func (e *PeerError) Error() string { return "recover " + e.InstanceID + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *PeerError) Unwrap() error { return e.Err }

// RecoverNow runs one recovery scan now, bounded by ctx: it finds the
// registered peers whose heartbeat has expired and, for each, resets the
// rows in its rows set, then deletes the set and removes the peer from the
// registry. It may be called before Start (an operator tool that never
// heartbeats can use it) and concurrently with the background scans: a
// claim in Redis makes sure one dead peer is recovered by one worker.
//
// The error is nil when every dead peer was handled; otherwise it joins a
// *PeerError for each peer that failed, or reports why the scan itself
// failed. The report describes what was done either way.
func (w *Worker) RecoverNow(ctx context.Context) (RecoveryReport, error) {
	if w.state.Load() == stateShutdown {
		return RecoveryReport{}, ErrShutdown
	}
	return w.scan(ctx)
}

// scan is one recovery pass: the design's steps 1 to 6 for every dead peer.
// It counts and emits what it does; logging is the loop's (recoveryLog).
func (w *Worker) scan(ctx context.Context) (rep RecoveryReport, err error) {
	start := time.Now()
	defer func() {
		rep.Duration = time.Since(start)
		w.stats.scans.Add(1)
		if err != nil {
			w.stats.errors.Add(uint64(len(unjoin(err))))
		}
		w.emit(Event{Kind: EventScanFinished, PeersChecked: rep.PeersChecked,
			PeersDead: rep.DeadPeers, Duration: rep.Duration, Err: err})
	}()

	peers, invalid, err := w.registeredPeers(ctx)
	if err != nil {
		w.emit(Event{Kind: EventRecoveryFailed, Err: err})
		return rep, err
	}
	rep.InvalidMembers = invalid
	rep.PeersChecked = len(peers)
	dead, err := w.deadPeers(ctx, peers)
	if err != nil {
		w.emit(Event{Kind: EventRecoveryFailed, Err: err})
		return rep, err
	}
	noticed := time.Now()
	rep.DeadPeers, rep.Dead = len(dead), dead
	w.stats.peersDead.Add(uint64(len(dead)))
	for _, peer := range dead {
		w.emit(Event{Kind: EventPeerDead, PeerID: peer})
	}
	var errs []error
	for _, peer := range dead {
		err := ctx.Err()
		var pr PeerRecovery
		claimed := false
		if err == nil {
			pr, claimed, err = w.recoverPeer(ctx, peer)
		}
		switch {
		case err != nil:
			errs = append(errs, &PeerError{InstanceID: peer, Err: err})
			w.emit(Event{Kind: EventRecoveryFailed, PeerID: peer, Err: err})
		case !claimed:
			rep.Skipped = append(rep.Skipped, peer)
		default:
			rep.Recovered = append(rep.Recovered, pr)
			rep.RowsReset += pr.RowsReset
			w.countRecovered(pr, "registry", time.Since(noticed))
		}
	}
	return rep, errors.Join(errs...)
}

// countRecovered counts and emits one peer's recovery.
func (w *Worker) countRecovered(pr PeerRecovery, foundBy string, took time.Duration) {
	w.stats.peersRecovered.Add(1)
	w.stats.rowsRecovered.Add(uint64(pr.RowsReset))
	w.stats.rowsQuarantined.Add(uint64(len(pr.Quarantined)))
	w.emit(Event{Kind: EventRowsRecovered, PeerID: pr.InstanceID, FoundBy: foundBy,
		Rows: pr.RowsFound, RowsReset: pr.RowsReset, RowsQuarantined: len(pr.Quarantined), Duration: took})
}

// claimTTL is how long a recoverer may hold a dead peer (options.claimTTL).
func (w *Worker) claimTTL() time.Duration { return w.opts.claimTTL() }

// recoverPeer recovers one dead peer under a claim. claimed is false when
// the peer was left alone (alive again, or claimed by another worker).
func (w *Worker) recoverPeer(ctx context.Context, peer string) (rep PeerRecovery, claimed bool, err error) {
	rep.InstanceID = peer
	k := keys.For(w.opts.keyPrefix, peer)
	token := newToken()
	parent := ctx // deregistering needs no claim, nor what is left of its time
	// Everything done under the claim ends before the claim can expire.
	ctx, cancel := context.WithTimeout(ctx, w.claimTTL())
	defer cancel()

	opCtx, opCancel := w.opContext(ctx)
	res, err := scripts.Claim.Run(opCtx, w.rdb, []string{k.Heartbeat, k.Claim},
		token, w.claimTTL().Milliseconds()).Int()
	opCancel()
	if err != nil {
		return rep, false, fmt.Errorf("claim: %w", err)
	}
	if res != scripts.ClaimTaken {
		return rep, false, nil
	}

	members, err := w.readRows(ctx, k.Rows)
	if err != nil {
		w.releaseClaim(k.Claim, token)
		return rep, true, err
	}
	ids, bad := parseRowIDs(members)
	rep.RowsFound, rep.InvalidMembers = len(ids), bad

	if len(ids) > 0 {
		resetCtx, resetCancel := context.WithTimeout(ctx, w.opts.resetTimeout)
		res, err := resetRows(resetCtx, w.resetter, peer, ids)
		resetCancel()
		if err != nil {
			w.releaseClaim(k.Claim, token)
			return rep, true, fmt.Errorf("reset %d rows of %s: %w", len(ids), peer, err)
		}
		rep.RowsReset, rep.Quarantined = res.Reset, res.Quarantined
	}

	opCtx, opCancel = w.opContext(ctx)
	defer opCancel()
	fin, err := scripts.Finish.Run(opCtx, w.rdb, []string{k.Heartbeat, k.Rows, k.Claim}, token).Int()
	if err != nil {
		return rep, true, fmt.Errorf("delete rows set after reset: %w", err)
	}
	switch fin {
	case scripts.FinishLost:
		return rep, true, fmt.Errorf("claim on %s expired before the rows set could be deleted", peer)
	case scripts.FinishBack:
		rep.PeerCameBack = true
		if len(members) > 0 {
			pipe := w.rdb.Pipeline()
			for chunk := range slices.Chunk(members, readRowsBatch) {
				pipe.SRem(opCtx, k.Rows, toArgs(chunk)...)
			}
			if _, err := pipe.Exec(opCtx); err != nil {
				return rep, true, fmt.Errorf("remove reset rows from the set of returned peer: %w", err)
			}
		}
		return rep, true, nil
	}
	if err := w.deregister(parent, peer); err != nil {
		return rep, true, err
	}
	return rep, true, nil
}

// readRowsBatch is how many members one SSCAN asks for. Small sets (up to
// 512 integers) come back whole in one call; a huge one is read in pieces,
// each under the operation timeout, so a dead peer with a million rows is
// still recovered and the server is never blocked for long.
const readRowsBatch = 10000

// readRows returns the members of a rows set (without duplicates: SSCAN
// may repeat one).
func (w *Worker) readRows(ctx context.Context, key string) ([]string, error) {
	var (
		out    []string
		seen   map[string]struct{}
		cursor uint64
	)
	for {
		opCtx, cancel := w.opContext(ctx)
		page, next, err := w.rdb.SScan(opCtx, key, cursor, "", readRowsBatch).Result()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read rows set %s: %w", key, err)
		}
		if cursor == 0 && next == 0 {
			return page, nil // the whole set in one call: no repeats
		}
		if seen == nil {
			seen = make(map[string]struct{}, len(page))
		}
		for _, m := range page {
			if _, dup := seen[m]; !dup {
				seen[m] = struct{}{}
				out = append(out, m)
			}
		}
		if next == 0 {
			return out, nil
		}
		cursor = next
	}
}

// releaseClaim gives the claim up after a failure so the next scan, by any
// worker, can try again at once instead of waiting out its TTL. It runs on
// its own context: the recovery context may be the thing that ended.
func (w *Worker) releaseClaim(key, token string) {
	ctx, cancel := w.opContext(context.Background())
	defer cancel()
	if err := scripts.Release.Run(ctx, w.rdb, []string{key}, token).Err(); err != nil {
		w.log.Warn("release recovery claim; it expires by itself",
			slog.String("claim_key", key), slog.Any("error", err))
	}
}

// parseRowIDs splits rows-set members into row IDs (sorted) and the members
// that are not decimal int64s.
func parseRowIDs(members []string) (ids []int64, bad []string) {
	ids = make([]int64, 0, len(members))
	for _, m := range members {
		id, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			bad = append(bad, m)
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, bad
}

func toArgs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// runRecovery scans for dead peers at once and then every recovery interval
// (±10%) until ctx, which only Shutdown cancels, is done.
func (w *Worker) runRecovery(ctx context.Context) {
	w.log.Debug("recovery loop started", slog.Duration("interval", w.opts.recoveryInterval))
	defer w.log.Debug("recovery loop stopped")

	l := newRecoveryLog(w)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case peer := <-w.expired:
			w.recoverExpired(ctx, l, peer)
			continue
		case <-t.C:
		}
		w.recoveryTick(ctx, l)
		if ctx.Err() != nil {
			return
		}
		t.Reset(jitter(w.opts.recoveryInterval, 0.1))
	}
}

// recoverExpired recovers one peer whose heartbeat expiry Redis just
// announced. Every subscribed worker hears it; the claim lets one act.
func (w *Worker) recoverExpired(ctx context.Context, l *recoveryLog, peer string) {
	noticed := time.Now()
	w.stats.peersDead.Add(1)
	w.emit(Event{Kind: EventPeerDead, PeerID: peer, FoundBy: "expiry"})
	pr, claimed, err := w.recoverPeer(ctx, peer)
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		w.stats.errors.Add(1)
		w.emit(Event{Kind: EventRecoveryFailed, PeerID: peer, FoundBy: "expiry", Err: err})
		if !l.failing[peer] {
			l.failing[peer] = true
			w.log.Warn("recovery of dead peer failed; will retry",
				slog.String("peer_id", peer), slog.Any("error", err))
		}
	case claimed:
		delete(l.failing, peer)
		w.countRecovered(pr, "expiry", time.Since(noticed))
		w.log.Info("dead peer found: heartbeat expired", slog.String("peer_id", peer), slog.String("found_by", "expiry"))
		l.recovered(pr, "expiry")
	}
}

// recoveryTick is one turn of the recovery loop: the scan, if this worker
// holds the scan lease, then the backstop sweep if it is on.
func (w *Worker) recoveryTick(ctx context.Context, l *recoveryLog) {
	if w.takeScanLease(ctx) {
		rep, err := w.scan(ctx)
		if ctx.Err() != nil {
			return
		}
		l.report(rep, err)
	}
	if w.opts.sweep {
		srep, err := w.sweep(ctx)
		if ctx.Err() != nil {
			return
		}
		l.sweepReport(srep, err)
	}
}

// takeScanLease reports whether this worker should scan now. With the scan
// lease on (the default), one worker of the fleet scans per recovery
// interval: the first whose tick finds <prefix>_SCAN_LEASE free takes it
// for scanLeaseTTL, so the fleet's scan load stays that of one worker
// instead of growing with the square of its size. If Redis cannot be asked,
// the worker scans anyway: the scan reports the outage.
func (w *Worker) takeScanLease(ctx context.Context) bool {
	if !w.opts.scanLease {
		return true
	}
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	ok, err := w.rdb.SetNX(opCtx, keys.ScanLease(w.opts.keyPrefix), w.opts.instanceID, w.scanLeaseTTL()).Result()
	return ok || err != nil
}

// scanLeaseTTL is how long one worker's scan lease lasts
// (options.scanLeaseTTL).
func (w *Worker) scanLeaseTTL() time.Duration { return w.opts.scanLeaseTTL() }

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
	nowFailing := make(map[string]bool, len(peerErrs))
	for _, pe := range peerErrs {
		nowFailing[pe.InstanceID] = true
		if !l.failing[pe.InstanceID] {
			log.Warn("recovery of dead peer failed; will retry",
				slog.String("peer_id", pe.InstanceID), slog.Any("error", pe.Err))
		}
	}
	for _, pr := range rep.Recovered {
		l.recovered(pr, "registry")
	}
	l.failing = nowFailing
	log.Debug("recovery scan done",
		slog.Int("peers_checked", rep.PeersChecked),
		slog.Int("peers_dead", rep.DeadPeers),
		slog.Int64("rows_reset", rep.RowsReset),
		slog.Duration("duration", rep.Duration))
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
