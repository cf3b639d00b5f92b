package recovery

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestDefaultsMatchTheDesign(t *testing.T) {
	assert.Equal(t, 60*time.Second, defaultHeartbeatTTL)
	assert.Equal(t, 30*time.Second, defaultHeartbeatInterval)
	assert.Equal(t, 60*time.Second, defaultRecoveryInterval)
	assert.Equal(t, 180*time.Second, defaultRowsTTL)
	assert.Equal(t, "ALYA", defaultKeyPrefix)

	w, err := New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	assert.Equal(t, defaultHeartbeatTTL, w.opts.heartbeatTTL)
	assert.Equal(t, defaultHeartbeatInterval, w.opts.heartbeatInterval)
	assert.Equal(t, defaultRecoveryInterval, w.opts.recoveryInterval)
	assert.Equal(t, defaultRowsTTL, w.opts.rowsTTL)
	assert.Equal(t, defaultOperationTimeout, w.opts.opTimeout)
	assert.Equal(t, defaultSelfCheckWindow, w.opts.selfCheckWindow)
	assert.Equal(t, registryKey, w.store.Registry())
}

// defaultIDShape is <hostname>-<pid>-<unix start seconds>-<8 hex digits>.
var defaultIDShape = regexp.MustCompile(`^(.+)-(\d+)-(\d+)-([0-9a-f]{8})$`)

func TestDefaultInstanceIDIsHostPidStartTimeRandom(t *testing.T) {
	before := time.Now().Unix()
	w, err := New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	after := time.Now().Unix()

	id := w.InstanceID()
	m := defaultIDShape.FindStringSubmatch(id)
	require.NotNil(t, m, "instance ID %q", id)
	require.NoError(t, store.ValidateName(id))
	host, _ := os.Hostname()
	assert.Equal(t, store.Sanitize(host), m[1])
	assert.Equal(t, strconv.Itoa(os.Getpid()), m[2])
	started, _ := strconv.ParseInt(m[3], 10, 64)
	assert.GreaterOrEqual(t, started, before)
	assert.LessOrEqual(t, started, after)
	assert.Equal(t, keysOf(id).Heartbeat, w.ownKeys().Heartbeat)
	assert.Equal(t, keysOf(id).Rows, w.ownKeys().Rows)
}

// TestTwoWorkersMadeInOneProcessInTheSameSecondGetDifferentIDs reproduces
// part of F3 of issue 10: <hostname>-<pid>-<unix seconds> is one ID for
// every Worker a process makes within a second (and for containers with
// the same hostname and PID 1 started in the same second), and two live
// Workers with one ID share one heartbeat.
func TestTwoWorkersMadeInOneProcessInTheSameSecondGetDifferentIDs(t *testing.T) {
	const n = 64
	ids := make(map[string]bool, n)
	perSecond := make(map[string]int)
	for range n {
		w, err := New(idleClient(t), &fakeResetter{})
		require.NoError(t, err)
		id := w.InstanceID()
		m := defaultIDShape.FindStringSubmatch(id)
		require.NotNil(t, m, "instance ID %q keeps the design's shape plus a random part", id)
		require.NoError(t, store.ValidateName(id))
		assert.False(t, ids[id], "instance ID %q given twice", id)
		ids[id] = true
		perSecond[m[1]+"-"+m[2]+"-"+m[3]]++
	}
	shared := 0
	for _, c := range perSecond {
		shared = max(shared, c)
	}
	require.GreaterOrEqual(t, shared, 2, "the test must make Workers in the same second")
	assert.Len(t, ids, n)
}

