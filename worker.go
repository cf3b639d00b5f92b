package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/store"
)

// A Worker gives one process of a batch-worker fleet crash recovery. It
// keeps a heartbeat in Redis, registers itself in the fleet's registry,
// records the rows it is processing (Track/Untrack), and periodically resets
// the rows of peers whose heartbeat has expired.
//
// A Worker is safe for concurrent use. Create it with New, call Start once,
// and Shutdown when the process stops. See the package documentation for the
// lifecycle.
type Worker struct {
	opts     options
	resetter Resetter

	lifecycle // Start, Shutdown
	deps      // what every part is built from: the store, the log, New's decisions

	// Shared state.
	rows    inflight   // the rows tracked now (rowtrack.go)
	tracker tracker    // records them, in Redis or not, by mode (rowtrack.go)
	lease   lease      // heartbeat.go
	stats   counters   // stats.go
	events  dispatcher // events.go

	loops // what Start runs, and the parts they share
}

// deps are what New builds once and every part of a Worker is built
// from: each part embeds them (River's archetype) instead of holding a
// pointer to each. Besides the settings and the shared services, they
// hold New's decisions: how the client reaches Redis (for messages),
// what the resetter guarantees (its Info), whether the backstop sweep
// resets by owner (sweepOf), and this process's heartbeat value
// (heartbeat.go).
type deps struct {
	opts   *options    // the settings, read-only after New
	store  store.Store // every Redis command goes through it
	log    *slog.Logger
	stats  *counters
	events *dispatcher
	rlog   *recoveryLog // the recovery's log lines (events.go)
	fleet  *fleetView   // the fleet record and its timings (registry.go)
	// judge says who is dead: the registry, the heartbeats, node ages and
	// evictions, with the fleet's timings (registry.go); nil in the
	// judge itself and in the fleet view and node watch it is built on.
	judge *judge
	sig   *testSignals // the loops' test signals (events.go)

	target       redisTarget
	info         ResetterInfo
	sweepByOwner bool
	beatValue    string
}

// lifecycle is the state Start and Shutdown share.
type lifecycle struct {
	state     atomic.Int32
	mu        sync.Mutex // serializes Start and the transitions of Shutdown
	started   bool
	stopLoops context.CancelFunc
	loopsDone chan struct{}
	cleaned   bool
}

// loops are the Worker's background loops, one small type each, with run
// (the loop) and runOnce (one turn, which tests call), and the parts they
// share with Start and the exported methods. New builds each with what it
// uses; none holds the Worker.
type loops struct {
	heart   *heartbeater // heartbeat.go
	recov   *recoverer   // recovery.go
	sweeper *sweeper     // sweep.go; nil when no backstop sweep runs
	checker *selfChecker // selfcheck.go
	giver   *giver       // heartbeat.go; nil when a lost lease is not sticky
	// The liveness witness (witness.go), nil when it is off: this
	// worker's subscription and fence, and the judge of the others.
	witness *lifeWitness
	watch   *witnessWatch

	// The parts the loops share with Start and the exported methods.
	peers     *peerRecoverer  // the dead-peer path, with the judge (deadpeer.go, registry.go)
	twin      *twin           // Start's claim on the instance ID; the heartbeat's ousting (heartbeat.go)
	untracked *untrackedAlarm // the ErrUntrackedRows alarm (rowtrack.go)
}

