//go:build sim || simmutants

package recovery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The simulation's liveness witness (issue 34, witness.go): the pub/sub of
// the simulated Redis and the witness's commands, its fault classes, and
// its invariants.
//
// Each life's subscription lives on a simulated connection of its own
// (simSubConn, as the server holds it; simSub, as go-redis's PubSub holds
// it). The server counts a channel's subscribers over the connections it
// holds (PUBSUB NUMSUB). A connection the server closes (CLIENT KILL, a
// proxy cutting it, a Redis restart) is gone from the count at once; its
// client learns of it when the close reaches it, and re-makes it (go-redis
// reconnects and subscribes again) at its next call, unless reconnections
// are refused (Redis down, a partition of the subscriber connections). A
// PING is answered only while its connection is held by the server and
// the server is up; a paused process sends none and reads nothing. A
// killed process's connections are closed by its kernel: gone from the
// count at once; a vanished host's stay half-open: counted, and only the
// heartbeat TTL finds that worker.

// simSubConn is one subscriber connection as the server holds it.
type simSubConn struct {
	sub      *simSub
	channels map[string]bool
	// halfOpen: its client vanished without closing it (no FIN): the
	// server counts its subscriptions; nothing flows.
	halfOpen bool
}

// simSub is one life's subscription as the worker's client holds it
// (store.LifeSubscription).
type simSub struct {
	s        *simStore
	conn     *simSubConn // the connection; nil once the client knows it broke
	channels []string    // subscribed: what a reconnection subscribes again
	inbox    []simMsg    // replies on their way, in arrival order
	brokenAt time.Time   // when the server's close reaches the client; zero: none under way
	closed   bool
	wake     chan struct{} // a message or a close is on its way
}

// simMsg is a reply on a subscriber connection: it arrives at at.
type simMsg struct {
	at      time.Time
	conn    *simSubConn
	kind    int
	payload string
}

var _ store.LifeSubscription = (*simSub)(nil)

// numsub is PUBSUB NUMSUB of one channel.
func (r *simRedis) numsub(ch string) int64 {
	var n int64
	for c := range r.subConns {
		if c.channels[ch] {
			n++
		}
	}
	return n
}

// dropSubs closes every subscriber connection (a restart): each client
// learns of it a moment later.
func (r *simRedis) dropSubs() {
	for c := range r.subConns {
		if s := c.sub; s != nil && s.conn == c {
			s.closeReaches(time.Now().Add(500 * time.Microsecond))
		}
	}
	r.subConns = map[*simSubConn]bool{}
}

// closeReaches says the server closed s's connection; the client learns
// of it at at. The replies still on their way are lost. The caller holds
// world.mu.
func (s *simSub) closeReaches(at time.Time) {
	if s.brokenAt.IsZero() || at.Before(s.brokenAt) {
		s.brokenAt = at
	}
	now := time.Now()
	s.inbox = slices.DeleteFunc(s.inbox, func(m simMsg) bool { return m.at.After(now) })
	s.poke()
}

func (s *simSub) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// queue sends a reply on s's connection c, arriving after d (replies
// arrive in order). The caller holds world.mu.
func (s *simSub) queue(c *simSubConn, d time.Duration, kind int, payload string) {
	at := time.Now().Add(d)
	if n := len(s.inbox); n > 0 && at.Before(s.inbox[n-1].at) {
		at = s.inbox[n-1].at
	}
	s.inbox = append(s.inbox, simMsg{at: at, conn: c, kind: kind, payload: payload})
	s.poke()
}

// trip is one command on the subscriber connection: it reaches the server
// after a drawn latency, where effect runs under the world's lock; reply
// is the latency of the way back. Reconnections are refused while Redis
// is down or the process's subscriber connections are cut off.
func (s *simSub) trip(ctx context.Context, op string, effect func(r *simRedis, reply time.Duration) error) error {
	c := s.s.c
	w := c.world
	if err := c.proc.gate(ctx); err != nil {
		return err
	}
	var req, reply time.Duration
	spikes := w.faulty()
	c.draw("sub-"+op, func(r *rand.Rand) { req, reply = latency(r, spikes), latency(r, spikes) })
	if err := sleepCtx(ctx, req); err != nil {
		return err
	}
	refused := func() bool {
		now := time.Now()
		return now.Before(w.redis.downTill) || now.Before(c.proc.subCutTill)
	}
	if err := c.arrive(refused, errSimConn); err != nil {
		return err
	}
	defer w.mu.Unlock()
	return effect(w.redis, reply)
}

