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
	noSweep           bool // WithoutBackstopSweep
	scanLease         bool
	expiry            bool
	untrackLinger     time.Duration
	untrackSet        bool
	expiryConfigure   bool
	observer          Observer
	observerSet       bool
	noSchemaCheck     bool
	rowsSets          bool // WithRowsSets: no owner mode
	instanceIDSet     bool // WithInstanceID: the ID may have had a predecessor
	historyLen        int  // WithHistory; 0: off
	selfCheckWindow   time.Duration
	evictionAccepted  bool // WithEvictionAccepted
}

func defaultOptions() options {
	return options{
		instanceID:       defaultInstanceID(),
		keyPrefix:        DefaultKeyPrefix,
		heartbeatTTL:     DefaultHeartbeatTTL,
		recoveryInterval: DefaultRecoveryInterval,
		resetTimeout:     DefaultResetTimeout,
		scanLease:        true,
		historyLen:       DefaultHistoryLength,
		selfCheckWindow:  DefaultSelfCheckWindow,
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
// one. Same character rules as WithInstanceID. Default: DefaultKeyPrefix ("ALYA").
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(o *options) { o.keyPrefix = prefix })
}

// WithHeartbeatTTL sets how long a heartbeat key lives without a refresh,
// which is how long a dead worker goes unnoticed. The heartbeat interval
// and the rows TTL are derived from it unless set. Like every timing option
// it must lie between MinDuration (1ms) and MaxDuration (a week), so that
// no duration derived from it can overflow. Default: DefaultHeartbeatTTL (60s).
func WithHeartbeatTTL(d time.Duration) Option {
	return optionFunc(func(o *options) { o.heartbeatTTL = d })
}

// WithHeartbeatInterval sets how often the heartbeat is refreshed; it must be
// shorter than the heartbeat TTL, and with the operation timeout shorter
// than 90% of it (when the lease ends); at least MinDuration (1ms).
// Default: half the heartbeat TTL (DefaultHeartbeatInterval, 30s, for the
// default TTL), so one lost refresh does not cost a live worker its key.
func WithHeartbeatInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.heartbeatInterval, o.intervalSet = d, true })
}

// WithRecoveryInterval sets how often the worker scans for dead peers. Each
// wait is jittered by ±10% so a fleet started together does not scan in
// lockstep. It must lie between MinDuration (1ms) and MaxDuration (a
// week): the scan and sweep leases are derived from it (the sweep lease is
// 2.2 × the interval) and must not overflow. Default:
// DefaultRecoveryInterval (60s).
func WithRecoveryInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.recoveryInterval = d })
}

// WithRowsTTL sets the TTL of the worker's rows set, refreshed by every
// heartbeat and every Track, and by every recovery attempt once the worker
// is dead. It must exceed the longest wait for the first recovery scan:
// heartbeat TTL + recovery interval + 10% (the jitter) + the scan lease
// (min(0.8 × recovery interval, heartbeat TTL), when WithScanLease is on);
// and not exceed MaxDuration (a week). Default: three heartbeat TTLs, or
// that wait + one heartbeat TTL when three TTLs are not longer
// (DefaultRowsTTL, 180s, for the default TTL and recovery interval).
func WithRowsTTL(d time.Duration) Option {
	return optionFunc(func(o *options) { o.rowsTTL, o.rowsTTLSet = d, true })
}

// WithOperationTimeout bounds each Redis call made by the background loops
// and by Untrack; it must be at least MinDuration (1ms) and must not exceed
// the heartbeat interval. Default: DefaultOperationTimeout (5s), or half
// the heartbeat interval if shorter.
func WithOperationTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.opTimeout = d })
}

// WithResetTimeout bounds each ResetRows call made by recovery. It must lie
// between MinDuration (1ms) and MaxDuration (a week): there is no "no
// limit", because the recovery claim lives reset timeout + 3 × operation
// timeout and must expire, or a recoverer that died holding it would block
// the dead peer's recovery for ever. Default: DefaultResetTimeout (30s).
func WithResetTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.resetTimeout = d })
}