func TestNewRejectsBadConfiguration(t *testing.T) {
	rdb := idleClient(t)
	r := &fakeResetter{}
	cases := []struct {
		name string
		rdb  redis.UniversalClient
		r    Resetter
		opts []Option
		want string
	}{
		{"nil client", nil, r, nil, "redis client is nil"},
		{"typed nil client", (*redis.Client)(nil), r, nil, "redis client is nil"},
		{"nil resetter", rdb, nil, nil, "row resetter is nil"},
		{"typed nil resetter", rdb, (*pgxreset.Resetter)(nil), nil, "row resetter is nil"},
		{"nil option", rdb, r, []Option{nil}, "nil option"},
		{"interval equal to TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 60 * time.Second})},
			"Timings.HeartbeatInterval 1m0s must be shorter than Timings.HeartbeatTTL 1m0s"},
		{"interval above TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 90 * time.Second})},
			"Timings.HeartbeatInterval 1m30s must be shorter than Timings.HeartbeatTTL 1m0s"},
		{"rows TTL equal to TTL + interval", rdb, r, []Option{WithTimings(Timings{RowsTTL: 120 * time.Second})},
			"Timings.RowsTTL 2m0s must exceed Timings.HeartbeatTTL 1m0s + Timings.RecoveryInterval 1m0s (+10% jitter, + the scan turn if on: 2m54s)"},
		{"rows TTL inside the jitter", rdb, r, []Option{WithTimings(Timings{RowsTTL: 125 * time.Second})},
			"Timings.RowsTTL 2m5s must exceed Timings.HeartbeatTTL 1m0s + Timings.RecoveryInterval 1m0s (+10% jitter, + the scan turn if on: 2m54s)"},
		{"rows TTL inside the scan turn (a dead turn holder)", rdb, r, []Option{WithTimings(Timings{RowsTTL: 170 * time.Second})},
			"(+10% jitter, + the scan turn if on: 2m54s)"},
		{"rows TTL inside the jitter, scan turn off", rdb, r, []Option{WithTimings(Timings{RowsTTL: 125 * time.Second}), WithScanTurn(false)},
			"(+10% jitter, + the scan turn if on: 2m6s)"},
		{"rows TTL below window", rdb, r, []Option{WithTimings(Timings{RecoveryInterval: 150 * time.Second, RowsTTL: defaultRowsTTL})},
			"Timings.RowsTTL 3m0s must exceed Timings.HeartbeatTTL 1m0s + Timings.RecoveryInterval 2m30s"},
		{"interval too close to the lease end", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 50 * time.Second})},
			"Timings.HeartbeatInterval 50s + Timings.OperationTimeout 5s must be shorter than 90% of Timings.HeartbeatTTL 1m0s (54s)"},
		{"negative TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatTTL: -1})}, "Timings.HeartbeatTTL -1ns must be positive"},
		{"negative interval", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: -time.Second})}, "Timings.HeartbeatInterval -1s must be positive"},
		{"negative recovery interval", rdb, r, []Option{WithTimings(Timings{RecoveryInterval: -time.Second})}, "Timings.RecoveryInterval -1s must be positive"},
		{"negative rows TTL", rdb, r, []Option{WithTimings(Timings{RowsTTL: -1})}, "Timings.RowsTTL -1ns must be positive"},
		{"negative reset timeout", rdb, r, []Option{WithTimings(Timings{ResetTimeout: -time.Second})}, "Timings.ResetTimeout -1s must be positive"},
		{"negative self-check window", rdb, r, []Option{WithTimings(Timings{SelfCheckWindow: -time.Millisecond})}, "Timings.SelfCheckWindow -1ms must be positive"},
		{"self-check window over a week", rdb, r, []Option{WithTimings(Timings{SelfCheckWindow: 8 * 24 * time.Hour})}, "Timings.SelfCheckWindow 192h0m0s exceeds the maximum 168h0m0s (a week)"},
		{"sub-millisecond TTL", rdb, r, []Option{WithTimings(Timings{
			HeartbeatTTL:      time.Microsecond,
			HeartbeatInterval: time.Nanosecond,
			RecoveryInterval:  time.Nanosecond,
			RowsTTL:           time.Second,
		})}, "must be at least 1ms"},
		{"negative operation timeout", rdb, r, []Option{WithTimings(Timings{OperationTimeout: -time.Second})}, "Timings.OperationTimeout -1s must be positive"},
		{"operation timeout above interval", rdb, r, []Option{WithTimings(Timings{OperationTimeout: time.Minute})},
			"Timings.OperationTimeout 1m0s must not exceed Timings.HeartbeatInterval 30s"},
		{"empty instance ID", rdb, r, []Option{WithInstanceID("")}, `instance ID "" is empty`},
		{"instance ID with brace", rdb, r, []Option{WithInstanceID("a{b")}, `instance ID "a{b" contains '{'`},
		{"instance ID with closing brace", rdb, r, []Option{WithInstanceID("a}b")}, `instance ID "a}b" contains`},
		{"instance ID with space", rdb, r, []Option{WithInstanceID("a b")}, `instance ID "a b" contains`},
		{"instance ID with tab", rdb, r, []Option{WithInstanceID("a\tb")}, `instance ID "a\tb" contains`},
		{"instance ID with newline", rdb, r, []Option{WithInstanceID("a\n")}, `instance ID "a\n" contains`},
		{"instance ID too long", rdb, r, []Option{WithInstanceID(strings.Repeat("x", 10000))}, "is longer than 512 bytes"},
		{"empty prefix", rdb, r, []Option{WithKeyPrefix("")}, `key prefix "" is empty`},
		{"prefix with brace", rdb, r, []Option{WithKeyPrefix("AL{YA")}, `key prefix "AL{YA" contains`},
		{"prefix with space", rdb, r, []Option{WithKeyPrefix("AL YA")}, `key prefix "AL YA" contains`},
		{"nil logger", rdb, r, []Option{WithLogger(nil)}, "logger is nil"},
		{"expiry CONFIG SET alone", rdb, r, []Option{WithExpiryConfigSet()}, "WithExpiryConfigSet needs WithExpiryNotifications"},
		{"negative history length", rdb, r, []Option{WithHistory(-1)}, "history length -1 is negative"},
		{"deferred untrack linger not under the interval", rdb, r, []Option{WithDeferredUntrack(30 * time.Second)},
			"deferred untrack linger 30s must be positive and shorter than Timings.HeartbeatInterval 30s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := New(c.rdb, c.r, c.opts...)
			require.Error(t, err)
			assert.Nil(t, w)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "recovery: "), err.Error())
		})
	}
}

