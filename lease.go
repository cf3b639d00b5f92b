package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The lease is the worker's own view of its liveness (docs/safety.md). A
// heartbeat written at time t (taken before the write is sent) makes the
// key live until at least t + heartbeat TTL on the server, so until then no
// peer can find it dead. The lease ends a margin earlier, a tenth of the
// TTL, to allow for clock-rate differences and for the host to react.
//
// It is not to be confused with the fleet's two turns (the scan turn and
// the sweep turn, one worker at a time), nor with the claim a recoverer
// holds on a dead peer.

// leaseLength is how long after a heartbeat is sent the lease lasts: the
// TTL less the margin (a tenth of it). The one place the margin is written.
func leaseLength(ttl time.Duration) time.Duration { return ttl - ttl/10 }

// lease measures time on the monotonic clock from its epoch.
type lease struct {
	epoch  time.Time
	length time.Duration
	// until is the end of the lease, in nanoseconds since epoch; 0 before
	// the first heartbeat.
	until atomic.Int64
	// lost is set when the loss has been noted, so it is noted once.
	lost atomic.Bool
	// ousted is set, for good, when a heartbeat found the key holding
	// another process's value (heartbeat.go): the instance ID is not ours any
	// more, and neither are the rows tracked under it.
	ousted atomic.Bool
	// heldUntil, in nanoseconds since epoch, ends the hold after a lost
	// lease was regained (hold); regainedAt is when that regain was.
	heldUntil  atomic.Int64
	regainedAt atomic.Int64
	// movedOn is set when the host took rows (checkTrack) while rows held
	// at the last loss were still its own and no Block begun before that
	// loss was open: it has left them (lease.go). Each loss clears it
	// (markLeaseLost).
	movedOn atomic.Bool
	// blocks are the Blocks open now (rowtrack.go): the give-back waits for
	// those begun before the last loss.
	blocks openBlocks
	// perLife is set while the rows this worker takes carry per-life owner
	// values (owner mode, the host writing OwnerValue()): a recovery of a life
	// judged dead reaches none of the rows of a later life, so a regain
	// needs no hold (check). Cleared for good once the worker learns that
	// its host writes the bare instance ID (noteBareOwners).
	perLife atomic.Bool

	// What noting a loss touches (noteLeaseLoss, markLeaseLost), set by
	// New: the rows tracked, the counters, the events and the log.
	// releaseSafe is set when the host's Release is safe after a loss
	// (releaseSafeAfterLoss: owner fencing or the reset ledger), which
	// makes the loss sticky; newLives when a loss begins a new life
	// (owner mode).
	rows        *inflight
	stats       *counters
	events      *dispatcher
	log         *slog.Logger
	releaseSafe bool
	newLives    bool
}

func newLease(ttl time.Duration) lease {
	return lease{epoch: time.Now(), length: leaseLength(ttl)}
}

// renew extends the lease after a heartbeat sent at sentAt was written.
func (l *lease) renew(sentAt time.Time) {
	l.until.Store(int64(sentAt.Sub(l.epoch) + l.length))
}

// valid reports whether the lease has not ended.
func (l *lease) valid() bool {
	return int64(time.Since(l.epoch)) < l.until.Load()
}

// remaining is how long the lease has left (negative once it ended).
func (l *lease) remaining() time.Duration {
	return time.Duration(l.until.Load()) - time.Since(l.epoch)
}

// sinceRefresh is how long ago the last successful heartbeat was sent.
func (l *lease) sinceRefresh() time.Duration {
	sent := time.Duration(l.until.Load()) - l.length
	return time.Since(l.epoch) - sent
}

// hold keeps the lease counted as lost for d after a lost lease was
// regained. A recoverer may have claimed this worker while its heartbeat
// was gone; the heartbeat that came back cancels the claim, but a reset
// that recoverer already has under way still runs, for at most the claim
// TTL, and would reset rows this worker took meanwhile under its owner
// (model hole H1, docs/model.md). Taking no new rows for a claim TTL lets
// every such reset end first. With per-life owner values (perLife) the
// reset names the life it judged dead and never reaches rows of the new
// one: the hold is recorded but not counted, except for rows tracked under
// the bare instance ID (TrackAs).
func (l *lease) hold(d time.Duration) {
	now := time.Since(l.epoch)
	l.regainedAt.Store(int64(now))
	l.heldUntil.Store(int64(now + d))
}

