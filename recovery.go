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

	"github.com/redis/go-redis/v9"

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
	// RowsReset is the sum of RowsReset over Recovered and Failed.
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
	// NotReset lists rows that were neither reset nor shown to be settled
	// (see ResetResult.NotReset). The peer's rows set and registry entry
	// were kept, and the recovery returned an error wrapping
	// ErrRowsNotReset, so it is tried again by the next scan.
	NotReset []RowState
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
		if err != nil && rep.DeadPeers == 0 {
			w.stats.errors.Add(1) // the scan itself failed; peer failures are counted by recoverDead
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
		if err := ctx.Err(); err != nil {
			errs = append(errs, &PeerError{InstanceID: peer, Err: err})
			continue
		}
		pr, claimed, err := w.recoverDead(ctx, peer, "registry", noticed)
		switch {
		case err != nil:
			errs = append(errs, &PeerError{InstanceID: peer, Err: err})
			rep.Failed = append(rep.Failed, pr)
			rep.RowsReset += pr.RowsReset
		case !claimed:
			rep.Skipped = append(rep.Skipped, peer)
		default:
			rep.Recovered = append(rep.Recovered, pr)
			rep.RowsReset += pr.RowsReset
		}
	}
	return rep, errors.Join(errs...)
}

// recoverDead recovers one peer found dead by foundBy ("registry" or
// "expiry") and counts and emits what happened: the one path both take.
// A failure is counted and emitted here, and returned for the caller to
// report.
func (w *Worker) recoverDead(ctx context.Context, peer, foundBy string, noticed time.Time) (PeerRecovery, bool, error) {
	pr, claimed, err := w.recoverPeer(ctx, peer)
	w.countRows(pr) // rows reset before a failure are reset all the same
	if len(pr.NotReset) > 0 {
		w.stats.rowsNotReset.Add(uint64(len(pr.NotReset)))
		w.emit(Event{Kind: EventRowsNotReset, PeerID: peer, FoundBy: foundBy, Rows: pr.RowsFound,
			RowsReset: pr.RowsReset, RowsNotReset: len(pr.NotReset), Err: err})
	}
	if err != nil {
		w.stats.errors.Add(1)
		w.emit(Event{Kind: EventRecoveryFailed, PeerID: peer, FoundBy: foundBy, Err: err})
		return pr, claimed, err
	}
	if claimed && !pr.NoRecord {
		w.countRecovered(pr, foundBy, time.Since(noticed))
	}
	return pr, claimed, nil
}

// countRows counts the rows a recovery reset and quarantined.
func (w *Worker) countRows(pr PeerRecovery) {
	w.stats.rowsRecovered.Add(uint64(pr.RowsReset))
	w.stats.rowsQuarantined.Add(uint64(len(pr.Quarantined)))
}

// countRecovered counts and emits one peer's recovery; its rows are counted
// by countRows.
func (w *Worker) countRecovered(pr PeerRecovery, foundBy string, took time.Duration) {
	w.stats.peersRecovered.Add(1)
	w.emit(Event{Kind: EventRowsRecovered, PeerID: pr.InstanceID, FoundBy: foundBy,
		Rows: pr.RowsFound, RowsReset: pr.RowsReset, RowsQuarantined: len(pr.Quarantined), Duration: took})
}

// claimTTL is how long a recoverer may hold a dead peer (options.claimTTL).
func (w *Worker) claimTTL() time.Duration { return w.opts.claimTTL() }

// recoverPeer recovers one dead peer under a claim. claimed is false when
// the peer was left alone (alive again, or claimed by another worker).
//
// Each step survives a lost reply and a crash. The claim and finish
// scripts answer a retry as they answered the first call. A crash after
// the claim leaves it to expire (claim TTL); after the reset's COMMIT, the
// next recoverer finds the rows settled (owner guard) or recorded in the
// reset ledger, so it resets nothing twice; after Finish, only the
// deregistration is left, which the next scan does.
func (w *Worker) recoverPeer(ctx context.Context, peer string) (rep PeerRecovery, claimed bool, err error) {
	rep.InstanceID = peer
	k := keys.For(w.opts.keyPrefix, peer)
	token := newToken()
	parent := ctx // deregistering needs no claim, nor what is left of its time
	// Everything done under the claim ends before the claim can expire.
	ctx, cancel := context.WithTimeout(ctx, w.claimTTL())
	defer cancel()

	opCtx, opCancel := w.opContext(ctx)
	res, err := scripts.Claim.Run(opCtx, w.rdb, []string{k.Heartbeat, k.Claim, k.Rows, k.Incarnation},
		token, w.claimTTL().Milliseconds(), w.opts.rowsTTL.Milliseconds()).Int()
	opCancel()
	if err != nil {
		return rep, false, fmt.Errorf("claim: %w", err)
	}
	switch res {
	case scripts.ClaimTaken:
	case scripts.ClaimTakenNoRecord:
		rep.NoRecord = true
	case scripts.ClaimTakenLost:
		rep.NoRecord = true
		// An earlier recovery failed and the peer's record is gone since:
		// nothing in Redis says which rows it held any more. Deregister it
		// (there is nothing left to try) and say so loudly.
		if err := w.finish(ctx, parent, peer, k, token, &rep); err != nil {
			return rep, true, err
		}
		return rep, true, fmt.Errorf("%w: %s", ErrRowsSetLost, peer)
	default:
		return rep, false, nil
	}

	incarnation, members, err := w.readRows(ctx, k)
	if err != nil {
		w.releaseClaim(k.Claim, token)
		return rep, true, err
	}
	ids, bad := parseRowIDs(members)
	rep.RowsFound, rep.InvalidMembers = len(ids), bad

	if len(ids) > 0 {
		resetCtx, resetCancel := context.WithTimeout(ctx, w.opts.resetTimeout)
		res, err := resetRows(resetCtx, w.resetter, ResetRequest{InstanceID: peer, Incarnation: incarnation, RowIDs: ids})
		resetCancel()
		if err != nil {
			w.releaseClaim(k.Claim, token)
			return rep, true, fmt.Errorf("reset %d rows of %s: %w", len(ids), peer, err)
		}
		rep.RowsReset, rep.Quarantined, rep.NotReset = res.Reset, res.Quarantined, res.NotReset
		if len(res.NotReset) > 0 {
			// Forgetting the set now would lose these rows for good: keep it
			// and the registry entry, and try again at the next scan.
			w.releaseClaim(k.Claim, token)
			first := res.NotReset[0]
			return rep, true, fmt.Errorf("%w: %d of %d rows of %s (first: row %d has status %q)",
				ErrRowsNotReset, len(res.NotReset), len(ids), peer, first.ID, clip(first.Status))
		}
	}

	return rep, true, w.finish(ctx, parent, peer, k, token, &rep)
}