func TestNewAcceptsConsistentCustomTimings(t *testing.T) {
	w, err := New(idleClient(t), &fakeResetter{},
		WithTimings(Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           3901 * time.Millisecond,
		}),
		WithKeyPrefix("MY-FLEET"), WithInstanceID("w1"), WithLogger(slog.Default()))
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, w.opts.opTimeout, "operation timeout derives from a short interval")
	assert.Equal(t, "MY-FLEET_{w1}_HEARTBEAT", w.ownKeys().Heartbeat)
	assert.Equal(t, "MY-FLEET_{w1}_ROWS", w.ownKeys().Rows)
	assert.Equal(t, "MY-FLEET_WORKER_REGISTRY", w.store.Registry())
}

func TestNewDerivesTheHeartbeatIntervalAndRowsTTLUnlessSet(t *testing.T) {
	_, rdb := newMini(t)
	r := &fakeResetter{}

	w, err := New(rdb, r)
	require.NoError(t, err)
	assert.Equal(t, defaultHeartbeatInterval, w.opts.heartbeatInterval, "the defaults are what derivation gives")
	assert.Equal(t, defaultRowsTTL, w.opts.rowsTTL)

	w, err = New(rdb, r, WithTimings(Timings{HeartbeatTTL: 2 * time.Second}))
	require.NoError(t, err, "a short TTL alone is a valid configuration")
	assert.Equal(t, time.Second, w.opts.heartbeatInterval, "half the TTL")
	assert.Equal(t, 72*time.Second, w.opts.rowsTTL,
		"the first scan may come 2s + 66s + 2s (the scan turn) after a death: 3 TTLs are too short, so that + a TTL")

	w, err = New(rdb, r, WithTimings(Timings{RecoveryInterval: 150 * time.Second}))
	require.NoError(t, err, "a long recovery interval alone is a valid configuration")
	assert.Equal(t, w.opts.detectionWindow()+defaultHeartbeatTTL, w.opts.rowsTTL)

	w, err = New(rdb, r, WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 300 * time.Millisecond,
		RowsTTL:           time.Hour,
	}))
	require.NoError(t, err)
	assert.Equal(t, 300*time.Millisecond, w.opts.heartbeatInterval, "a set value overrides the derived one")
	assert.Equal(t, time.Hour, w.opts.rowsTTL)

	w, err = New(rdb, r, WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 0,
		RowsTTL:           0,
	}))
	require.NoError(t, err)
	assert.Equal(t, time.Second, w.opts.heartbeatInterval, "a zero field is derived, as if not set")
	assert.Equal(t, 72*time.Second, w.opts.rowsTTL)

	_, err = New(rdb, r, WithTimings(Timings{HeartbeatInterval: -time.Second}))
	assert.ErrorIs(t, err, ErrInvalidConfig, "a negative field is refused, not taken for the default")
}