// held reports whether the lease is held after a regain.
func (l *lease) held() bool {
	return int64(time.Since(l.epoch)) < l.heldUntil.Load()
}

// check reports errOusted for good once another process took the ID, and
// ErrLeaseLost while the lease has ended or its loss is noted and not yet
// followed by the hold (a heartbeat renews the lease just before
// heartbeater.restored holds it), while it is held after a regain,
// or while heldAtLoss rows (tracked when it was lost, or left to the sweep) are the host's:
// peers may have recovered those, and a host that went on with them would
// process them twice.
func (l *lease) check(heldAtLoss int) error {
	if l.ousted.Load() {
		return errOusted
	}
	if !l.valid() || l.lost.Load() || (l.held() && !l.perLife.Load()) || heldAtLoss > 0 {
		return ErrLeaseLost
	}
	return nil
}

// CheckLease reports whether the worker may go on processing rows: it
// returns nil while the last successful heartbeat is recent enough that no
// peer can consider this worker dead, ErrLeaseLost when it is not (the
// host should stop taking new rows and release the ones it has not
// finished), ErrNotStarted before Start and ErrShutdown after Shutdown.
//
// With owner fencing or the reset ledger (see Release), a lost lease stays
// lost after the heartbeat is back for as long as the rows tracked when it
// was lost are tracked: peers may have recovered them meanwhile (a worker
// resuming from a long pause sees its heartbeat succeed within
// milliseconds). Untrack or Release them (a Block's Close does) and the
// lease is valid again; the error names them. A host that does neither does
// not idle the worker: it gives them back itself, as Release would, half a
// heartbeat interval after the regain in owner mode with per-life owner
// values; otherwise once the hold below has ended and the host has moved
// on (it called Track, TrackAs or Begin for new rows since the loss) and
// every Block begun before the loss is closed (docs/safety.md §3).
// Rows a worker without an owner column left to the backstop sweep (its
// rows set was gone when its heartbeat came back, docs/safety.md §3) count
// among them: they are no longer written back, but the lease stays lost
// until the host releases or untracks them.
// With neither nothing safe can be done with those rows, and the lease is
// valid again with the next heartbeat.
//
// In rows-set mode, and in owner mode once the host was seen writing the
// bare instance ID instead of OwnerValue(), a lost lease that comes back is held
// for one recovery claim TTL (reset timeout + 3 × operation timeout) before
// CheckLease reports nil again: a peer that claimed this worker while it
// looked dead may still be resetting its rows, and rows taken meanwhile
// would be reset under it. In owner mode with per-life owner values the
// new life's rows are out of that reset's reach, and CheckLease reports nil
// as soon as a heartbeat has recorded the new life (docs/safety.md §3).
func (w *Worker) CheckLease() error { return w.lease.checkIn(&w.state) }

// checkIn is CheckLease for a worker in lifecycle state.
func (l *lease) checkIn(state *atomic.Int32) error {
	_, err := l.checkHeld(state)
	return err
}

// checkTrack is checkIn for a host that takes rows (Track, TrackAs,
// Begin): one that does so while rows held at the last loss are still its
// own has moved on from them (movedOn), which lets the worker give them
// back (lease.go); not while a Block begun before the loss is open (a
// goroutine may still be in one of its rows).
func (l *lease) checkTrack(state *atomic.Int32) error {
	held, err := l.checkHeld(state)
	if held && !l.blocks.openBefore(l.stats.leaseLosses.Load()) {
		l.movedOn.Store(true)
	}
	return err
}

// checkHeld is checkIn; held reports that the lease is back but for the
// rows held at the loss.
func (l *lease) checkHeld(state *atomic.Int32) (held bool, err error) {
	switch state.Load() {
	case stateNew:
		return false, ErrNotStarted
	case stateShutdown:
		return false, ErrShutdown
	}
	if n := l.rows.heldAtLoss(); n > 0 && !l.ousted.Load() && l.valid() && !l.lost.Load() {
		return true, l.heldErr(n) // back, but for the rows held at the loss: it names them
	}
	if err := l.check(0); err != nil {
		return false, err
	}
	if _, written := l.rows.writtenLife(); l.newLives && !written {
		return false, ErrLeaseLost // a new life no heartbeat has recorded yet (TrackAs refuses it)
	}
	return false, nil
}

