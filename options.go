package recovery

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/alya/recovery/internal/store"
)

// An Option configures a Worker. Options are applied in order and validated
// together by New.
type Option interface {
	apply(*options)
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// options are the Worker's settings: what the options set, with their
// defaults. They do not change after New; what New decides from them and
// the resetter is in deps (worker.go), the test hooks in testHooks
// (events.go).
type options struct {
	instanceID        string
	keyPrefix         string
	heartbeatTTL      time.Duration
	heartbeatInterval time.Duration // derived from the heartbeat TTL unless intervalSet
	recoveryInterval  time.Duration
	rowsTTL           time.Duration // derived from the detection window unless rowsTTLSet
	intervalSet       bool
	rowsTTLSet        bool
	opTimeout         time.Duration // 0: derived from the heartbeat interval
	resetTimeout      time.Duration
	logger            *slog.Logger
	loggerSet         bool
	sweep             bool
	noSweep           bool // WithBackstopSweep(false)
	scanLease         bool // WithScanTurn
	expiry            bool
	untrackLinger     time.Duration
	untrackSet        bool
	expiryConfigure   bool
	observer          func(Event)
	observerSet       bool
	noSchemaCheck     bool
	rowsSets          bool // WithRowsSets: no owner mode
	instanceIDSet     bool // WithInstanceID: the ID may have had a predecessor
	historyLen        int  // WithHistory; 0: off
	selfCheckWindow   time.Duration
	evictionAccepted  bool // WithEvictionAccepted
	// The liveness witness (witness.go): noWitness is WithLivenessWitness(false);
	// witnessSet is a WitnessGrace or WitnessFence given.
	noWitness    bool
	witnessGrace time.Duration
	witnessFence time.Duration
	witnessSet   bool
}

func defaultOptions() options {
	return options{
		instanceID:       defaultInstanceID(),
		keyPrefix:        defaultKeyPrefix,
		heartbeatTTL:     defaultHeartbeatTTL,
		recoveryInterval: defaultRecoveryInterval,
		resetTimeout:     defaultResetTimeout,
		scanLease:        true,
		historyLen:       defaultHistoryLength,
		selfCheckWindow:  defaultSelfCheckWindow,
		witnessGrace:     defaultWitnessGrace,
		witnessFence:     defaultWitnessFence,
	}
}

// defaultInstanceID is <hostname>-<pid>-<unix start seconds>, as in the
// design, followed by 8 random hex digits: the design's three parts alone
// collide for containers with the same hostname and PID 1 started in the
// same second, and for two Workers made in one process in the same second.
// The hostname is sanitized so the ID is always a valid key part.
func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d-%d-%s", store.Sanitize(host), os.Getpid(), time.Now().Unix(), newToken()[:8])
}

// WithInstanceID sets the worker's identity in Redis. It must be unique in
// the fleet and stable for the life of the process; it must not be empty or
// contain '{', '}', whitespace or control characters. Start refuses, with
// ErrInstanceIDInUse, an ID another live process heartbeats; an ID reused
// after a crash (a StatefulSet pod's name) waits out the predecessor's
// heartbeat and gets its rows recovered first (docs/safety.md §10). Default: <hostname>-<pid>-<unix start seconds>-<8 random
// hex digits>, unique per Worker even for containers with the same
// hostname and PID started in the same second.
func WithInstanceID(id string) Option {
	return optionFunc(func(o *options) { o.instanceID, o.instanceIDSet = id, true })
}

// WithKeyPrefix sets the first part of every Redis key. Workers that must
// recover each other need the same prefix; fleets that must not, a different
// one. Same character rules as WithInstanceID. Default: "ALYA".
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(o *options) { o.keyPrefix = prefix })
}

