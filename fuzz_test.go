package recovery

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// documentedNameRule is the rule for instance IDs and key prefixes as the
// docs state it (WithInstanceID, docs/design.md "Redis keys"), written
// independently of internal/keys: not empty, at most 512 bytes, valid
// UTF-8, no '{', '}', whitespace or control characters.
func documentedNameRule(s string) bool {
	if s == "" || len(s) > 512 || !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return r == '{' || r == '}' || unicode.IsSpace(r) || unicode.IsControl(r)
	})
}

// documentedTimingRule is the timing table of docs/design.md and the
// Timings docs: a zero field takes its default (heartbeat TTL 60s,
// recovery interval 60s, reset timeout 30s, self-check window 500ms) or
// its derived value (heartbeat interval: half the TTL, at least 1ms; rows
// TTL: three TTLs, or TTL + 1.1 × recovery interval + the scan turn + a
// TTL when that is longer, at most a week; operation timeout: min(5s,
// interval/2)); then every duration lies between 1ms (Redis expiries have
// millisecond resolution) and a week, the operation timeout at most the
// heartbeat interval, interval < TTL, rows TTL > TTL + 1.1 × recovery
// interval + the scan turn, min(0.8 × recovery interval, TTL) and at least
// 1ms (in arithmetic that cannot overflow), and interval + operation
// timeout < 0.9 × TTL.
func documentedTimingRule(ttl, interval, recovery, rowsTTL, op, reset, window time.Duration) bool {
	const week = 7 * 24 * time.Hour // written out, not maxDuration: the docs say a week
	or := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	ttl, recovery, reset, window = or(ttl, 60*time.Second), or(recovery, 60*time.Second), or(reset, 30*time.Second), or(window, 500*time.Millisecond)
	inBounds := func(d time.Duration) bool { return d >= time.Millisecond && d <= week }
	if !inBounds(ttl) || !inBounds(recovery) {
		return false
	}
	lease := max(min(recovery-recovery/5, ttl), time.Millisecond) // the scan turn, on by default
	interval = or(interval, max(ttl/2, time.Millisecond))
	if rowsTTL == 0 {
		rowsTTL = 3 * ttl // at most 3 weeks: no overflow
		if detection := ttl + recovery + recovery/10 + lease; rowsTTL <= detection {
			rowsTTL = detection + ttl
		}
		rowsTTL = min(rowsTTL, week)
	}
	for _, d := range []time.Duration{interval, rowsTTL, reset, window} {
		if !inBounds(d) {
			return false
		}
	}
	if op != 0 && (op < time.Millisecond || op > interval) {
		return false
	}
	if op == 0 {
		op = min(5*time.Second, interval/2)
	}
	spare := rowsTTL - ttl - lease // all at most a week: no overflow
	return interval < ttl &&
		spare > recovery && spare-recovery > recovery/10 &&
		interval < ttl-ttl/10-op
}

