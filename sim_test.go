//go:build sim || simmutants

package recovery

// Deterministic simulation of the real Worker (issue 13, part 1).
//
// One seed decides everything: the mode (owner mode, or rows sets with or
// without owner fencing, with or without the backstop sweep), the
// latencies, the faults and when they strike, which process crashes,
// pauses or restarts, what each host does and how long it takes. Several
// real Workers and their host loops run in one testing/synctest bubble
// over an in-memory Redis (sim_store_test.go) and an in-memory rows table
// (sim_table_test.go); the fake clock makes a run of half a minute of
// fleet time take milliseconds, and the same seed replays it exactly.
//
//	go test -tags sim -run 'TestSimulation$' -seeds 2000     # seeds 1..2000
//	go test -tags sim -run 'TestSimulation$' -seed 1234 -v   # one seed, with its trace
//
// Invariants, checked at every step that could break them (every reset,
// every completion) and at the end of each run:
//   - no row is reset by recovery while a live worker holds it with a valid
//     lease (the host fetched it, has not finished it, CheckLease is nil);
//   - no row is completed twice; no row is reset more often than taken (a
//     reset applied twice);
//   - once the faults stop, every row ends done or quarantined within a
//     bound;
//   - a worker killed once the faults stopped has its rows queued again
//     within the documented bound: TTL + 1.1 × recovery interval + the scan
//     turn, from its last heartbeat, + one scan (+ 2 TTLs after a
//     failover or evictions: the hold, by up to two workers in turn); in a fleet of
//     mixed timings, its TTL + the slowest member's wait for a scan, and
//     the fleet's longest TTLs for the hold; with its rows set taken by a
//     FLUSHALL or an eviction after its last heartbeat (rows+sweep), the
//     backstop sweep's bound;
//
// Fault classes added later (issue 20) draw from a stream of their own, so
// earlier seeds replay as they did: members with different timings (a
// rolling change of every timing option, with Redis restarts), a
// second fleet (another table) starting a worker under the prefix, keys
// with a TTL evicted (seeds with the sweep whose number is 5 mod 7), a
// row lock held by a vanished session (the worker the bound check kills
// leaves one of its rows locked for a while: its other rows must be back
// within the bound, the locked one within the bound after the lock ends);
// and, for the backstop sweep by row version (issue 21), a Redis that
// restarts empty before every sweep look (youngRedis) and an operator
// re-queueing the rows of a sweep's reset on its way (operator); and a
// mass death of 2,000 registered workers right before the bound check's
// kill (massDeath).
//   - no goroutine of any Worker is left after Shutdown.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/cryptotest"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/store"
)

var (
	simSeed  = flag.Uint64("seed", 0, "simulation: run this one seed (0: run -seeds seeds)")
	simSeeds = flag.Int("seeds", 200, "simulation: how many seeds to run, from -seedstart")
	simStart = flag.Uint64("seedstart", 1, "simulation: the first seed")
	simTrace = flag.Bool("simtrace", false, "simulation: print the trace of every seed run")
)

// Timings of the simulated fleet: the fast timings of the unit tests.
const (
	simTTL      = 2 * time.Second
	simInterval = 500 * time.Millisecond
	simRecovery = time.Second
	simReset    = time.Second
	simRows     = 250
	simFaultEnd = 12 * time.Second // faults strike before this
	simLiveness = 20 * time.Second // after the faults, every row ends within this
	// simLong multiplies every timing of a long-timed member (the
	// timings fault class).
	simLong = 4
)

// simMutations are the deliberate breakages of the simulated Redis and
// PostgreSQL (sim_mutants_test.go): reverted fixes of issue 10 and
// mutations of the protocol.
type simMutations struct {
	f1             bool // the claim does not renew the dead peer's rows set
	f4             bool // the claim does not recognise its own token on a retry
	f8             bool // finish deletes a came-back peer's set; a heartbeat leaves a claim
	claimNoRecheck bool // the claim does not re-check the heartbeat
	noStatusGuard  bool // the reset changes any row not queued
	noRewrite      bool // the heartbeat does not write tracked rows back
	noVersionGuard bool // the backstop sweep's reset ignores the row's version (xmin)
	noLedger       bool // no reset ledger without an owner column (F2)
	noKeep         bool // verdicts held after a failover do not renew the rows sets (seed 1359)
	readLocked     bool // the self-check reads rows an open fetch holds (no SKIP LOCKED)
	noUnowned      bool // issue 20.1 reverted: a fenced reset takes a row without an owner for another worker's
	lockWait       bool // issue 20.5 reverted: a reset waits on a row lock another session holds (and times out)
	lockedSettled  bool // a reset counts a row another session holds locked as settled (not in NotReset)
	noWitness      bool // not a mutation: every owner-mode seed runs without the liveness witness
}

// simConfig is what the seed chose for a run.
type simConfig struct {
	mode      string // owner, rows+fenced+sweep, rows+fenced, rows, rows+sweep (no owner column: the sweep by row version)
	procs     int
	maxRec    int
	deferred  bool
	lostReply float64
	lostAck   float64
	redisLoss bool // Redis may forget (restart empty, old snapshot, failover): only with the backstop sweep
	// timings: members with different timings (a rolling change of every
	// timing option): every second process uses simLong's, four times
	// the others'. Only with redisLoss, where a verdict on another's
	// behalf depends on the fleet's longest TTL (issue 20, item 3).
	timings bool
	// foreign: a second fleet (another table) starts a worker under the
	// prefix during the faults, tracks row IDs of its own table that our
	// live workers hold in ours, and dies (issue 20, item 2).
	foreign bool
	// evicting: Redis may evict keys with a TTL (maxmemory, volatile-lru,
	// evictions accepted): only with the backstop sweep, which recovers a
	// dead worker whose rows set was evicted (docs/operations.md).
	evicting bool
	// rollout: an owner column rolled out under a running fleet (owner
	// mode only): every other instance ID is a worker of the release
	// before the column, rows sets without an owner column, whose fetch
	// leaves the owner NULL (the NULL owners fault class, issue 20.1).
	rollout bool
	// operator: during the faults, an operator (or a tool of the host's
	// own) re-queues stray rows of dead workers while the backstop sweep's
	// reset of them is on its way, and a worker takes them again before it
	// arrives (rows+sweep only): what the reset's version guard is for.
	// No restart from a snapshot or failover in these runs: a rows set
	// brought back would let a recovery reset a row the operator re-queued
	// out of the ledger's sight (docs/safety.md §3, "a host's own
	// ResetRows").
	operator bool
	// youngRedis: for a stretch of the faults, Redis restarts empty right
	// after each sweep turn is taken (rows+sweep only): every look of the
	// sweep comes from a server younger than a heartbeat TTL, whose rows
	// sets live workers have not written again yet (a crash-looping
	// Redis at its worst): what the sweep's strict node age is for.
	youngRedis bool
	// vanish: the worker the bound check kills vanishes (its host gone,
	// no FIN) with a completion transaction open on one of its rows: the
	// row stays locked until the server ends the session
	// (idle_in_transaction_session_timeout, or TCP keepalive), a drawn
	// 1 to 11 s later. Every reset must pass over it (SKIP LOCKED), reset
	// the others within the bound, report it (RowState.Locked) and come
	// back to it once the lock ends (issue 20, item 5).
	vanish bool
	// massDeath: right before the bound check's kill, simMassDeath
	// registered workers of a zone outage that came before it are found
	// dead: registry entries without a heartbeat, every tenth with an
	// incarnation a heartbeat wrote before the victim's last (it needs its
	// own recovery). The victim's rows must be back within the bound all
	// the same (issue 33).
	massDeath bool
	// witness: owner mode runs the liveness witness (issue 34) with the
	// grace and fence drawn (sim_witness_test.go, drawWitness); massCut
	// adds mass disappearances to its faults.
	witness        bool
	wGrace, wFence time.Duration
	massCut        bool
}