// Timings are the worker's durations, set with WithTimings. A zero field
// keeps its default, or the value derived from the other fields where the
// field says so; every field set must lie between 1 ms (Redis expiries
// have millisecond resolution) and a week, so that no duration derived
// from them (the largest, the recovery claim's TTL, is at most four weeks)
// can overflow, and New checks their relations:
// HeartbeatInterval < HeartbeatTTL; HeartbeatInterval + OperationTimeout
// < 90% of HeartbeatTTL (when the lease ends); OperationTimeout ≤
// HeartbeatInterval; RowsTTL > HeartbeatTTL + 1.1 × RecoveryInterval +
// the scan turn. A value out of bounds or relation makes New fail with an
// ErrInvalidConfig error that names the field.
//
// With every field zero, a dead worker's rows are back in the queue within
// 174 s: HeartbeatTTL + 1.1 × RecoveryInterval (the jitter) + the scan
// turn (0.8 × RecoveryInterval); the key must expire, then the next scan
// must run, and a scan-turn holder that dies right after scanning holds
// that scan back by up to its turn; 126 s while the holder lives. It
// assumes Redis answers within OperationTimeout, the resetter gets a
// connection and no clock jumps (docs/safety.md, "What every bound assumes").
type Timings struct {
	// HeartbeatTTL is how long a heartbeat key lives without a refresh:
	// how long a dead worker goes unnoticed. HeartbeatInterval, RowsTTL
	// and OperationTimeout are derived from it unless set. Default: 60 s.
	HeartbeatTTL time.Duration

	// HeartbeatInterval is how often the heartbeat is refreshed; shorter
	// than HeartbeatTTL, and with OperationTimeout shorter than 90% of it
	// (when the lease ends). Default: half HeartbeatTTL, at least 1 ms
	// (30 s for the default TTL), so one lost refresh does not cost a live
	// worker its key.
	HeartbeatInterval time.Duration

	// RecoveryInterval is how often the worker scans for dead peers. Each
	// wait is jittered by ±10% so a fleet started together does not scan
	// in lockstep. The scan and sweep turns are derived from it (the
	// sweep turn is 2.2 × the interval). Default: 60 s.
	RecoveryInterval time.Duration

	// RowsTTL is the TTL of the worker's rows set, refreshed by every
	// heartbeat and every Track, and by every recovery attempt once the
	// worker is dead. It must exceed the longest wait for the first
	// recovery scan: HeartbeatTTL + RecoveryInterval + 10% (the jitter) +
	// the scan turn (min(0.8 × RecoveryInterval, HeartbeatTTL), when
	// WithScanTurn is on), so a dead worker's rows set is still there when
	// a peer first comes to recover it; it bounds how long an orphaned set
	// can stay in Redis when no peer ever does. The scan's own duration
	// does not count, however many peers died: each scan renews the rows
	// set of every dead peer it finds before recovering any, starts no
	// recovery after half the recovery interval, and the next starts a
	// recovery interval after it began. Default: three heartbeat
	// TTLs, or that wait + one HeartbeatTTL when three TTLs are not longer
	// (180 s for the default TTL and recovery interval).
	RowsTTL time.Duration

	// OperationTimeout bounds each Redis call made by the background loops
	// and by Untrack; at most HeartbeatInterval. Default: 5 s, or half
	// HeartbeatInterval if shorter, so a hung call never costs a whole
	// refresh.
	OperationTimeout time.Duration

	// ResetTimeout bounds each reset made by recovery. There is no "no
	// limit": the recovery claim lives ResetTimeout + 3 × OperationTimeout
	// and must expire, or a recoverer that died holding it would block the
	// dead peer's recovery for ever; a reset that hangs is cancelled
	// before another worker may take over the peer. Default: 30 s.
	ResetTimeout time.Duration

	// SelfCheckWindow is how long a row the worker tracks may stay not in
	// progress before the self-check raises ErrMisconfigured: until it has
	// seen one of its rows in progress, the worker reads the committed
	// state of its newest tracked rows shortly after each Track (a tenth
	// of the window), and a row not in progress at two reads at least the
	// window apart, tracked all along, is the alarm. Raise it if your host
	// may take longer than that from the COMMIT that finishes a row (done,
	// failed or queued again) to its Untrack; lower it to judge shorter
	// blocks (a block whose rows leave the in-progress status sooner than
	// about 1.1 windows after their COMMIT is not judged). Default:
	// 500 ms, long enough for a host to untrack a row it just completed,
	// short enough that the first block of about a second is judged.
	SelfCheckWindow time.Duration

	// WitnessGrace is how long the liveness witness (WithLivenessWitness)
	// must see a worker's life channel without a subscriber before it
	// judges that life dead and resets its rows: the fast path's detection
	// time, about WitnessGrace + WitnessGrace/10 after a kill. A judge
	// waits the longer of its own grace and the one the judged worker
	// announced. Default: 500 ms.
	WitnessGrace time.Duration

	// WitnessFence is how long after its last answered ping a worker keeps
	// taking work (CheckLease, Track, TrackAs, Begin) when its witness
	// connection falls silent; it pings every WitnessFence × 2/5. Past it
	// those calls wait until Redis answers again (a pause ends, an outage
	// ends), or fail with ErrLeaseLost once the lease ends or the life was
	// judged. New refuses a fence that is not shorter than WitnessGrace:
	// the worker must stop before any peer's grace ends (docs/safety.md
	// §14). Default: 250 ms.
	WitnessFence time.Duration
}