// TestWithTimingsMergesTheFieldsSet: each WithTimings changes only its
// non-zero fields, so calls compose in any order and a later non-zero
// field wins; a zero field never undoes an earlier one.
func TestWithTimingsMergesTheFieldsSet(t *testing.T) {
	rdb := idleClient(t)
	whole := Timings{HeartbeatTTL: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		RecoveryInterval: time.Second, RowsTTL: 10 * time.Second, OperationTimeout: 100 * time.Millisecond,
		ResetTimeout: 3 * time.Second, SelfCheckWindow: time.Second}
	one, err := New(rdb, &fakeResetter{}, WithTimings(whole))
	require.NoError(t, err)
	parts, err := New(rdb, &fakeResetter{},
		WithTimings(Timings{ResetTimeout: time.Minute, SelfCheckWindow: time.Second}),
		WithTimings(Timings{HeartbeatTTL: 2 * time.Second, RowsTTL: 10 * time.Second}),
		WithTimings(Timings{}),
		WithTimings(Timings{HeartbeatInterval: 500 * time.Millisecond, RecoveryInterval: time.Second}),
		WithTimings(Timings{OperationTimeout: 100 * time.Millisecond, ResetTimeout: 3 * time.Second}))
	require.NoError(t, err)
	for _, w := range []*Worker{one, parts} {
		assert.Equal(t, whole.HeartbeatTTL, w.opts.heartbeatTTL)
		assert.Equal(t, whole.HeartbeatInterval, w.opts.heartbeatInterval)
		assert.Equal(t, whole.RecoveryInterval, w.opts.recoveryInterval)
		assert.Equal(t, whole.RowsTTL, w.opts.rowsTTL)
		assert.Equal(t, whole.OperationTimeout, w.opts.opTimeout)
		assert.Equal(t, whole.ResetTimeout, w.opts.resetTimeout, "the later non-zero field wins")
		assert.Equal(t, whole.SelfCheckWindow, w.opts.selfCheckWindow)
	}

	w, err := New(rdb, &fakeResetter{}, WithTimings(Timings{}))
	require.NoError(t, err)
	d, err := New(rdb, &fakeResetter{})
	require.NoError(t, err)
	assert.Equal(t, d.opts.heartbeatTTL, w.opts.heartbeatTTL, "the zero Timings are the defaults")
	assert.Equal(t, d.opts.rowsTTL, w.opts.rowsTTL)
	assert.Equal(t, d.opts.opTimeout, w.opts.opTimeout)
}