// Healthy returns nil while the worker holds a valid heartbeat lease, and
// the reason otherwise (ErrNotStarted, ErrLeaseLost, ErrShutdown). It is
// meant for a liveness or readiness probe: a worker that keeps failing it
// cannot reach Redis and its rows are being recovered by peers. It also
// fails, with an error wrapping ErrMisconfigured, once the self-check found
// that the rows this worker tracks would not be recovered should it crash
// (statuses or owner column misconfigured), and with an error wrapping
// ErrUntrackedRows for a rows TTL after this worker was found to track
// rows after their COMMIT, or not at all (see ErrUntrackedRows). When
// several hold at once it returns them joined (errors.Join), lease first,
// so that errors.Is finds each: a lease lost during an outage does not
// hide a misconfiguration. A single reason is returned as it is.
func (w *Worker) Healthy() error {
	var errs []error
	for _, err := range []error{w.CheckLease(), w.checker.alarmErr(), w.untracked.err()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...) // nil when none
}

// noteBareOwners notes that this worker's rows carry its bare instance ID
// (the host writes InstanceID(), not OwnerValue()): from now on a regained lease
// is held (lease.hold). Logged once.
func (l *lease) noteBareOwners() {
	if !l.perLife.Swap(false) {
		return
	}
	l.log.Warn("the host writes the bare instance ID into the owner column, not OwnerValue(): every regained lease is held for a claim TTL (docs/safety.md §3); fetch and complete under OwnerValue() and pass it to TrackAs")
}

// The give-back: a worker whose lease was lost and came back gives the rows
// it held at the loss back itself, as Release would, once that is safe and
// the host has had its chance to do it. A host that abandons a block on
// ErrLeaseLost without Release (or whose goroutine holding the block
// returned early) would otherwise keep the lease lost, and the worker idle,
// for good: the rows held at the loss keep it lost (lease.check) until
// they are given back.
//
// It runs only where Release is safe after a loss (owner fencing or the
// reset ledger, releaseSafeAfterLoss): only there is a loss sticky and are
// rows held at it. When it is due:
//
//   - with per-life owner values (owner mode), half a heartbeat interval
//     after the regain: the reset names the ended life, so a completion the
//     host still commits under it is refused by the owner guard, a crash
//     leaves none of them in progress under it, and rows of the new life
//     are out of its reach;
//   - otherwise once the hold after the regain has ended (a claim TTL:
//     every recovery that claimed the worker while it looked dead has
//     ended) and the host has moved on: it called Track, TrackAs or Begin
//     (lease.checkTrack). A host still in the old block, one long row past
//     the hold, would otherwise go on with the next row once CheckLease
//     said nil, a row given back (its completion guarded by the status
//     only) or left to the backstop sweep (untracked: a crash would strand
//     it past the crash bound). The simulator found the latter (seed 721)
//     with a give-back at the end of the hold alone.
//
// The reset is Release's (the ledger skips a row a recovery already reset;
// owner fencing leaves a row someone else holds); rows left to the backstop
// sweep are only forgotten, as Release does.
type giver struct {
	deps    // the settings, the store, the log and the shared parts (worker.go)
	lease   *lease
	rows    *inflight
	tracker tracker
	// kick wakes the loop after a heartbeat that succeeded with rows held
	// at a loss (note).
	kick chan struct{}
}

func newGiver(d deps, l *lease, rows *inflight, t tracker) *giver {
	return &giver{deps: d, lease: l, rows: rows, tracker: t, kick: make(chan struct{}, 1)}
}

// note wakes the loop if rows held at a loss are still held: the heartbeat
// calls it after each success. It never blocks.
func (g *giver) note() {
	if g == nil {
		return
	}
	if g.rows.heldAtLoss() == 0 {
		return
	}
	g.wake()
}