// WithTimings sets the worker's durations: each non-zero field of t
// replaces the value set before (by the defaults or an earlier
// WithTimings), so WithTimings(Timings{HeartbeatTTL: d}) changes the
// heartbeat TTL alone, and repeated calls compose. A negative field is
// kept and refused by New. See Timings for the defaults and bounds.
func WithTimings(t Timings) Option {
	return optionFunc(func(o *options) {
		if t.HeartbeatTTL != 0 {
			o.heartbeatTTL = t.HeartbeatTTL
		}
		if t.HeartbeatInterval != 0 {
			o.heartbeatInterval, o.intervalSet = t.HeartbeatInterval, true
		}
		if t.RecoveryInterval != 0 {
			o.recoveryInterval = t.RecoveryInterval
		}
		if t.RowsTTL != 0 {
			o.rowsTTL, o.rowsTTLSet = t.RowsTTL, true
		}
		if t.OperationTimeout != 0 {
			o.opTimeout = t.OperationTimeout
		}
		if t.ResetTimeout != 0 {
			o.resetTimeout = t.ResetTimeout
		}
		if t.SelfCheckWindow != 0 {
			o.selfCheckWindow = t.SelfCheckWindow
		}
		if t.WitnessGrace != 0 {
			o.witnessGrace, o.witnessSet = t.WitnessGrace, true
		}
		if t.WitnessFence != 0 {
			o.witnessFence, o.witnessSet = t.WitnessFence, true
		}
	})
}

// WithScanTurn turns the scan turn on or off. With it, one worker of the
// fleet (whichever ticks first) runs the recovery scan each recovery
// interval and the others skip theirs, so the fleet's Redis load grows
// linearly with its size instead of quadratically (docs/performance.md has
// the figures). Off, every worker scans every interval, as in the design.
// ops.RecoverNow always scans. The turn is held in the Redis key
// <prefix>_SCAN_LEASE (a name kept from earlier releases). Default: on.
func WithScanTurn(enabled bool) Option {
	return optionFunc(func(o *options) { o.scanLease = enabled })
}

// WithDeferredUntrack makes Untrack return without waiting for Redis: the
// rows are forgotten in memory at once and removed from the rows set in one
// batched SREM at most linger later (a heartbeat or Shutdown sends it too
// if that fails). It saves a round trip per row on the hot path (see the
// host-loop figures in docs/performance.md). The price: a worker killed
// within the linger leaves finished rows in its set (a crash between the
// host's completion COMMIT and a synchronous Untrack does too, for one
// round trip), and recovery passes them to the resetter. While such a row
// stays finished, the PostgreSQL resetters' status guard leaves it alone.
// If the application can put finished rows back in the queue (retries, a
// batch run again) and another worker takes one before the dead worker's
// set is recovered, only owner fencing (postgres.WithOwnerColumn, the host
// setting the owner when it takes rows) keeps the reset off the new
// holder; without it that row is reset under its holder and processed
// twice. So: with the PostgreSQL resetters nothing is processed twice if
// finished rows are never re-queued, or with owner fencing (and instance
// IDs never reused, which the default ID ensures); a custom Resetter must
// guard the same way. See docs/safety.md, "Finished rows left in a dead
// worker's set". linger must be positive and shorter than the heartbeat
// interval. In owner mode Untrack sends nothing, so there is nothing to
// defer and the option has no effect. Default: off (Untrack waits for its
// SREM).
func WithDeferredUntrack(linger time.Duration) Option {
	return optionFunc(func(o *options) { o.untrackLinger = linger; o.untrackSet = true })
}

// WithLogger sets the logger; it must not be nil. Default: slog.Default(),
// read when New is called.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l; o.loggerSet = true })
}

