package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The liveness witness (docs/safety.md §14): a death seen in under a second.
//
// The commonest deaths (an OOM kill, SIGKILL, a panic) leave the kernel to
// close the process's connections at once, and Redis drops a closed
// connection's subscriptions the moment it notices. So in owner mode each
// life of a worker holds a subscription to a channel of its own
// (store.LifeChannel) on a connection of its own, pings it every
// WitnessFence × 2/5, and writes a marker (store.Witness) naming the life,
// its grace, the server run and its connection's epoch. One worker of the
// fleet, the holder of the witness turn, counts the subscribers of every
// marked life (PUBSUB NUMSUB) every WitnessGrace / 10; another, its
// second, counts the holder's alone. A life whose channel
// had no subscriber at every count over its grace is judged dead: the
// judge swaps its marker for "judged <life>" (compare-and-set on the value
// it read) and resets the rows of that life by its owner value.
//
// Why a live worker is never judged by it:
//
//   - A blip (CLIENT KILL, a proxy closing both sides) is followed by a
//     reconnection within milliseconds (go-redis resubscribes), well within
//     the grace. A worker that reconnected writes its marker again with a
//     new epoch before anything else, so the judge's compare-and-set on the
//     value it read before fails even when its counts missed the
//     reconnection.
//   - A pause (SIGSTOP, a long GC) closes no connection: the subscription
//     stays.
//   - A Redis restart or failover is another server run: a marker names the
//     run it was written on, and the judge judges only markers of the run
//     it counts on. Many lives gone at once (more than two and more than a
//     tenth of those watched: a partition, a proxy restarting) are left to
//     the heartbeat TTL.
//
// And why a worker that is judged has stopped first (the inequality New
// enforces, WitnessFence < WitnessGrace): the worker takes only the answer
// to a PING sent after its marker of the current epoch was written as
// proof that its channel is held, and its lease (CheckLease, Track,
// TrackAs, Begin) refuses work once the last proof was sent more than
// WitnessFence ago. A judge's counts see the channel empty only after the
// epoch's subscription ended, so after every proof of it; its verdict
// comes a grace (the longer of its own and the marker's) after its first
// empty count. The worker thus stopped taking work WitnessGrace −
// WitnessFence before any verdict. After a reconnection it reads its
// marker: "judged" ends the life (a lease loss: OwnerValue changes, rows of
// the judged life are given back), anything else lets it go on.
//
// On a Redis 7 Cluster the channel is a shard channel (SSUBSCRIBE) in the
// slot of the instance's keys, so on their master; each channel is
// counted on its master (PUBSUB SHARDNUMSUB), judged against that
// master's run, and marked with it. A slot that leaves the master (a
// resharding) ends the subscription (sunsubscribe): no proof until the
// life subscribed on the new master and marked its run. A failover within
// the shard may leave it on the demoted master, where no judge counts it;
// the marker's renewal finds the channel on another run and subscribes
// anew. Before Redis 7 (no shard channels) Start turns the witness off.
//
// The heartbeat TTL stays the backstop for what a closed connection does
// not show (a vanished host, a hung process, a partition; a Cluster
// before Redis 7, a Ring, where it does not run), and
// the recovery of a judged life by its owner value is idempotent with the
// dead-peer path that follows when its heartbeat expires.

// Default witness timings (Timings.WitnessGrace, Timings.WitnessFence).
const (
	defaultWitnessGrace = 500 * time.Millisecond
	defaultWitnessFence = 250 * time.Millisecond
)

// foundByWitness: a life judged dead by the witness (Event.FoundBy).
const foundByWitness = "witness"

// witnessStore is what the witness says to Redis (store.Redis; the
// simulator's in-memory store, sim_store_test.go).
type witnessStore interface {
	WitnessSupported() bool
	WitnessAvailable(ctx context.Context) error
	SubscribeLife(ctx context.Context, channel string) (store.LifeSubscription, error)
	CountLives(ctx context.Context, channels []string) ([]int64, []string, error)
	LifeHeld(ctx context.Context, channel string) (bool, string, error)
	WriteWitness(ctx context.Context, id string, w store.Witness, ttl time.Duration) (bool, error)
	ReadWitnesses(ctx context.Context, ids []string) ([]string, error)
	JudgeLife(ctx context.Context, id, value string, w store.Witness) (bool, error)
	DropWitness(ctx context.Context, id, v string) error
	TakeWitnessTurn(ctx context.Context, id string, second bool, ttl time.Duration) (store.TurnTake, error)
	WitnessHolder(ctx context.Context) (string, string, error)
	WitnessTurnsTaken(ctx context.Context) (int64, error)
	DropWitnessTurn(ctx context.Context, holder string, second bool) error
}

// witnessPing is how often a life pings its channel's connection.
func (o *options) witnessPing() time.Duration { return o.witnessFence * 2 / 5 }

// witnessPoll is how often the witness turn's holder counts subscribers.
func (o *options) witnessPoll() time.Duration { return o.witnessGrace / 10 }