// reconnect makes a new connection and subscribes it to s's channels, as
// go-redis does at the first call after a broken one.
func (s *simSub) reconnect(ctx context.Context) error {
	p := s.s.c.proc
	return s.trip(ctx, "connect", func(r *simRedis, reply time.Duration) error {
		if s.closed {
			return errors.New("sim: redis: client is closed")
		}
		c := &simSubConn{sub: s, channels: map[string]bool{}}
		for _, ch := range s.channels {
			c.channels[ch] = true
		}
		r.subConns[c] = true
		s.conn, s.brokenAt, s.inbox = c, time.Time{}, nil
		p.lastSub = time.Now()
		for _, ch := range s.channels {
			s.queue(c, reply, store.LifeSubscribed, ch)
		}
		return nil
	})
}

// SubscribeLife subscribes to channel on a new connection; the
// confirmation comes through Receive.
func (s *simStore) SubscribeLife(ctx context.Context, channel string) (store.LifeSubscription, error) {
	sub := &simSub{s: s, channels: []string{channel}, wake: make(chan struct{}, 1)}
	w := s.c.world
	w.mu.Lock()
	s.c.proc.subs = append(s.c.proc.subs, sub)
	w.mu.Unlock()
	if err := sub.reconnect(ctx); err != nil {
		s.c.trace("witness subscribe %s: %v", channel, err)
		return nil, fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	s.c.trace("witness subscribed %s", channel)
	return sub, nil
}

// Receive waits up to timeout for a reply. A connection whose close has
// reached the client returns an error once; the next call reconnects.
func (s *simSub) Receive(ctx context.Context, timeout time.Duration) (int, string, error) {
	p := s.s.c.proc
	w := s.s.c.world
	deadline := time.Now().Add(timeout)
	for {
		if err := p.gate(ctx); err != nil { // a paused process reads nothing
			return store.LifeNothing, "", err
		}
		w.mu.Lock()
		now := time.Now()
		switch {
		case s.closed:
			w.mu.Unlock()
			return store.LifeNothing, "", errors.New("sim: redis: client is closed")
		case !s.brokenAt.IsZero() && !now.Before(s.brokenAt):
			s.conn, s.brokenAt, s.inbox = nil, time.Time{}, nil
			w.mu.Unlock()
			return store.LifeNothing, "", fmt.Errorf("%w: EOF", errSimConn)
		case s.conn == nil:
			w.mu.Unlock()
			if err := s.reconnect(ctx); err != nil {
				return store.LifeNothing, "", err
			}
			continue
		case len(s.inbox) > 0 && !now.Before(s.inbox[0].at):
			m := s.inbox[0]
			s.inbox = s.inbox[1:]
			w.mu.Unlock()
			return m.kind, m.payload, nil
		case !now.Before(deadline):
			w.mu.Unlock()
			return store.LifeNothing, "", nil
		}
		next := deadline
		if len(s.inbox) > 0 && s.inbox[0].at.Before(next) {
			next = s.inbox[0].at
		}
		if !s.brokenAt.IsZero() && s.brokenAt.Before(next) {
			next = s.brokenAt
		}
		w.mu.Unlock()
		t := time.NewTimer(time.Until(next))
		select {
		case <-s.wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return store.LifeNothing, "", ctx.Err()
		case <-p.deadCh:
			t.Stop()
			return store.LifeNothing, "", errSimDead
		}
		t.Stop()
	}
}

// Ping writes PING payload (reconnecting first if the connection is known
// broken); the server answers it if it gets it on a connection it holds.
func (s *simSub) Ping(ctx context.Context, payload string) error {
	c := s.s.c
	w := c.world
	if err := c.proc.gate(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	switch {
	case s.closed:
		w.mu.Unlock()
		return errors.New("sim: redis: client is closed")
	case !s.brokenAt.IsZero() && !time.Now().Before(s.brokenAt):
		// A write on a connection the server closed.
		s.conn, s.brokenAt, s.inbox = nil, time.Time{}, nil
		w.mu.Unlock()
		return fmt.Errorf("%w: broken pipe", errSimConn)
	case s.conn == nil:
		w.mu.Unlock()
		if err := s.reconnect(ctx); err != nil {
			return err
		}
		w.mu.Lock()
	}
	var req, reply time.Duration
	spikes := w.faulty()
	c.draw("sub-ping", func(r *rand.Rand) { req, reply = latency(r, spikes), latency(r, spikes) })
	// Answered if the server holds the connection and is up (a reply on
	// its way is lost if the server closes it meanwhile: closeReaches).
	if conn := s.conn; conn != nil && w.redis.subConns[conn] && !conn.halfOpen && !time.Now().Before(w.redis.downTill) {
		s.queue(conn, req+reply, store.LifePong, payload)
	}
	w.mu.Unlock()
	return nil
}

// Move subscribes the connection to channel and unsubscribes it from old.
// On a connection known broken it reconnects, subscribed to channel
// alone, as go-redis's Subscribe does; on one whose close has just
// reached the client it fails (the write's error), and the next call
// reconnects.
func (s *simSub) Move(ctx context.Context, old, channel string) error {
	w := s.s.c.world
	if err := s.s.c.proc.gate(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	switch {
	case s.closed:
		w.mu.Unlock()
		return errors.New("sim: redis: client is closed")
	case !s.brokenAt.IsZero() && !time.Now().Before(s.brokenAt):
		s.conn, s.brokenAt, s.inbox = nil, time.Time{}, nil
		w.mu.Unlock()
		return fmt.Errorf("subscribe to %s: %w: broken pipe", channel, errSimConn)
	case s.conn == nil:
		s.channels = []string{channel}
		w.mu.Unlock()
		if err := s.reconnect(ctx); err != nil {
			return fmt.Errorf("subscribe to %s: %w", channel, err)
		}
		return nil
	}
	w.mu.Unlock()
	return s.trip(ctx, "move", func(r *simRedis, reply time.Duration) error {
		c := s.conn
		if c == nil || !r.subConns[c] {
			return fmt.Errorf("subscribe to %s: %w", channel, errSimConn)
		}
		c.channels[channel] = true
		delete(c.channels, old)
		s.channels = []string{channel}
		s.queue(c, reply, store.LifeSubscribed, channel)
		s.queue(c, reply, store.LifeUnsubscribed, old)
		return nil
	})
}

// Close closes the connection: the server drops its subscriptions. A
// crashed process closes nothing (its kernel did, or did not: the crash
// decided).
func (s *simSub) Close() error {
	w := s.s.c.world
	w.mu.Lock()
	defer w.mu.Unlock()
	s.closed = true
	if c := s.conn; c != nil && !s.s.c.proc.dead {
		delete(w.redis.subConns, c)
	}
	s.conn = nil
	s.poke()
	return nil
}

// The simulated Redis runs the witness: a store without it would leave
// the witness off in every seed, silently.
var _ witnessStore = (*simStore)(nil)

// WitnessSupported: the simulated Redis is a standalone server.
func (s *simStore) WitnessSupported() bool { return true }

// WitnessAvailable: a standalone server sends nothing.
func (s *simStore) WitnessAvailable(context.Context) error { return nil }

// CountLives is PUBSUB NUMSUB and INFO's run_id in one round trip: one
// server, so every channel has its run.
func (s *simStore) CountLives(ctx context.Context, channels []string) ([]int64, []string, error) {
	counts := make([]int64, len(channels))
	var runID string
	err := s.c.roundTrip(ctx, "numsub", func(r *simRedis) {
		for i, ch := range channels {
			counts[i] = r.numsub(ch)
			if counts[i] == 0 {
				s.c.world.lastEmpty = time.Now()
			}
		}
		runID = r.runID
	})
	if err != nil {
		return nil, nil, fmt.Errorf("count the subscribers of %d life channels: %w", len(channels), err)
	}
	if empty := slices.Index(counts, 0); empty >= 0 {
		empties := len(counts) - len(slices.DeleteFunc(slices.Clone(counts), func(n int64) bool { return n == 0 }))
		s.c.trace("witness count: %d of %d lives without a subscriber (%s first)", empties, len(counts), channels[empty][len(defaultKeyPrefix):])
	}
	runIDs := make([]string, len(channels))
	for i := range runIDs {
		runIDs[i] = runID
	}
	return counts, runIDs, nil
}

// LifeHeld is CountLives of one channel. It draws from a stream of its
// own: the worker's witness sends it, and its judge counts, from two
// goroutines that a pause's end wakes at one instant.
func (s *simStore) LifeHeld(ctx context.Context, channel string) (bool, string, error) {
	var held bool
	var runID string
	err := s.c.roundTrip(ctx, "numsub-held", func(r *simRedis) { held, runID = r.numsub(channel) > 0, r.runID })
	if err != nil {
		return false, "", fmt.Errorf("count the subscribers of %s: %w", channel, err)
	}
	return held, runID, nil
}

// WriteWitness is writeWitnessScript.
func (s *simStore) WriteWitness(ctx context.Context, id string, m store.Witness, ttl time.Duration) (bool, error) {
	key := store.WitnessKey(s.prefix, id)
	w := s.c.world
	var judged bool
	err := s.c.roundTrip(ctx, "witness-write", func(r *simRedis) {
		v, _ := r.getStr(key)
		judged = v == store.WitnessJudged+m.Life
		if judged {
			return
		}
		if v != m.String() {
			w.markedAt[id] = time.Now()
		}
		r.set(key, m.String(), ttl)
	})
	if err != nil {
		return false, fmt.Errorf("write the witness marker: %w", err)
	}
	if judged {
		s.c.trace("witness marker of %s: judged", m.Life)
	}
	return judged, nil
}

// ReadWitnesses is a pipelined GET of each marker.
func (s *simStore) ReadWitnesses(ctx context.Context, ids []string) ([]string, error) {
	out := make([]string, len(ids))
	if len(ids) == 0 {
		return nil, nil
	}
	err := s.c.roundTrip(ctx, "witness-read", func(r *simRedis) {
		for i, id := range ids {
			out[i], _ = r.getStr(store.WitnessKey(s.prefix, id))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read %d witness markers: %w", len(ids), err)
	}
	return out, nil
}

// JudgeLife is judgeLifeScript; a verdict it lands is checked against the
// witness's invariants (simWorld.checkVerdict).
func (s *simStore) JudgeLife(ctx context.Context, id, value string, m store.Witness) (bool, error) {
	key := store.WitnessKey(s.prefix, id)
	judged := store.Witness{Life: m.Life, Judged: true}.String()
	w := s.c.world
	var ok bool
	err := s.c.roundTrip(ctx, "witness-judge", func(r *simRedis) {
		v, _ := r.getStr(key)
		switch {
		case v == judged:
			ok = true
		case v != value:
			ok = false
		default:
			ok = true
			w.checkVerdict(s.c.proc, id, m.Life) // on the markers as the judge counted them
			e := r.get(key)
			e.str = judged // KEEPTTL
			w.tracef("%s WITNESS judges %s life %s dead", s.c.proc, id, short(m.Life))
			w.verdicts++
			w.judgedAt[id+"/"+m.Life] = time.Now()
		}
	})
	if err != nil {
		return false, fmt.Errorf("mark the life judged: %w", err)
	}
	return ok, nil
}

// DropWitness is dropIfScript on the marker.
func (s *simStore) DropWitness(ctx context.Context, id, v string) error {
	key := store.WitnessKey(s.prefix, id)
	return s.c.roundTrip(ctx, "witness-drop", func(r *simRedis) {
		if cur, ok := r.getStr(key); ok && cur == v {
			r.del(key)
		}
	})
}

// TakeWitnessTurn is turnScript on the witness turn or its second.
func (s *simStore) TakeWitnessTurn(ctx context.Context, id string, second bool, ttl time.Duration) (store.TurnTake, error) {
	key := store.WitnessTurnKey(s.prefix)
	if second {
		key = store.WitnessSecondKey(s.prefix)
	}
	w := s.c.world
	held, err := s.takeTurnThen(ctx, "witness-turn", key, id, ttl, func(r *simRedis) {
		if v, _ := r.getStr(key); v == id && w.turnOf[key] != id {
			w.turnOf[key], w.turnSince[key] = id, time.Now()
		}
	})
	return store.TurnTake{Held: held}, err
}

// WitnessHolder is a GET of the turn and one of its holder's marker.
func (s *simStore) WitnessHolder(ctx context.Context) (string, string, error) {
	var holder, marker string
	err := s.c.roundTrip(ctx, "witness-holder", func(r *simRedis) { holder, _ = r.getStr(store.WitnessTurnKey(s.prefix)) })
	if err != nil || holder == "" {
		return "", "", err
	}
	err = s.c.roundTrip(ctx, "witness-holder-marker", func(r *simRedis) { marker, _ = r.getStr(store.WitnessKey(s.prefix, holder)) })
	return holder, marker, err
}

// WitnessTurnsTaken is EXISTS of the turn and its second.
func (s *simStore) WitnessTurnsTaken(ctx context.Context) (int64, error) {
	var n int64
	err := s.c.roundTrip(ctx, "witness-turns", func(r *simRedis) {
		for _, k := range []string{store.WitnessTurnKey(s.prefix), store.WitnessSecondKey(s.prefix)} {
			if r.exists(k) {
				n++
			}
		}
	})
	return n, err
}

// DropWitnessTurn is dropIfScript on the turn or its second.
func (s *simStore) DropWitnessTurn(ctx context.Context, holder string, second bool) error {
	key := store.WitnessTurnKey(s.prefix)
	if second {
		key = store.WitnessSecondKey(s.prefix)
	}
	return s.c.roundTrip(ctx, "witness-turn-drop", func(r *simRedis) {
		if v, ok := r.getStr(key); ok && v == holder {
			r.del(key)
		}
	})
}

// simMass is a mass disappearance: the subscriber connections of lives
// cut at one instant (lives: each process's life then).
type simMass struct {
	at    time.Time
	lives map[*simProc]string
}

// drawWitness draws the witness's timings and fault classes of an
// owner-mode run, from streams of their own (every other run replays as
// before): the defaults a third of the time, else a grace of 150 to
// 500 ms and a fence between a fifth and nine tenths of it (never under
// 10 ms); mass disappearances in half the runs, which then have at least
// five workers (a judge watches more than two others, crashes or not).
func drawWitness(seed uint64, cfg *simConfig, off bool) {
	if cfg.mode != "owner" {
		return
	}
	// A quarter of the owner-mode seeds run without it
	// (WithLivenessWitness(false)), as every one does with off: the
	// heartbeat's path, the backstop of every death the witness cannot
	// see, is simulated in owner mode too.
	if off || rand.New(rand.NewPCG(seed, 0x3479)).IntN(4) == 0 {
		return
	}
	r := rand.New(rand.NewPCG(seed, 0x3471))
	cfg.witness = true
	cfg.wGrace, cfg.wFence = defaultWitnessGrace, defaultWitnessFence
	if r.IntN(3) != 0 {
		cfg.wGrace = 150*time.Millisecond + dur(r, 350*time.Millisecond)
		lo := max(10*time.Millisecond, cfg.wGrace/5)
		cfg.wFence = lo + dur(r, cfg.wGrace*9/10-lo)
	}
	cfg.massCut = r.IntN(2) == 0
	if cfg.massCut {
		cfg.procs = max(cfg.procs, 5)
	}
}

// witnessPoll is how often a holder of the witness turn counts.
func (c simConfig) witnessPoll() time.Duration { return c.wGrace / 10 }

// witnessRunning reports whether p runs the liveness witness. The caller
// holds w.mu.
func (p *simProc) witnessRunning() bool {
	return !p.dead && p.w != nil && p.w.lease.witness != nil && !p.w.witness.off.Load()
}

// leaseOK is CheckLease without waiting for the witness's proof (Healthy's
// look at the lease): nil while the host may complete a row. The sim's
// invariants read it, under w.mu, where nothing may wait.
func (p *simProc) leaseOK() bool {
	return p.w.lease.checkIn(context.Background(), &p.w.state, false) == nil
}

// cutSubs closes p's subscriber connections at the server, and refuses
// their reconnection until till. The caller holds w.mu.
func (w *simWorld) cutSubs(p *simProc, till time.Time) int {
	n := 0
	for _, s := range p.subs {
		if c := s.conn; c != nil && w.redis.subConns[c] {
			delete(w.redis.subConns, c)
			s.closeReaches(time.Now().Add(300*time.Microsecond + time.Duration(p.n)*time.Microsecond))
			n++
		}
	}
	p.subCutTill = latest(p.subCutTill, till)
	w.lastCut = latest(w.lastCut, till)
	return n
}

// killSubs is what a crash does to p's subscriber connections: its kernel
// closes them (gone from the count at once), or, for a vanished host
// (p.halfOpen), they stay half-open. The caller holds w.mu.
func (w *simWorld) killSubs(p *simProc) {
	w.lastCut = latest(w.lastCut, time.Now())
	for _, s := range p.subs {
		if c := s.conn; c != nil && w.redis.subConns[c] {
			if p.halfOpen {
				c.halfOpen = true
			} else {
				delete(w.redis.subConns, c)
			}
		}
	}
	if p.halfOpen {
		w.tracef("FAULT %s's witness connection stays half-open (a vanished host)", p)
	}
}

// witnessFaults strikes the witness's fault classes at instants drawn from
// a stream of their own: a connection blip (CLIENT KILL: the worker
// resubscribes), a paused worker whose connection is cut meanwhile (and,
// half the time, not re-made for a while after the pause), and, in
// massCut runs, a mass disappearance (the subscriber connections of three
// or more workers closed at once and not re-made for up to 2 s more than
// the grace: a partition, a proxy restarting).
func (w *simWorld) witnessFaults(done chan<- struct{}) {
	defer close(done)
	r := w.wrng
	var at []time.Duration
	for n := 2 + r.IntN(6); n > 0; n-- {
		at = append(at, 300*time.Millisecond+dur(r, simFaultEnd-1500*time.Millisecond))
	}
	slices.Sort(at)
	kinds := []string{"blip", "blip", "cut-pause", "cut-pause"}
	if w.cfg.massCut {
		kinds = append(kinds, "mass", "mass")
	}
	end := w.start.Add(simFaultEnd - 200*time.Millisecond)
	for _, a := range at {
		time.Sleep(time.Until(w.start.Add(a))) // fake clock: the next witness fault's instant
		kind := kinds[r.IntN(len(kinds))]
		w.mu.Lock()
		var live []*simProc
		for _, p := range w.procs {
			if p.witnessRunning() && time.Now().After(p.pausedUntil) {
				live = append(live, p)
			}
		}
		if len(live) == 0 {
			w.mu.Unlock()
			continue
		}
		now := time.Now()
		switch kind {
		case "blip":
			p := live[r.IntN(len(live))]
			if w.cutSubs(p, now) > 0 {
				w.tracef("FAULT %s's witness connection closed by the server (a blip)", p)
			}
		case "cut-pause":
			p := live[r.IntN(len(live))]
			d := min(w.cfg.wFence+dur(r, 1500*time.Millisecond), end.Sub(now))
			till := now
			if r.IntN(2) == 0 {
				till = now.Add(d + dur(r, time.Second))
			}
			if d > 0 {
				p.pausedUntil = now.Add(d)
				till = earliest(till, end)
				w.cutSubs(p, till)
				w.tracef("FAULT %s paused for %v, its witness connection closed meanwhile (re-made from %.6fs)",
					p, d, till.Sub(w.start).Seconds())
			}
		case "mass":
			// Two times in three the turn's holder is spared (its second
			// may judge it: documented), so that the judge watches them.
			if holder := w.redis.getStr2(store.WitnessTurnKey(defaultKeyPrefix)); r.IntN(3) != 0 {
				live = slices.DeleteFunc(live, func(p *simProc) bool { return p.id == holder })
			}
			if len(live) < 3 {
				break
			}
			r.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
			live = live[:3+r.IntN(len(live)-2)]
			till := earliest(now.Add(w.cfg.wGrace+dur(r, 2*time.Second)), end)
			m := &simMass{at: now, lives: map[*simProc]string{}}
			for _, p := range live {
				m.lives[p] = p.w.rows.currentIncarnation()
				w.cutSubs(p, till)
			}
			w.masses = append(w.masses, m)
			w.tracef("FAULT mass disappearance: the witness connections of %v closed, not re-made until %.6fs", live, till.Sub(w.start).Seconds())
		}
		w.mu.Unlock()
	}
}

// checkVerdict checks a verdict the witness just landed (judge judged life
// of instance id) against the mass rule's invariant: no verdict against a
// live worker cut in a mass disappearance while more than two lives of
// that disappearance that the judge watches (others' lives, registered,
// marked on this run and not judged) are still cut, and more than a tenth
// of the lives marked; the documented exception is the second's verdict
// on the turn's holder (docs/safety.md §14). The caller holds w.mu.
func (w *simWorld) checkVerdict(judge *simProc, id, life string) {
	r := w.redis
	watched := func(p *simProc, l string) bool {
		m, ok := store.ParseWitness(r.getStr2(store.WitnessKey(defaultKeyPrefix, p.id)))
		return p.id != judge.id && ok && !m.Judged && m.Life == l && m.RunID == r.runID &&
			r.sismember(store.RegistryKey(defaultKeyPrefix), p.id)
	}
	marked := 0
	seen := map[string]bool{}
	for _, p := range w.procs {
		if seen[p.id] || p.id == judge.id {
			continue
		}
		seen[p.id] = true
		if m, ok := store.ParseWitness(r.getStr2(store.WitnessKey(defaultKeyPrefix, p.id))); ok && !m.Judged && m.RunID == r.runID {
			marked++
		}
	}
	for _, e := range w.masses {
		var target *simProc
		cut := 0
		for p, l := range e.lives {
			if p.lastSub.After(e.at) || !watched(p, l) {
				continue
			}
			cut++
			if p.id == id && l == life && !p.dead {
				target = p
			}
		}
		if target == nil || cut <= 2 || cut*10 <= marked {
			continue
		}
		turn, _ := r.getStr(store.WitnessTurnKey(defaultKeyPrefix))
		second, _ := r.getStr(store.WitnessSecondKey(defaultKeyPrefix))
		if second == judge.id && turn == id {
			w.tracef("%s judged the turn's holder %s, cut in a mass disappearance (its second: documented)", judge, target)
			continue
		}
		w.violate("%s judged live %s (life %s) in a mass disappearance at %.6fs, %d of its lives still cut",
			judge, target, short(life), e.at.Sub(w.start).Seconds(), cut)
	}
}

// getStr2 is getStr's value alone.
func (r *simRedis) getStr2(k string) string {
	v, _ := r.getStr(k)
	return v
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// simWitnessSlack is what the witness's bound allows beyond its counts for
// the round trips from the first count that finds the channel empty to
// the rows queued: that count, the count that judges, the compare-and-set,
// the two drops of the judged worker's turns and the reset's transaction.
// Once the faults stopped each takes at most 2 × 1.55 ms (no latency
// spikes; the transaction 1 ms more), or, with its reply lost once (lost
// replies go on 6 s past the faults), that again plus go-redis's first
// backoff (under 8 ms): 6 × (3.1 + 8 + 3.1) + 1 ms, rounded up.
const simWitnessSlack = 90 * time.Millisecond

// witnessBound is how soon after a kill that closes its connections a
// worker the witness watches alone has its rows queued again: the first
// count after the kill sees its channel empty (within a counting
// interval), the count a grace after that one judges it (within another
// interval), then the verdict and the reset (simWitnessSlack).
func (c simConfig) witnessBound() time.Duration {
	return c.wGrace + 2*c.witnessPoll() + simWitnessSlack
}

// witnessSettled reports whether a kill of p would be judged by the
// witness alone within witnessBound: p runs the witness, its marker names
// its life on this server run and has not changed for a grace and two
// counting intervals (its judge has read it), its judge (the turn's
// holder, or the second if p holds the turn) is a live worker holding its
// turn for as long, and every other marked life's channel is held (p's
// death alone is no mass disappearance).
func (w *simWorld) witnessSettled(p *simProc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.redis
	now := time.Now()
	calm := w.cfg.wGrace + 2*w.cfg.witnessPoll()
	held := func(q *simProc) (marked, ok bool) {
		m, valid := store.ParseWitness(r.getStr2(store.WitnessKey(defaultKeyPrefix, q.id)))
		if !valid || m.Judged || m.RunID != r.runID {
			return false, true
		}
		return true, r.numsub(store.LifeChannel(defaultKeyPrefix, q.id, m.Life)) > 0
	}
	if now.Before(w.start.Add(simFaultEnd + simSpike + 10*time.Millisecond)) {
		return false // a round trip sent before the faults ended may still be on its way (a spike)
	}
	if now.Sub(w.lastCut) < time.Second+calm || now.Sub(w.lastEmpty) < time.Second+calm {
		// A life gone in a mass disappearance, or one a count found gone,
		// may still be flagged by the judge, which then leaves a death
		// that comes meanwhile to the TTL (a life newly absent while a
		// disappearance goes on joins it).
		return false
	}
	if !p.witnessRunning() || now.Before(p.pausedUntil) || now.Sub(w.markedAt[p.id]) < calm {
		return false
	}
	m, _ := store.ParseWitness(r.getStr2(store.WitnessKey(defaultKeyPrefix, p.id)))
	if marked, ok := held(p); !marked || !ok || m.Life != p.w.rows.currentIncarnation() {
		return false
	}
	key := store.WitnessTurnKey(defaultKeyPrefix)
	if r.getStr2(key) == p.id {
		key = store.WitnessSecondKey(defaultKeyPrefix)
	}
	judge := r.getStr2(key)
	if judge == "" || w.turnOf[key] != judge || now.Sub(w.turnSince[key]) < calm {
		return false
	}
	found := false
	for _, q := range w.procs {
		if q == p {
			continue
		}
		if q.id == judge && q.witnessRunning() && !now.Before(q.pausedUntil) {
			found = true
		}
		if q.dead && slices.ContainsFunc(w.procs, func(o *simProc) bool { return o.id == q.id && !o.dead }) {
			continue // its instance ID lives on in another process
		}
		if _, ok := held(q); !ok {
			return false
		}
	}
	return found
}

// checkWitnessBound checks that victim, killed at killed with its
// connections closed, has its rows queued again within witnessBound (a
// row it held is queued again, done or quarantined), and notes how long
// it took.
func (w *simWorld) checkWitnessBound(victim *simProc, rows []int64, killed time.Time) {
	deadline := killed.Add(w.cfg.witnessBound())
	w.mu.Lock()
	w.tracef("WITNESS BOUND %s killed holding %v, its connection closed: queued again by %.6fs",
		victim, rows, deadline.Sub(w.start).Seconds())
	w.mu.Unlock()
	for {
		w.mu.Lock()
		var left []int64
		for _, id := range rows {
			if row := w.table.rows[id]; row.status == stInprog && row.taker == victim {
				left = append(left, id)
			}
		}
		if len(left) == 0 {
			w.detected = time.Since(killed)
			w.tracef("WITNESS BOUND %s's rows queued again %v after the kill", victim, w.detected)
			w.mu.Unlock()
			return
		}
		if !time.Now().Before(deadline) {
			w.violate("rows %v of %s, killed with its witness connection closed after the faults ended, still in progress %v after the kill (witness bound %v)",
				left, victim, time.Since(killed), w.cfg.witnessBound())
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		time.Sleep(time.Millisecond + 3*time.Microsecond) // fake clock: the next look at the victim's rows
	}
}

// simWitnessTally sums up the witness over the seeds TestSimulation runs:
// runs with the witness, verdicts, mass disappearances, and the bound
// check's kill-to-queued times (witnessBound).
var simWitnessTally witnessTally

type witnessTally struct {
	runs, verdicts, masses int
	detected               []time.Duration
	slowest                float64 // the largest share of its bound a kill took
}

func (t *witnessTally) add(w *simWorld) {
	if !w.cfg.witness {
		return
	}
	t.runs++
	t.verdicts += w.verdicts
	t.masses += len(w.masses)
	if w.detected > 0 {
		t.detected = append(t.detected, w.detected)
		t.slowest = max(t.slowest, float64(w.detected)/float64(w.cfg.witnessBound()))
	}
}

func (t *witnessTally) report() {
	if t.runs == 0 {
		return
	}
	line := fmt.Sprintf("simulation: witness in %d runs: %d verdicts, %d mass disappearances", t.runs, t.verdicts, t.masses)
	if n := len(t.detected); n > 0 {
		d := slices.Sorted(slices.Values(t.detected))
		line += fmt.Sprintf("; %d kills held to its bound: rows queued %v median, %v max after the kill (at most %.0f%% of the bound)",
			n, d[n/2].Round(time.Millisecond), d[n-1].Round(time.Millisecond), 100*t.slowest)
	}
	fmt.Fprintln(os.Stderr, line)
	*t = witnessTally{}
}

// witnessState describes p's witness for a violation's message: the age of
// its last proof against its fence. The caller holds w.mu.
func (p *simProc) witnessState() string {
	wt := p.w.witness
	if wt == nil || p.w.lease.witness == nil {
		return ""
	}
	age := time.Since(p.w.lease.epoch) - time.Duration(wt.proof.Load())
	return fmt.Sprintf(" (its witness's last proof %v ago, fence %v, stopped %v)", age.Round(time.Microsecond), wt.opts.witnessFence, wt.liftAt.Load() > 0)
}

// checkLease is the host's CheckLease, checked against the witness's
// first invariant (model/witness.pml's w1): no CheckLease called after
// the worker's life was judged passes in that life.
func (p *simProc) checkLease() error {
	called := time.Now()
	err := p.w.CheckLease()
	if err != nil || !p.world.cfg.witness {
		return err
	}
	life := p.w.rows.currentIncarnation()
	w := p.world
	w.mu.Lock()
	defer w.mu.Unlock()
	key := p.id + "/" + life
	at, ok := w.judgedAt[key]
	switch {
	case !ok || !at.Before(called) || p.dead:
	case w.redisUp.After(at) || w.redis.evictedAt[store.WitnessKey(defaultKeyPrefix, p.id)].After(at):
		if !w.judgedLost[key] {
			w.judgedLost[key] = true
			w.known[knownJudgedLost]++
			w.tracef("KNOWN %s goes on in life %s, judged at %.6fs: Redis lost the judged marker since (docs/safety.md §14)",
				p, short(life), at.Sub(w.start).Seconds())
		}
	default:
		w.violate("%s: CheckLease passed in life %s, which the witness judged dead at %.6fs%s",
			p, short(life), at.Sub(w.start).Seconds(), p.witnessState())
	}
	return nil
}