// WithObserver sets the function that receives the worker's events, for
// metrics or alerting; it must not be nil. It is called from one goroutine
// of the Worker's own, in order, never from the heartbeat or recovery
// loops: a slow observer delays other events (and past a buffer of 1024
// events, drops them: Stats.EventsDropped), never a heartbeat. A panic in
// it is recovered and counted as a drop. A collector with an Observe
// method (prom.Collector, otel.Observer) is passed as c.Observe; to feed
// two, pass a func that calls both. Default: none (events are only
// logged).
func WithObserver(observe func(Event)) Option {
	return optionFunc(func(o *options) { o.observer = observe; o.observerSet = true })
}

// WithEvictionAccepted lets Start succeed on a Redis server whose
// maxmemory-policy can evict the library's keys (any volatile-* or
// allkeys-* policy with maxmemory set), which Start otherwise refuses
// with ErrEvictionPolicy. The worker then takes no death verdict while the
// server is evicting (INFO stats evicted_keys moved less than a heartbeat
// TTL before) nor while it cannot read that count: a live worker's
// evicted heartbeat never gets its rows reset, and a dead worker's rows
// are recovered a heartbeat TTL after the evictions stop. An evicted rows
// set of a dead worker loses Redis's record of its rows; the backstop
// sweep finds them in the database (by owner with an owner column, by row
// version without one: on by default, unless WithBackstopSweep(false); docs/
// operations.md, "Managed Redis"). The server must still answer
// INFO (memory and stats) to the worker's user. Default: off; use
// maxmemory-policy noeviction for the recovery keys instead when you can.
func WithEvictionAccepted() Option {
	return optionFunc(func(o *options) { o.evictionAccepted = true })
}

// WithExpiryNotifications turns on expiry-driven recovery: the worker
// subscribes to expired-key events (on every master of a Cluster, checked
// again every heartbeat interval so that a replica promoted by a failover
// is subscribed to as well) and recovers a peer as soon as its heartbeat
// key expires, the periodic scan staying as the fallback. Detection then
// takes about the heartbeat TTL instead of TTL + recovery interval. The
// server must have notify-keyspace-events with "E" and "x"; a master that
// has not is logged with a warning and the worker relies on scans for it,
// unless WithExpiryConfigSet is given too. This option never changes the
// server's configuration. Default: off.
func WithExpiryNotifications() Option {
	return optionFunc(func(o *options) { o.expiry = true })
}

// WithExpiryConfigSet lets Start (and the check, for a newly promoted
// master) add "E" and "x" to a master's notify-keyspace-events with
// CONFIG SET, logging a warning, where WithExpiryNotifications finds them
// missing. New refuses it without WithExpiryNotifications. Default: off
// (the server's configuration is left alone).
func WithExpiryConfigSet() Option {
	return optionFunc(func(o *options) { o.expiryConfigure = true })
}

// WithHistory sets about how many entries the fleet's history stream
// (<prefix>_HISTORY) keeps: each append trims it to about maxLen (Redis
// trims whole stream nodes, so a few more may stay). 0 turns the history
// off: this worker appends nothing (others of the fleet may). The length
// is per append, so the fleet's stream follows whichever worker appended
// last; give every worker the same value. Entries are written only when a
// peer dies, a recovery fails or a lease is lost, two per recovery: the
// default, 10,000, keeps the last 5,000 recoveries, 50 days of a fleet
// that loses 100 workers a day, in about 2 MB of one key. It must not be
// negative. Default: 10,000 (on: the history helps only if it was on
// before the bad night).
func WithHistory(maxLen int) Option {
	return optionFunc(func(o *options) { o.historyLen = maxLen })
}

// WithRowsSets keeps the design's rows-set mode even when the resetter
// fences by owner: Track and Untrack write the worker's rows set in Redis,
// recovery resets the rows a dead peer's set lists, and the backstop sweep
// runs only WithBackstopSweep(true), as in releases before owner mode.
// Without a resetter that fences by owner the worker is in rows-set mode
// anyway. Workers of both modes recover each other (docs/integration.md,
// "Rolling out owner mode"). Stats.OwnerMode tells which mode a worker
// runs in. Default: off (owner mode whenever the resetter allows it).
func WithRowsSets() Option {
	return optionFunc(func(o *options) { o.rowsSets = true })
}