// simMassDeath is how many dead entries the massDeath class registers.
const simMassDeath = 2000

func (c simConfig) fenced() bool { return c.mode != "rows" && c.mode != "rows+sweep" }
func (c simConfig) sweep() bool {
	return c.mode == "owner" || c.mode == "rows+fenced+sweep" || c.mode == "rows+sweep"
}

// simWorld is one run.
type simWorld struct {
	seed  uint64
	rng   *rand.Rand // the driver's
	later *rand.Rand // the driver's, for the fault classes added later
	cfg   simConfig
	mut   simMutations

	mu         sync.Mutex // guards everything below, and every simProc's state
	redis      *simRedis
	table      *simTable
	procs      []*simProc
	trace      []string
	violations []string
	start      time.Time
	pgDownTill time.Time
	pgSlowTill time.Time
	pgSlowMax  time.Duration
	lostTill   time.Time // lost replies and acknowledgements strike until then
	redisUp    time.Time // when Redis last came back with data it may lack (a restart, a failover)
	// youngFrom, youngTill: the stretch of the youngRedis class.
	youngFrom, youngTill time.Time
	failedOver           bool      // a replica was promoted during the run
	evicted              bool      // Redis evicted keys during the run
	flushedAt            time.Time // the last FLUSHALL (rows+sweep only)
	promoted             []time.Time
	// unrecorded are the instances a claim found without a rows set.
	unrecorded map[string]bool
	snaps      []simSnap
	nextProc   int
	nextID     int
	clients    []*redis.Client
	// known counts, by cause, what the invariants tolerate by name: holes
	// docs/safety.md documents as not covered.
	known map[string]int
	// The liveness witness (sim_witness_test.go): the streams of its
	// fault driver (wrng) and of the main driver's crashes (hrng: closed
	// or half-open), when each instance's marker last changed, who holds
	// each witness turn since when, the mass disappearances, and how long
	// the bound check's victim took to be judged and reset.
	wrng, hrng *rand.Rand
	markedAt   map[string]time.Time
	turnOf     map[string]string
	turnSince  map[string]time.Time
	masses     []*simMass
	detected   time.Duration
	verdicts   int
	judgedAt   map[string]time.Time // instance/life: when the witness judged it
	judgedLost map[string]bool      // instance/life: judged, its marker lost by Redis (knownJudgedLost)
	lastCut    time.Time            // the end of the last cut or crash of a witness connection
	lastEmpty  time.Time            // the last count that found a channel without a subscriber
}

// Causes the invariants tolerate, by name (reported by TestSimulation).
const (
	knownStuck      = "no sweep: a rows set expired before any claim, or the ledger hides a re-taken row (safety.md §9)"
	knownFresh      = "a worker started less than a TTL after a promotion reset a live row (safety.md §8)"
	knownRolledBack = "no fencing: a fetch rolled back after Track, its row reset under its next taker (safety.md §2)"
	knownTwoTakes   = "one instance ID, two takes: a row taken after the recoverer's claim or read (issue 10's note)"
	knownForeign    = "a second fleet started right after Redis restarted empty, before our heartbeats recorded the fleet again (safety.md §13, A2)"
	knownJudgedLost = "a Redis restart, failover or eviction lost a judged marker: the worker goes on in the judged life (safety.md §14)"
)

// freshAfterPromotion reports whether p started less than a TTL after a
// promotion, so its first look at the new master had nothing to compare
// with: docs/safety.md §8 documents that such a worker may reset the rows
// of a live worker whose last heartbeat the failover lost. The caller
// holds w.mu.
func (w *simWorld) freshAfterPromotion(p *simProc) bool {
	for _, at := range w.promoted {
		if !p.started.Before(at) && p.started.Sub(at) < w.longestTTL() {
			return true
		}
	}
	return false
}

// setExpired reports whether row, in progress for a dead taker, belongs
// to a rows set that expired before any recoverer claimed it, without the
// backstop sweep: the fleet could not scan for rows TTL − detection window
// after the taker's death (docs/safety.md: the sweep's case). The caller
// holds w.mu.
func (w *simWorld) setExpired(row *simRow) bool {
	// A row of a worker of the old kind has no owner: the sweep cannot
	// find it either.
	return row.taker != nil && (!w.cfg.sweep() || row.taker.old) && row.taker.dead && w.unrecorded[row.taker.id]
}

// trackedThenRolledBack reports whether a process of instance tracked row
// id in a fetch that rolled back. The caller holds w.mu.
func (w *simWorld) trackedThenRolledBack(instance string, id int64) bool {
	for _, p := range w.procs {
		if p.id == instance && p.rolledBack[id] {
			return true
		}
	}
	return false
}

// ledgerHides reports whether row id, in progress for a dead taker, is
// the documented leftover of docs/safety.md §9 without owner fencing: its
// taker was paused past its TTL, the row was reset under it and recorded
// in the reset ledger for the taker's incarnation, and the taker took it
// again under that same incarnation before it died, so every recovery
// skips it. The caller holds w.mu.
func (w *simWorld) ledgerHides(id int64, row *simRow) bool {
	return w.setExpired(row) || w.ledgerRecorded(id, row)
}

// ledgerRecorded reports whether, without fencing, the reset ledger holds
// an entry for row id under its taker's instance, so a later recovery of
// that instance leaves it alone (docs/safety.md §9). The caller holds w.mu.
func (w *simWorld) ledgerRecorded(id int64, row *simRow) bool {
	if row.taker == nil || row.taker.setsOwner() {
		return false
	}
	for k := range w.table.recorded {
		if k.instance == row.taker.id && k.row == id && row.resets > 0 {
			return true
		}
	}
	return false
}

type simSnap struct {
	at   time.Time
	keys map[string]*simKey
}

// tracef records a step; the caller holds w.mu (or runs before any other
// goroutine of the run).
func (w *simWorld) tracef(format string, args ...any) {
	line := fmt.Sprintf("%10.6fs  ", time.Since(w.start).Seconds()) + fmt.Sprintf(format, args...)
	w.trace = append(w.trace, line)
	if os.Getenv("SIMLIVE") != "" {
		fmt.Fprintln(os.Stderr, line)
	}
}

