//go:build sim || simmutants

package recovery

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// simProc is one process of the simulated fleet: a real Worker, its host
// loop, and its connections to the simulated Redis and PostgreSQL. A
// crashed process stays in the world, dead, for the invariants' sake.
type simProc struct {
	world *simWorld
	n     int    // process number
	id    string // instance ID
	w     *Worker
	conn  *simConn

	// Guarded by world.mu.
	dead        bool
	started     time.Time // when Start returned
	pausedUntil time.Time
	held        map[int64]bool   // rows fetched (committed) and not finished, released or given up
	heldAs      map[int64]string // the owner value (OwnerValue()) each held row was fetched under
	rolledBack  map[int64]bool   // rows whose fetch rolled back after they were tracked
	old         bool             // rollout: a worker of the release before the owner column (set at spawn)
	// The liveness witness (sim_witness_test.go): the subscriptions the
	// Worker made, until when their reconnection is refused (a cut
	// lasting), when the last connection was made, and whether a crash
	// leaves them half-open (a vanished host).
	subs       []*simSub
	subCutTill time.Time
	lastSub    time.Time
	halfOpen   bool

	deadCh   chan struct{} // closed at the crash
	hostStop context.CancelFunc
	hostDone chan struct{}
}

func (p *simProc) String() string { return fmt.Sprintf("%s#%d", p.id, p.n) }

// setsOwner reports whether p's fetch sets the owner column, its
// completion is guarded by it and its resetter fences by it.
func (p *simProc) setsOwner() bool { return p.world.table.fenced && !p.old }

// alive reports whether p has not crashed; the caller holds world.mu.
func (p *simProc) alive() bool { return p != nil && !p.dead }

// holdsLive reports whether p, alive, holds row id with a valid lease:
// the rows no recovery may touch. With the liveness witness, a worker
// whose last proof is older than its fence has no valid lease (CheckLease
// would wait). The caller holds world.mu.
func (p *simProc) holdsLive(id int64) bool {
	return !p.dead && p.held[id] && p.leaseOK()
}

// gate blocks while the process is paused (a frozen process does not
// see its deadlines pass), and reports a crash or a context that ended.
func (p *simProc) gate(ctx context.Context) error {
	w := p.world
	for {
		w.mu.Lock()
		until, dead := p.pausedUntil, p.dead
		w.mu.Unlock()
		if dead {
			return errSimDead
		}
		if !time.Now().Before(until) {
			return ctx.Err()
		}
		select {
		case <-time.After(time.Until(until)):
		case <-p.deadCh:
		}
	}
}

// frozen is gate for a call that must not block: it fails while the
// process is paused.
func (p *simProc) frozen(ctx context.Context) error {
	w := p.world
	w.mu.Lock()
	paused, dead := time.Now().Before(p.pausedUntil), p.dead
	w.mu.Unlock()
	switch {
	case dead:
		return errSimDead
	case paused:
		return fmt.Errorf("%w: i/o timeout (process paused)", errSimConn)
	}
	return ctx.Err()
}

var errSimDead = errors.New("sim: process crashed")

// simConn is a process's network: every Redis round trip and every
// PostgreSQL transaction draws its latency and faults from a stream of its
// own (per process and operation), so goroutines woken at one instant draw
// in no racy order.
type simConn struct {
	world     *simWorld
	proc      *simProc
	opTimeout time.Duration
	mu        sync.Mutex
	streams   map[string]*rand.Rand
	// When this process last took a claim on, and last read the rows set
	// of, each peer (at the server); guarded by world.mu.
	claimAt, readAt map[string]time.Time
}

// trace records a step of the process.
func (c *simConn) trace(format string, args ...any) {
	c.world.mu.Lock()
	defer c.world.mu.Unlock()
	c.world.tracef("%s "+format, append([]any{c.proc}, args...)...)
}

