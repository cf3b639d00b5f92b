package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

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
	lease   *lease
	rows    *inflight
	tracker tracker
	opts    *options // read-only: the heartbeat interval, the reset timeout
	log     *slog.Logger
	// kick wakes the loop after a heartbeat that succeeded with rows held
	// at a loss (note).
	kick chan struct{}
}

func newGiver(l *lease, rows *inflight, t tracker, opts *options, log *slog.Logger) *giver {
	return &giver{lease: l, rows: rows, tracker: t, opts: opts, log: log, kick: make(chan struct{}, 1)}
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
		g.opts.sig.gave.Signal(err) // test signal: a give-back ended
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