// checkDerivedDurations checks every duration a Worker derives from its
// options, in exact (big integer) arithmetic, so a value that wrapped
// around or saturated is caught: each is positive, equals its documented
// formula, and keeps the relation it exists for.
func checkDerivedDurations(t *testing.T, w *Worker) {
	t.Helper()
	o := &w.opts
	exact := func(d time.Duration) *big.Int { return big.NewInt(int64(d)) }
	sum := func(ds ...*big.Int) *big.Int {
		s := new(big.Int)
		for _, d := range ds {
			s.Add(s, d)
		}
		return s
	}
	mul := func(d time.Duration, n int64) *big.Int { return new(big.Int).Mul(exact(d), big.NewInt(n)) }
	equal := func(name string, got time.Duration, want *big.Int) {
		t.Helper()
		if exact(got).Cmp(want) != 0 {
			t.Fatalf("%s = %v (%d ns), want %s ns: overflow or wrong formula", name, got, int64(got), want)
		}
	}
	greater := func(name string, a, b time.Duration) {
		t.Helper()
		if a <= b {
			t.Fatalf("%s: %v must exceed %v", name, a, b)
		}
	}
	// A Redis expiry (PX) must be at least 1ms and small enough that now +
	// PX fits the server's int64 milliseconds; four weeks is the most any
	// derived TTL can be.
	redisTTL := func(name string, d time.Duration) {
		t.Helper()
		if d < time.Millisecond || d > 4*maxDuration {
			t.Fatalf("%s %v is not a Redis expiry in [1ms, 4 weeks]", name, d)
		}
	}

	if o.opTimeout <= 0 || o.opTimeout > o.heartbeatInterval {
		t.Fatalf("operation timeout %v not in (0, heartbeat interval %v]", o.opTimeout, o.heartbeatInterval)
	}

	claim := o.claimTTL()
	equal("claim TTL", claim, sum(exact(o.resetTimeout), mul(o.opTimeout, 3)))
	greater("claim TTL > reset timeout", claim, o.resetTimeout)
	greater("claim TTL > reset timeout + 2 op timeouts", claim-o.resetTimeout, 2*o.opTimeout)
	redisTTL("claim TTL", claim)

	scan := o.scanTurnTTL()
	equal("scan lease TTL", scan, exact(max(min(o.recoveryInterval-o.recoveryInterval/5, o.heartbeatTTL), time.Millisecond)))
	if scan > o.heartbeatTTL && scan > time.Millisecond {
		t.Fatalf("scan lease %v outlives heartbeat TTL %v", scan, o.heartbeatTTL)
	}
	if o.recoveryInterval >= 10*time.Millisecond && 10*scan >= 9*o.recoveryInterval {
		t.Fatalf("scan lease %v not free at the holder's next tick (0.9 × %v)", scan, o.recoveryInterval)
	}
	redisTTL("scan lease TTL", scan)

	sweep := o.sweepTurnTTL()
	equal("sweep lease TTL", sweep, sum(mul(o.recoveryInterval, 2), exact(o.recoveryInterval/5), exact(o.opTimeout)))
	greater("sweep lease > 2 × recovery interval", sweep-o.recoveryInterval, o.recoveryInterval)
	greater("sweep lease > longest recovery wait", sweep, o.longestRecoveryWait())
	redisTTL("sweep lease TTL", sweep)

	lease := leaseLength(o.heartbeatTTL)
	margin := o.heartbeatTTL - lease
	equal("lease length", lease, new(big.Int).Sub(exact(o.heartbeatTTL), exact(margin)))
	if margin < 0 || lease <= 0 || lease > o.heartbeatTTL {
		t.Fatalf("lease %v (margin %v) not in (0, heartbeat TTL %v]", lease, margin, o.heartbeatTTL)
	}
	greater("lease > heartbeat interval + op timeout", lease-o.opTimeout, o.heartbeatInterval)

	window := o.detectionWindow()
	if o.scanLease {
		equal("detection window", window, sum(exact(o.heartbeatTTL), exact(o.recoveryInterval), exact(o.recoveryInterval/10), exact(o.scanTurnTTL())))
	} else {
		equal("detection window", window, sum(exact(o.heartbeatTTL), exact(o.recoveryInterval), exact(o.recoveryInterval/10)))
	}
	greater("rows TTL > detection window", o.rowsTTL, window)
	redisTTL("rows TTL", o.rowsTTL)
	redisTTL("heartbeat TTL", o.heartbeatTTL)

	wait := o.longestRecoveryWait()
	equal("longest recovery wait", wait, sum(exact(o.recoveryInterval), exact(o.recoveryInterval/10)))
	for range 4 {
		if j := jitter(o.recoveryInterval, 0.1); j <= 0 || j > wait+1 {
			t.Fatalf("recovery wait %v not in (0, %v]", j, wait)
		}
	}
	for n := 1; n <= 64; n++ {
		if d := w.heart.retryDelay(n); d <= 0 || d > o.heartbeatInterval+o.heartbeatInterval/5+1 {
			t.Fatalf("heartbeat retry %d waits %v, not in (0, 1.2 × interval %v]", n, d, o.heartbeatInterval)
		}
	}
}