// New returns a Worker that keeps its keys in rdb and resets the rows of
// dead peers through resetter. rdb may be a single-node client, a failover
// client or a cluster client; build it with ContextTimeoutEnabled set, or
// go-redis ignores the deadlines of the worker's per-call timeouts and a
// call to an unresponsive server lasts its ReadTimeout. New neither
// contacts Redis nor starts any goroutine; Start does. The Worker never
// closes rdb.
//
// New returns an error wrapping ErrInvalidConfig that names the bad value
// when an argument or option is invalid: among them a resetter whose
// Info names no in-progress or queued status, or the same one for both,
// and WithBackstopSweep with a resetter that cannot list the rows in
// progress (Info().ListsInProgress). New calls the resetter's Info once
// and decides everything from it: a wrapper that embeds a Resetter keeps
// every guarantee of the resetter it wraps.
func New(rdb redis.UniversalClient, resetter Resetter, opts ...Option) (*Worker, error) {
	o, hooks, d, err := configure(rdb, resetter, opts)
	if err != nil {
		return nil, err
	}
	var st store.Store = store.NewRedis(rdb, o.keyPrefix, o.opTimeout)
	if hooks.wrapStore != nil {
		st = hooks.wrapStore(st)
	}
	w := &Worker{opts: o, resetter: resetter, lease: newLease(o.heartbeatTTL)}
	log := o.logger.With(slog.String("instance_id", o.instanceID))
	w.deps = deps{opts: &w.opts, store: st, log: log, stats: &w.stats, events: &w.events,
		rlog: newRecoveryLog(log, o.opTimeout), sig: &hooks.sig,
		target: targetOf(rdb), info: d.info, sweepByOwner: d.sw != nil, beatValue: store.HeartbeatOf(newToken())}
	w.fleet = &fleetView{store: st, log: log, opts: &w.opts, mode: d.announce()}
	// nodes: node ages, their holds and the eviction hold (registry.go).
	nodes := &nodeWatch{deps: w.deps}
	// judge: the registry, death verdicts, deregistration, registry health (registry.go).
	w.judge = &judge{deps: w.deps, nodes: nodes}
	buildShared(w, d)
	buildLoops(w, d, nodes)
	w.sweeper = newSweeper(w, d, nodes)
	return w, nil
}

// decisions are what New decides once, from the options and the
// resetter's Info, to build the parts with.
type decisions struct {
	info ResetterInfo // the resetter's Info, asked once
	// ownerMode: the owner column, not a rows set, says which rows a
	// worker holds (ownerModeOf); it picks the tracker.
	ownerMode bool
	// sw and rs back the backstop sweep, by owner or by row version
	// (sweepOf); both nil without one.
	sw, rs Resetter
}

// announce is the mode the heartbeats announce in the fleet record.
func (d decisions) announce() string {
	if d.ownerMode {
		return "owner"
	}
	return "rows-set"
}

// configure applies and validates the options (the package's tests'
// own to the test hooks), asks the resetter's Info once, and decides
// from both the mode and the backstop sweep.
func configure(rdb redis.UniversalClient, resetter Resetter, opts []Option) (o options, hooks *testHooks, d decisions, err error) {
	if isNil(rdb) {
		return o, nil, d, fmt.Errorf("%w: redis client is nil", ErrInvalidConfig)
	}
	if isNil(resetter) {
		return o, nil, d, fmt.Errorf("%w: row resetter is nil", ErrInvalidConfig)
	}
	o, hooks = defaultOptions(), new(testHooks)
	for _, opt := range opts {
		if opt == nil {
			return o, nil, d, fmt.Errorf("%w: nil option", ErrInvalidConfig)
		}
		if h, ok := opt.(hookFunc); ok {
			h(hooks)
			continue
		}
		opt.apply(&o)
	}
	if err := o.validate(); err != nil {
		return o, nil, d, err
	}
	d.info = resetter.Info()
	if err := checkInfo(resetter, d.info); err != nil {
		return o, nil, d, err
	}
	d.ownerMode = ownerModeOf(d.info, o)
	d.sw, d.rs, err = sweepOf(resetter, d.info, o, d.ownerMode)
	if err != nil {
		return o, nil, d, err
	}
	return o, hooks, d, nil
}

