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
)

func TestDefaultsMatchTheDesign(t *testing.T) {
	assert.Equal(t, 60*time.Second, defaultHeartbeatTTL)
	assert.Equal(t, 30*time.Second, defaultHeartbeatInterval)
	assert.Equal(t, 60*time.Second, defaultRecoveryInterval)
	assert.Equal(t, 180*time.Second, defaultRowsTTL)
	assert.Equal(t, "ALYA", DefaultKeyPrefix)

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
		r    RowResetter
		opts []Option
		want string
	}{
		{"nil client", nil, r, nil, "redis client is nil"},
		{"typed nil client", (*redis.Client)(nil), r, nil, "redis client is nil"},
		{"nil resetter", rdb, nil, nil, "row resetter is nil"},
		{"typed nil resetter", rdb, (*PgxResetter)(nil), nil, "row resetter is nil"},
		{"nil option", rdb, r, []Option{nil}, "nil option"},
		{"interval equal to TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 60 * time.Second})},
			"heartbeat interval 1m0s must be shorter than heartbeat TTL 1m0s"},
		{"interval above TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 90 * time.Second})},
			"heartbeat interval 1m30s must be shorter than heartbeat TTL 1m0s"},
		{"rows TTL equal to TTL + interval", rdb, r, []Option{WithTimings(Timings{RowsTTL: 120 * time.Second})},
			"rows TTL 2m0s must exceed heartbeat TTL 1m0s + recovery interval 1m0s (+10% jitter, + the scan lease if on: 2m54s)"},
		{"rows TTL inside the jitter", rdb, r, []Option{WithTimings(Timings{RowsTTL: 125 * time.Second})},
			"rows TTL 2m5s must exceed heartbeat TTL 1m0s + recovery interval 1m0s (+10% jitter, + the scan lease if on: 2m54s)"},
		{"rows TTL inside the scan lease (a dead lease holder)", rdb, r, []Option{WithTimings(Timings{RowsTTL: 170 * time.Second})},
			"(+10% jitter, + the scan lease if on: 2m54s)"},
		{"rows TTL inside the jitter, scan lease off", rdb, r, []Option{WithTimings(Timings{RowsTTL: 125 * time.Second}), WithScanTurn(false)},
			"(+10% jitter, + the scan lease if on: 2m6s)"},
		{"rows TTL below window", rdb, r, []Option{WithTimings(Timings{RecoveryInterval: 150 * time.Second}), WithTimings(Timings{RowsTTL: defaultRowsTTL})},
			"rows TTL 3m0s must exceed heartbeat TTL 1m0s + recovery interval 2m30s"},
		{"interval too close to the lease end", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: 50 * time.Second})},
			"heartbeat interval 50s + operation timeout 5s must be shorter than 90% of heartbeat TTL 1m0s (54s)"},
		{"zero TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatTTL: 0})}, "heartbeat TTL 0s must be positive"},
		{"negative interval", rdb, r, []Option{WithTimings(Timings{HeartbeatInterval: -time.Second})}, "heartbeat interval -1s must be positive"},
		{"zero recovery interval", rdb, r, []Option{WithTimings(Timings{RecoveryInterval: 0})}, "recovery interval 0s must be positive"},
		{"negative rows TTL", rdb, r, []Option{WithTimings(Timings{RowsTTL: -1})}, "rows TTL -1ns must be positive"},
		{"zero reset timeout", rdb, r, []Option{WithTimings(Timings{ResetTimeout: 0})}, "reset timeout 0s must be positive"},
		{"zero self-check window", rdb, r, []Option{WithTimings(Timings{SelfCheckWindow: 0})}, "self-check window 0s must be positive"},
		{"sub-millisecond TTL", rdb, r, []Option{WithTimings(Timings{HeartbeatTTL: time.Microsecond}), WithTimings(Timings{HeartbeatInterval: time.Nanosecond}),
			WithTimings(Timings{RecoveryInterval: time.Nanosecond}), WithTimings(Timings{RowsTTL: time.Second})}, "must be at least 1ms"},
		{"negative operation timeout", rdb, r, []Option{WithTimings(Timings{OperationTimeout: -time.Second})}, "operation timeout -1s must be positive"},
		{"operation timeout above interval", rdb, r, []Option{WithTimings(Timings{OperationTimeout: time.Minute})},
			"operation timeout 1m0s must not exceed heartbeat interval 30s"},
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
		{"sweep on and off", rdb, r, []Option{WithBackstopSweep(true), WithBackstopSweep(false)}, "WithBackstopSweep and WithBackstopSweep(false) contradict each other"},
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
		WithTimings(Timings{HeartbeatTTL: 2 * time.Second}), WithTimings(Timings{HeartbeatInterval: 500 * time.Millisecond}),
		WithTimings(Timings{RecoveryInterval: time.Second}), WithTimings(Timings{RowsTTL: 3901 * time.Millisecond}),
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

	w, err = New(rdb, r, WithTimings(Timings{HeartbeatTTL: 2 * time.Second}), WithTimings(Timings{HeartbeatInterval: 300 * time.Millisecond}), WithTimings(Timings{RowsTTL: time.Hour}))
	require.NoError(t, err)
	assert.Equal(t, 300*time.Millisecond, w.opts.heartbeatInterval, "a set value overrides the derived one")
	assert.Equal(t, time.Hour, w.opts.rowsTTL)

	_, err = New(rdb, r, WithTimings(Timings{HeartbeatInterval: 0}))
	assert.ErrorIs(t, err, ErrInvalidConfig, "an explicit zero is refused, not taken for the default")
}

func TestScanLeaseNeverOutlivesTheHeartbeatTTL(t *testing.T) {
	w, err := New(idleClient(t), &fakeResetter{}, WithTimings(Timings{HeartbeatTTL: 2 * time.Second}),
		WithTimings(Timings{HeartbeatInterval: time.Second}), WithTimings(Timings{RecoveryInterval: 10 * time.Second}), WithTimings(Timings{RowsTTL: time.Minute}))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, w.opts.scanTurnTTL(), "capped: a dead holder's lease is gone when its heartbeat is")
	w, err = New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	assert.Equal(t, 48*time.Second, w.opts.scanTurnTTL(), "0.8 x the 60s recovery interval")
}

// TestDocsStateTheDefaultRecoveryBoundTheCodeHas: the crash bound with the
// default timings is derived from the code (detectionWindow: heartbeat TTL
// + 1.1 × recovery interval + the scan lease, 174 s; 126 s while the
// scan-lease holder lives), and every default figure stated next to the
// bound's formula in the package doc, constants.go, the README and docs/ is
// one of those two (doc.go and constants.go said 120 s).
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
	formula := regexp.MustCompile(`TTL \+ (?:1\.1 × )?(?:Default)?[Rr]ecovery ?[Ii]nterval`)
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
				assert.True(t, figures[fm[1]], "%s: %q after %q: the default bound is %v (%v while the scan-lease holder lives)",
					f, fm[0], text[m[0]:m[1]], worst, live)
			}
		}
	}
	assert.Greater(t, stated, 5, "the check found the docs' figures")
}