// WithScanLease turns the scan lease on or off. With it, one worker of the
// fleet (whichever ticks first) runs the recovery scan each recovery
// interval and the others skip theirs, so the fleet's Redis load grows
// linearly with its size instead of quadratically (docs/performance.md has
// the figures). Off, every worker scans every interval, as in the design.
// ops.RecoverNow always scans. Default: on.
func WithScanLease(enabled bool) Option {
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
// stays finished, PgxResetter's status guard leaves it alone. If the
// application can put finished rows back in the queue (retries, a batch
// run again) and another worker takes one before the dead worker's set is
// recovered, only owner fencing (WithOwnerColumn, the host setting the
// owner when it takes rows) keeps the reset off the new holder; without it
// that row is reset under its holder and processed twice. So: with
// PgxResetter nothing is processed twice if finished rows are never
// re-queued, or with owner fencing (and instance IDs never reused, which
// the default ID ensures); a custom Resetter must guard the same way.
// See docs/safety.md, "Finished rows left in a dead worker's set". linger
// must be positive and shorter than the heartbeat interval. In owner mode
// Untrack sends nothing, so there is nothing to defer and the option has
// no effect. Default: off (Untrack waits for its SREM).
func WithDeferredUntrack(linger time.Duration) Option {
	return optionFunc(func(o *options) { o.untrackLinger = linger; o.untrackSet = true })
}

// WithSelfCheckWindow sets how long a row the worker tracks may stay not
// in progress before the self-check raises ErrMisconfigured: until it has
// seen one of its rows in progress, the worker reads the committed state
// of its newest tracked rows shortly after each Track (a tenth of the
// window), and a row not in progress at two reads at least the window
// apart, tracked all along, is the alarm. Raise it if your host may take
// longer than that from the COMMIT that finishes a row (done, failed or
// queued again) to its Untrack; lower it to judge shorter blocks (a block
// whose rows leave the in-progress status sooner than about 1.1 windows
// after their COMMIT is not judged). It must be between MinDuration and
// MaxDuration. Default: DefaultSelfCheckWindow (500 ms).
func WithSelfCheckWindow(d time.Duration) Option {
	return optionFunc(func(o *options) { o.selfCheckWindow = d })
}

// WithLogger sets the logger; it must not be nil. Default: slog.Default(),
// read when New is called.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l; o.loggerSet = true })
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
	if o.sweep && o.noSweep {
		return fmt.Errorf("%w: WithBackstopSweep and WithoutBackstopSweep contradict each other", ErrInvalidConfig)
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
	if o.observerSet && isNil(o.observer) {
		return fmt.Errorf("%w: observer is nil", ErrInvalidConfig)
	}
	if err := checkBounds("self-check window", o.selfCheckWindow); err != nil {
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
		o.heartbeatInterval = max(o.heartbeatTTL/2, MinDuration)
	}
	if !o.rowsTTLSet && checkBounds("recovery interval", o.recoveryInterval) == nil {
		// Three TTLs, as the design has it, unless the first scan after a
		// death may come later than that: then that wait + a TTL.
		o.rowsTTL = satMul(o.heartbeatTTL, 3)
		if window := o.detectionWindow(); o.rowsTTL <= window {
			o.rowsTTL = satAdd(window, o.heartbeatTTL)
		}
		o.rowsTTL = min(o.rowsTTL, MaxDuration)
	}
	if o.opTimeout == 0 {
		o.opTimeout = min(DefaultOperationTimeout, o.heartbeatInterval/2)
	}
}

// validateTimings derives what is not set and checks every timing and
// their relations.
func (o *options) validateTimings() error {
	if err := checkBounds("heartbeat TTL", o.heartbeatTTL); err != nil {
		return err
	}
	if o.opTimeout != 0 { // 0 means derived, which may be under a millisecond
		if err := checkBounds("operation timeout", o.opTimeout); err != nil {
			return err
		}
	}
	o.deriveTimings()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"heartbeat interval", o.heartbeatInterval},
		{"recovery interval", o.recoveryInterval},
		{"rows TTL", o.rowsTTL},
		{"reset timeout", o.resetTimeout},
	} {
		if err := checkBounds(d.name, d.v); err != nil {
			return err
		}
	}
	if o.heartbeatInterval >= o.heartbeatTTL {
		return fmt.Errorf("%w: heartbeat interval %v must be shorter than heartbeat TTL %v",
			ErrInvalidConfig, o.heartbeatInterval, o.heartbeatTTL)
	}
	// The first scan after a death comes at most heartbeat TTL + 1.1 ×
	// recovery interval (jitter) + the scan turn later; the rows set must
	// still be there.
	if window := o.detectionWindow(); o.rowsTTL <= window {
		return fmt.Errorf("%w: rows TTL %v must exceed heartbeat TTL %v + recovery interval %v (+10%% jitter, + the scan lease if on: %v)",
			ErrInvalidConfig, o.rowsTTL, o.heartbeatTTL, o.recoveryInterval, window)
	}
	if o.opTimeout > o.heartbeatInterval {
		return fmt.Errorf("%w: operation timeout %v must not exceed heartbeat interval %v",
			ErrInvalidConfig, o.opTimeout, o.heartbeatInterval)
	}
	// The lease ends at 90% of the TTL after a heartbeat is sent (see
	// CheckLease); the next one must be sent and answered before that, or
	// a healthy worker would lose its lease every cycle.
	if lease := leaseLength(o.heartbeatTTL); o.heartbeatInterval >= lease-o.opTimeout {
		return fmt.Errorf("%w: heartbeat interval %v + operation timeout %v must be shorter than 90%% of heartbeat TTL %v (%v), when the lease ends",
			ErrInvalidConfig, o.heartbeatInterval, o.opTimeout, o.heartbeatTTL, lease)
	}
	if o.untrackSet && (o.untrackLinger <= 0 || o.untrackLinger >= o.heartbeatInterval) {
		return fmt.Errorf("%w: deferred untrack linger %v must be positive and shorter than heartbeat interval %v",
			ErrInvalidConfig, o.untrackLinger, o.heartbeatInterval)
	}
	return nil
}