// buildShared sets up the state the parts share: the rows, the event
// dispatcher, the lease, the self-check and the tracker, which is the
// mode's.
func buildShared(w *Worker, d decisions) {
	o, ownerMode := w.opts, d.ownerMode
	w.events.id = o.instanceID
	w.rows.init()
	w.lease.perLife.Store(ownerMode) // per-life owner values (owner.go)
	w.events.obs, w.events.sig = o.observer, &w.sig.deliver
	// historian: the fleet history's writer, nil when it is off (events.go);
	// running is also the self-check's
	state := &w.state
	running := func() bool { return state.Load() == stateRunning }
	w.events.hist = newHistorian(w.store, w.log, &w.opts, w.sig, running)
	// lease: what noting its loss touches (heartbeat.go)
	w.lease.rows, w.lease.stats, w.lease.events, w.lease.log = &w.rows, &w.stats, &w.events, w.log
	w.lease.releaseSafe, w.lease.newLives = releaseSafeAfterLoss(d.info), ownerMode
	// selfChecker: the self-check loop (selfcheck.go)
	w.checker = (&selfChecker{deps: w.deps, resetter: w.resetter,
		rows: &w.rows, lease: &w.lease, running: running}).init()
	// tracker: owner mode sends nothing to Redis, rows-set mode mirrors
	// the rows in the rows set (rowtrack.go); the mode is decided here.
	core := trackerCore{deps: w.deps, rows: &w.rows, id: o.instanceID, resetter: w.resetter,
		state: &w.state, lease: &w.lease, checker: w.checker, releaseLock: make(chan struct{}, 1)}
	if ownerMode {
		w.tracker = &ownerTracker{trackerCore: core, noteBareOwners: w.lease.noteBareOwners}
	} else {
		w.tracker = newRowsSetTracker(core, d.rs != nil)
	}
}

// buildLoops builds the loops and the parts they share.
func buildLoops(w *Worker, d decisions, nodes *nodeWatch) {
	// giver: gives back the rows held at a lost lease the host left
	// (heartbeat.go); only where a loss is sticky, nil elsewhere.
	if w.lease.releaseSafe {
		w.giver = newGiver(w.deps, &w.lease, &w.rows, w.tracker)
	}
	// untracked: the ErrUntrackedRows alarm (rowtrack.go).
	w.untracked = &untrackedAlarm{deps: w.deps, state: &w.state,
		trackCalled: w.tracker.trackCalled, off: w.tracker.heldByOwner()}
	// peers: the dead-peer path (deadpeer.go).
	w.peers = &peerRecoverer{deps: w.deps, resetter: w.resetter,
		held: w.tracker, misconfigured: w.checker.alarmErr,
		unverifiedHold: w.checker.unverifiedHold}
	// twin: Start's claim on the instance ID, and the heartbeat's ousting (heartbeat.go)
	w.twin = &twin{deps: w.deps, lease: &w.lease, rows: &w.rows,
		nodes: nodes, peers: w.peers, ownedRows: d.ownerMode || d.sw != nil}
	// heartbeater: the heartbeat loop (heartbeat.go)
	w.heart = &heartbeater{deps: w.deps, lease: &w.lease, rows: &w.rows,
		tracker: w.tracker, ousted: w.twin.noteOusted, giver: w.giver}
	// recov: the recovery loop (recovery.go).
	w.recov = &recoverer{deps: w.deps, peers: w.peers,
		expired: make(chan string, expiredQueue), untracked: w.untracked}
	// witness and watch: the liveness witness (witness.go), in owner mode
	// on a store that can run it (not on a Ring; on a Cluster, Start
	// turns it off before Redis 7: docs/safety.md §14).
	if ws, ok := w.store.(witnessStore); ok && ws.WitnessSupported() && w.opts.witnessOn(d.ownerMode) {
		w.heart.kicked = make(chan struct{}, 1)
		w.witness = &lifeWitness{deps: w.deps, ws: ws, rows: &w.rows, lease: &w.lease, kick: w.heart.kick}
		w.watch = &witnessWatch{deps: w.deps, ws: ws, resetter: w.resetter, peers: w.peers}
	}
}

// newSweeper returns the backstop sweep with its strategy, by owner or by
// row version; nil when neither.
func newSweeper(w *Worker, d decisions, nodes *nodeWatch) *sweeper {
	var by sweepStrategy
	switch {
	case d.sw != nil:
		by = &ownerSweep{deps: w.deps, resetter: d.sw, rows: &w.rows, peers: w.peers,
			absentSince: make(map[string]time.Time), warned: make(map[string]bool), endedSince: make(map[string]time.Time)}
	case d.rs != nil:
		by = &rowSweep{deps: w.deps, resetter: d.rs, untracked: w.untracked, misconfigured: w.checker.alarmErr,
			nodes: nodes}
	default:
		return nil
	}
	return &sweeper{deps: w.deps, turn: sweepTurn{deps: w.deps, token: newToken()}, by: by,
		ousted: &w.lease.ousted}
}

// InstanceID returns the worker's identity in Redis.
func (w *Worker) InstanceID() string { return w.opts.instanceID }