// witnessTurnTTL is how long the witness turn and its second outlive
// their holders' last renewal (every half grace). A judged worker's turn
// is freed at once by its judge; the TTL counts only when both die.
func (o *options) witnessTurnTTL() time.Duration { return 2 * o.witnessGrace }

// errWitnessStale is the fence: no proof for longer than WitnessFence.
var errWitnessStale = errors.New("liveness witness: Redis has not answered this worker's ping within the fence (a peer could judge it dead)")

// lifeWitness is the worker's own side: its subscription, its pings, its
// marker, and the proof the lease reads (fresh).
type lifeWitness struct {
	deps
	ws    witnessStore
	rows  *inflight
	lease *lease
	// kick asks the heartbeat loop for a heartbeat now: a life ended by a
	// verdict is replaced at once.
	kick func()

	sub     store.LifeSubscription
	channel string
	life    string
	epoch   int
	marker  store.Witness // the marker written for this epoch; Life "" before
	sent    store.Witness // the last marker sent, whatever its reply
	// renewedAt is when the marker was last written (renewed every third
	// of the TTL); progress is when the witness last got a proof or
	// subscribed anew (the watchdog in run starts over from it).
	renewedAt time.Time
	progress  time.Time
	// writtenTill is when the last marker written in this life may
	// expire at the latest (the send time of its last successful write +
	// its TTL): a "judged" marker keeps that TTL.
	writtenTill time.Time

	// proof is the send time (ns since the lease's epoch) of the last ping
	// answered after this epoch's marker was written (markedAt); 0 for
	// none.
	proof    atomic.Int64
	markedAt atomic.Int64
	mu       sync.Mutex
	proved   chan struct{} // closed and replaced at each proof
	// off is set when the witness stopped for good (Shutdown).
	off atomic.Bool
	// liftAt, once the witness stopped while the worker runs (a panic,
	// SUBSCRIBE refused for good), is when the fence lifts (ns since the
	// lease's epoch): at once if the marker was dropped, else when it
	// expires; 0 while the witness runs. panicked and refused say why it
	// stopped; written is the last marker whose write succeeded, and
	// judgedLife a life a peer judged (no marking until the next).
	liftAt     atomic.Int64
	panicked   bool
	refused    int
	written    store.Witness
	judgedLife string
	// killed makes stop leave the marker, as a killed process does (the
	// tests' crash).
	killed atomic.Bool
}

// startOwnWitness starts w's side of the witness, if it runs, and reports
// whether it did; the lease's fence reads it from then on. A failure is
// logged: the worker goes on with the heartbeat TTL alone.
func startOwnWitness(ctx context.Context, w *Worker) bool {
	if w.witness == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.opTimeout)
	defer cancel()
	if err := w.witness.ws.WitnessAvailable(ctx); errors.Is(err, store.ErrWitnessUnsupported) {
		// A Cluster before Redis 7 (no shard channels): off for this
		// worker's whole run, both sides; decided here once.
		w.log.Warn("liveness witness off: a Redis Cluster master has no shard channels (Redis 7 needed); a death of a worker is seen when its heartbeat expires (docs/safety.md §14)",
			slog.Any("error", err))
		w.witness, w.watch = nil, nil
		return false
	}
	running, err := startWitness(ctx, w.witness)
	switch {
	case err == nil:
	case running:
		// A marker may be in Redis (its reply was lost) and could not be
		// dropped: a peer may judge this life, so the witness runs, and
		// fences the worker, until it is established.
		w.log.Warn("liveness witness not established at Start; this worker takes no rows until it is (docs/safety.md §14)",
			slog.Any("error", err))
	default:
		w.log.Warn("liveness witness unavailable: a death of this worker is seen when its heartbeat expires, not at once (docs/safety.md §14)",
			slog.Any("error", err))
		return false
	}
	w.lease.witness = w.witness
	return true
}

// startWitness subscribes the current life's channel and waits, within
// ctx, for the confirmation, the marker and the first proof. On an error
// it closes the subscription, leaving the worker on the heartbeat TTL
// alone, unless a marker it sent may be in Redis and cannot be dropped:
// then running is true, and the witness must run (a peer may judge the
// life the marker names once the channel is empty).
func startWitness(ctx context.Context, w *lifeWitness) (running bool, err error) {
	w.proved = make(chan struct{})
	w.life = w.rows.currentIncarnation()
	w.channel = store.LifeChannel(w.opts.keyPrefix, w.opts.instanceID, w.life)
	sub, err := w.ws.SubscribeLife(ctx, w.channel)
	if err != nil {
		return false, err
	}
	w.sub = sub
	err = w.establish(ctx)
	if err == nil {
		return true, nil
	}
	if w.sent.Life != "" {
		dropCtx, cancel := w.opts.opContext(context.Background())
		derr := w.ws.DropWitness(dropCtx, w.opts.instanceID, w.sent.String())
		cancel()
		if derr != nil {
			w.marker.Life = "" // no proof until the loop marks again
			return true, errors.Join(err, derr)
		}
	}
	sub.Close()
	return false, err
}