// violate records a broken invariant; the caller holds w.mu.
func (w *simWorld) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.tracef("VIOLATION: %s", msg)
	w.violations = append(w.violations, fmt.Sprintf("at %.6fs: %s", time.Since(w.start).Seconds(), msg))
}

// faulty reports whether the faults still strike: latency spikes, lost
// replies lost again on a retry.
func (w *simWorld) faulty() bool { return time.Since(w.start) < simFaultEnd }

func (w *simWorld) lostReplies() float64 {
	if time.Now().Before(w.lostTill) {
		return w.cfg.lostReply
	}
	return 0
}

func (w *simWorld) lostAcks() float64 {
	if time.Now().Before(w.lostTill) {
		return w.cfg.lostAck
	}
	return 0
}

// pgDown is called with w.mu held.
func (w *simWorld) pgDown() bool { return time.Now().Before(w.pgDownTill) }

func (w *simWorld) pgSlow() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Now().Before(w.pgSlowTill) {
		return w.pgSlowMax
	}
	return 0
}

// newSimWorld draws the run's configuration from the seed.
func newSimWorld(seed uint64, mut simMutations) *simWorld {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	modes := []string{"owner", "rows+fenced+sweep", "rows+fenced", "rows"}
	cfg := simConfig{
		mode:      modes[rng.IntN(len(modes))],
		procs:     2 + rng.IntN(3),
		lostReply: []float64{0, 0.01, 0.05, 0.1}[rng.IntN(4)],
		lostAck:   []float64{0, 0.02, 0.1}[rng.IntN(3)],
	}
	if rng.IntN(2) == 0 {
		cfg.maxRec = 3 + rng.IntN(3)
	}
	// A third of the seeds that chose rows sets without an owner column
	// run the backstop sweep by row version (issue 21); the choice is not
	// drawn from rng, so every other seed replays as before.
	if cfg.mode == "rows" && seed%3 == 1 {
		cfg.mode = "rows+sweep"
	}
	cfg.deferred = cfg.mode != "owner" && rng.IntN(3) == 0
	// Drawn from a stream of its own, so the seeds of the other modes
	// replay as they did before the rollout existed.
	cfg.rollout = cfg.mode == "owner" && rand.New(rand.NewPCG(seed, 0x0e11)).IntN(3) == 0
	// Redis forgetting strands the rows of a dead worker of the old kind
	// (its rows set gone, and no owner for the sweep): the rows-set mode
	// without the sweep, not drawn.
	cfg.redisLoss = cfg.sweep() && !cfg.rollout
	// The fault classes of issue 20's items 2 and 3 draw from a stream of
	// their own too, so that every earlier seed replays the run it always
	// did.
	later := rand.New(rand.NewPCG(seed, 0x1a7e))
	cfg.timings = cfg.redisLoss && later.IntN(2) == 0
	cfg.foreign = later.IntN(2) == 0
	// Drawn from the seed, not the driver's stream, so that the seeds
	// without evictions replay as before. Not during a rollout: an evicted
	// rows set of a worker of the old kind strands its rows (no owner for
	// the sweep), as Redis forgetting does (docs/safety.md §13, A1).
	cfg.evicting = cfg.sweep() && !cfg.rollout && seed%7 == 5
	// Its own stream too (issue 21's version guard).
	cfg.operator = cfg.mode == "rows+sweep" && rand.New(rand.NewPCG(seed, 0x09e7)).IntN(2) == 0
	cfg.youngRedis = cfg.mode == "rows+sweep" && rand.New(rand.NewPCG(seed, 0x7a6e)).IntN(2) == 0
	if cfg.youngRedis {
		// Rows a paused worker leaves to the sweep (its set wiped) come
		// back a fleet's longest rows TTL later: with the long-timed
		// members' (4 × 6 s) that outlasts the liveness check.
		cfg.timings = false
	}
	// A stream of its own again; the class changes nothing before the
	// bound check's kill, so every run replays as before up to there.
	cfg.vanish = rand.New(rand.NewPCG(seed, 0x10c4)).IntN(2) == 0
	// The same for the mass death.
	cfg.massDeath = rand.New(rand.NewPCG(seed, 0xdea7)).IntN(2) == 0
	// The liveness witness's timings and classes: streams of their own.
	drawWitness(seed, &cfg, mut.noWitness)
	ledger := (!cfg.fenced() || cfg.rollout) && !mut.noLedger
	return &simWorld{seed: seed, rng: rng, later: later, cfg: cfg, mut: mut, unrecorded: map[string]bool{}, known: map[string]int{},
		table:    newSimTable(simRows, cfg.fenced(), ledger, cfg.maxRec),
		wrng:     rand.New(rand.NewPCG(seed, 0x3472)),
		hrng:     rand.New(rand.NewPCG(seed, 0x3473)),
		markedAt: map[string]time.Time{}, turnOf: map[string]string{}, turnSince: map[string]time.Time{},
		judgedAt: map[string]time.Time{}, judgedLost: map[string]bool{}}
}

// options are the Worker options of a process of the run; old is a worker
// of the release before the owner column (rollout); long gives it simLong
// times the timings.
func (w *simWorld) options(id string, old, long bool) []Option {
	k := time.Duration(1)
	if long {
		k = simLong
	}
	opts := []Option{
		WithInstanceID(id), WithLogger(discardLogger),
		WithTimings(Timings{
			HeartbeatTTL:      k * simTTL,
			HeartbeatInterval: k * simInterval,
			RecoveryInterval:  k * simRecovery,
			ResetTimeout:      k * simReset,
		}),
		WithHistory(0), // the fleet history is not part of the protocol modelled
	}
	if w.cfg.mode != "owner" || old {
		opts = append(opts, WithRowsSets())
	}
	if w.cfg.mode == "rows+fenced+sweep" {
		opts = append(opts, WithBackstopSweep(true))
	}
	if w.cfg.mode == "rows" {
		opts = append(opts, WithBackstopSweep(false))
	}
	if w.cfg.deferred {
		opts = append(opts, WithDeferredUntrack(100*time.Millisecond))
	}
	if w.cfg.witness {
		opts = append(opts, WithTimings(Timings{WitnessGrace: w.cfg.wGrace, WitnessFence: w.cfg.wFence}))
	} else if w.cfg.mode == "owner" {
		opts = append(opts, WithLivenessWitness(false))
	}
	return opts
}