// WithBackstopSweep turns the backstop sweep on or off; of several calls
// the last wins. The sweep runs every recovery interval on the one worker
// holding the sweep turn. With an owner column it finds the rows in
// progress of owners no live worker has, and in owner mode it is always
// on; WithBackstopSweep(true) turns it on in rows-set mode (WithRowsSets)
// too. Without an owner column it looks for rows in progress that no rows
// set holds, seen unchanged at two looks a rows TTL apart, and is on by
// default whenever the resetter lists rows in progress
// (ResetterInfo.ListsInProgress); WithBackstopSweep(false) turns it off,
// and rows whose rows set is gone before a peer reset them then stay in
// progress until someone resets them by hand (docs/safety.md §5).
// WithBackstopSweep(true) makes New refuse a resetter that cannot sweep.
// Default: on, except with an owner column in rows-set mode.
func WithBackstopSweep(on bool) Option {
	return optionFunc(func(o *options) { o.sweep, o.noSweep = on, !on })
}

// WithLivenessWitness turns the liveness witness on or off: in owner mode
// each life of the worker holds a Redis subscription of its own, and one
// worker of the fleet (the holder of <prefix>_WITNESS_TURN) judges a life
// dead once its channel has had no subscriber for Timings.WitnessGrace,
// and resets its rows: a killed worker's rows are back in about 0.6 s
// instead of the heartbeat TTL and a scan. It sees only deaths that close
// the process's connections (a kill, a crash, an OOM kill); the heartbeat
// TTL stays the backstop for the rest. It runs in owner mode on
// standalone and Sentinel Redis and on a Redis 7 Cluster (shard channels),
// never on a Ring, and costs each worker one more connection and about 10
// PINGs a second (docs/safety.md §7, docs/performance.md). Start logs a
// warning and goes on without it where it cannot run (a Cluster before
// Redis 7, PUBSUB or SUBSCRIBE refused). Default: on in owner mode when
// WitnessGrace is shorter than the heartbeat TTL.
func WithLivenessWitness(on bool) Option {
	return optionFunc(func(o *options) { o.noWitness = !on })
}

// WithoutSchemaCheck makes Start skip the resetter's Check, for a
// database role that may not read the catalogue or a resetter whose check
// is too slow to run at every start; with the PostgreSQL resetters it also
// skips the check that the session can write (ErrReadOnly). The first sign
// of a wrong configuration is then a failed recovery. Default: Start runs
// the check.
func WithoutSchemaCheck() Option {
	return optionFunc(func(o *options) { o.noSchemaCheck = true })
}