// establish waits for the subscription's confirmation, writes the marker
// of a new epoch and pings until the first proof, within ctx.
func (w *lifeWitness) establish(ctx context.Context) error {
	confirmed := false
	for !confirmed {
		kind, payload, err := w.sub.Receive(ctx, w.opts.witnessFence)
		if err != nil {
			return fmt.Errorf("liveness witness: subscribe to %s: %w", w.channel, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("liveness witness: subscribe to %s: %w", w.channel, ctx.Err())
		}
		confirmed = kind == store.LifeSubscribed && payload == w.channel
	}
	if judged, err := w.mark(ctx); err != nil || judged {
		return errors.Join(err, errLifeJudged)
	}
	for w.proof.Load() == 0 || w.marker.Life != w.life {
		sent := time.Now()
		if err := w.sub.Ping(ctx, w.payload(sent)); err != nil {
			return fmt.Errorf("liveness witness: ping: %w", err)
		}
		kind, payload, err := w.sub.Receive(ctx, w.opts.witnessFence)
		if err != nil {
			return fmt.Errorf("liveness witness: ping: %w", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("liveness witness: ping: %w", ctx.Err())
		}
		if kind == store.LifePong {
			w.pong(payload)
		}
	}
	return nil
}

// errLifeJudged: a peer judged this life dead (its marker says so).
var errLifeJudged = errors.New("liveness witness: a peer judged this life dead")

// mark writes the marker of a new epoch on the server the channel is held
// on, and reports whether a peer judged the life already. Proofs count
// only from pings sent after it.
func (w *lifeWitness) mark(ctx context.Context) (judged bool, err error) {
	if w.life == "" || w.life == w.judgedLife {
		return false, errors.New("liveness witness: no life to mark (moving to a new one)")
	}
	opCtx, cancel := w.opts.opContext(ctx)
	defer cancel()
	held, runID, err := w.ws.LifeHeld(opCtx, w.channel)
	if err != nil {
		return false, fmt.Errorf("liveness witness: %w", err)
	}
	if !held {
		return false, fmt.Errorf("liveness witness: %s has no subscriber on the server this worker writes to", w.channel)
	}
	if w.written.Life == w.life && !time.Now().Add(2*w.opts.opTimeout).Before(w.writtenTill) &&
		time.Since(w.lease.epoch)-time.Duration(w.proof.Load()) >= w.opts.witnessGrace {
		// Cut off from its channel for longer than the grace, a peer may
		// have judged this life, and the "judged" marker, which keeps the
		// TTL of the marker it replaced, may have expired, or may expire
		// before the write below (two round trips away) lands: nothing in
		// Redis would say so. The life ends, as a verdict ends it.
		return true, nil
	}
	w.epoch++
	m := store.Witness{Life: w.life, Grace: w.opts.witnessGrace, RunID: runID, Epoch: w.epoch}
	w.sent = m // from here, the marker may be in Redis whatever the reply
	sent, ttl := time.Now(), w.fleet.ttl()
	judged, err = w.ws.WriteWitness(opCtx, w.opts.instanceID, m, ttl)
	if err != nil {
		return false, fmt.Errorf("liveness witness: %w", err)
	}
	if judged {
		return true, nil
	}
	w.writtenTill = sent.Add(ttl)
	w.marker, w.written = m, m
	w.markedAt.Store(int64(time.Since(w.lease.epoch)))
	w.renewedAt = time.Now()
	return false, nil
}

// payload is what a ping sent at sent carries back: the send time, and
// the epoch it was sent in.
func (w *lifeWitness) payload(sent time.Time) string {
	return strconv.Itoa(w.epoch) + " " + strconv.FormatInt(int64(sent.Sub(w.lease.epoch)), 10)
}

// pong takes the answer to a ping as proof if it was sent after this
// epoch's marker was written.
func (w *lifeWitness) pong(payload string) {
	var epoch int
	var sent int64
	if _, err := fmt.Sscanf(payload, "%d %d", &epoch, &sent); err != nil || epoch != w.epoch || w.marker.Life == "" ||
		sent < w.markedAt.Load() {
		return
	}
	w.progress = time.Now()
	if sent > w.proof.Load() {
		w.proof.Store(sent)
		w.mu.Lock()
		close(w.proved)
		w.proved = make(chan struct{})
		w.mu.Unlock()
	}
}

// fresh is the fence: nil while the last proof was sent at most
// WitnessFence ago. Past it, with wait, it waits for a new proof (a worker
// resuming from a pause gets one within a round trip; during a Redis
// outage it waits for its end, since a peer that still reaches Redis
// could judge this worker meanwhile), and returns an error wrapping
// ErrLeaseLost if the lease ends or the life was judged first, ctx's error
// if ctx ends, and ErrShutdown once the worker is shut down. Without wait
// (Healthy) it returns the ErrLeaseLost error at once.
func (w *lifeWitness) fresh(ctx context.Context, wait bool) error {
	if w == nil {
		return nil
	}
	for {
		w.mu.Lock()
		ch := w.proved
		w.mu.Unlock()
		since := time.Since(w.lease.epoch) - time.Duration(w.proof.Load())
		lift := w.liftAt.Load()
		switch {
		case w.off.Load():
			return ErrShutdown
		case lift > 0 && int64(time.Since(w.lease.epoch)) >= lift:
			return nil // the witness stopped, and no peer can judge this worker by it
		case since <= w.opts.witnessFence || mutantWitnessNoFence:
			return nil
		case !wait || !w.lease.valid() || w.lease.lost.Load():
			return fmt.Errorf("%w: %w (last answer %v ago)", ErrLeaseLost, errWitnessStale, since.Round(time.Millisecond))
		}
		t := time.NewTimer(min(max(w.lease.remaining(), time.Millisecond), w.opts.witnessPing()))
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("liveness witness: waiting for Redis to answer this worker's ping: %w", ctx.Err())
		}
		t.Stop()
	}
}

// run pings every witnessPing and reads what comes back until ctx, which
// only Shutdown cancels, is done; then it drops the marker and closes the
// subscription, in that order, so that no judge sees the channel empty
// while the marker still names the life.
func (w *lifeWitness) run(ctx context.Context) {
	defer func() { w.stop(ctx.Err() != nil) }()
	defer w.contain()
	next := time.Now()
	confirmed := w.marker.Life != "" // startWitness saw it confirmed and marked it
	w.progress = time.Now()
	for ctx.Err() == nil {
		if life := w.rows.currentIncarnation(); life != w.life {
			confirmed = false
			w.follow(ctx, life)
			if w.life == "" {
				continue // the move failed: tried again (follow slept)
			}
		}
		if w.sub == nil {
			w.resubscribe(ctx)
			if w.sub == nil {
				// Redis refuses or is away: try again two fences later
				// (jittered), not at every ping, so a fleet does not dial
				// a recovering server in lockstep. The fence holds meanwhile.
				w.sleep(ctx, w.opts.jitter("witness", 2*w.opts.witnessFence, 0.2))
				continue
			}
		}
		if time.Since(w.progress) > 4*w.opts.witnessFence && w.life != w.judgedLife {
			// No proof for four fences while Redis may answer: an error
			// reply (BUSY, LOADING) or a connection closed unseen leaves
			// go-redis neither reconnecting nor subscribing again. A new
			// subscription, a new epoch.
			confirmed = false
			w.resubscribe(ctx)
			continue // the top of the loop sees a failed one
		}
		if now := time.Now(); !now.Before(next) {
			next = now.Add(w.opts.witnessPing())
			if confirmed && w.marker.Life == "" && w.reestablished(ctx) {
				now = time.Now()
			}
			if err := w.sub.Ping(ctx, w.payload(now)); err != nil && ctx.Err() == nil {
				confirmed = false
				w.marker.Life = ""
			}
			if w.marker.Life != "" && time.Since(w.renewedAt) > w.fleet.ttl()/3 {
				w.renewMarker(ctx)
				if w.sub == nil {
					continue // subscribing anew failed: the top of the loop tries again
				}
			}
		}
		kind, payload, err := w.sub.Receive(ctx, max(time.Until(next), time.Millisecond))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Broken: go-redis reconnects and subscribes again; no proof
			// counts until the next epoch's marker.
			confirmed = false
			w.marker.Life = ""
			if store.IsAuthError(err) {
				// SUBSCRIBE refused (an ACL changed): give up as Start does
				// after a few tries, the marker dropped.
				if w.refused++; w.refused >= 3 {
					w.log.Warn("liveness witness: Redis refuses its subscription; this worker goes on with the heartbeat TTL alone (docs/safety.md §14)",
						slog.Any("error", err))
					return
				}
			}
			w.sleep(ctx, w.opts.witnessPing())
			if store.IsMoved(err) {
				// SSUBSCRIBE sent to a master that no longer holds the
				// slot (a slot map older than a resharding): go-redis
				// neither follows it nor reconnects. Subscribe anew, by
				// the map the redirection had reloaded.
				w.resubscribe(ctx)
			}
		case kind == store.LifePong:
			w.pong(payload)
		case kind == store.LifeUnsubscribed && payload == w.channel:
			// The server ended the subscription: on a Cluster, the slot
			// left the master (a migration; a failover, sometimes). As after
			// a broken connection, no proof counts until a new epoch's
			// marker; subscribe anew, on the slot's new master.
			confirmed = false
			w.resubscribe(ctx)
		case kind == store.LifeSubscribed && payload == w.channel:
			// Every confirmation is a new connection's (go-redis may
			// reconnect without an error): a new epoch before any proof.
			confirmed = true
			w.progress = time.Now()
			w.refused = 0
			w.marker.Life = ""
			if w.reestablished(ctx) {
				next = time.Now() // ping at once: the first proof of the epoch
			}
		}
		w.sig.witness.Signal(struct{}{}) // test signal: a witness turn ended
	}
}