// spawn makes a process with instance ID id ("" for a new one) and starts
// its Worker and host loop in the background: Start is tried until it
// succeeds (a predecessor under the same ID is waited out, Redis may be
// down) or the process is killed.
func (w *simWorld) spawn(t *testing.T, id string) *simProc {
	w.mu.Lock()
	w.nextProc++
	if id == "" {
		w.nextID++
		id = fmt.Sprintf("w%d", w.nextID)
	}
	p := &simProc{world: w, n: w.nextProc, id: id, held: map[int64]bool{}, heldAs: map[int64]string{}, rolledBack: map[int64]bool{},
		deadCh: make(chan struct{}), hostDone: make(chan struct{})}
	// A kind per instance ID (a restart keeps it): every other process of
	// the first fleet is of the old release; the deploy replaces the
	// others with new ones.
	var n int
	_, _ = fmt.Sscanf(id, "w%d", &n)
	p.old = w.cfg.rollout && n%2 == 1 && n <= w.cfg.procs
	p.conn = &simConn{world: w, proc: p, streams: map[string]*rand.Rand{},
		claimAt: map[string]time.Time{}, readAt: map[string]time.Time{}}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	w.clients = append(w.clients, rdb)
	long := w.cfg.timings && p.n%2 == 0
	wk, err := New(rdb, &simResetter{p: p}, append(w.options(id, p.old, long), withStore(func(store.Store) store.Store {
		return &simStore{c: p.conn, prefix: defaultKeyPrefix}
	}))...)
	if err != nil {
		w.mu.Unlock()
		t.Fatalf("New: %v", err)
	}
	p.w = wk
	p.conn.opTimeout = wk.opts.opTimeout
	w.procs = append(w.procs, p)
	w.tracef("%s spawned (owner mode %v, old release %v, TTL %v)", p, wk.Stats().OwnerMode, p.old, wk.opts.heartbeatTTL)
	w.mu.Unlock()

	hostCtx, cancel := context.WithCancel(context.Background())
	p.hostStop = cancel
	// This goroutine owns the Worker's lifecycle: Start holds the
	// Worker's lock while it waits, and in a bubble a goroutine waiting
	// for a mutex stops the fake clock, so nothing else may take it
	// meanwhile. Once hostCtx ends it stops the Worker: w.crash after a
	// crash, Shutdown at the end of the run.
	go func() {
		defer close(p.hostDone)
		defer p.stop()
		for {
			ctx, cancel := context.WithTimeout(hostCtx, 3*simTTL)
			err := wk.Start(ctx)
			cancel()
			if err == nil {
				break
			}
			w.mu.Lock()
			w.tracef("%s Start: %v", p, err)
			w.mu.Unlock()
			if sleepCtx(hostCtx, 100*time.Millisecond+time.Duration(p.n)*time.Microsecond) != nil {
				return
			}
		}
		w.mu.Lock()
		p.started = time.Now()
		w.tracef("%s started", p)
		w.mu.Unlock()
		p.host(hostCtx)
	}()
	return p
}

// stop ends the Worker once the host has stopped: as SIGKILL would if the
// process crashed, with Shutdown otherwise.
func (p *simProc) stop() {
	w := p.world
	w.mu.Lock()
	dead := p.dead
	w.mu.Unlock()
	if dead {
		p.w.crash()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.w.Shutdown(ctx); err != nil {
		w.mu.Lock()
		w.violate("%s Shutdown: %v", p, err)
		w.mu.Unlock()
	}
}

// crash kills p as SIGKILL would: its calls in flight have no effect, its
// loops stop without any clean-up, its open fetch transaction rolls back.
func (w *simWorld) crash(p *simProc) {
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return
	}
	p.dead = true
	close(p.deadCh)
	w.tracef("FAULT %s crashes holding %v", p, slices.Sorted(mapKeys(p.held)))
	w.killSubs(p)
	p.held = map[int64]bool{}
	for id, row := range w.table.rows {
		if row.lockedBy == p {
			row.lockedBy = nil
			p.rolledBack[id] = true
		}
	}
	w.mu.Unlock()
	w.stopHost(p)
}

// stopHost stops p's host loop and waits for it to end. A host still in a
// call 30 s later (CheckLease waiting for a witness proof that never
// comes) is a violation; the Worker is then stopped under it, as a kill
// stops it, so that the run ends.
func (w *simWorld) stopHost(p *simProc) {
	p.hostStop()
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-p.hostDone:
		return
	case <-t.C:
	}
	w.mu.Lock()
	w.violate("%s: its host still runs 30 s after it was stopped (a call that never returns: CheckLease waiting for a proof?)%s", p, p.witnessState())
	w.mu.Unlock()
	p.w.crash()
	<-p.hostDone
}