// draw runs f with the stream of op. It holds c.mu only while drawing.
func (c *simConn) draw(op string, f func(r *rand.Rand)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.streams[op]
	if !ok {
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%s/%d/%s", c.world.seed, c.proc.id, c.proc.n, op)
		a := h.Sum64()
		fmt.Fprintf(h, "/2")
		r = rand.New(rand.NewPCG(a, h.Sum64()))
		c.streams[op] = r
	}
	f(r)
}

// simSpike is the longest latency spike, while the faults strike.
const simSpike = 300 * time.Millisecond

// latency is one way of a round trip: mostly under 2ms, now and then a
// spike of up to 300ms; never a round number, so no two events of the
// simulation share an instant.
func latency(r *rand.Rand, spikes bool) time.Duration {
	d := 50*time.Microsecond + dur(r, 1500*time.Microsecond)
	if r.IntN(100) == 0 && spikes {
		d += dur(r, simSpike)
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// underLock are the operations the Worker sends while it holds its
// rows-set lock (inflight.assert): the heartbeat, Untrack's SREM and what
// follows it, the incarnation's rotation, Shutdown's clean-up. In a
// synctest bubble a goroutine waiting for a sync.RWMutex is not durably
// blocked, so fake time stands still while one waits: a holder that slept
// its latency on the fake clock would never wake. These operations take no
// fake time: they reach the server at the instant they are sent, and a
// paused process's call fails at once (as a frozen call times out) instead
// of blocking until the pause ends.
var underLock = map[string]bool{"beat": true, "rotate": true, "retrack": true, "untrack": true, "leave": true}

// roundTrip sends one command (or pipeline, or script) to Redis: effect
// runs atomically at the instant it reaches the server. A reply lost after
// the command ran is retried, as go-redis does (MaxRetries 3, with its
// backoff), unless ctx has ended.
func (c *simConn) roundTrip(ctx context.Context, op string, effect func(*simRedis)) error {
	w := c.world
	instant := underLock[op]
	for attempt := 0; ; attempt++ {
		if instant {
			if err := c.proc.frozen(ctx); err != nil {
				return err
			}
		} else if err := c.proc.gate(ctx); err != nil {
			return err
		}
		var req, reply, backoff time.Duration
		var lost bool
		spikes := w.faulty()
		c.draw(op, func(r *rand.Rand) {
			req, reply = latency(r, spikes), latency(r, spikes)
			// Once the faults stop, a lost reply is only ever lost once:
			// go-redis's retry gets through.
			lost = r.Float64() < w.lostReplies() && (attempt == 0 || spikes)
			backoff = dur(r, min(8*time.Millisecond<<attempt, 512*time.Millisecond))
		})
		if !instant {
			if err := sleepCtx(ctx, req); err != nil {
				return err
			}
		}
		if err := c.arrive(func() bool { return time.Now().Before(w.redis.downTill) }, errSimConn); err != nil {
			return err
		}
		w.redis.evict()
		effect(w.redis)
		if lost {
			w.tracef("%s redis %s: reply lost (attempt %d)", c.proc, op, attempt+1)
		}
		w.mu.Unlock()
		if !lost {
			if instant {
				return nil
			}
			if err := sleepCtx(ctx, reply); err != nil {
				return err
			}
			return c.proc.gate(ctx)
		}
		if attempt == 3 {
			return fmt.Errorf("%w: i/o timeout", errSimConn)
		}
		if !instant {
			if err := sleepCtx(ctx, backoff); err != nil {
				return err
			}
		}
	}
}

// arrive takes the world's lock at the instant a call reaches its server,
// unless the process has crashed or the server is down (down is called
// under the lock); on nil the caller holds the lock.
func (c *simConn) arrive(down func() bool, errDown error) error {
	w := c.world
	w.mu.Lock()
	switch {
	case c.proc.dead:
		w.mu.Unlock()
		return errSimDead
	case down():
		w.mu.Unlock()
		return fmt.Errorf("%w: connection refused", errDown)
	}
	return nil
}

// pg runs one PostgreSQL transaction: effect runs atomically at the
// instant it commits. The database may be down (nothing done), slow
// (more latency, so the caller's deadline may pass: nothing done), or,
// for commit, lose the acknowledgement of a COMMIT that took effect.
func (c *simConn) pg(ctx context.Context, op string, commit bool, effect func(*simTable)) error {
	return c.pgDelayed(ctx, op, commit, 0, effect)
}

// pgDelayed is pg with extra latency on the way to the server.
func (c *simConn) pgDelayed(ctx context.Context, op string, commit bool, extra time.Duration, effect func(*simTable)) error {
	w := c.world
	if err := c.proc.gate(ctx); err != nil {
		return err
	}
	var req, reply time.Duration
	var lostAck bool
	slow := w.pgSlow()
	spikes := w.faulty()
	c.draw(op, func(r *rand.Rand) {
		req, reply = latency(r, spikes)+time.Millisecond+extra, latency(r, spikes)
		if slow > 0 {
			req += dur(r, slow)
		}
		lostAck = commit && r.Float64() < w.lostAcks()
	})
	if err := sleepCtx(ctx, req); err != nil {
		return err
	}
	if err := c.proc.gate(ctx); err != nil {
		return err
	}
	if err := c.arrive(w.pgDown, errSimPG); err != nil {
		return err
	}
	effect(w.table)
	if lostAck {
		w.tracef("%s pg %s: COMMIT acknowledgement lost", c.proc, op)
	}
	w.mu.Unlock()
	if lostAck {
		return fmt.Errorf("commit: %w", errSimPG)
	}
	if err := sleepCtx(ctx, reply); err != nil {
		return err
	}
	return c.proc.gate(ctx)
}

// The host loop, as docs/safety.md §2 and §3 describe it: fetch a block
// with SKIP LOCKED, setting the status (and owner) and tracking the rows
// inside the fetch's transaction; process each row; complete it with the
// guarded UPDATE only while CheckLease is nil; Untrack it once its outcome
// is committed; Release what it will not finish once the lease is lost.
func (p *simProc) host(ctx context.Context) {
	var (
		r     = rand.New(rand.NewPCG(p.world.seed, uint64(p.n)<<32|0x705))
		fails = map[int64]int{}
	)
	pause := func(d time.Duration) bool {
		return sleepCtx(ctx, d) == nil && p.gate(ctx) == nil
	}
	for {
		if !pause(time.Duration(r.IntN(5_000_000)) + 100*time.Microsecond) {
			return
		}
		held := p.heldRows()
		if lerr := p.checkLease(); lerr != nil {
			if errors.Is(lerr, ErrShutdown) {
				return
			}
			if len(held) > 0 && (p.setsOwner() || p.world.table.ledger) {
				if err := p.w.Release(ctx, held...); err == nil {
					p.logf("host: lease lost (%v), released %v", lerr, held)
					p.drop(held...)
				}
			}
			if !pause(time.Duration(r.IntN(50_000_000)) + time.Millisecond) {
				return
			}
			continue
		}
		if len(held) == 0 {
			p.fetch(ctx, r)
			continue
		}
		id := held[0]
		if !pause(time.Duration(r.IntN(200_000_000)) + 10*time.Millisecond) { // processing
			return
		}
		// Without an owner column the backstop sweep must leave a row a
		// live worker holds for longer than the rows TTL alone: now and
		// then a row takes 5 to 10 s (drawn only in that mode, so other
		// seeds replay as before), while the faults strike.
		slowOdds, slowMin := 60, 5*time.Second
		if now := time.Now(); !now.Before(p.world.youngFrom) && now.Before(p.world.youngTill) {
			// The youngRedis class: rows that outlive the sweep's gap.
			slowOdds, slowMin = 3, 7*time.Second
		}
		if p.world.cfg.mode == "rows+sweep" && r.IntN(slowOdds) == 0 && time.Since(p.world.start) < simFaultEnd {
			d := slowMin + time.Duration(r.Int64N(int64(10*time.Second-slowMin)))
			p.logf("host: a slow row %d (%v)", id, d)
			if !pause(d) {
				return
			}
		}
		if p.checkLease() != nil {
			continue // the top of the loop gives the block back
		}
		changed, err := p.complete(ctx, id)
		switch {
		case err != nil && fails[id] < 3:
			fails[id]++
			p.logf("host: completion of row %d failed: %v", id, err)
			continue // tried again
		case err != nil:
			// Give it back rather than hold it for ever.
			if rerr := p.w.Release(ctx, id); rerr != nil {
				continue
			}
			p.logf("host: released row %d after failed completions", id)
		case changed:
			p.logf("host: row %d done", id)
		default:
			p.logf("host: row %d was recovered under it: result discarded", id)
		}
		delete(fails, id)
		_ = p.w.Untrack(id)
		p.drop(id)
	}
}

// fetch takes a block: lock queued rows, Track them, commit.
func (p *simProc) fetch(ctx context.Context, r *rand.Rand) {
	owner := p.w.OwnerValue() // once per block, before the fetch (docs/safety.md §2)
	ids, err := p.lockBlock(ctx, 1+r.IntN(6))
	if err != nil || len(ids) == 0 {
		if len(ids) > 0 {
			p.rollback(ids)
		}
		_ = sleepCtx(ctx, time.Duration(r.IntN(100_000_000))+time.Millisecond)
		return
	}
	// A Track that failed rolls the fetch back. (Track's doc says the
	// host may go on when only the Redis write failed, the next heartbeat
	// writing the rows: seed 19 showed a crash before that heartbeat
	// strands them in rows-set mode without the sweep.)
	if err := p.w.TrackAs(ctx, p.ownerValue(owner), ids...); err != nil {
		p.rollback(ids)
		_ = p.w.Untrack(ids...)
		return
	}
	if err := p.commitBlock(ctx, ids, owner); err != nil {
		p.logf("host: fetch of %v failed: %v", ids, err)
		_ = p.w.Untrack(ids...)
		return
	}
	p.world.mu.Lock()
	for _, id := range ids {
		p.held[id] = true
		p.heldAs[id] = owner
	}
	p.world.mu.Unlock()
	p.logf("host: fetched and tracked %v as %s", ids, owner)
}

// logf traces a step of the host; it takes the world's lock.
func (p *simProc) logf(format string, args ...any) {
	p.world.mu.Lock()
	defer p.world.mu.Unlock()
	p.world.tracef("%s "+format, append([]any{p}, args...)...)
}

func (p *simProc) heldRows() []int64 {
	p.world.mu.Lock()
	defer p.world.mu.Unlock()
	return slices.Sorted(maps.Keys(p.held))
}

func (p *simProc) drop(ids ...int64) {
	p.world.mu.Lock()
	defer p.world.mu.Unlock()
	for _, id := range ids {
		delete(p.held, id)
		delete(p.heldAs, id)
	}
}

// ownerValue is what TrackAs is told the block was fetched under: OwnerValue()
// for a host that sets the owner column, the instance ID for one that
// does not (a rollout's old worker, rows-set mode without a column).
func (p *simProc) ownerValue(owner string) string {
	if p.setsOwner() {
		return owner
	}
	return p.id
}

// heldOwner returns the owner value row id was fetched under.
func (p *simProc) heldOwner(id int64) string {
	p.world.mu.Lock()
	defer p.world.mu.Unlock()
	return p.heldAs[id]
}

// dur draws a duration in [0, d).
func dur(r *rand.Rand, d time.Duration) time.Duration { return time.Duration(r.Int64N(int64(d))) }