// finish runs the finish script and, if the peer is still dead,
// deregisters it (on parent: it needs no claim).
func (w *Worker) finish(ctx, parent context.Context, peer string, k keys.Keys, token string, rep *PeerRecovery) error {
	opCtx, opCancel := w.opContext(ctx)
	defer opCancel()
	fin, err := scripts.Finish.Run(opCtx, w.rdb, []string{k.Heartbeat, k.Rows, k.Claim, k.Incarnation},
		token, w.tombstoneTTL().Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("delete rows set after reset: %w", err)
	}
	switch fin {
	case scripts.FinishLost:
		// The claim expired, or the peer's heartbeat came back and
		// cancelled it: its rows set is left for the next scan.
		return fmt.Errorf("claim on %s was lost before the rows set could be deleted (it expired, or the peer came back)", peer)
	case scripts.FinishBack:
		rep.PeerCameBack = true
		return nil
	}
	return w.deregister(parent, peer)
}

// tombstoneTTL is how long a finished claim keeps its result for a retry
// of the finish script: longer than go-redis's retries of one call.
func (w *Worker) tombstoneTTL() time.Duration { return 2 * w.opts.opTimeout }

// readRowsBatch is how many members one SSCAN asks for. Small sets (up to
// 512 integers) come back whole in one call; a huge one is read in pieces,
// each under the operation timeout, so a dead peer with a million rows is
// still recovered and the server is never blocked for long.
const readRowsBatch = 10000

// readRows returns the incarnation of a peer's rows set ("" if it has
// none: a worker of an older version) and the set's members (without
// duplicates: SSCAN may repeat one).
func (w *Worker) readRows(ctx context.Context, k keys.Keys) (incarnation string, members []string, err error) {
	opCtx, cancel := w.opContext(ctx)
	incarnation, err = w.rdb.Get(opCtx, k.Incarnation).Result()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", nil, fmt.Errorf("read incarnation %s: %w", k.Incarnation, err)
	}
	members, err = w.scanSet(ctx, k.Rows)
	return incarnation, members, err
}

// scanSet returns the members of a set, read with SSCAN in pages.
func (w *Worker) scanSet(ctx context.Context, key string) ([]string, error) {
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
			return out, w.checkComplete(ctx, key, len(out))
		}
		cursor = next
	}
}

// checkComplete makes sure a set read in several SSCAN pages was read
// whole. An SSCAN cursor only means something on the node that issued it:
// should the key's slot migrate to another Cluster node between two pages
// (go-redis follows the MOVED or ASK), the cursor walks another hash table
// and may skip members, which Finish would then delete unread. A dead
// peer's set does not change under the claim, so fewer distinct members
// than SCARD means some were skipped: the read fails, and the next scan
// reads it again.
func (w *Worker) checkComplete(ctx context.Context, key string, read int) error {
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	card, err := w.rdb.SCard(opCtx, key).Result()
	if err != nil {
		return fmt.Errorf("count rows set %s: %w", key, err)
	}
	if int64(read) < card {
		return fmt.Errorf("read rows set %s: %d of its %d members read (its slot moved between pages?); read again at the next scan", key, read, card)
	}
	return nil
}

// releaseClaim gives the claim up after a failure so the next scan, by any
// worker, can try again at once instead of waiting out its TTL, and leaves
// a note that this recovery failed (scripts.Fail): if the peer's rows set
// is gone by the next try, that recoverer knows rows were lost. The note
// lives as long as a rows set renewed now. It runs on its own context: the
// recovery context may be the thing that ended.
func (w *Worker) releaseClaim(key, token string) {
	ctx, cancel := w.opContext(context.Background())
	defer cancel()
	note := satAdd(w.opts.rowsTTL, w.opts.recoveryInterval)
	if err := scripts.Fail.Run(ctx, w.rdb, []string{key}, token, note.Milliseconds()).Err(); err != nil {
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
	w.stats.peersDead.Add(1)
	w.emit(Event{Kind: EventPeerDead, PeerID: peer, FoundBy: "expiry"})
	pr, claimed, err := w.recoverDead(ctx, peer, "expiry", time.Now())
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		l.peerFailed(peer, err)
	case claimed:
		l.peerRecovered(pr, "expiry")
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