// wake wakes the loop; it never blocks.
func (g *giver) wake() {
	if g == nil {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run gives back the rows held at a loss when they are due, until ctx is
// done. A give-back that fails is tried again a heartbeat interval later.
func (g *giver) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-t.C:
		}
		wait, due := g.due()
		if !due {
			continue // nothing held, or the lease is lost again: a heartbeat kicks
		}
		if wait > 0 {
			t.Reset(wait)
			continue
		}
		err := g.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			g.log.Warn("giving back the rows held when the lease was lost failed; retrying", slog.Any("error", err))
			t.Reset(g.opts.jitter("giveback", g.opts.heartbeatInterval, 0.1))
		}
		g.sig.gave.Signal(err) // test signal: a give-back ended
	}
}

// due reports whether rows held at a loss wait for the give-back, and how
// long until it is due (0 or less: now). Not while the lease is lost, nor
// once another process took the instance ID.
func (g *giver) due() (time.Duration, bool) {
	l := g.lease
	if g.rows.heldAtLoss() == 0 || l.ousted.Load() || l.lost.Load() || !l.valid() {
		return 0, false
	}
	end := l.heldUntil.Load()
	switch {
	case l.perLife.Load():
		end = l.regainedAt.Load() + int64(g.opts.heartbeatInterval/2)
	case !l.movedOn.Load() || l.blocks.openBefore(l.stats.leaseLosses.Load()):
		// The host may still be in the old block: a Track or Begin says
		// it left, and Close of every Block begun before the loss (which
		// wakes the loop).
		return 0, false
	}
	return time.Duration(end) - time.Since(l.epoch), true
}

// runOnce gives back the rows held at the last loss (Release's reset),
// bounded by the reset timeout.
func (g *giver) runOnce(ctx context.Context) error {
	ids := g.rows.heldAtLossIDs(0)
	if len(ids) == 0 {
		return nil
	}
	g.log.Warn("giving back rows held when the lease was lost: the host did not release them (defer Block.Close, or Release the rows of an abandoned block)",
		slog.Int("rows", len(ids)))
	ctx, cancel := context.WithTimeout(ctx, g.opts.resetTimeout)
	defer cancel()
	if err := g.tracker.release(ctx, ids); err != nil {
		return fmt.Errorf("give back %d rows held at a lost lease: %w", len(ids), err)
	}
	return nil
}

// heldAtLossIDs returns, in ID order, the rows heldAtLoss counts: at most
// n of them, or all with n 0.
func (s *inflight) heldAtLossIDs(n int) []int64 {
	s.mu.Lock()
	ids := append(members(s.stale), members(s.abandoned)...)
	s.mu.Unlock()
	slices.Sort(ids)
	if n > 0 && len(ids) > n {
		ids = ids[:n]
	}
	return ids
}

// heldErr is the lease's error while n rows held at the last loss are not
// given back: it names them and what gives them back.
func (l *lease) heldErr(n int) error {
	ids := l.rows.heldAtLossIDs(8)
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	list := strings.Join(s, ", ")
	if n > len(ids) {
		list += ", ..."
	}
	return fmt.Errorf("%w: %d rows held when it was lost are not given back yet (rows %s): Release them (Block.Close does); otherwise the worker gives them back itself once safe (docs/safety.md §3)",
		ErrLeaseLost, n, list)
}

// openBlocks are the Blocks open now, each with the worker's lease losses
// at its Begin.
type openBlocks struct {
	mu    sync.Mutex
	began map[*Block]uint64
}

// open registers b, begun now, and returns the lease losses so far.
func (o *openBlocks) open(b *Block, losses *atomic.Uint64) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := losses.Load()
	if o.began == nil {
		o.began = make(map[*Block]uint64)
	}
	o.began[b] = n
	return n
}

// close forgets b.
func (o *openBlocks) close(b *Block) {
	o.mu.Lock()
	delete(o.began, b)
	o.mu.Unlock()
}

// openBefore reports whether a Block begun before the losses-th lease loss
// is open.
func (o *openBlocks) openBefore(losses uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, n := range o.began {
		if n < losses {
			return true
		}
	}
	return false
}