// validate checks the options after all were applied and fills in derived
// values. The error names the bad value.
func (o *options) validate() error {
	if err := store.ValidateName(o.instanceID); err != nil {
		return fmt.Errorf("%w: instance ID %q %v", ErrInvalidConfig, clip(o.instanceID), err)
	}
	if err := store.ValidateName(o.keyPrefix); err != nil {
		return fmt.Errorf("%w: key prefix %q %v", ErrInvalidConfig, clip(o.keyPrefix), err)
	}
	if o.expiryConfigure && !o.expiry {
		return fmt.Errorf("%w: WithExpiryConfigSet needs WithExpiryNotifications", ErrInvalidConfig)
	}
	if err := o.validateTimings(); err != nil {
		return err
	}
	if o.loggerSet && o.logger == nil {
		return fmt.Errorf("%w: logger is nil", ErrInvalidConfig)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.observerSet && o.observer == nil {
		return fmt.Errorf("%w: observer is nil", ErrInvalidConfig)
	}
	if err := checkBounds("Timings.SelfCheckWindow", o.selfCheckWindow); err != nil {
		return err
	}
	if o.historyLen < 0 {
		return fmt.Errorf("%w: history length %d is negative (0 turns the history off)", ErrInvalidConfig, o.historyLen)
	}
	return nil
}

// deriveTimings fills in the timings not set from the heartbeat TTL and
// the recovery interval.
func (o *options) deriveTimings() {
	if !o.intervalSet {
		// Half the TTL: one lost refresh does not cost a live worker its
		// key, and with the operation timeout (at most a quarter of the
		// TTL, derived below) the next is answered before the lease ends.
		o.heartbeatInterval = max(o.heartbeatTTL/2, minDuration)
	}
	if !o.rowsTTLSet && checkBounds("Timings.RecoveryInterval", o.recoveryInterval) == nil {
		// Three TTLs, as the design has it, unless the first scan after a
		// death may come later than that: then that wait + a TTL.
		o.rowsTTL = satMul(o.heartbeatTTL, 3)
		if window := o.detectionWindow(); o.rowsTTL <= window {
			o.rowsTTL = satAdd(window, o.heartbeatTTL)
		}
		o.rowsTTL = min(o.rowsTTL, maxDuration)
	}
	if o.opTimeout == 0 {
		o.opTimeout = min(defaultOperationTimeout, o.heartbeatInterval/2)
	}
}

// validateTimings derives what is not set and checks every timing and
// their relations.
func (o *options) validateTimings() error {
	if err := checkBounds("Timings.HeartbeatTTL", o.heartbeatTTL); err != nil {
		return err
	}
	if o.opTimeout != 0 { // 0 means derived, which may be under a millisecond
		if err := checkBounds("Timings.OperationTimeout", o.opTimeout); err != nil {
			return err
		}
	}
	o.deriveTimings()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Timings.HeartbeatInterval", o.heartbeatInterval},
		{"Timings.RecoveryInterval", o.recoveryInterval},
		{"Timings.RowsTTL", o.rowsTTL},
		{"Timings.ResetTimeout", o.resetTimeout},
	} {
		if err := checkBounds(d.name, d.v); err != nil {
			return err
		}
	}
	if o.heartbeatInterval >= o.heartbeatTTL {
		return fmt.Errorf("%w: Timings.HeartbeatInterval %v must be shorter than Timings.HeartbeatTTL %v",
			ErrInvalidConfig, o.heartbeatInterval, o.heartbeatTTL)
	}
	// The first scan after a death comes at most heartbeat TTL + 1.1 ×
	// recovery interval (jitter) + the scan turn later; the rows set must
	// still be there.
	if window := o.detectionWindow(); o.rowsTTL <= window {
		return fmt.Errorf("%w: Timings.RowsTTL %v must exceed Timings.HeartbeatTTL %v + Timings.RecoveryInterval %v (+10%% jitter, + the scan turn if on: %v)",
			ErrInvalidConfig, o.rowsTTL, o.heartbeatTTL, o.recoveryInterval, window)
	}
	if o.opTimeout > o.heartbeatInterval {
		return fmt.Errorf("%w: Timings.OperationTimeout %v must not exceed Timings.HeartbeatInterval %v",
			ErrInvalidConfig, o.opTimeout, o.heartbeatInterval)
	}
	// The lease ends at 90% of the TTL after a heartbeat is sent (see
	// CheckLease); the next one must be sent and answered before that, or
	// a healthy worker would lose its lease every cycle.
	if lease := leaseLength(o.heartbeatTTL); o.heartbeatInterval >= lease-o.opTimeout {
		return fmt.Errorf("%w: Timings.HeartbeatInterval %v + Timings.OperationTimeout %v must be shorter than 90%% of Timings.HeartbeatTTL %v (%v), when the lease ends",
			ErrInvalidConfig, o.heartbeatInterval, o.opTimeout, o.heartbeatTTL, lease)
	}
	if err := o.validateWitness(); err != nil {
		return err
	}
	if o.untrackSet && (o.untrackLinger <= 0 || o.untrackLinger >= o.heartbeatInterval) {
		return fmt.Errorf("%w: deferred untrack linger %v must be positive and shorter than Timings.HeartbeatInterval %v",
			ErrInvalidConfig, o.untrackLinger, o.heartbeatInterval)
	}
	return nil
}

// checkBounds refuses a timing that is not positive or lies outside
// [minDuration, maxDuration].
func checkBounds(name string, d time.Duration) error {
	switch {
	case d <= 0:
		return fmt.Errorf("%w: %s %v must be positive", ErrInvalidConfig, name, d)
	case d < minDuration:
		return fmt.Errorf("%w: %s %v must be at least 1ms: Redis expiries have millisecond resolution",
			ErrInvalidConfig, name, d)
	case d > maxDuration:
		return fmt.Errorf("%w: %s %v exceeds the maximum %v (a week)", ErrInvalidConfig, name, d, maxDuration)
	}
	return nil
}