// reestablished writes a new epoch's marker after a reconnection or a new
// life, unless a peer judged the life meanwhile, which ends it. It reports
// whether the marker was written; the loop tries again at its next ping
// otherwise.
func (w *lifeWitness) reestablished(ctx context.Context) bool {
	judged, err := w.mark(ctx)
	switch {
	case judged:
		w.judged()
	case err != nil:
		if ctx.Err() == nil {
			w.log.Debug("liveness witness: the marker could not be written; this worker takes no rows until it is", slog.Any("error", err))
		}
	default:
		return true
	}
	return false
}

// judged ends the current life: a peer judged it dead and reset its rows.
func (w *lifeWitness) judged() {
	w.marker.Life = ""
	if w.judgedLife == w.life {
		return
	}
	w.judgedLife = w.life
	wasLost := w.lease.lost.Load()
	w.lease.markLeaseLost(errLifeJudged)
	if wasLost && w.rows.currentIncarnation() == w.life {
		// A loss noted before (an outage) began this life and makes
		// markLeaseLost a no-op: the judged life would go on once a
		// heartbeat regains the lease. The next life begins now.
		w.rows.markLoss(w.lease.releaseSafe && !mutantNoStickyLease, w.lease.newLives && !mutantOneLife)
	}
	w.kick()
}

