package recovery

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/alya/recovery/internal/keys"
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
	heartbeatInterval time.Duration
	recoveryInterval  time.Duration
	rowsTTL           time.Duration
	opTimeout         time.Duration // 0: derived from the heartbeat interval
	resetTimeout      time.Duration
	logger            *slog.Logger
	loggerSet         bool
	sweep             bool
	scanLease         bool
	expiry            bool
	untrackLinger     time.Duration
	untrackSet        bool
	expiryConfigure   bool
	observer          Observer
	observerSet       bool
	noSchemaCheck     bool
}

func defaultOptions() options {
	return options{
		instanceID:        defaultInstanceID(),
		keyPrefix:         DefaultKeyPrefix,
		heartbeatTTL:      DefaultHeartbeatTTL,
		heartbeatInterval: DefaultHeartbeatInterval,
		recoveryInterval:  DefaultRecoveryInterval,
		rowsTTL:           DefaultRowsTTL,
		resetTimeout:      DefaultResetTimeout,
		scanLease:         true,
	}
}

// defaultInstanceID is <hostname>-<pid>-<unix start seconds>, as in the
// design. The hostname is sanitized so the ID is always a valid key part.
func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d-%d", keys.Sanitize(host), os.Getpid(), time.Now().Unix())
}

// WithInstanceID sets the worker's identity in Redis. It must be unique in
// the fleet and stable for the life of the process; it must not be empty or
// contain '{', '}', whitespace or control characters. Default:
// <hostname>-<pid>-<unix start seconds>.
func WithInstanceID(id string) Option {
	return optionFunc(func(o *options) { o.instanceID = id })
}

// WithKeyPrefix sets the first part of every Redis key. Workers that must
// recover each other need the same prefix; fleets that must not, a different
// one. Same character rules as WithInstanceID. Default: DefaultKeyPrefix ("ALYA").
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(o *options) { o.keyPrefix = prefix })
}

// WithHeartbeatTTL sets how long a heartbeat key lives without a refresh,
// which is how long a dead worker goes unnoticed. Default: DefaultHeartbeatTTL (60s).
func WithHeartbeatTTL(d time.Duration) Option {
	return optionFunc(func(o *options) { o.heartbeatTTL = d })
}

// WithHeartbeatInterval sets how often the heartbeat is refreshed; it must be
// shorter than the heartbeat TTL, and with the operation timeout shorter
// than 90% of it (when the lease ends). Default: DefaultHeartbeatInterval (30s).
func WithHeartbeatInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.heartbeatInterval = d })
}

// WithRecoveryInterval sets how often the worker scans for dead peers. Each
// wait is jittered by ±10% so a fleet started together does not scan in
// lockstep. Default: DefaultRecoveryInterval (60s).
func WithRecoveryInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.recoveryInterval = d })
}

// WithRowsTTL sets the TTL of the worker's rows set, refreshed by every
// heartbeat and every Track. It must exceed heartbeat TTL + recovery
// interval + 10% (the jitter). Default: DefaultRowsTTL (180s).
func WithRowsTTL(d time.Duration) Option {
	return optionFunc(func(o *options) { o.rowsTTL = d })
}

// WithOperationTimeout bounds each Redis call made by the background loops
// and by Untrack; it must not exceed the heartbeat interval. Default:
// DefaultOperationTimeout (5s), or half the heartbeat interval if shorter.
func WithOperationTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.opTimeout = d })
}

// WithResetTimeout bounds each ResetRows call made by recovery. Default:
// DefaultResetTimeout (30s).
func WithResetTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.resetTimeout = d })
}

// WithScanLease turns the scan lease on or off. With it, one worker of the
// fleet (whichever ticks first) runs the recovery scan each recovery
// interval and the others skip theirs, so the fleet's Redis load grows
// linearly with its size instead of quadratically (docs/performance.md has
// the figures). Off, every worker scans every interval, as in the design.
// RecoverNow always scans. Default: on.
func WithScanLease(enabled bool) Option {
	return optionFunc(func(o *options) { o.scanLease = enabled })
}

