package recovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The one path for a dead peer. Whoever finds a peer dead (the scan, an
// expiry notification, the backstop sweep, or Start finding a predecessor
// under its own ID) hands it to peerRecoverer.recoverDead, which runs the
// design's steps, each a small function below:
//
//	claim       store.ClaimDead: re-check the heartbeat, take the claim
//	read+reset  rows from the rows set if there is one (resetTracked), then,
//	            by owner (owner mode, the sweep), every row the peer still
//	            owns in PostgreSQL (resetOwned)
//	finish      store.FinishRecovery: delete the rows set if still dead
//	deregister  store.Deregister
//
// and counts, emits and logs what happened, the same way for every finder.
//
// Each step survives a lost reply and a crash. The claim and finish
// scripts answer a retry as they answered the first call. A crash after
// the claim leaves it to expire (claim TTL); after the reset's COMMIT, the
// next recoverer finds the rows settled (owner guard) or recorded in the
// reset ledger, so it resets nothing twice; after the finish, only the
// deregistration is left, which the next scan does.

// peerRecoverer is the dead-peer path: it recovers dead peers, each
// recovery under a claim of its own (peerRecovery), and counts, emits and
// logs what happened. The recovery loop (its scans, and the peers the
// expiry watcher hands it), the backstop sweep and Start share the one New
// builds, concurrently.
type peerRecoverer struct {
	deps     // the settings, the store, the log and the shared parts (worker.go)
	resetter Resetter
	// held answers, for the mode, who holds a dead peer's rows (the
	// tracker, rowtrack.go).
	held holdings
	// seen is what the scans remember of the dead peers they found
	// (recovery.go).
	seen deadSeen

	// What it needs of the other parts, set in New.

	// misconfigured returns the self-check's alarm, or nil (selfcheck.go).
	misconfigured func() error
	// unverifiedHold holds a suspect recovery while this worker's
	// configuration is unverified (selfcheck.go).
	unverifiedHold func(ctx context.Context, peer string, ids []int64) error
}

// Finders: which mechanism found a dead peer (Event.FoundBy, the found_by
// log attribute).
const (
	foundByScan    = "registry"
	foundByExpiry  = "expiry"
	foundBySweep   = "sweep"
	foundByRestart = "restart"
)

// recoverDead recovers one peer found dead by foundBy, noticed at noticed,
// and counts, emits and logs what happened. claimed is false when the peer
// was left alone (alive again, or claimed by another worker). A failure is
// counted, emitted and logged here, and returned for the caller's report.
func (p *peerRecoverer) recoverDead(ctx context.Context, peer, foundBy string, noticed time.Time) (report.PeerRecovery, bool, error) {
	return p.recoverDeadLives(ctx, peer, foundBy, noticed, nil)
}

// recoverDeadLives is recoverDead, resetting by owner also the owner values
// in lives (values of peer's lives the sweep saw in progress: owner.go).
func (p *peerRecoverer) recoverDeadLives(ctx context.Context, peer, foundBy string, noticed time.Time, lives []string) (report.PeerRecovery, bool, error) {
	// A worker whose self-check found its own configuration wrong
	// (statuses swapped or misspelt) would take the dead peer's rows in
	// progress for settled ones and drop its rows set: it takes no verdict,
	// and leaves the peer, set and all, to a worker configured right, or to
	// itself once fixed.
	if err := p.misconfigured(); err != nil && foundBy != foundByRestart {
		err = fmt.Errorf("recovery held: %w", err)
		p.stats.errors.Add(1)
		p.events.emit(Event{Kind: EventRecoveryFailed, PeerID: peer, FoundBy: foundBy, Err: err})
		p.rlog.peerFailed(peer, err)
		return report.PeerRecovery{InstanceID: peer}, false, err
	}
	if foundBy != foundByRestart { // Start's own predecessor is not a peer
		p.stats.peersDead.Add(1)
		p.events.emit(Event{Kind: EventPeerDead, PeerID: peer, FoundBy: foundBy})
	}
	r := &peerRecovery{p: p, peer: peer, foundBy: foundBy, noticed: noticed,
		byOwner: p.held.heldByOwner() || foundBy == foundBySweep || (foundBy == foundByRestart && p.sweepByOwner),
		token:   newToken(), lives: lives}
	r.rep.InstanceID = peer
	claimed, err := r.run(ctx)
	pr := r.rep
	p.countRows(pr) // rows reset before a failure are reset all the same
	// Rows left because another session held them locked are not a
	// misconfiguration: the failed recovery (an error wrapping
	// ErrRowsLocked) reports them, and the next scan retries them.
	// Rows that no longer exist (deleted since they were taken) are
	// neither: told apart, in Stats and the events.
	locked, refused, gone := lockedRows(pr.NotReset), refusedRows(pr.NotReset), len(pr.Gone)
	p.stats.rowsLocked.Add(uint64(locked))
	p.stats.rowsRefused.Add(uint64(refused))
	p.stats.rowsGone.Add(uint64(gone))
	if n := len(pr.NotReset) - locked; n > 0 {
		p.stats.rowsNotReset.Add(uint64(n))
		p.events.emit(Event{Kind: EventRowsNotReset, PeerID: peer, FoundBy: foundBy, Rows: pr.RowsFound,
			RowsReset: pr.RowsReset, RowsNotReset: n, RowsLocked: locked, RowsRefused: refused, RowsGone: gone, Err: err})
	}
	switch {
	case err != nil:
		if p.stats.countFailure(ctx) {
			p.events.emit(Event{Kind: EventRecoveryFailed, PeerID: peer, FoundBy: foundBy, Err: err,
				RowsLocked: locked, RowsRefused: refused, RowsGone: gone})
			p.rlog.peerFailed(peer, err)
		}
	case claimed:
		if !pr.NoRecord {
			p.stats.peersRecovered.Add(1)
			p.stats.noteRowsStuck(r.rowsStuck)
			p.events.emit(Event{Kind: EventRowsRecovered, PeerID: peer, FoundBy: foundBy,
				Rows: pr.RowsFound, RowsReset: pr.RowsReset, RowsQuarantined: len(pr.Quarantined),
				Duration: time.Since(noticed), StuckFor: r.rowsStuck, RowsGone: gone,
				RowIDs: sortedIDs(r.changed), QuarantinedIDs: sortedIDs(pr.Quarantined)})
		}
		if foundBy != foundByRestart { // Start logs its predecessor's recovery itself
			p.rlog.recovered(pr, foundBy, r.rowsStuck)
		}
	}
	return pr, claimed, err
}

// rowsStuck estimates how long a dead peer's rows were stuck, at the
// commit of their reset, sinceNoticed after its death was noticed. Nothing
// records a peer's last heartbeat, but its key was absent when the death
// was noticed, and every heartbeat sets the key's TTL to the full
// heartbeat TTL (the fleet's, which is this worker's): so the last
// heartbeat was at least a TTL before the death was noticed, and the rows
// were stuck at least TTL + sinceNoticed. The estimate is that lower
// bound. It is within milliseconds of the truth when an expiry
// notification found the peer; a scan or sweep notices up to 1.1 ×
// recovery interval + the scan lease after the expiry, which the estimate
// leaves out. A peer that shut down holding rows deleted its key rather
// than let it expire: then its rows were stuck for less, by up to a TTL.
func (p *peerRecoverer) rowsStuck(sinceNoticed time.Duration) time.Duration {
	return satAdd(p.opts.heartbeatTTL, sinceNoticed)
}

// countRows counts the rows a recovery reset and quarantined.
func (p *peerRecoverer) countRows(pr report.PeerRecovery) {
	p.stats.rowsRecovered.Add(uint64(pr.RowsReset))
	p.stats.rowsQuarantined.Add(uint64(len(pr.Quarantined)))
}

// peerRecovery is one recovery of one dead peer, under one claim token.
type peerRecovery struct {
	p       *peerRecoverer
	peer    string
	foundBy string
	noticed time.Time // when the death was noticed
	byOwner bool      // reset every row the peer owns (the sweep), not its rows set
	token   string
	rep     report.PeerRecovery
	// back is set when the peer came back between the claim and the read
	// of its rows set: nothing was reset.
	back bool
	// rowsStuck is how long the reset rows had been stuck (rowsStuck);
	// zero when none was reset.
	rowsStuck time.Duration
	// lives are owner values of the peer's lives the sweep saw in
	// progress (owner.go).
	lives []string
	// changed are the rows the resets changed, as the resetter listed
	// them (Event.RowIDs).
	changed []int64
	// life is the peer's incarnation, read under the claim (lifeRead);
	// confirmed is set once a claim sent after that read was still ours,
	// so the read was made while the peer was dead and names the life
	// judged dead, not one it began when it came back.
	life      string
	lifeRead  bool
	confirmed bool
}

// run takes the claim and, if it got it, resets, finishes and deregisters.
// Everything done under the claim ends before the claim can expire;
// deregistering needs no claim, and runs on ctx.
func (r *peerRecovery) run(ctx context.Context) (claimed bool, err error) {
	p := r.p
	claimCtx, cancel, res, err := r.takeClaim(ctx)
	if err != nil {
		return false, err
	}
	defer cancel()
	if !res.Taken() {
		return false, nil
	}
	p.events.emit(Event{Kind: EventPeerClaimed, PeerID: r.peer, FoundBy: r.foundBy, Duration: time.Since(r.noticed)})
	switch {
	case res == store.ClaimTakenLost && !r.byOwner:
		// An earlier recovery failed and the peer's record is gone since:
		// nothing in Redis says which rows it held any more. Deregister it
		// (there is nothing left to try) and say so loudly.
		r.rep.NoRecord = true
		if err := r.finish(claimCtx, ctx); err != nil {
			return true, err
		}
		return true, fmt.Errorf("%w: %s", ErrRowsSetLost, r.peer)
	case res != store.ClaimTaken && !r.byOwner:
		r.rep.NoRecord = true
		if n, at := p.seen.rowsSeen(r.peer); n > 0 {
			// A scan saw its rows set (this worker's, or any worker's
			// that renewed it: the rows-seen key), and it is gone without
			// a finish (which forgets the peer): it expired or was
			// evicted before the recovery. Nothing in Redis says which rows it held any
			// more; deregister it and say so loudly, as above.
			if err := r.finish(claimCtx, ctx); err != nil {
				return true, err
			}
			seen := "when a scan renewed it"
			if !at.IsZero() {
				seen = fmt.Sprintf("when a scan of this worker saw it %s ago", time.Since(at).Round(time.Millisecond))
			}
			return true, fmt.Errorf("%w: %s: its rows set, %d rows %s, expired or was evicted before its recovery",
				ErrRowsSetLost, r.peer, n, seen)
		}
	}

	if err := r.reset(claimCtx, res == store.ClaimTaken); err != nil {
		r.release()
		return true, err
	}
	if r.back {
		return false, nil // alive again: left alone, as if found alive at the claim
	}
	if r.byOwner && res != store.ClaimTaken && r.rep.RowsFound == 0 {
		r.rep.NoRecord = true // nothing in Redis, nothing owned: it died idle
	}
	sinceNoticed := time.Since(r.noticed)
	if r.rep.RowsReset > 0 {
		r.rowsStuck = p.rowsStuck(sinceNoticed)
	}
	p.events.emit(Event{Kind: EventRowsReset, PeerID: r.peer, FoundBy: r.foundBy, Rows: r.rep.RowsFound,
		RowsReset: r.rep.RowsReset, RowsQuarantined: len(r.rep.Quarantined), Duration: sinceNoticed,
		StuckFor: r.rowsStuck, RowIDs: sortedIDs(r.changed), QuarantinedIDs: sortedIDs(r.rep.Quarantined)})
	return true, r.finish(claimCtx, ctx)
}

// claimTries is how many times takeClaim sends the claim while its reply
// times out.
const claimTries = 3

// takeClaim is step 1, sent again with the same token while its reply
// times out: the claim may have run and only its reply come late, and
// go-redis does not retry after a deadline. Without this the recovery
// failed, and every later try (with a new token) found the claim held
// until its TTL ran out (simulation seed 619). A claim sent again with its
// token answers as the first call did, and renews the claim. The returned
// context bounds what is done under the claim: it started before the send
// that answered, so it ends no later than the claim.
//
// Before each retry the peer is judged again (deadPeers, with its
// restart and failover hold): the timeout may have come with a failover
// that lost the peer's return, and the claim script only checks the
// heartbeat key. When it gives up, it drops whatever it may hold
// (dropClaim), so the next recoverer need not wait out the claim.
func (r *peerRecovery) takeClaim(ctx context.Context) (context.Context, context.CancelFunc, store.ClaimResult, error) {
	for try := 1; ; try++ {
		claimCtx, cancel := context.WithTimeout(ctx, r.p.opts.claimTTL())
		res, err := r.claim(claimCtx)
		if err == nil {
			return claimCtx, cancel, res, nil
		}
		cancel()
		if try == claimTries || !isTimeout(err) || ctx.Err() != nil {
			if !store.IsReply(err) { // no answer: the claim may have run
				r.dropClaim()
			}
			return ctx, func() {}, res, redisSlow(r.p.opts.opTimeout, err)
		}
		if r.foundBy == foundByRestart {
			continue // this worker's own ID: Start judged it, and holds it
		}
		dead, jerr := r.p.judge.judgeDead(ctx, []string{r.peer}, r.foundBy == foundBySweep)
		if jerr != nil {
			r.dropClaim()
			return ctx, func() {}, res, err
		}
		if len(dead) == 0 {
			r.dropClaim()
			return ctx, func() {}, store.ClaimAlive, nil // alive, or not judged now: as if found so at the claim
		}
	}
}

// dropClaim gives up, on its own context, a claim this recovery could not
// confirm it took; a failure note the claim took over goes back.
func (r *peerRecovery) dropClaim() {
	p := r.p
	ctx, cancel := p.opts.opContext(context.Background())
	defer cancel()
	if err := p.store.DropClaim(ctx, r.peer, r.token, p.fleet.failureNoteTTL()); err != nil {
		p.rlog.claimNotReleased(r.peer, err)
	}
}

// isTimeout reports whether err is a deadline that ran out: the request
// may have been executed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// claim sends the claim: re-check that the heartbeat is absent and take
// the claim, renewing the rows set's TTL.
func (r *peerRecovery) claim(ctx context.Context) (store.ClaimResult, error) {
	p := r.p
	opCtx, cancel := p.opts.opContext(ctx)
	defer cancel()
	return p.store.ClaimDead(opCtx, r.peer, r.token, p.opts.claimTTL(), p.fleet.rowsTTL())
}

// reset is steps 2 and 3. A rows set, when the peer has one, is read and
// its rows reset under its incarnation, with the check that every row is
// reset or settled (a worker of rows-set mode, or of a release before owner
// mode). By owner (owner mode, the sweep), every row the peer still owns in
// progress is then reset, whatever Redis remembers.
func (r *peerRecovery) reset(ctx context.Context, hasSet bool) error {
	if hasSet || !r.byOwner {
		if err := r.resetTracked(ctx); err != nil {
			return err
		}
	}
	if r.byOwner {
		if err := r.confirmLife(ctx); err != nil || r.back {
			return err
		}
		return r.resetOwned(ctx)
	}
	return nil
}

// confirmLife reads the peer's incarnation, unless resetTracked did, and
// claims again: a heartbeat cancels the claim, and a worker writes a new
// life only with a heartbeat, so a claim still ours after the read means
// the life read is the one that died (owner.go). When the claim is gone the
// peer came back (r.back) and nothing more is reset.
func (r *peerRecovery) confirmLife(ctx context.Context) error {
	if !r.lifeRead {
		incarnation, _, err := r.p.store.ReadRows(ctx, r.peer)
		if err != nil {
			return err
		}
		r.life, r.lifeRead = incarnation, true
		if incarnation == "" && len(r.lives) == 0 && r.foundBy != foundByRestart && !mutantNoLifeListing {
			// Redis no longer has the peer's life (an evicted key): list
			// the lives of the peer in progress in the table instead, as
			// the sweep does. Each was written by a fetch committed before
			// this listing, made under the claim: a life the peer begins
			// later needs a heartbeat, which cancels the claim, and the
			// claim sent again below then finds it gone. A listing that
			// fails leaves those rows to the sweep, which judges them by
			// the instance's heartbeat; so does Start's recovery of its
			// own predecessor (its lives are ended ones of a live
			// instance once this worker's heartbeat records its own).
			lives, err := r.listLives(ctx)
			if err != nil {
				r.p.log.Warn("recovery: cannot list the lives of a dead peer in progress; its per-life rows are left to the backstop sweep",
					slog.String("peer_id", r.peer), slog.Any("error", err))
			}
			r.lives = lives
		}
	}
	if r.confirmed {
		return nil
	}
	return r.claimAgain(ctx)
}

// listLives returns the per-life owner values of the peer in progress in
// the table, read through the resetter's InProgressOwners (none when it
// does not fence by owner or cannot list the rows in progress).
func (r *peerRecovery) listLives(ctx context.Context) ([]string, error) {
	if !r.p.info.OwnerFencing || !r.p.info.ListsInProgress {
		return nil, nil
	}
	dbCtx, cancel := context.WithTimeout(ctx, r.p.opts.resetTimeout)
	owners, err := r.p.resetter.InProgressOwners(dbCtx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("list the lives of %s in progress (its life is not in Redis): %w", r.peer, err)
	}
	var out []string
	for _, o := range owners {
		if id, life, ok := parseOwner(o); ok && id == r.peer && life != "" {
			out = append(out, o)
		}
	}
	return out, nil
}

// claimAgain sends the claim again after a read made under it: still ours,
// the read was made whole while the peer was dead (confirmed); gone, the
// peer came back (back).
func (r *peerRecovery) claimAgain(ctx context.Context) error {
	again, err := r.claim(ctx)
	if err != nil {
		return err
	}
	if !again.Taken() {
		r.back = true
		return nil
	}
	r.confirmed = true
	return nil
}

// ownerValues are the owner values a reset by owner resets: the bare
// instance ID (workers that write it), the life read under the claim, and
// the lives the sweep saw. Never a life the peer began after the claim.
func (r *peerRecovery) ownerValues() []string {
	out := []string{r.peer}
	if r.life != "" && store.ValidateName(r.life) == nil {
		out = append(out, lifeOwner(r.peer, r.life))
	}
	for _, v := range r.lives {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// resetTracked reads the rows set and resets its rows under its
// incarnation.
func (r *peerRecovery) resetTracked(ctx context.Context) error {
	p := r.p
	incarnation, members, err := p.store.ReadRows(ctx, r.peer)
	if err != nil {
		return err
	}
	r.life, r.lifeRead = incarnation, true
	ids, bad := parseRowIDs(members)
	r.rep.RowsFound, r.rep.InvalidMembers = len(ids), bad
	if len(ids) == 0 {
		return nil
	}
	// The peer may have come back between the claim and the read: its
	// heartbeat cancelled the claim, and the set now lists rows it took
	// since, under a valid lease, which the owner guard cannot tell from
	// its old ones (found by the simulation, seed 530). Any heartbeat
	// cancels the claim, and a worker tracks nothing before a heartbeat
	// renews its lease, so a claim still ours after the read means the
	// set was read whole while the peer was dead. Claiming again is a
	// retry of our own call when nothing changed.
	if err := r.claimAgain(ctx); err != nil {
		return err
	}
	if r.back {
		r.rep.RowsFound = 0
		return nil
	}
	if r.foundBy != foundByRestart {
		if err := p.unverifiedHold(ctx, r.peer, ids); err != nil {
			return err
		}
	}
	resetCtx, cancel := context.WithTimeout(ctx, p.opts.resetTimeout)
	res, err := p.resetter.ResetRows(resetCtx, RowsReset{InstanceID: r.peer, Incarnation: incarnation, RowIDs: ids, FromRowsSet: true})
	cancel()
	if err != nil {
		// The peer is named by report.PeerError, and the PostgreSQL resetters' errors name
		// it too: one more "of <peer>" would repeat it.
		return fmt.Errorf("reset %d rows: %w", len(ids), err)
	}
	r.rep.RowsReset, r.rep.Quarantined, r.rep.NotReset, r.rep.Gone = res.Changed, res.Quarantined, res.NotReset, res.Gone
	r.changed = append(r.changed, res.ChangedIDs...)
	// Forgetting the set now would lose rows not reset for good: keep it
	// and the registry entry, and try again at the next scan.
	return notResetError(r.peer, len(ids), res.NotReset, p.info.OwnerFencing)
}

// notResetError returns nil when no row is left not reset, else an error
// wrapping ErrRowsNotReset that names the first such row, and also
// ErrRowsLocked when every one was left because another session held it
// locked (found is how many rows the reset looked at); fenced says the
// resetter knows owners, so a row without one is counted (noOwnerHint).
func notResetError(peer string, found int, notReset []RowState, fenced bool) error {
	if len(notReset) == 0 {
		return nil
	}
	locked, refused := lockedRows(notReset), refusedRows(notReset)
	if locked == len(notReset) {
		return fmt.Errorf("%w: %w: %d of %d rows of %s (first: row %d) are held by a transaction still open (retried at every scan; idle_in_transaction_session_timeout ends such a session)",
			ErrRowsNotReset, ErrRowsLocked, locked, found, peer, notReset[0].ID)
	}
	if refused > 0 {
		first := notReset[slices.IndexFunc(notReset, func(s RowState) bool { return s.Refused })]
		also, lockErr := "", error(nil)
		if locked > 0 {
			also, lockErr = fmt.Sprintf("; %d more held by a transaction still open", locked), ErrRowsLocked
		}
		if other := len(notReset) - locked - refused; other > 0 {
			also += fmt.Sprintf("; %d more neither reset nor settled", other)
		}
		return errors.Join(fmt.Errorf("%w: %w: %d of %d rows of %s (first: row %d) were refused by the database: a BEFORE UPDATE trigger returned NULL for them (retried at every scan; fix the trigger)%s",
			ErrRowsNotReset, ErrRowsRefused, refused, found, peer, first.ID, also), lockErr)
	}
	first := notReset[slices.IndexFunc(notReset, func(s RowState) bool { return !s.Locked })]
	return fmt.Errorf("%w: %d of %d rows of %s (first: row %d has status %q)%s",
		ErrRowsNotReset, len(notReset), found, peer, first.ID, clip(first.Status), noOwnerHint(notReset, fenced))
}

// noOwnerHint says, with a resetter that knows owners, how many of rows
// have no owner (and were not left for a lock), and what resets them:
// rows a worker took without setting the owner column are reset only under
// the reset ledger (docs/safety.md §2, "Rows without an owner").
func noOwnerHint(rows []RowState, fenced bool) string {
	if !fenced {
		return ""
	}
	n := 0
	for _, s := range rows {
		if s.Owner == "" && !s.Locked {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d without an owner: rows taken without setting the owner column are reset only under the reset ledger, create its table (docs/operations.md)", n)
}

// lockedRows counts the rows among notReset left because another session
// held them locked.
func lockedRows(notReset []RowState) int {
	return rowsThat(notReset, func(s RowState) bool { return s.Locked })
}

// refusedRows counts the rows among notReset the database refused to
// change (RowState.Refused).
func refusedRows(notReset []RowState) int {
	return rowsThat(notReset, func(s RowState) bool { return s.Refused })
}

// rowsThat counts the rows of rows for which is holds.
func rowsThat(rows []RowState, is func(RowState) bool) int {
	n := 0
	for _, s := range rows {
		if is(s) {
			n++
		}
	}
	return n
}

// resetOwned resets every row in progress the peer owns in PostgreSQL,
// and adds them to what resetTracked found.
func (r *peerRecovery) resetOwned(ctx context.Context) error {
	p := r.p
	if !p.info.OwnerFencing {
		return fmt.Errorf("%w: resetting rows by owner needs a resetter that fences by owner (Info().OwnerFencing); %T does not", ErrInvalidConfig, p.resetter)
	}
	resetCtx, cancel := context.WithTimeout(ctx, p.opts.resetTimeout)
	defer cancel()
	found, notReset := 0, []RowState(nil)
	for _, owner := range r.ownerValues() {
		res, err := p.resetter.ResetOwner(resetCtx, OwnerReset{Owner: owner})
		if err != nil {
			if owner != r.peer {
				return fmt.Errorf("reset by owner %s: %w", clip(owner), err)
			}
			return fmt.Errorf("reset by owner: %w", err) // report.PeerError names the peer
		}
		r.rep.RowsReset += res.Changed
		r.rep.Quarantined = append(r.rep.Quarantined, res.Quarantined...)
		r.changed = append(r.changed, res.ChangedIDs...)
		found += int(res.Changed) + len(res.NotReset) // quarantined rows included
		notReset = append(notReset, res.NotReset...)
	}
	r.rep.RowsFound += found
	r.rep.NotReset = append(r.rep.NotReset, notReset...)
	// Rows left in progress (another session holds them locked) keep the
	// peer registered, with the failure note, for the next scan.
	return notResetError(r.peer, found, notReset, true)
}

// finish is steps 4 and 5: the finish script and, if the peer is still
// dead, deregistration (on parent: it needs no claim).
func (r *peerRecovery) finish(ctx, parent context.Context) error {
	p := r.p
	opCtx, cancel := p.opts.opContext(ctx)
	fin, err := p.store.FinishRecovery(opCtx, r.peer, r.token, p.opts.tombstoneTTL())
	cancel()
	if err != nil {
		return err
	}
	switch fin {
	case store.FinishLost:
		// The claim expired, or the peer's heartbeat came back and
		// cancelled it: its rows set is left for the next scan.
		return fmt.Errorf("claim on %s was lost before the rows set could be deleted (it expired, or the peer came back)", r.peer)
	case store.FinishBack:
		r.rep.PeerCameBack = true
		p.seen.forget(r.peer)
		return nil
	}
	p.seen.forget(r.peer)
	return p.judge.deregister(parent, r.peer)
}

// release gives the claim up after a failure so the next scan, by any
// worker, can try again at once instead of waiting out its TTL, and leaves
// a note that this recovery failed: if the peer's rows set is gone by the
// next try, that recoverer knows rows were lost. The note lives as long as
// a rows set renewed now. It runs on its own context: the recovery context
// may be the thing that ended.
func (r *peerRecovery) release() {
	p := r.p
	ctx, cancel := p.opts.opContext(context.Background())
	defer cancel()
	if err := p.store.FailRecovery(ctx, r.peer, r.token, p.fleet.failureNoteTTL()); err != nil {
		p.rlog.claimNotReleased(r.peer, err)
	}
}

// sortedIDs returns a sorted copy of ids without duplicates, nil for none.
func sortedIDs(ids []int64) []int64 {
	if len(ids) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(ids)))
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

// newToken returns 32 random hex digits.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}