// follow moves the subscription to a new life's channel.
func (w *lifeWitness) follow(ctx context.Context, life string) {
	old := w.channel
	w.life = life
	w.channel = store.LifeChannel(w.opts.keyPrefix, w.opts.instanceID, life)
	w.marker.Life = ""
	if w.sub == nil {
		return // the next subscription is made on the new channel
	}
	if err := w.sub.Move(ctx, old, w.channel); err != nil && ctx.Err() == nil {
		w.log.Debug("liveness witness: could not move to the new life's channel; retrying", slog.Any("error", err))
		w.channel = old // the next turn of the loop tries again
		w.life = ""
		w.sleep(ctx, w.opts.witnessPing())
	}
}

// renewMarker writes the marker again, same epoch, for its TTL, if the
// channel is still held on the server run the marker names. On a Cluster
// a failover within the slot's shard may leave the subscription on the
// old master, now a replica (Redis 7.0.15 ends it there in some runs, not
// in others): judges count on the new master, on another run, and would
// never judge this life. It then subscribes anew, on the slot's master.
func (w *lifeWitness) renewMarker(ctx context.Context) {
	opCtx, cancel := w.opts.opContext(ctx)
	defer cancel()
	held, runID, err := w.ws.LifeHeld(opCtx, w.channel)
	if err != nil {
		return // tried again at the next ping
	}
	if !held || runID != w.marker.RunID {
		w.resubscribe(ctx)
		return
	}
	sent, ttl := time.Now(), w.fleet.ttl()
	judged, err := w.ws.WriteWitness(opCtx, w.opts.instanceID, w.marker, ttl)
	switch {
	case judged:
		w.judged()
	case err == nil:
		w.renewedAt = time.Now()
		w.writtenTill = sent.Add(ttl)
	}
}

// resubscribe closes the subscription and subscribes on a new connection
// (the loop marks a new epoch once it is confirmed); a failure is tried
// again a ping later.
func (w *lifeWitness) resubscribe(ctx context.Context) {
	w.marker.Life = ""
	w.progress = time.Now()
	if w.sub != nil {
		w.sub.Close()
		w.sub = nil
	}
	opCtx, cancel := w.opts.opContext(ctx)
	defer cancel()
	sub, err := w.ws.SubscribeLife(opCtx, w.channel)
	if err != nil {
		w.log.Debug("liveness witness: subscribing again failed; retrying", slog.Any("error", err))
		return
	}
	w.sub = sub
}

func (w *lifeWitness) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// witnessPanicked is the log line of a witness loop that panicked.
const witnessPanicked = "liveness witness stopped after a panic (a bug: please report it); this worker goes on with the heartbeat TTL alone"

// contain turns a panic of the witness's loop into an Error: the witness
// stops, and stop drops the marker and lifts the fence (once no peer can
// judge this worker by it); the process goes on with the heartbeat TTL.
func (w *lifeWitness) contain() {
	if r := recover(); r != nil {
		w.panicked = true
		w.log.Error(witnessPanicked, slog.Any("recovered", r), slog.String("stack", string(debug.Stack())))
		w.sig.witness.Signal(struct{}{}) // test signal: the loop's last turn
	}
}