// Start checks the resetter's configuration against the database (its
// Check, unless WithoutSchemaCheck), records what the fleet
// under the key prefix serves (database, schema, table: the PostgreSQL resetters
// tell, in Check's ResetterInfo.Serves) or, when another is recorded, returns an error
// wrapping ErrFleetMismatch that names both, makes sure no other live
// process heartbeats its instance ID, writes the first heartbeat and
// registers the worker, then starts the heartbeat loop and
// the recovery loop, whose first scan runs at once. It returns an error,
// and starts nothing, if the check fails (an error wrapping ErrSchema names
// the table, column or status at fault, one wrapping ErrReadOnly a
// database session that cannot write; nothing has been written to Redis)
// or Redis cannot be reached within ctx and the operation timeout (the
// error names the address and the cause), or Redis refuses the client (a
// missing or wrong password: an error wrapping ErrRedisAuth, after one
// PING, before anything else is sent); Start may then be called again.
// It also refuses, with an error wrapping ErrEvictionPolicy and before
// writing anything, a Redis master whose maxmemory-policy can evict the
// library's keys (unless WithEvictionAccepted) or that will not say
// (INFO memory refused).
//
// If the heartbeat key already holds another process's value, Start
// watches it: a process that refreshes it within a heartbeat interval +
// operation timeout (+ a tenth of the interval) is alive, and Start
// returns an error wrapping ErrInstanceIDInUse, having written nothing
// but the fleet record (what its fleet serves, if none was recorded). A
// process that stopped refreshing it (a crashed predecessor under a fixed
// WithInstanceID) is waited out until its key expires, at most its
// remaining TTL, and the rows it left tracked are then recovered, under
// its incarnation, before this worker's first heartbeat: they are not
// this worker's. In owner mode (with WithInstanceID, or the backstop sweep)
// the rows PostgreSQL still names this ID the owner of are recovered the
// same way, under the claim on the ID, even when Redis remembers nothing of
// the predecessor; rows of it that another session still holds locked (its
// host vanished mid-transaction) are waited for. ctx bounds the wait; a Start that gives up has written
// nothing but that recovery's claim and can be retried (by a restarted
// process too).
//
// A Worker whose lost lease comes back holds it for a claim TTL before
// CheckLease reports nil (see CheckLease).
//
// ctx bounds only Start itself. The loops run until Shutdown, whatever
// happens to ctx: a worker that stops refreshing its heartbeat while it
// still processes rows would have them recovered under it.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state.Load() {
	case stateShutdown:
		return ErrShutdown
	case stateRunning:
		return ErrAlreadyStarted
	}
	expiry, err := startUp(ctx, w)
	if err != nil {
		return err
	}
	witnessUp := startOwnWitness(ctx, w)
	loopCtx, cancel := context.WithCancel(context.Background())
	w.stopLoops = cancel
	w.loopsDone = make(chan struct{})
	w.started = true
	w.checker.runningSince.Store(time.Now().UnixNano())
	w.state.Store(stateRunning)

	var wg sync.WaitGroup
	wg.Go(func() { w.heart.run(loopCtx) })
	wg.Go(func() { w.recov.run(loopCtx) })
	if w.giver != nil {
		wg.Go(func() { w.giver.run(loopCtx) })
	}
	if flush := w.tracker.loop(); flush != nil {
		wg.Go(func() { flush(loopCtx) })
	}
	if w.sweeper != nil {
		wg.Go(func() { w.sweeper.run(loopCtx) })
	}
	if !w.checker.off.Load() {
		wg.Go(func() { w.checker.run(loopCtx) })
	}
	if expiry != nil {
		wg.Go(func() { expiry.run(loopCtx) })
	}
	if witnessUp {
		wg.Go(func() { w.witness.run(loopCtx) })
	}
	if w.watch != nil {
		wg.Go(func() { w.watch.run(loopCtx) })
	}
	go func() { wg.Wait(); close(w.loopsDone) }()
	w.log.Debug("recovery worker started",
		slog.Duration("heartbeat_ttl", w.opts.heartbeatTTL),
		slog.Duration("recovery_interval", w.opts.recoveryInterval))
	return nil
}

