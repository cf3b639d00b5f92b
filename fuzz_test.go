package recovery

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
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

// documentedTimingRule is the timing table of docs/design.md and the With*
// docs: every duration positive, TTLs at least 1ms (Redis expiries have
// millisecond resolution), interval < TTL, rows TTL > TTL + 1.1 × recovery
// interval (in arithmetic that cannot overflow), an operation timeout of 0
// meaning min(5s, interval/2) and otherwise positive and at most the
// heartbeat interval, and interval + operation timeout < 0.9 × TTL.
func documentedTimingRule(ttl, interval, recovery, rowsTTL, op, reset time.Duration) bool {
	for _, d := range []time.Duration{ttl, interval, recovery, rowsTTL, reset} {
		if d <= 0 {
			return false
		}
	}
	if op < 0 || op > interval {
		return false
	}
	if op == 0 {
		op = min(DefaultOperationTimeout, interval/2)
	}
	spare := rowsTTL - ttl // both positive: no overflow
	return ttl >= time.Millisecond && rowsTTL >= time.Millisecond &&
		interval < ttl &&
		spare > recovery && spare-recovery > recovery/10 &&
		interval < ttl-ttl/10-op
}

// FuzzNewAcceptsExactlyTheDocumentedConfigurations feeds New fuzzed
// instance IDs, prefixes and durations: it must never panic, must accept a
// configuration exactly when the documented rules allow it, and must say
// why it refused one with an ErrInvalidConfig error of bounded length (a
// 10 KB ID is clipped, not echoed).
func FuzzNewAcceptsExactlyTheDocumentedConfigurations(f *testing.F) {
	s := int64(time.Second)
	for _, seed := range []struct {
		id, prefix                                  string
		ttl, interval, recovery, rowsTTL, op, reset int64
	}{
		{"host-1-2", "ALYA", 60 * s, 30 * s, 60 * s, 180 * s, 0, 30 * s},                                     // the design's defaults
		{"w", "P", 2 * s, s / 2, s, 6 * s, 0, 10 * s},                                                        // the fault suite's timings
		{"w", "P", 2 * s, s / 2, s, 3 * s, 0, 10 * s},                                                        // rows TTL = TTL + recovery: refused
		{"w", "P", 2 * s, 2 * s, s, 6 * s, 0, 10 * s},                                                        // interval = TTL: refused
		{"w", "P", 2 * s, s / 2, s, 6 * s, s, 10 * s},                                                        // op timeout > interval: refused
		{"w", "P", 2 * s, s / 2, s, 6 * s, -1, 10 * s},                                                       // negative op timeout: refused
		{"w", "P", int64(time.Millisecond) - 1, 1, 1, 6 * s, 0, s},                                           // TTL under 1ms: refused
		{"a{b}", "P", 2 * s, s / 2, s, 6 * s, 0, s},                                                          // braces
		{"", "P", 2 * s, s / 2, s, 6 * s, 0, s},                                                              // empty ID
		{"w", "A B", 2 * s, s / 2, s, 6 * s, 0, s},                                                           // whitespace in the prefix
		{"w\u00a0x", "P", 2 * s, s / 2, s, 6 * s, 0, s},                                                      // non-ASCII space
		{"\xff", "P", 2 * s, s / 2, s, 6 * s, 0, s},                                                          // invalid UTF-8
		{"höst-1", "ALYA", 2 * s, s / 2, s, 6 * s, 0, s},                                                     // non-ASCII letters are fine
		{strings.Repeat("x", 512), "P", 2 * s, s / 2, s, 6 * s, 0, s},                                        // longest ID
		{strings.Repeat("x", 10240), "P", 2 * s, s / 2, s, 6 * s, 0, s},                                      // 10 KB ID
		{"w", "P", math.MaxInt64 - 1, s, 1, math.MaxInt64, 0, math.MaxInt64},                                 // huge but consistent
		{"w", "P", 2 * s, s / 2, s, 6 * s, 0, 0},                                                             // zero reset timeout
		{"w", "P", math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64}, // all negative
	} {
		f.Add(seed.id, seed.prefix, seed.ttl, seed.interval, seed.recovery, seed.rowsTTL, seed.op, seed.reset)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does no I/O
	f.Cleanup(func() { rdb.Close() })

	f.Fuzz(func(t *testing.T, id, prefix string, ttl, interval, recovery, rowsTTL, op, reset int64) {
		d := func(n int64) time.Duration { return time.Duration(n) }
		opts := []Option{
			WithInstanceID(id), WithKeyPrefix(prefix),
			WithHeartbeatTTL(d(ttl)), WithHeartbeatInterval(d(interval)),
			WithRecoveryInterval(d(recovery)), WithRowsTTL(d(rowsTTL)),
			WithResetTimeout(d(reset)),
		}
		if op != 0 {
			opts = append(opts, WithOperationTimeout(d(op)))
		}
		w, err := New(rdb, &fakeResetter{}, opts...)

		want := documentedNameRule(id) && documentedNameRule(prefix) &&
			documentedTimingRule(d(ttl), d(interval), d(recovery), d(rowsTTL), d(op), d(reset))
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
		WithHeartbeatTTL(half), WithHeartbeatInterval(time.Second),
		WithRecoveryInterval(half), WithRowsTTL(half+1))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("rows TTL %v < TTL %v + recovery interval %v accepted", half+1, half, half)
	}
}