// checkBounds refuses a timing that is not positive or lies outside
// [MinDuration, MaxDuration].
func checkBounds(name string, d time.Duration) error {
	switch {
	case d <= 0:
		return fmt.Errorf("%w: %s %v must be positive", ErrInvalidConfig, name, d)
	case d < MinDuration:
		return fmt.Errorf("%w: %s %v must be at least 1ms (MinDuration): Redis expiries have millisecond resolution",
			ErrInvalidConfig, name, d)
	case d > MaxDuration:
		return fmt.Errorf("%w: %s %v exceeds the maximum %v (MaxDuration, a week)", ErrInvalidConfig, name, d, MaxDuration)
	}
	return nil
}

// Durations derived from the options, in one place. validate keeps every
// option within [MinDuration, MaxDuration], so none of these can overflow
// (the largest, claimTTL, is at most 4 × MaxDuration); they saturate all
// the same, so their correctness does not rest on that bound alone. The
// option fuzzer checks each of them for every configuration New accepts.

// claimTTL is how long a recoverer may hold a dead peer: long enough for
// reading the rows set, the reset and the clean-up, each under its own
// timeout, so the claim outlives the work it protects.
func (o *options) claimTTL() time.Duration {
	return satAdd(o.resetTimeout, satMul(o.opTimeout, 3))
}

// scanTurnTTL is 0.8 × the recovery interval, so the holder's own next
// tick (at least 0.9 × the interval later) finds the lease free, but never
// more than the heartbeat TTL: a holder that dies right after taking the
// lease has released it by the time its heartbeat expires, so the next
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
// (the jitter), + the scan lease when it is on (a holder that dies right
// after scanning holds the next scan back by up to its lease). The rows set
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