// stop drops the marker (bounded by the operation timeout), then closes
// the subscription. At Shutdown (shutdown) the fence answers ErrShutdown
// from then on; when the witness stops while the worker runs, the fence
// lifts once no peer can judge the worker by the witness: at once if the
// marker was dropped, else when it expires.
func (w *lifeWitness) stop(shutdown bool) {
	if shutdown {
		w.off.Store(true)
	}
	dropped := true
	if !w.killed.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), w.opts.opTimeout)
		for _, m := range []store.Witness{w.sent, w.written} {
			if m.Life == "" {
				continue
			}
			if err := w.ws.DropWitness(ctx, w.opts.instanceID, m.String()); err != nil {
				dropped = false
				w.log.Warn("liveness witness: could not drop the marker; a peer may judge this worker until it expires", slog.Any("error", err))
			}
		}
		cancel()
	}
	if w.sub != nil {
		w.sub.Close()
	}
	if !shutdown {
		lift := time.Since(w.lease.epoch)
		if !dropped {
			lift = w.renewedAt.Sub(w.lease.epoch) + w.fleet.ttl()
		}
		w.liftAt.Store(int64(max(lift, 1)))
		w.mu.Lock()
		close(w.proved) // wake the fence's waiters
		w.proved = make(chan struct{})
		w.mu.Unlock()
		w.sig.witness.Signal(struct{}{}) // test signal: the witness stopped
	}
}

// witnessWatch is the judge's side: taking the witness turn, counting the
// marked lives' subscribers, and judging.
type witnessWatch struct {
	deps
	ws       witnessStore
	resetter Resetter
	peers    *peerRecoverer

	wg       sync.WaitGroup // the resets under way
	role     int            // watchNone, watchAll (the witness turn), watchHolder (its second)
	tries    int            // looks at the turns while holding neither
	nextTurn time.Time
	nextRead time.Time
	lastSent time.Time           // send time of the last count that answered
	lives    map[string]*watched // by channel
	massWarn bool
}

// The roles of the witness turns: the holder of <prefix>_WITNESS_TURN
// counts every marked life; the holder of <prefix>_WITNESS_SECOND counts
// the first's alone, so that the first's own death is judged as fast as
// anyone's, and gives its turn up for the second to take.
const (
	watchNone = iota
	watchAll
	watchHolder
)

// watched is one marked life as the judge counts it.
type watched struct {
	id      string
	marker  store.Witness
	value   string    // the marker as read, for the compare-and-set
	absent  time.Time // receive time of the first of the counts without a subscriber; zero while held
	massive bool      // absent in a mass disappearance: left to the TTL
	// run is the run ID of the server that counted the channel last (on a
	// Cluster, the master of its slot: each channel has its own).
	run string
}