// WithDeferredUntrack makes Untrack return without waiting for Redis: the
// rows are forgotten in memory at once and removed from the rows set in one
// batched SREM at most linger later (a heartbeat or Shutdown sends it too
// if that fails). It saves a round trip per row on the hot path (see the
// host-loop figures in docs/performance.md). The price: a worker killed
// within the linger leaves finished rows in its set; recovery passes them
// to the resetter, whose status guard (and owner guard) leaves them
// untouched, so with PgxResetter nothing is processed twice; a custom
// RowResetter must guard the same way. linger must be positive and shorter
// than the heartbeat interval. Default: off (Untrack waits for its SREM).
func WithDeferredUntrack(linger time.Duration) Option {
	return optionFunc(func(o *options) { o.untrackLinger = linger; o.untrackSet = true })
}

// WithLogger sets the logger; it must not be nil. Default: slog.Default(),
// read when New is called.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l; o.loggerSet = true })
}

// validate checks the options after all were applied and fills in derived
// values. The error names the bad value.
func (o *options) validate() error {
	if err := keys.ValidateName(o.instanceID); err != nil {
		return fmt.Errorf("%w: instance ID %q %v", ErrInvalidConfig, clip(o.instanceID), err)
	}
	if err := keys.ValidateName(o.keyPrefix); err != nil {
		return fmt.Errorf("%w: key prefix %q %v", ErrInvalidConfig, clip(o.keyPrefix), err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"heartbeat TTL", o.heartbeatTTL},
		{"heartbeat interval", o.heartbeatInterval},
		{"recovery interval", o.recoveryInterval},
		{"rows TTL", o.rowsTTL},
		{"reset timeout", o.resetTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s %v must be positive", ErrInvalidConfig, d.name, d.v)
		}
	}
	// Redis expiries have millisecond resolution.
	if o.heartbeatTTL < time.Millisecond || o.rowsTTL < time.Millisecond {
		return fmt.Errorf("%w: heartbeat TTL %v and rows TTL %v must be at least 1ms", ErrInvalidConfig, o.heartbeatTTL, o.rowsTTL)
	}
	if o.heartbeatInterval >= o.heartbeatTTL {
		return fmt.Errorf("%w: heartbeat interval %v must be shorter than heartbeat TTL %v",
			ErrInvalidConfig, o.heartbeatInterval, o.heartbeatTTL)
	}
	// The first scan after a death comes at most heartbeat TTL + 1.1 ×
	// recovery interval (jitter) later; the rows set must still be there.
	if window := satAdd(satAdd(o.heartbeatTTL, o.recoveryInterval), o.recoveryInterval/10); o.rowsTTL <= window {
		return fmt.Errorf("%w: rows TTL %v must exceed heartbeat TTL %v + recovery interval %v (+10%% jitter: %v)",
			ErrInvalidConfig, o.rowsTTL, o.heartbeatTTL, o.recoveryInterval, window)
	}
	switch {
	case o.opTimeout < 0:
		return fmt.Errorf("%w: operation timeout %v must be positive", ErrInvalidConfig, o.opTimeout)
	case o.opTimeout == 0:
		o.opTimeout = min(DefaultOperationTimeout, o.heartbeatInterval/2)
	case o.opTimeout > o.heartbeatInterval:
		return fmt.Errorf("%w: operation timeout %v must not exceed heartbeat interval %v",
			ErrInvalidConfig, o.opTimeout, o.heartbeatInterval)
	}
	// The lease ends at 90% of the TTL after a heartbeat is sent (see
	// CheckLease); the next one must be sent and answered before that, or
	// a healthy worker would lose its lease every cycle.
	if lease := o.heartbeatTTL - o.heartbeatTTL/10; o.heartbeatInterval >= lease-o.opTimeout {
		return fmt.Errorf("%w: heartbeat interval %v + operation timeout %v must be shorter than 90%% of heartbeat TTL %v (%v), when the lease ends",
			ErrInvalidConfig, o.heartbeatInterval, o.opTimeout, o.heartbeatTTL, lease)
	}
	if o.untrackSet && (o.untrackLinger <= 0 || o.untrackLinger >= o.heartbeatInterval) {
		return fmt.Errorf("%w: deferred untrack linger %v must be positive and shorter than heartbeat interval %v",
			ErrInvalidConfig, o.untrackLinger, o.heartbeatInterval)
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
	return nil
}

// satAdd adds two positive durations, saturating instead of overflowing, so
// absurd options are refused instead of wrapping around.
func satAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// clip shortens a bad value for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