// Durations derived from the options, in one place. validate keeps every
// option within [minDuration, maxDuration], so none of these can overflow
// (the largest, claimTTL, is at most 4 × maxDuration); they saturate all
// the same, so their correctness does not rest on that bound alone. The
// option fuzzer checks each of them for every configuration New accepts.

// claimTTL is how long a recoverer may hold a dead peer: long enough for
// reading the rows set, the reset and the clean-up, each under its own
// timeout, so the claim outlives the work it protects.
func (o *options) claimTTL() time.Duration {
	return satAdd(o.resetTimeout, satMul(o.opTimeout, 3))
}

// scanTurnTTL is 0.8 × the recovery interval, so the holder's own next
// tick (at least 0.9 × the interval later) finds the turn free, but never
// more than the heartbeat TTL: a holder that dies right after taking the
// turn has released it by the time its heartbeat expires, so the next
// tick of any peer after that scans, and worst-case recovery stays
// heartbeat TTL + recovery interval (+ jitter) whatever the ratio of the
// two. It is at least 1ms, the shortest expiry Redis can hold.
func (o *options) scanTurnTTL() time.Duration {
	return max(min(o.recoveryInterval-o.recoveryInterval/5, o.heartbeatTTL), time.Millisecond)
}

// sweepTurnTTL is 2.2 × the recovery interval + an operation timeout: the
// holder may miss one renewal (±10% jitter included) before another worker
// may take over.
func (o *options) sweepTurnTTL() time.Duration {
	return satAdd(satAdd(satMul(o.recoveryInterval, 2), o.recoveryInterval/5), o.opTimeout)
}

// detectionWindow is the longest time from a worker's last heartbeat to the
// first scan after its key expired: heartbeat TTL + 1.1 × recovery interval
// (the jitter), + the scan turn when it is on (a holder that dies right
// after scanning holds the next scan back by up to its turn). The rows set
// must outlive it: from the first claim on, every recovery attempt renews
// it, but nothing does before.
func (o *options) detectionWindow() time.Duration {
	w := satAdd(satAdd(o.heartbeatTTL, o.recoveryInterval), o.recoveryInterval/10)
	if o.scanLease {
		w = satAdd(w, o.scanTurnTTL())
	}
	return w
}

// longestRecoveryWait is the longest wait between two recovery ticks: the
// recovery interval + 10% jitter.
func (o *options) longestRecoveryWait() time.Duration {
	return satAdd(o.recoveryInterval, o.recoveryInterval/10)
}

// satAdd adds two non-negative durations, saturating instead of
// overflowing.
func satAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul multiplies a non-negative duration by n > 0, saturating instead of
// overflowing.
func satMul(d time.Duration, n int64) time.Duration {
	if d > time.Duration(math.MaxInt64/n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

// clip shortens a bad value for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// validateWitness checks the witness timings: the worker fences itself
// (WitnessFence after its last answered ping) before any peer's grace
// ends (WitnessGrace after it first saw the channel empty), with room for
// the pings (every 2/5 fence) and the counts (every grace/10).
func (o *options) validateWitness() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timings.WitnessGrace", o.witnessGrace}, {"Timings.WitnessFence", o.witnessFence}} {
		if err := checkBounds(d.name, d.v); err != nil {
			return err
		}
	}
	if o.witnessFence >= o.witnessGrace {
		return fmt.Errorf("%w: Timings.WitnessFence %v must be shorter than Timings.WitnessGrace %v: a worker must stop taking work before any peer may judge it dead",
			ErrInvalidConfig, o.witnessFence, o.witnessGrace)
	}
	if o.witnessSet && !o.noWitness && o.witnessGrace >= o.heartbeatTTL {
		return fmt.Errorf("%w: Timings.WitnessGrace %v must be shorter than Timings.HeartbeatTTL %v (or turn the witness off: WithLivenessWitness(false))",
			ErrInvalidConfig, o.witnessGrace, o.heartbeatTTL)
	}
	if o.witnessFence < 10*time.Millisecond {
		return fmt.Errorf("%w: Timings.WitnessFence %v must be at least 10ms (it pings every 2/5 of it)", ErrInvalidConfig, o.witnessFence)
	}
	return nil
}

// witnessOn reports whether the worker runs the liveness witness (owner
// mode is New's decision, given as ownerMode).
func (o *options) witnessOn(ownerMode bool) bool {
	return ownerMode && !o.noWitness && o.witnessGrace < o.heartbeatTTL
}