// run counts every witnessPoll while this worker holds the witness turn.
func (v *witnessWatch) run(ctx context.Context) {
	t := time.NewTicker(v.opts.witnessPoll())
	defer t.Stop()
	defer v.leave()
	defer v.wg.Wait()
	defer func() {
		if r := recover(); r != nil { // this worker judges no more; another takes the turn
			v.log.Error(witnessPanicked, slog.Any("recovered", r), slog.String("stack", string(debug.Stack())))
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v.runOnce(ctx)
	}
}

// leave gives up the turn this worker holds (compare-and-delete, bounded
// by the operation timeout): at Shutdown another takes it at its next look.
func (v *witnessWatch) leave() {
	if v.role == watchNone {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.opts.opTimeout)
	defer cancel()
	_ = v.ws.DropWitnessTurn(ctx, v.opts.instanceID, v.role == watchHolder)
}

// runOnce is one turn: the witness turn, the markers (every grace), one
// count, and the verdicts it allows.
func (v *witnessWatch) runOnce(ctx context.Context) {
	now := time.Now()
	if !now.Before(v.nextTurn) {
		v.takeTurn(ctx)
		// A holder renews every half grace; the others look (one EXISTS)
		// every grace.
		next := v.opts.witnessGrace
		if v.role != watchNone {
			next /= 2
		}
		v.nextTurn = now.Add(v.opts.jitter("witness-turn", next, 0.2))
	}
	if v.role == watchNone {
		return
	}
	if !now.Before(v.nextRead) {
		v.readMarkers(ctx)
		v.nextRead = now.Add(v.opts.witnessGrace)
	}
	if len(v.lives) == 0 {
		return
	}
	channels := slices.Sorted(maps.Keys(v.lives)) // in one order: the verdicts of a count too (the simulator replays a seed)
	opCtx, cancel := context.WithTimeout(ctx, min(v.opts.opTimeout, v.opts.witnessGrace/2))
	sent := time.Now()
	counts, runIDs, err := v.ws.CountLives(opCtx, channels)
	cancel()
	recv := time.Now()
	// An unanswered count, one answered late or a count after a gap (this
	// process paused) breaks the watch: every absence is counted again from
	// the next count.
	if err != nil || recv.Sub(sent) > v.opts.witnessGrace/2 || (!v.lastSent.IsZero() && sent.Sub(v.lastSent) > 3*v.opts.witnessPoll()) {
		v.lastSent = time.Time{}
		for i, ch := range channels {
			l := v.lives[ch]
			l.absent, l.massive = time.Time{}, false
			if err == nil {
				l.run = runIDs[i]
			}
		}
		if err == nil {
			v.lastSent = sent
		}
		return
	}
	v.lastSent = sent
	v.count(ctx, channels, counts, runIDs, sent, recv)
}

// count notes what one count saw and judges the lives absent for their
// grace. A channel counted on another server run than the last time (a
// restart, a failover, on a Cluster its slot on another master), or whose
// server did not answer (run ""), is counted again from the next count.
func (v *witnessWatch) count(ctx context.Context, channels []string, counts []int64, runIDs []string, sent, recv time.Time) {
	var due []*watched
	for i, ch := range channels {
		l := v.lives[ch]
		switch {
		case runIDs[i] == "" || runIDs[i] != l.run:
			l.run = runIDs[i]
			l.absent, l.massive = time.Time{}, false
		case counts[i] > 0:
			l.absent, l.massive = time.Time{}, false
		case l.marker.RunID != l.run:
			// written on another server run: never judged here
		case l.absent.IsZero():
			l.absent = recv
			if mutantWitnessNoGrace {
				due = append(due, l)
			}
		case !l.massive && sent.Sub(l.absent) >= max(v.opts.witnessGrace, l.marker.Grace):
			due = append(due, l)
		}
	}
	absent, ongoing := 0, false
	for _, l := range v.lives {
		switch {
		case !l.absent.IsZero() && !l.massive:
			absent++
		case !l.absent.IsZero():
			ongoing = true
		}
	}
	// A mass disappearance, or a life newly absent while one goes on (a
	// life this worker learns of, or sees gone, only after the others).
	mass := absent > 2 && absent*10 > len(v.lives) || ongoing && absent > 0
	if v.role == watchAll && mass && !mutantWitnessJudgesMass {
		for _, l := range v.lives {
			if !l.absent.IsZero() {
				l.massive = true
			}
		}
		if !v.massWarn {
			v.massWarn = true
			v.log.Warn("liveness witness: many lives lost their subscription at once (a partition, a proxy or Redis restarting?); left to the heartbeat TTL",
				slog.Int("lives", absent), slog.Int("watched", len(v.lives)))
		}
		return
	}
	v.massWarn = false
	for _, l := range due {
		v.pronounce(ctx, l)
	}
}

// pronounce marks l judged (compare-and-set on the marker it read) and
// resets the rows of that life by its owner value, in a goroutine of its
// own: the counts go on meanwhile.
func (v *witnessWatch) pronounce(ctx context.Context, l *watched) {
	if v.peers.misconfigured() != nil {
		return // a worker whose configuration is wrong takes no verdict
	}
	opCtx, cancel := v.opts.opContext(ctx)
	ok, err := v.ws.JudgeLife(opCtx, l.id, l.value, l.marker)
	cancel()
	if err != nil {
		return // kept: the next count tries again (a judgment already made answers yes)
	}
	delete(v.lives, store.LifeChannel(v.opts.keyPrefix, l.id, l.marker.Life))
	if !ok {
		return // reconnected, moved on or left: read again
	}
	// A turn the judged worker held is free at once: for this second's
	// next try, or for a new second.
	for _, second := range []bool{false, true} {
		opCtx, cancel := v.opts.opContext(ctx)
		_ = v.ws.DropWitnessTurn(opCtx, l.id, second)
		cancel()
	}
	if v.role == watchHolder {
		v.nextTurn = time.Time{}
	}
	v.wg.Go(func() { v.resetLife(ctx, l.id, l.marker.Life, l.absent) })
}

// resetLife resets the rows of life of id, judged dead, noticed when its
// channel was first seen empty. A failure is left to the dead-peer path
// that follows the heartbeat's expiry (it resets every life's rows).
func (v *witnessWatch) resetLife(ctx context.Context, id, life string, noticed time.Time) {
	defer func() {
		if r := recover(); r != nil { // the host's resetter panicked: the heartbeat's expiry recovers the peer
			v.log.Error(witnessPanicked, slog.Any("recovered", r), slog.String("stack", string(debug.Stack())))
		}
	}()
	v.stats.peersDead.Add(1)
	v.events.emit(Event{Kind: EventPeerDead, PeerID: id, FoundBy: foundByWitness})
	owner := lifeOwner(id, life)
	pr := report.PeerRecovery{InstanceID: id}
	for attempt := 1; ; attempt++ {
		resetCtx, cancel := context.WithTimeout(ctx, v.opts.resetTimeout)
		res, err := v.resetter.ResetOwner(resetCtx, OwnerReset{Owner: owner})
		cancel()
		if err == nil {
			pr.RowsFound, pr.RowsReset, pr.Quarantined, pr.NotReset = int(res.Changed)+len(res.NotReset), res.Changed, res.Quarantined, res.NotReset
			// The death came after the count before the first empty one.
			stuck := time.Since(noticed) + v.opts.witnessPoll()
			v.peers.countRows(pr)
			v.stats.peersRecovered.Add(1)
			v.stats.noteRowsStuck(stuck)
			reset := Event{Kind: EventRowsReset, PeerID: id, FoundBy: foundByWitness,
				Rows: pr.RowsFound, RowsReset: pr.RowsReset, RowsQuarantined: len(pr.Quarantined),
				Duration: time.Since(noticed), StuckFor: stuck,
				RowIDs: sortedIDs(res.ChangedIDs), QuarantinedIDs: sortedIDs(res.Quarantined)}
			v.events.emit(reset)
			reset.Kind = EventRowsRecovered
			v.events.emit(reset)
			v.rlog.recovered(pr, foundByWitness, stuck) // the line every recovery logs
			v.log.Debug("liveness witness: a life judged dead and its rows reset",
				slog.String("peer_id", id), slog.String("owner", clip(owner)), slog.Duration("channel_empty_for", time.Since(noticed)))
			return
		}
		if attempt == 3 || ctx.Err() != nil || errors.Is(err, ErrRowsLocked) || !waitOrDone(ctx, time.Duration(attempt)*v.opts.witnessGrace/5) {
			v.stats.countFailure(ctx)
			v.events.emit(Event{Kind: EventRecoveryFailed, PeerID: id, FoundBy: foundByWitness, Err: err})
			v.log.Warn("liveness witness: the reset of a life judged dead failed; its heartbeat's expiry recovers it",
				slog.String("peer_id", id), slog.String("owner", clip(owner)), slog.Any("error", err))
			return
		}
	}
}

// takeTurn takes or renews the witness turn, or else its second's. A
// worker holding neither runs the takes only when a turn is free, or
// every fourth look (a stranger's value without a TTL is taken over then).
func (v *witnessWatch) takeTurn(ctx context.Context) {
	if v.role == watchNone {
		v.tries++
		opCtx, cancel := v.opts.opContext(ctx)
		n, err := v.ws.WitnessTurnsTaken(opCtx)
		cancel()
		if err != nil || (n == 2 && v.tries%4 != 0) {
			return
		}
	}
	role := watchNone
	for _, r := range []int{watchAll, watchHolder} {
		opCtx, cancel := v.opts.opContext(ctx)
		t, err := v.ws.TakeWitnessTurn(opCtx, v.opts.instanceID, r == watchHolder, v.opts.witnessTurnTTL())
		cancel()
		if t.Stranger != "" {
			key := store.WitnessTurnKey(v.opts.keyPrefix)
			if r == watchHolder {
				key = store.WitnessSecondKey(v.opts.keyPrefix)
			}
			v.rlog.turnFromStranger("witness", key, t)
		}
		if err != nil && v.role != watchNone {
			return // keep the role: its key lives on; the next look tries again
		}
		if err == nil && t.Held {
			role = r
			break
		}
	}
	if role != v.role {
		v.lives, v.lastSent = nil, time.Time{}
		v.nextRead = time.Time{}
		if v.role == watchHolder && role == watchAll {
			// Another worker may be the second at once, not a turn TTL later.
			opCtx, cancel := v.opts.opContext(ctx)
			_ = v.ws.DropWitnessTurn(opCtx, v.opts.instanceID, true)
			cancel()
		}
	}
	v.role = role
}

// readMarkers reads the markers of the lives this worker counts: every
// registered peer's (the witness turn), or the turn holder's (its
// second). The counts of lives still marked the same carry over.
func (v *witnessWatch) readMarkers(ctx context.Context) {
	var ids, values []string
	if v.role == watchHolder {
		opCtx, cancel := v.opts.opContext(ctx)
		holder, marker, err := v.ws.WitnessHolder(opCtx)
		cancel()
		if err != nil {
			return
		}
		if holder != "" && holder != v.opts.instanceID {
			ids, values = []string{holder}, []string{marker}
		}
	} else {
		peers, _, err := v.deps.judge.registeredPeers(ctx)
		if err != nil {
			return
		}
		opCtx, cancel := v.opts.opContext(ctx)
		values, err = v.ws.ReadWitnesses(opCtx, peers)
		cancel()
		if err != nil {
			return
		}
		ids = peers
	}
	lives := make(map[string]*watched, len(ids))
	for i, id := range ids {
		m, ok := store.ParseWitness(values[i])
		if !ok || m.Judged {
			continue
		}
		ch := store.LifeChannel(v.opts.keyPrefix, id, m.Life)
		if old, ok := v.lives[ch]; ok && old.value == values[i] {
			lives[ch] = old
			continue
		}
		lives[ch] = &watched{id: id, marker: m, value: values[i]}
	}
	v.lives = lives
}

// waitOrDone waits d, or until ctx ends (false).
func waitOrDone(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