func mapKeys[V any](m map[int64]V) func(func(int64) bool) {
	return func(yield func(int64) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// newAlive reports whether a worker that sets the owner column is alive:
// during a rollout only those find the rows of a dead one (the sweep);
// the old kind finds no rows set and deregisters it.
func (w *simWorld) newAlive() bool {
	for _, p := range w.live() {
		if !p.old {
			return true
		}
	}
	return false
}

func (w *simWorld) live() []*simProc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*simProc
	for _, p := range w.procs {
		if !p.dead {
			out = append(out, p)
		}
	}
	return out
}

// fault strikes one fault drawn by the driver.
func (w *simWorld) fault(t *testing.T, until time.Time) {
	left := time.Until(until)
	if left <= 0 {
		return
	}
	r := w.rng
	// Faults end at a drawn moment before the phase ends, never at an
	// instant the driver uses.
	capped := func(d time.Duration) time.Duration {
		return max(time.Microsecond, min(d, left-time.Duration(r.Int64N(int64(100*time.Millisecond)))-7*time.Microsecond))
	}
	kinds := []string{"crash", "crash", "pause", "pause", "pgdown", "pgslow", "redisdown"}
	if w.cfg.redisLoss && w.cfg.operator {
		kinds = append(kinds, "restart-empty")
	} else if w.cfg.redisLoss {
		kinds = append(kinds, "restart-empty", "restart-snapshot", "failover")
	}
	if w.cfg.evicting {
		kinds = append(kinds, "evict", "evict")
	}
	if w.cfg.mode == "rows+sweep" {
		kinds = append(kinds, "flush") // FLUSHALL: node age cannot see it
	}
	if w.cfg.youngRedis {
		// The crash-looping Redis is the run's fault, with pauses: outages
		// of Redis or PostgreSQL would only end the sweep's looks early,
		// and crashes end the slow rows.
		kinds = []string{"pause"}
	}
	kind := kinds[r.IntN(len(kinds))]
	live := w.live()
	switch kind {
	case "crash":
		if len(live) == 0 {
			return
		}
		p := live[r.IntN(len(live))]
		if w.cfg.witness {
			// A quarter of the crashes are hosts that vanish: the
			// witness's connection stays half-open (its own stream).
			p.halfOpen = w.hrng.IntN(4) == 0
		}
		w.crash(p)
		delay := time.Duration(r.Int64N(int64(3 * time.Second)))
		sameID := r.IntN(2) == 0
		go func() {
			time.Sleep(delay) // fake clock: the crashed process restarts after its delay
			if time.Now().Before(until.Add(-time.Second)) || len(w.live()) < 2 {
				id := ""
				if sameID {
					id = p.id
				}
				w.spawn(t, id)
			}
		}()
	case "pause":
		if len(live) == 0 {
			return
		}
		p := live[r.IntN(len(live))]
		d := capped(time.Duration(r.Int64N(int64(2*simTTL))) + time.Millisecond)
		w.mu.Lock()
		p.pausedUntil = time.Now().Add(d)
		w.tracef("FAULT %s paused for %v", p, d)
		w.mu.Unlock()
	case "pgdown":
		d := capped(time.Duration(r.Int64N(int64(8*time.Second))) + time.Millisecond)
		w.mu.Lock()
		w.pgDownTill = time.Now().Add(d)
		w.tracef("FAULT PostgreSQL down for %v", d)
		w.mu.Unlock()
	case "pgslow":
		d := capped(time.Duration(r.Int64N(int64(5*time.Second))) + time.Millisecond)
		w.mu.Lock()
		w.pgSlowTill = time.Now().Add(d)
		w.pgSlowMax = time.Duration(r.Int64N(int64(1500*time.Millisecond))) + time.Millisecond
		w.tracef("FAULT PostgreSQL slow (up to %v more per transaction) for %v", w.pgSlowMax, d)
		w.mu.Unlock()
	case "evict":
		d := capped(time.Duration(r.Int64N(int64(3*time.Second))) + time.Millisecond)
		w.mu.Lock()
		w.redis.evictTill = time.Now().Add(d)
		w.evicted = true
		w.tracef("FAULT Redis evicts a key with a TTL at every command for %v", d)
		w.mu.Unlock()
	case "redisdown":
		d := capped(time.Duration(r.Int64N(int64(time.Second))) + time.Millisecond)
		w.mu.Lock()
		w.redis.downTill = time.Now().Add(d)
		w.tracef("FAULT Redis unreachable for %v", d)
		w.mu.Unlock()
	case "restart-empty":
		d := capped(time.Duration(r.Int64N(int64(500*time.Millisecond))) + time.Millisecond)
		w.mu.Lock()
		w.redis.restart(nil, d)
		w.redisUp = time.Now().Add(d)
		w.tracef("FAULT Redis restarted empty (down %v)", d)
		w.mu.Unlock()
	case "flush":
		w.mu.Lock()
		w.redis.flush()
		w.flushedAt = time.Now()
		w.tracef("FAULT Redis flushed (FLUSHALL)")
		w.mu.Unlock()
	case "restart-snapshot", "failover":
		d := capped(time.Duration(r.Int64N(int64(300*time.Millisecond))) + time.Millisecond)
		w.mu.Lock()
		if len(w.snaps) == 0 {
			w.mu.Unlock()
			return
		}
		if kind == "failover" {
			// The replica lags by the last snapshot or two.
			s := w.snaps[max(0, len(w.snaps)-1-r.IntN(2))]
			w.redis.failover(s.keys, d, w.start)
			w.redisUp = time.Now().Add(d)
			w.failedOver = true
			w.promoted = append(w.promoted, time.Now().Add(d))
			w.tracef("FAULT Redis failover to a replica %v behind (down %v)", time.Since(s.at), d)
		} else {
			s := w.snaps[r.IntN(len(w.snaps))]
			w.redis.restart(s.keys, d)
			w.redisUp = time.Now().Add(d)
			w.tracef("FAULT Redis restarted from a snapshot %v old (down %v)", time.Since(s.at), d)
		}
		w.mu.Unlock()
	}
}

// Identities of the two fleets' tables, in the foreign fault class.
const (
	simServes        = "database=sim schema=public table=batchrows"
	simForeignServes = "database=sim schema=public table=other"
)

// simForeignResetter is the second fleet's resetter: its table is not
// modelled; a reset there changes nothing of ours.
type simForeignResetter struct{}

func (simForeignResetter) Info() ResetterInfo {
	return ResetterInfo{Name: "simForeignResetter", InProgressStatus: stInprog, QueuedStatus: stQueued}
}

// Check tells what the second fleet serves.
func (r simForeignResetter) Check(context.Context, bool) (ResetterInfo, error) {
	info := r.Info()
	info.Serves, info.IdleInTxTimeout = simForeignServes, time.Minute
	return info, nil
}

func (simForeignResetter) ResetRows(_ context.Context, req RowsReset) (ResetResult, error) {
	return ResetResult{Changed: int64(len(req.RowIDs))}, nil
}

func (simForeignResetter) ResetOwner(context.Context, OwnerReset) (ResetResult, error) {
	return ResetResult{}, nil
}

func (simForeignResetter) ResetVersions(context.Context, VersionsReset) (ResetResult, error) {
	return ResetResult{}, nil
}

func (simForeignResetter) PlanReset(context.Context, PlanRequest) (ResetResult, error) {
	return ResetResult{}, errors.ErrUnsupported
}

func (simForeignResetter) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

func (simForeignResetter) InProgressRows(context.Context) ([]RowState, error) {
	return nil, errors.ErrUnsupported
}

// RowStates is not supported: the second fleet's worker runs no
// self-check.
func (simForeignResetter) RowStates(context.Context, []int64) ([]RowState, error) {
	return nil, errors.ErrUnsupported
}

// foreignStrike starts a worker of a second fleet under the prefix. Start
// must refuse it (ErrFleetMismatch). If it starts, it tracks the row IDs
// our live workers hold (the same numbers in its own table) and dies: a
// recovery of it by our fleet would reset them in ours. One that started
// because it recorded its table first, Redis having restarted empty just
// before and no heartbeat of ours having recorded ours again, is the
// documented limit (knownForeign): it shuts down cleanly.
func (w *simWorld) foreignStrike() {
	w.mu.Lock()
	w.nextProc++
	p := &simProc{world: w, n: w.nextProc, id: "other-app", held: map[int64]bool{}, heldAs: map[int64]string{}, rolledBack: map[int64]bool{},
		deadCh: make(chan struct{}), hostDone: make(chan struct{})}
	p.conn = &simConn{world: w, proc: p, streams: map[string]*rand.Rand{},
		claimAt: map[string]time.Time{}, readAt: map[string]time.Time{}}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	w.clients = append(w.clients, rdb)
	wk, err := New(rdb, simForeignResetter{}, WithInstanceID(p.id), WithLogger(discardLogger),
		WithTimings(Timings{
			HeartbeatTTL:      simTTL,
			HeartbeatInterval: simInterval,
			RecoveryInterval:  simRecovery,
			ResetTimeout:      simReset,
		}), WithHistory(0), WithRowsSets(), withStore(func(store.Store) store.Store {
			return &simStore{c: p.conn, prefix: defaultKeyPrefix}
		}))
	if err != nil {
		w.violate("New of the second fleet's worker: %v", err)
		w.mu.Unlock()
		return
	}
	p.w = wk
	p.conn.opTimeout = wk.opts.opTimeout
	w.tracef("SECOND FLEET %s starts under the prefix", p)
	w.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 3*simTTL)
	err = wk.Start(ctx)
	cancel()
	w.mu.Lock()
	if err != nil {
		w.tracef("SECOND FLEET %s Start: %v", p, err)
		w.mu.Unlock()
		return
	}
	recorded := ""
	if e := w.redis.get(store.FleetKey(defaultKeyPrefix)); e != nil {
		recorded = e.hash["serves"]
	}
	if recorded == simForeignServes {
		w.known[knownForeign]++
		w.tracef("KNOWN second fleet %s recorded its table first (Redis restarted empty just before)", p)
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = wk.Shutdown(ctx)
		cancel()
		// The operator, told by our heartbeats' Error and our refused
		// Starts, gives that application its own prefix and deletes the
		// record (docs/operations.md): our fleet records its table again.
		w.mu.Lock()
		w.redis.del(store.FleetKey(defaultKeyPrefix))
		w.tracef("operator deletes the fleet record")
		w.mu.Unlock()
		return
	}
	var ids []int64
	for _, q := range w.procs {
		if !q.dead {
			ids = append(ids, slices.Sorted(mapKeys(q.held))...)
		}
	}
	w.tracef("SECOND FLEET %s started (record %q); tracks %v of its own table and dies", p, recorded, ids)
	w.mu.Unlock()
	if len(ids) > 0 {
		_ = wk.Track(context.Background(), ids...)
	}
	wk.crash()
}