// startUp is what Start does before its loops run: the checks, the claim
// on the instance ID, the first heartbeat, and the expiry watcher's
// subscription (nil when expiry is off). Its error is Start's.
func startUp(ctx context.Context, w *Worker) (*expiryWatcher, error) {
	if err := startChecks(ctx, w); err != nil {
		return nil, fmt.Errorf("start %s: %w", w.opts.instanceID, err)
	}
	if err := w.twin.claimInstanceID(ctx); err != nil {
		if _, ok := errors.AsType[*readError](err); ok {
			err = w.target.firstHeartbeatError(ctx, &w.opts, err)
		}
		return nil, fmt.Errorf("start %s: %w", w.opts.instanceID, err)
	}
	if err := w.heart.runOnce(ctx); err != nil {
		if errors.Is(err, ErrInstanceIDInUse) {
			return nil, fmt.Errorf("start %s: %w: another process wrote its heartbeat first", w.opts.instanceID, ErrInstanceIDInUse)
		}
		return nil, fmt.Errorf("start %s: %w", w.opts.instanceID, w.target.firstHeartbeatError(ctx, &w.opts, err))
	}
	w.judge.nodes.observeNodes(ctx)
	if !w.opts.expiry {
		return nil, nil
	}
	// expiry: built with what it uses, subscribed here.
	return subscribeExpiry(ctx, &expiryWatcher{deps: w.deps, nodes: w.judge.nodes, hand: w.recov.hand}), nil
}

// startChecks runs what Start checks before it writes a heartbeat: the
// schema, the self-check's probe, Redis's reachability and eviction
// policy, and the fleet record, whose members it learns.
func startChecks(ctx context.Context, w *Worker) error {
	checked, err := w.checkSchema(ctx)
	if err != nil {
		return err
	}
	w.checker.probe(ctx)
	if err := w.target.ping(ctx, w.store, &w.opts); err != nil {
		return err
	}
	if err := w.judge.nodes.checkEviction(ctx); err != nil {
		if _, ok := errors.AsType[*readError](err); ok {
			err = w.target.firstHeartbeatError(ctx, &w.opts, err)
		}
		return err
	}
	fleet, read, err := w.fleet.check(ctx, checked)
	if err != nil {
		return err
	}
	// Before the first heartbeat's recount drops them: a record loaded
	// from an old snapshot lists members whose announcements have lapsed.
	// fleetView.check's script returned the record; read it when it did not run.
	if read {
		w.fleet.learnMembers(fleet)
	} else {
		w.fleet.learnRecord(ctx)
	}
	return nil
}

// opContext returns a context for one Redis call of the background work.
func (o *options) opContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, o.opTimeout)
}

// tombstoneTTL is how long a finished claim keeps its result for a retry
// of the finish script: longer than go-redis's retries of one call.
func (o *options) tombstoneTTL() time.Duration { return 2 * o.opTimeout }

// isNil reports whether v is nil or a nil pointer, so New refuses a
// (*redis.Client)(nil) instead of panicking on first use.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// sweepOf returns what backs the backstop sweep: by owner (sw) when it
// is on (WithBackstopSweep, or owner mode) and the resetter fences by
// owner; by row version (rs) when the resetter does not fence by owner,
// unless WithBackstopSweep(false). Both need a resetter that lists the rows in
// progress (Info().ListsInProgress): WithBackstopSweep without one is an
// error.
func sweepOf(r Resetter, info ResetterInfo, o options, ownerMode bool) (sw, rs Resetter, err error) {
	on := o.sweep || ownerMode
	if !info.ListsInProgress {
		if on {
			return nil, nil, fmt.Errorf("%w: WithBackstopSweep(true) needs a resetter that lists rows in progress (Info().ListsInProgress); %T does not",
				ErrInvalidConfig, r)
		}
		return nil, nil, nil
	}
	switch {
	case info.OwnerFencing && on:
		return r, nil, nil
	case !info.OwnerFencing && !o.noSweep:
		return nil, r, nil
	}
	return nil, nil, nil
}

// ownKeys returns the key names of this worker's instance.
func (w *Worker) ownKeys() store.Keys { return w.store.Keys(w.opts.instanceID) }