// TestOptionSwitchesTakeTheLastCall: WithBackstopSweep(on) sets the one
// switch, so the last call wins instead of two options contradicting each
// other; WithExpiryNotifications alone never lets the worker CONFIG SET.
func TestOptionSwitchesTakeTheLastCall(t *testing.T) {
	opts := func(o ...Option) options {
		t.Helper()
		applied := defaultOptions()
		for _, opt := range o {
			opt.apply(&applied)
		}
		require.NoError(t, applied.validate())
		return applied
	}
	o := opts(WithBackstopSweep(true), WithBackstopSweep(false))
	assert.True(t, !o.sweep && o.noSweep, "off: the last call")
	o = opts(WithBackstopSweep(false), WithBackstopSweep(true))
	assert.True(t, o.sweep && !o.noSweep, "on: the last call")
	o = opts()
	assert.True(t, !o.sweep && !o.noSweep, "absent: the default")

	o = opts(WithExpiryNotifications())
	assert.True(t, o.expiry && !o.expiryConfigure, "notifications on, the server's configuration left alone")
	o = opts(WithExpiryConfigSet(), WithExpiryNotifications())
	assert.True(t, o.expiry && o.expiryConfigure)

	o = opts(WithScanTurn(false))
	assert.False(t, o.scanLease)
	assert.True(t, opts().scanLease, "the scan turn is on by default")
}

func TestScanTurnNeverOutlivesTheHeartbeatTTL(t *testing.T) {
	w, err := New(idleClient(t), &fakeResetter{}, WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: time.Second,
		RecoveryInterval:  10 * time.Second,
		RowsTTL:           time.Minute,
	}))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, w.opts.scanTurnTTL(), "capped: a dead holder's turn is gone when its heartbeat is")
	w, err = New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	assert.Equal(t, 48*time.Second, w.opts.scanTurnTTL(), "0.8 x the 60s recovery interval")
}

// TestDocsStateTheDefaultRecoveryBoundTheCodeHas: the crash bound with the
// default timings is derived from the code (detectionWindow: heartbeat TTL
// + 1.1 × recovery interval + the scan turn, 174 s; 126 s while the
// scan-turn holder lives), and every default figure stated next to the
// bound's formula in the package doc, constants.go, the README and docs/ is
// one of those two (doc.go and the defaults once said 120 s).
func TestDocsStateTheDefaultRecoveryBoundTheCodeHas(t *testing.T) {
	o := defaultOptions()
	worst := o.detectionWindow()
	live := o.heartbeatTTL + o.longestRecoveryWait()
	require.Equal(t, 174*time.Second, worst, "the docs state 174 s: change them with the defaults")
	require.Equal(t, 126*time.Second, live, "the docs state 126 s: change them with the defaults")
	figures := map[string]bool{strconv.Itoa(int(worst.Seconds())): true, strconv.Itoa(int(live.Seconds())): true}

	files := []string{"doc.go", "constants.go", "README.md"}
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	formula := regexp.MustCompile(`TTL \+ (?:1\.1 × )?(?:[Dd]efault)?[Rr]ecovery ?[Ii]nterval`)
	figure := regexp.MustCompile(`(\d+(?:[–-]\d+)?) s(?: at worst)? (?:by default|with the default timings)`)
	stated := 0
	for _, f := range append(files, docs...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		text := regexp.MustCompile(`\n\s*(?://)?\s*`).ReplaceAllString(string(b), " ")
		if f == "doc.go" || f == "constants.go" {
			for _, want := range []time.Duration{worst, live} {
				assert.True(t, strings.Contains(text, strconv.Itoa(int(want.Seconds()))+" s"), "%s states the bound %v", f, want)
			}
		}
		for _, m := range formula.FindAllStringIndex(text, -1) {
			// The rest of the sentence, or of the table cell.
			rest := text[m[1]:min(len(text), m[1]+300)]
			if end := regexp.MustCompile(`\.(?:\s|$)|\|`).FindStringIndex(rest); end != nil {
				rest = rest[:end[0]]
			}
			for _, fm := range figure.FindAllStringSubmatch(rest, -1) {
				stated++
				assert.True(t, figures[fm[1]], "%s: %q after %q: the default bound is %v (%v while the scan-turn holder lives)",
					f, fm[0], text[m[0]:m[1]], worst, live)
			}
		}
	}
	assert.Greater(t, stated, 5, "the check found the docs' figures")
}