// snapshotter keeps the last ten seconds of Redis snapshots, every 250ms
// or so, for restarts from an old RDB file and failovers.
func (w *simWorld) snapshotter(stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(250*time.Millisecond + time.Duration(i%7)*time.Microsecond):
		}
		w.mu.Lock()
		w.snaps = append(w.snaps, simSnap{at: time.Now(), keys: w.redis.snapshot()})
		if len(w.snaps) > 40 {
			w.snaps = w.snaps[1:]
		}
		w.mu.Unlock()
	}
}

// longestTTL is the longest heartbeat TTL of the run's members: verdicts
// held after a restart or a failover wait for it (registry.go).
func (w *simWorld) longestTTL() time.Duration {
	if w.cfg.timings {
		return simLong * simTTL
	}
	return simTTL
}

// simBound is the documented recovery bound from a worker's last heartbeat
// (TTL + 1.1 × recovery interval + the scan turn), plus one scan: the
// heartbeat's own latency and the scan's round trips and reset, each under
// the operation timeout. In a fleet of mixed timings the wait for the scan
// is the slowest member's (README, Timings): the victim's TTL + the
// longest wait + the longest operation timeouts. The caller holds w.mu.
func (w *simWorld) simBound(victim *Worker) time.Duration {
	wait, op := victim.opts.detectionWindow()-victim.opts.heartbeatTTL, victim.opts.opTimeout
	for _, p := range w.procs {
		o := p.w.opts
		wait, op = max(wait, o.detectionWindow()-o.heartbeatTTL), max(op, o.opTimeout)
	}
	return victim.opts.heartbeatTTL + wait + 2*op
}

// run is one seed, inside a bubble. It returns the violations.
func (w *simWorld) run(t *testing.T) {
	w.start = time.Now()
	w.redis = newSimRedis(w.start)
	w.redis.evictRng = rand.New(rand.NewPCG(w.seed, 0xe71c7))
	w.lostTill = w.start.Add(simFaultEnd + 6*time.Second)
	if w.cfg.youngRedis {
		r := rand.New(rand.NewPCG(w.seed, 0x7a6f))
		w.youngFrom = w.start.Add(500*time.Millisecond + dur(r, time.Second))
		w.youngTill = w.youngFrom.Add(9*time.Second + dur(r, time.Second))
	}
	w.tracef("seed %d: %+v %+v", w.seed, w.cfg, w.mut)
	stopSnaps := make(chan struct{})
	snapsDone := make(chan struct{})
	go func() { defer close(snapsDone); w.snapshotter(stopSnaps) }()

	for range w.cfg.procs {
		w.spawn(t, "")
		time.Sleep(time.Duration(w.rng.Int64N(int64(3 * time.Millisecond)))) // fake clock: the processes start up to 3 ms apart
	}

	foreignDone := make(chan struct{})
	if w.cfg.foreign {
		at := time.Second + time.Duration(w.later.Int64N(int64(8*time.Second)))
		go func() {
			defer close(foreignDone)
			time.Sleep(at) // fake clock: the foreign strike's instant
			w.foreignStrike()
		}()
	} else {
		close(foreignDone)
	}

	// The witness's faults, from a driver of their own.
	witnessDone := make(chan struct{})
	if w.cfg.witness {
		go w.witnessFaults(witnessDone)
	} else {
		close(witnessDone)
	}

	// Faults, at drawn instants, until simFaultEnd.
	faultEnd := w.start.Add(simFaultEnd)
	var at []time.Duration
	for n := 3 + w.rng.IntN(8); n > 0; n-- {
		at = append(at, 300*time.Millisecond+time.Duration(w.rng.Int64N(int64(simFaultEnd-time.Second))))
	}
	slices.Sort(at)
	for _, a := range at {
		time.Sleep(time.Until(w.start.Add(a))) // fake clock: the next fault's instant
		w.fault(t, faultEnd)
	}
	time.Sleep(time.Until(faultEnd)) // fake clock: the end of the faults
	<-foreignDone
	<-witnessDone
	for len(w.live()) < 2 || !w.newAlive() {
		w.spawn(t, "")
	}
	w.mu.Lock()
	w.tracef("faults end")
	w.mu.Unlock()

	// The bound: kill a worker that holds rows, once nothing else is wrong.
	// A Redis that restarted or failed over holds death verdicts back for
	// a TTL after the workers see it (registry.go): the bound counts from
	// the end of that.
	w.mu.Lock()
	quiet := w.redisUp.Add(w.longestTTL() + w.longestTTL()/4)
	w.mu.Unlock()
	time.Sleep(time.Until(quiet)) // fake clock: the bound's start, after the last restart's hold
	w.checkBound(t)

	// Liveness: every row ends done or quarantined.
	deadline := time.Now().Add(simLiveness)
	for !w.allSettled() && time.Now().Before(deadline) && !w.onlyKnownLeft() {
		time.Sleep(50 * time.Millisecond) // fake clock: the next look at the table
	}
	w.mu.Lock()
	for _, id := range w.table.ids() {
		row := w.table.rows[id]
		if row.status == stInprog && w.ledgerHides(id, row) {
			w.known[knownStuck]++
			w.tracef("KNOWN row %d stays in progress for %s: its rows set expired before any claim, or the ledger hides it (docs/safety.md §9)", id, row.taker)
			continue
		}
		if row.status != stDone && row.status != stFailed {
			w.violate("row %d not done %v after the faults ended: status %s, owner %q, taken by %v; Redis: %s",
				id, simLiveness, row.status, row.owner, row.taker, w.describe())
			break
		}
	}
	w.tracef("all settled")
	// Every worker is configured right: the self-check, which runs on
	// every Worker of the simulation (simResetter reads row states), must
	// never take the rows of a paused, recovered or crashed one for a
	// misconfiguration.
	for _, p := range w.procs {
		if err := p.w.checker.alarmErr(); err != nil {
			w.violate("%s: false alarm of the self-check: %v", p, err)
		}
	}
	w.mu.Unlock()

	// Shutdown: no goroutine left.
	for _, p := range w.live() {
		w.stopHost(p)
	}
	close(stopSnaps)
	<-snapsDone
	if n := workerGoroutines(); n > 0 {
		w.mu.Lock()
		w.violate("%d goroutines of Workers left after Shutdown", n)
		w.mu.Unlock()
	}
	for _, c := range w.clients {
		c.Close()
	}
}