// checkSchema runs the resetter's Check, bounded by ctx and the reset
// timeout: with the schema check on (not WithoutSchemaCheck), the session
// (it must be able to write; a session without
// idle_in_transaction_session_timeout, or with a statement_timeout shorter
// than the reset timeout, is warned about, when the resetter tells what it
// serves: a database), the owner column's
// width against this worker's owner value, and the table; either way,
// what the resetter serves, which fleetView.check then records. It runs before
// anything is written to Redis: a failure leaves no heartbeat and no
// registry entry behind (which peers would take for a dead worker), and
// Start can be retried. With WithoutSchemaCheck an error only means that
// the resetter cannot tell what it serves: it is logged at Warn, and the
// fleet is not checked.
func (w *Worker) checkSchema(ctx context.Context) (ResetterInfo, error) {
	schema := !w.opts.noSchemaCheck
	ctx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	defer cancel()
	info, err := w.resetter.Check(ctx, schema)
	if !errors.Is(err, contract.ErrPoolExhausted) { // the error says it better
		w.checkPool(info)
	}
	if schema {
		// OwnerValue() counts the life in owner mode (lifeWidth more characters).
		n := utf8.RuneCountInString(w.tracker.currentOwner())
		if info.OwnerWidth > 0 && n > info.OwnerWidth {
			what := "instance ID"
			if w.tracker.heldByOwner() {
				what = fmt.Sprintf("owner value (the instance ID and its life, %d characters more: docs/safety.md §2)", lifeWidth)
			}
			return info, fmt.Errorf("check schema: %w: the owner column (WithOwnerColumn) holds at most %d characters and this worker's %s %q has %d: widen the column (text) or use a shorter WithInstanceID",
				ErrSchema, info.OwnerWidth, what, clip(w.tracker.currentOwner()), n)
		}
		if err != nil {
			return info, err
		}
		if info.IdleInTxTimeout == 0 && info.Serves != "" {
			w.log.Warn("the database session has no idle_in_transaction_session_timeout: a transaction left open by a host that vanished keeps its rows locked, and recovery skips them, until the server drops the connection (about 2 h 11 min with Linux's TCP keepalive defaults); set it for the role or database of the workers (docs/operations.md)")
		}
		if st := info.StatementTimeout; st > 0 && st < w.opts.resetTimeout {
			w.log.Warn("the database session's statement_timeout is shorter than the reset timeout: resets size their chunks to fit half of it, and a reset whose chunk of one row takes longer (a slow trigger, a wait for a table lock) never completes; raise it for the role of the workers (docs/operations.md)",
				slog.Duration("statement_timeout", st), slog.Duration("reset_timeout", w.opts.resetTimeout),
				slog.Duration("lock_timeout", info.LockTimeout))
		}
		return info, nil
	}
	if err != nil {
		w.log.Warn("cannot tell what this worker serves; the key prefix is not checked against the fleet's record",
			slog.Any("error", err))
		return ResetterInfo{}, nil
	}
	return info, nil
}

// minResetterConns is how many connections of its pool the resetter may
// use at once: the recovery loop's reset and one more, the backstop
// sweep's, the self-check's, Release's or ops.RecoverNow's, which run in
// their own goroutines.
const minResetterConns = 2

// checkPool warns when the resetter's pool (ResetterInfo.PoolSize, a pool
// with a limit) had fewer than minResetterConns connections free when
// Check began. A host that shares the pool with the resetter can then
// hold every connection, and recovery waits for one past its reset
// timeout, scan after scan. It only warns: a pool shared with a host
// whose transactions are short serves both in practice, and a pool with
// room at Start may still be exhausted later, which the recovery's error
// then says (postgres.ErrPoolExhausted).
func (w *Worker) checkPool(info ResetterInfo) {
	free := info.PoolSize - info.PoolInUse
	if info.PoolSize <= 0 || free >= minResetterConns {
		return
	}
	w.log.Warn("the resetter's connection pool had fewer connections free at Start than recovery uses at once (2); a host that shares the pool can hold them all, leaving dead peers' rows in progress until one is free: give the resetter a pool of its own (docs/operations.md)",
		slog.Int("pool_max_conns", info.PoolSize), slog.Int("pool_in_use", info.PoolInUse), slog.Int("pool_free", max(free, 0)))
}