// FuzzNewAcceptsExactlyTheDocumentedConfigurations feeds New fuzzed
// instance IDs, prefixes and durations: it must never panic, must accept a
// configuration exactly when the documented rules allow it, and must say
// why it refused one with an ErrInvalidConfig error of bounded length (a
// 10 KB ID is clipped, not echoed).
func FuzzNewAcceptsExactlyTheDocumentedConfigurations(f *testing.F) {
	s, ms, week := int64(time.Second), int64(time.Millisecond), int64(maxDuration)
	for _, seed := range []struct {
		id, prefix                                          string
		ttl, interval, recovery, rowsTTL, op, reset, window int64
	}{
		{"host-1-2", "ALYA", 60 * s, 30 * s, 60 * s, 180 * s, 0, 30 * s, 0},                                                 // the design's defaults
		{"w", "P", 2 * s, s / 2, s, 6 * s, 0, 10 * s, 0},                                                                    // the fault suite's timings
		{"w", "P", 2 * s, s / 2, s, 3 * s, 0, 10 * s, 0},                                                                    // rows TTL = TTL + recovery: refused
		{"w", "P", 2 * s, 2 * s, s, 6 * s, 0, 10 * s, 0},                                                                    // interval = TTL: refused
		{"w", "P", 2 * s, s / 2, s, 6 * s, s, 10 * s, 0},                                                                    // op timeout > interval: refused
		{"w", "P", 2 * s, s / 2, s, 6 * s, -1, 10 * s, 0},                                                                   // negative op timeout: refused
		{"w", "P", int64(time.Millisecond) - 1, 1, 1, 6 * s, 0, s, 0},                                                       // TTL under 1ms: refused
		{"a{b}", "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                      // braces
		{"", "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                          // empty ID
		{"w", "A B", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                       // whitespace in the prefix
		{"w\u00a0x", "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                  // non-ASCII space
		{"\xff", "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                      // invalid UTF-8
		{"höst-1", "ALYA", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                                 // non-ASCII letters are fine
		{strings.Repeat("x", 512), "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                    // longest ID
		{strings.Repeat("x", 10240), "P", 2 * s, s / 2, s, 6 * s, 0, s, 0},                                                  // 10 KB ID
		{"w", "P", math.MaxInt64 - 1, s, 1, math.MaxInt64, 0, math.MaxInt64, 0},                                             // huge but consistent: refused
		{"w", "P", 60 * s, 30 * s, 60 * s, 180 * s, 0, math.MaxInt64, 0},                                                    // "no limit" reset timeout: refused
		{"w", "P", 60 * s, 30 * s, 5 * 365 * 24 * 3600 * s, math.MaxInt64, 0, 30 * s, 0},                                    // 5-year recovery interval: refused
		{"w", "P", week, week - 4*week/10, 1, week, 0, week, 0},                                                             // every timing at its maximum
		{"w", "P", 3 * ms, ms, ms, 7 * ms, ms, ms, 0},                                                                       // every timing at its minimum
		{"w", "P", 3 * ms, ms, ms, 7 * ms, 0, ms, 0},                                                                        // derived op timeout of 0.5ms
		{"w", "P", 2 * s, s / 2, s, 6 * s, 0, 0, 0},                                                                         // zero reset timeout
		{"w", "P", math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64}, // all negative
		{"w", "P", 0, 0, 0, 0, 0, 0, 0},                                                                                     // every field zero: the defaults
		{"w", "P", 2 * s, 0, s, 0, 0, 0, 0},                                                                                 // the interval and rows TTL derived from a short TTL
		{"w", "P", 0, 0, 0, 0, 0, 0, -1},                                                                                    // negative self-check window: refused
		{"w", "P", 0, 0, 0, 0, 0, 0, week + 1},                                                                              // self-check window over a week: refused
		{"w", "P", 0, 0, 150 * s, 0, 0, 0, 0},                                                                               // a long recovery interval alone: rows TTL derived past it
		{"w", "P", 0, 0, week, 0, 0, 0, 0},                                                                                  // a week of recovery interval: no rows TTL fits, refused
		{"w", "P", 3 * ms / 2, 0, ms, 0, 0, 0, 0},                                                                           // a derived interval floored at 1ms
		{"w", "P", 0, 0, 0, 0, 0, 0, 2 * ms},                                                                                // a short self-check window
	} {
		f.Add(seed.id, seed.prefix, seed.ttl, seed.interval, seed.recovery, seed.rowsTTL, seed.op, seed.reset, seed.window)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does no I/O
	f.Cleanup(func() { rdb.Close() })

	f.Fuzz(func(t *testing.T, id, prefix string, ttl, interval, recovery, rowsTTL, op, reset, window int64) {
		d := func(n int64) time.Duration { return time.Duration(n) }
		timings := Timings{
			HeartbeatTTL: d(ttl), HeartbeatInterval: d(interval), RecoveryInterval: d(recovery),
			RowsTTL: d(rowsTTL), OperationTimeout: d(op), ResetTimeout: d(reset), SelfCheckWindow: d(window),
		}
		opts := []Option{WithInstanceID(id), WithKeyPrefix(prefix), WithTimings(timings)}
		if ttl%2 == 0 {
			// Field by field, the same: WithTimings merges what is set.
			opts = opts[:2]
			for _, t := range []Timings{
				{HeartbeatTTL: d(ttl)}, {HeartbeatInterval: d(interval)}, {RecoveryInterval: d(recovery)},
				{RowsTTL: d(rowsTTL)}, {OperationTimeout: d(op)}, {ResetTimeout: d(reset)}, {SelfCheckWindow: d(window)},
			} {
				opts = append(opts, WithTimings(t))
			}
		}
		w, err := New(rdb, &fakeResetter{}, opts...)

		want := documentedNameRule(id) && documentedNameRule(prefix) &&
			documentedTimingRule(d(ttl), d(interval), d(recovery), d(rowsTTL), d(op), d(reset), d(window))
		switch {
		case want && err != nil:
			t.Fatalf("New refused a configuration the docs allow: %v", err)
		case !want && err == nil:
			t.Fatalf("New accepted a configuration the docs forbid: id %q prefix %q ttl %v interval %v recovery %v rows TTL %v op %v reset %v",
				id, prefix, d(ttl), d(interval), d(recovery), d(rowsTTL), d(op), d(reset))
		case err != nil:
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error does not wrap ErrInvalidConfig: %v", err)
			}
			if len(err.Error()) > 400 {
				t.Fatalf("error of %d bytes: bad values must be clipped", len(err.Error()))
			}
		default:
			if w.InstanceID() != id {
				t.Fatalf("InstanceID() = %q, want %q", w.InstanceID(), id)
			}
			checkDerivedDurations(t, w)
		}
	})
}

// TestNewRejectsARowsTTLShorterThanAnOverflowingDetectionWindow reproduces
// a bug found by the fuzz target: New checks rows TTL > TTL + recovery
// interval with an int64 sum, which wraps negative for huge durations, so
// a rows TTL shorter than the detection window is accepted.
func TestNewRejectsARowsTTLShorterThanAnOverflowingDetectionWindow(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	half := time.Duration(math.MaxInt64/2 + 1)
	_, err := New(rdb, &fakeResetter{},
		WithTimings(Timings{
			HeartbeatTTL:      half,
			HeartbeatInterval: time.Second,
			RecoveryInterval:  half,
			RowsTTL:           half + 1,
		}))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("rows TTL %v < TTL %v + recovery interval %v accepted", half+1, half, half)
	}
}

// TestNewRefusesTimingsWhoseDerivedDurationsWouldOverflow reproduces F5 of
// issue 10: New accepted a reset timeout of math.MaxInt64 (a natural "no
// limit"), whose claim TTL, reset timeout + 3 × operation timeout, wrapped
// negative so every recovery failed; and recovery intervals of years, whose
// sweep lease (2.2 × interval + operation timeout) wraps negative from
// about 13 years. Now each is refused with an error that names it and the
// maximum.
func TestNewRefusesTimingsWhoseDerivedDurationsWouldOverflow(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, c := range []struct {
		name string
		opts []Option
		want string
	}{
		{"no-limit reset timeout", []Option{WithTimings(Timings{ResetTimeout: math.MaxInt64})},
			"Timings.ResetTimeout 2562047h47m16.854775807s exceeds the maximum 168h0m0s (a week)"},
		{"5-year recovery interval", []Option{WithTimings(Timings{RecoveryInterval: 5 * year, RowsTTL: 10 * year})},
			"Timings.RecoveryInterval 43800h0m0s exceeds the maximum 168h0m0s"},
		{"20-year recovery interval", []Option{WithTimings(Timings{RecoveryInterval: 20 * year, RowsTTL: 40 * year})},
			"Timings.RecoveryInterval 175200h0m0s exceeds the maximum"},
		{"no-limit operation timeout", []Option{WithTimings(Timings{OperationTimeout: math.MaxInt64})},
			"Timings.OperationTimeout 2562047h47m16.854775807s exceeds the maximum"},
		{"rows TTL over a week", []Option{WithTimings(Timings{RowsTTL: maxDuration + 1})}, "Timings.RowsTTL 168h0m0.000000001s exceeds the maximum"},
		{"sub-millisecond reset timeout", []Option{WithTimings(Timings{ResetTimeout: time.Microsecond})},
			"Timings.ResetTimeout 1µs must be at least 1ms"},
		{"sub-millisecond operation timeout", []Option{WithTimings(Timings{OperationTimeout: time.Microsecond})},
			"Timings.OperationTimeout 1µs must be at least 1ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := New(idleClient(t), &fakeResetter{}, c.opts...)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Nil(t, w)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

// TestEveryDerivedDurationIsSoundAtTheMaximumTimings builds workers with
// every timing at the largest value New accepts and checks what they
// derive: the claim TTL outlives the reset, the sweep lease two recovery
// intervals, and nothing wrapped around.
func TestEveryDerivedDurationIsSoundAtTheMaximumTimings(t *testing.T) {
	for _, opts := range [][]Option{
		{WithTimings(Timings{ResetTimeout: maxDuration})},
		{WithTimings(Timings{
			ResetTimeout:      maxDuration,
			HeartbeatTTL:      maxDuration / 2,
			HeartbeatInterval: maxDuration / 8,
			OperationTimeout:  maxDuration / 8,
			RecoveryInterval:  maxDuration / 4,
			RowsTTL:           maxDuration,
		})},
		{WithTimings(Timings{RecoveryInterval: maxDuration / 2, RowsTTL: maxDuration})},
	} {
		w, err := New(idleClient(t), &fakeResetter{}, opts...)
		require.NoError(t, err)
		checkDerivedDurations(t, w)
		require.Greater(t, w.opts.claimTTL(), w.opts.resetTimeout)
		require.Greater(t, w.opts.sweepTurnTTL(), 2*w.opts.recoveryInterval)
	}
}