// checkBound kills a worker that holds rows once the faults have ended and
// checks that its rows are queued again within the bound.
func (w *simWorld) checkBound(t *testing.T) {
	var victim *simProc
	var rows []int64
	// With the liveness witness, and a kill that closes the victim's
	// connections (not a vanished host), the victim is looked for among
	// workers the witness would judge alone (witnessSettled) first: its
	// rows are held to the witness's bound.
	fast := w.cfg.witness && !w.cfg.vanish
	looks := 400
	if w.cfg.witness {
		looks = 800
	}
	for look := range looks {
		if look == 400 {
			fast = false // none settled: the heartbeat's bound alone
		}
		for _, p := range w.live() {
			// Not a worker holding rows it left to the backstop sweep (its
			// rows set was gone when its lease came back: docs/safety.md
			// §3): its lease stays lost until it releases them.
			if r := p.heldRows(); len(r) > 0 && p.leaseOK() && (!fast || w.witnessSettled(p)) {
				victim, rows = p, r
				break
			}
		}
		if victim != nil {
			break
		}
		time.Sleep(5*time.Millisecond + 3*time.Microsecond) // fake clock: the next look for a process holding rows
	}
	if victim == nil {
		return // nothing in flight: every row is done already
	}
	lease := &victim.w.lease
	lastBeat := lease.epoch.Add(time.Duration(lease.until.Load()) - lease.length)
	var lockedID int64
	var lockEnd time.Time
	if w.cfg.vanish {
		// The victim's host vanishes in the middle of completing its first
		// row: its transaction holds the row locked until the server ends
		// the session.
		lockedID = rows[0]
		lockEnd = time.Now().Add(time.Second + time.Duration(rand.New(rand.NewPCG(w.seed, 0x10c5)).Int64N(int64(10*time.Second))))
		w.mu.Lock()
		w.table.rows[lockedID].lockTill = lockEnd
		w.tracef("FAULT %s vanishes completing row %d: locked until %.6fs", victim, lockedID, lockEnd.Sub(w.start).Seconds())
		w.mu.Unlock()
	}
	if w.cfg.massDeath {
		w.mu.Lock()
		reg := store.RegistryKey(defaultKeyPrefix)
		for i := range simMassDeath {
			id := fmt.Sprintf("gone-%04d", i)
			w.redis.sadd(reg, id)
			if i%10 == 0 {
				// Written by its last heartbeat, before the victim's.
				w.redis.set(store.InstanceKeys(defaultKeyPrefix, id).Incarnation, "life", simTTL/2)
			}
		}
		w.tracef("FAULT %d registered workers found dead at once (a zone outage)", simMassDeath)
		w.mu.Unlock()
	}
	victim.halfOpen = w.cfg.witness && w.cfg.vanish
	killed := time.Now()
	w.crash(victim)
	w.spawn(t, "")
	if fast {
		w.checkWitnessBound(victim, rows, killed)
	}
	w.mu.Lock()
	bound := w.simBound(victim.w)
	if w.cfg.rollout && !victim.old {
		// An old worker may scan first, find no rows set and deregister
		// it; the sweep of a new one then finds its rows by owner, two
		// sightings a TTL apart (docs/integration.md, "Rolling out owner
		// mode"; docs/safety.md §2, O3's bound).
		bound = max(bound, 2*w.longestTTL()+44*simRecovery/10+2*victim.w.opts.opTimeout)
	}
	if w.failedOver {
		// A worker learns of a promotion at its first INFO, which it
		// sends when it first finds a heartbeat absent, and holds its
		// verdicts for a TTL from then (docs/safety.md §8): the first
		// death after a failover waits that TTL too, and another if the
		// scan turn passes meanwhile to a worker that had not looked at
		// the new master yet (seed 1653). The rows sets of the peers held
		// are renewed meanwhile (keepHeld), so the wait loses nothing.
		bound += 2 * w.longestTTL()
	} else if w.evicted {
		// The same after evictions: a look after the faults may be the
		// first to see the count moved, or a worker's first look, which
		// cannot tell when it moved (registry.go); either holds a TTL.
		bound += 2 * w.longestTTL()
	}
	deadline := lastBeat.Add(bound)
	if w.flushedAt.After(lastBeat) {
		// The victim (paused) wrote nothing after a FLUSHALL: only the
		// backstop sweep finds its rows, two looks a rows TTL apart after
		// the flush, by a holder of the sweep turn (which the victim may
		// have held) (docs/safety.md §5b).
		o := victim.w.opts
		backstop := o.rowsTTL + 2*o.recoveryInterval*11/10 + o.sweepTurnTTL() + o.recoveryInterval
		deadline = latest(deadline, w.flushedAt.Add(backstop))
	}
	setKey := store.InstanceKeys(defaultKeyPrefix, victim.id).Rows
	if w.cfg.mode == "rows+sweep" && w.redis.evictedAt[setKey].After(lastBeat) &&
		slices.ContainsFunc(rows, func(id int64) bool { return !w.redis.sismember(setKey, fmt.Sprint(id)) }) {
		// The evictions took the victim's rows set after its last
		// heartbeat wrote it (seed 2140: tracked 70 ms after the beat,
		// evicted 70 ms later, the victim killed before its next beat):
		// nothing in Redis names those rows, and only the backstop sweep
		// finds them (docs/safety.md §4, eviction). Its looks count once
		// the eviction hold is over (2 TTLs after the last eviction, as
		// above), and two of them a rows TTL apart find the rows, as after
		// a flush.
		o := victim.w.opts
		backstop := o.rowsTTL + 2*o.recoveryInterval*11/10 + o.sweepTurnTTL() + o.recoveryInterval
		deadline = latest(deadline, w.redis.lastEvict.Add(2*w.longestTTL()+backstop))
	}
	w.mu.Unlock()
	w.mu.Lock()
	w.tracef("BOUND %s killed holding %v; its last heartbeat went at %.6fs: queued again by %.6fs",
		victim, rows, lastBeat.Sub(w.start).Seconds(), deadline.Sub(w.start).Seconds())
	w.mu.Unlock()
	time.Sleep(time.Until(deadline)) // fake clock: the bound's deadline
	w.mu.Lock()
	for _, id := range rows {
		row := w.table.rows[id]
		// Not setExpired: the victim died with the fleet calm, its rows set
		// written by its last heartbeat, so a set that expires before a
		// claim is a finding (seed 1359: it did, while verdicts were held
		// after a failover). The row the vanished session locked is
		// checked below.
		if row.status == stInprog && row.taker == victim && !w.ledgerRecorded(id, row) && id != lockedID {
			w.violate("row %d of %s, killed after the faults ended, still in progress %v after its last heartbeat (bound %v)",
				id, victim, time.Since(lastBeat), bound)
		}
	}
	w.mu.Unlock()
	if lockedID == 0 {
		return
	}
	// The locked row is tried again at every scan: it is queued again
	// within a scan's wait after the session ended (its claim's TTL, the
	// scan turn and a scan: the bound from the lock's end), or by the bound
	// from the last heartbeat, whichever is later.
	again := latest(deadline, lockEnd.Add(bound))
	time.Sleep(time.Until(again)) // fake clock: the locked row's deadline
	w.mu.Lock()
	defer w.mu.Unlock()
	if row := w.table.rows[lockedID]; row.status == stInprog && row.taker == victim && !w.ledgerRecorded(lockedID, row) {
		w.violate("row %d of %s, locked by its vanished session until %.6fs, still in progress at %.6fs (bound %v from the lock's end)",
			lockedID, victim, lockEnd.Sub(w.start).Seconds(), time.Since(w.start).Seconds(), bound)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// onlyKnownLeft reports whether every row not settled yet is one the
// ledger hides: waiting longer changes nothing.
func (w *simWorld) onlyKnownLeft() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, row := range w.table.rows {
		if row.status != stDone && row.status != stFailed && !(row.status == stInprog && !row.taker.alive() && w.ledgerHides(id, row)) {
			return false
		}
	}
	return true
}

func (w *simWorld) allSettled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, row := range w.table.rows {
		if row.status != stDone && row.status != stFailed {
			return false
		}
	}
	return true
}

// describe lists the Redis keys, for a failure's message. The caller holds
// w.mu.
func (w *simWorld) describe() string {
	var parts []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range w.redis.keys {
			if !yield(k) {
				return
			}
		}
	}) {
		e := w.redis.get(k)
		if e == nil {
			continue
		}
		v := e.str
		if e.isSet {
			v = fmt.Sprint(w.redis.smembers(k))
		}
		parts = append(parts, fmt.Sprintf("%s=%s", strings.TrimPrefix(k, defaultKeyPrefix+"_"), v))
	}
	return strings.Join(parts, " ")
}

// short abbreviates a token for the trace.
func short(s string) string {
	if len(s) > 6 {
		return s[:6]
	}
	return s
}

// simulate runs one seed in a bubble and returns its violations and trace.
func simulate(t *testing.T, seed uint64, mut simMutations) (violations, trace []string, known map[string]int) {
	cryptotest.SetGlobalRandom(t, seed)
	w := newSimWorld(seed, mut)
	// The loops' jitter: a stream per process and loop.
	var jmu sync.Mutex
	streams := map[string]*rand.Rand{}
	prev := jitterSource
	jitterSource = func(o *options, loop string) float64 {
		key := loop
		w.mu.Lock()
		for _, p := range w.procs {
			if p.w != nil && &p.w.opts == o {
				key = fmt.Sprintf("%d/%s/%d/%s", seed, p.id, p.n, loop)
			}
		}
		w.mu.Unlock()
		jmu.Lock()
		defer jmu.Unlock()
		r := streams[key]
		if r == nil {
			h := fnv.New64a()
			fmt.Fprint(h, key)
			r = rand.New(rand.NewPCG(seed, h.Sum64()))
			streams[key] = r
		}
		return r.Float64()
	}
	defer func() { jitterSource = prev }()
	synctest.Test(t, func(t *testing.T) { w.run(t) })
	simWitnessTally.add(w)
	return w.violations, w.trace, w.known
}

// replay is the command that runs one seed again.
func replay(seed uint64, tags string) string {
	return fmt.Sprintf("go test -tags %s -run 'TestSimulation$' -seed %d -v .", tags, seed)
}

func TestSimulation(t *testing.T) {
	seeds := []uint64{*simSeed}
	if *simSeed == 0 {
		seeds = seeds[:0]
		for i := range *simSeeds {
			seeds = append(seeds, *simStart+uint64(i))
		}
	}
	began := time.Now()
	known := map[string]int{}
	for _, seed := range seeds {
		violations, trace, k := simulate(t, seed, simMutations{})
		for c, n := range k {
			known[c] += n
		}
		if *simTrace || *simSeed != 0 {
			t.Logf("trace of seed %d:\n%s", seed, strings.Join(trace, "\n"))
		}
		if len(violations) > 0 {
			t.Fatalf("seed %d broke an invariant:\n  %s\nreplay: %s\n%s",
				seed, strings.Join(violations, "\n  "), replay(seed, "sim"), tail(trace, 400))
		}
	}
	t.Logf("%d seeds passed in %v", len(seeds), time.Since(began).Round(time.Millisecond))
	for _, c := range slices.Sorted(maps.Keys(known)) {
		fmt.Fprintf(os.Stderr, "simulation: tolerated %4d× %s\n", known[c], c)
	}
	simWitnessTally.report()
	fmt.Fprintf(os.Stderr, "simulation: %d seeds from %d passed in %v\n", len(seeds), seeds[0], time.Since(began).Round(time.Millisecond))
}

// TestSimulationSeedsPastTheBudget replays, with every `make sim`, seeds
// past the 2,000 of the CI budget that found something. 2140 (rows+sweep,
// evictions, a vanished session, a mass death): the worker the bound check
// kills lost its rows set to an eviction 70 ms after it wrote it, and the
// backstop sweep brings its rows back within the sweep's bound, not the
// scan's.
func TestSimulationSeedsPastTheBudget(t *testing.T) {
	if *simSeed != 0 {
		t.Skip("-seed replays one seed in TestSimulation")
	}
	for _, seed := range []uint64{2140} {
		if violations, trace, _ := simulate(t, seed, simMutations{}); len(violations) > 0 {
			t.Fatalf("seed %d broke an invariant:\n  %s\nreplay: %s\n%s",
				seed, strings.Join(violations, "\n  "), replay(seed, "sim"), tail(trace, 400))
		}
	}
}

// tail is the run's first line (the seed's configuration) and its last n
// steps.
func tail(trace []string, n int) string {
	from := max(1, len(trace)-n)
	return fmt.Sprintf("%s\n... last %d steps:\n%s", trace[0], len(trace)-from, strings.Join(trace[from:], "\n"))
}

// The same seed gives the same run, step for step.
func TestSimulationIsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		_, a, _ := simulate(t, seed, simMutations{})
		_, b, _ := simulate(t, seed, simMutations{})
		if !slices.Equal(a, b) {
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("seed %d: runs differ at step %d of %d/%d:\n  %s\n  %s", seed, i, len(a), len(b), a[i], b[i])
				}
			}
			t.Fatalf("seed %d: runs differ in length: %d and %d steps", seed, len(a), len(b))
		}
	}
}

var _ = store.FailedClaim
