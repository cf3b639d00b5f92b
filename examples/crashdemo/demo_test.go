package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/testutil"
)

// The workers the demo starts are this test binary again: TestMain runs
// the worker role when the demo asks for it.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(workerMain(os.Args[1:]))
	}
	code := testutil.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fastArgs keep a demo run to a few seconds: 60 rows in blocks of 6, 40ms a
// row, TTL 1s, heartbeat every 250ms, recovery every 500ms.
var fastArgs = []string{"-rows", "60", "-block", "6", "-work", "40ms",
	"-ttl", "1s", "-heartbeat", "250ms", "-recovery", "500ms", "-timeout", "60s"}

// needPostgresBinaries ends the test when the demo could not start its own
// PostgreSQL.
func needPostgresBinaries(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts servers and processes: skipped in -short mode")
	}
	if _, err := servers.PostgresBinDir(); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

var pidRE = regexp.MustCompile(`started \(pid (\d+)\)`)

// assertProcessesGone checks that every worker the output names is gone.
func assertProcessesGone(t *testing.T, out string) {
	t.Helper()
	pids := pidRE.FindAllStringSubmatch(out, -1)
	require.Len(t, pids, 3, "three workers started")
	for _, m := range pids {
		pid, _ := strconv.Atoi(m[1])
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "worker pid %d is gone", pid)
	}
}

// assertQuiet checks that a demo on a correct setup shows no warning and
// no error: every WARN or ERROR a worker logs is a line "wN warn: ..." or
// "wN error: ...". A heartbeat that Redis answered later than the
// operation timeout is the machine's load, not the setup's: its Warn names
// that assumption and is allowed (the demo's verdict still holds the
// bound).
func assertQuiet(t *testing.T, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "warn: heartbeat failed; retrying Redis did not answer within the operation timeout") {
			continue
		}
		assert.NotRegexp(t, `\bw\d+ (warn|error): `, l, "a correct setup warns of nothing")
	}
}

// assertPortClosed checks that nothing listens on addr any more.
func assertPortClosed(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	assert.Error(t, err, "nothing listens on %s", addr)
}

func TestDemoWithItsOwnServersKeepsEveryPromise(t *testing.T) {
	needPostgresBinaries(t)
	var out, errOut bytes.Buffer
	start := time.Now()
	code := runDemo(context.Background(), append(fastArgs, "-plain"), func(string) string { return "" }, &out, &errOut)
	t.Logf("demo took %v; output:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	require.Equal(t, exitPass, code, errOut.String())

	s := out.String()
	assert.Regexp(t, `verdict: PASS: 60/60 rows processed, processed twice: 0, rows queued again [0-9.]+m?s after the kill \(bound 1.55s\)`, s)
	assert.Contains(t, s, "w2 KILLED with SIGKILL in the middle of rows")
	assert.Regexp(t, `w2's heartbeat key expired, [0-9.]+m?s after the kill`, s)
	assert.Regexp(t, `w[13]'s recovery scan found w2 dead`, s)
	assert.Regexp(t, `w[13] reset \d+ rows? of w2 to queued, [0-9.]+m?s after the kill`, s)
	assert.Regexp(t, `w[13] took rows [0-9, -]+: \d+ rows? of them back from recovery`, s)
	assert.NotContains(t, s, "\x1b[", "no escape codes when stdout is not a terminal")
	if _, err := exec.LookPath("redis-server"); err == nil {
		assert.Contains(t, s, "Redis: throwaway redis-server on ", "a real server when one is installed")
		assertQuiet(t, s)
	}

	assertProcessesGone(t, s)
	m := regexp.MustCompile(`Redis: (?:throwaway redis-server|embedded miniredis) on (\S+)`).FindStringSubmatch(s)
	require.NotNil(t, m)
	assertPortClosed(t, m[1])
	m = regexp.MustCompile(`PostgreSQL: throwaway cluster on (\S+),`).FindStringSubmatch(s)
	require.NotNil(t, m)
	assertPortClosed(t, m[1])
}

func TestDemoOnGivenServersRemovesWhatItCreated(t *testing.T) {
	redisURL, dbURL := testutil.RedisURL(t), testutil.PostgresURL(t)
	env := map[string]string{"REDIS_URL": redisURL, "DATABASE_URL": dbURL}
	var out, errOut bytes.Buffer
	code := runDemo(context.Background(), append(fastArgs, "-workers", "3"), func(k string) string { return env[k] }, &out, &errOut)
	s := out.String()
	require.Equal(t, exitPass, code, "%s\n%s", s, errOut.String())
	assert.Contains(t, s, "verdict: PASS")
	assert.Contains(t, s, "Redis: REDIS_URL, keys under prefix CRASHDEMO-")
	assertQuiet(t, s)
	assert.NotContains(t, s, redisURL, "connection strings are never printed")
	assert.NotContains(t, s, dbURL)
	assertProcessesGone(t, s)

	schema := regexp.MustCompile(`schema (crashdemo_[0-9a-f]+)`).FindStringSubmatch(s)
	require.NotNil(t, schema)
	db := testutil.Postgres(t)
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`, schema[1]).Scan(&n))
	assert.Zero(t, n, "schema %s dropped", schema[1])

	prefix := regexp.MustCompile(`prefix (CRASHDEMO-[0-9a-f]+)`).FindStringSubmatch(s)
	require.NotNil(t, prefix)
	opt, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	left, err := rdb.Keys(context.Background(), prefix[1]+"*").Result() // a test server: KEYS is fine here
	require.NoError(t, err)
	assert.Empty(t, left, "keys under %s deleted", prefix[1])
}

func TestInterruptStopsEverythingTheDemoStarted(t *testing.T) {
	needPostgresBinaries(t)
	cfg, err := parseConfig(append(fastArgs, "-plain", "-rows", "300"), func(string) string { return "" }, &bytes.Buffer{})
	require.NoError(t, err)
	out := &syncBuffer{}
	d := newDemo(cfg, newUI(out, true, os.Getenv), &bytes.Buffer{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codec := make(chan int, 1)
	go func() { codec <- d.run(ctx) }()

	require.Eventually(t, func() bool { return strings.Contains(out.String(), "KILLED") }, 30*time.Second, 10*time.Millisecond)
	cancel() // what Ctrl-C does through signal.NotifyContext in main
	select {
	case code := <-codec:
		assert.Equal(t, exitInterrupted, code)
	case <-time.After(20 * time.Second):
		t.Fatal("the demo did not stop after the interrupt")
	}
	s := out.String()
	assert.Regexp(t, "interrupted; stopped 3 worker processes, PostgreSQL, (redis-server|miniredis)", s)
	assert.NotContains(t, s, "verdict")
	assertProcessesGone(t, s)
	require.NotNil(t, d.pg)
	_, err = os.Stat(d.pg.Dir)
	assert.True(t, errors.Is(err, os.ErrNotExist), "PostgreSQL's folder removed")
	assert.ErrorIs(t, syscall.Kill(d.pg.Pid(), 0), syscall.ESRCH, "postmaster gone")
}

func TestBadFlagsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "1"}, "need at least 2"},
		{[]string{"-block", "1"}, "need at least 2 rows"},
		{[]string{"-rows", "5"}, "need at least -block × -workers"},
		{[]string{"-ttl", "1s", "-heartbeat", "1s"}, "Timings.HeartbeatInterval 1s must be shorter than Timings.HeartbeatTTL 1s"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		var out, errOut bytes.Buffer
		code := runDemo(context.Background(), tc.args, func(string) string { return "" }, &out, &errOut)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Contains(t, errOut.String(), tc.want, tc.args)
		assert.Empty(t, out.String(), "nothing started")
	}
}

func TestVerdictFailsWhenAPromiseIsBroken(t *testing.T) {
	kill := time.Now()
	good := outcome{rows: 10, done: 10, ledger: 10, killed: true, killedAt: kill,
		recoveredAt: kill.Add(2500 * time.Millisecond), rowsReset: 3, stranded: 3,
		ttl: 2 * time.Second, recoveryInterval: time.Second}
	broken, lines := good.verdict()
	assert.Empty(t, broken, lines)
	assert.Equal(t, 3100*time.Millisecond, good.recoveryBound())
	assert.Equal(t, "verdict: PASS: 10/10 rows processed, processed twice: 0, rows queued again 2.5s after the kill (bound 3.1s)", good.summary(broken))

	for name, tc := range map[string]struct {
		change func(*outcome)
		want   string
	}{
		"twice":       {func(o *outcome) { o.twice, o.ledger = 1, 11 }, "1 rows were processed twice"},
		"unfinished":  {func(o *outcome) { o.done = 8 }, "2 rows were never finished"},
		"late":        {func(o *outcome) { o.recoveredAt = kill.Add(3700 * time.Millisecond) }, "recovery took 3.7s, over the bound 3.1s"},
		"never":       {func(o *outcome) { o.recoveredAt = time.Time{} }, "never recovered"},
		"no kill":     {func(o *outcome) { o.killed = false }, "no worker was killed"},
		"nothing":     {func(o *outcome) { o.rowsReset = 0 }, "none was reset"},
		"live lost":   {func(o *outcome) { o.lostByLive = 1 }, "recovered from a worker that was alive"},
		"worker died": {func(o *outcome) { o.workerFailure = "w1: exit status 1" }, "a surviving worker failed"},
		"timeout":     {func(o *outcome) { o.timedOut = true }, "did not finish within -timeout"},
	} {
		o := good
		tc.change(&o)
		broken, _ := o.verdict()
		require.NotEmpty(t, broken, name)
		assert.Contains(t, strings.Join(broken, "; "), tc.want, name)
		assert.True(t, strings.HasPrefix(o.summary(broken), "verdict: FAIL: "), name)
	}
	within := good
	within.recoveredAt = kill.Add(3100*time.Millisecond + measurementSlack)
	broken, _ = within.verdict()
	assert.Empty(t, broken, "the bound plus the measurement's slack is still kept")
}

func TestTerminalOutputRedrawsTheTableInPlace(t *testing.T) {
	var b bytes.Buffer
	u := &ui{w: &b, tty: true, color: true, start: time.Now()}
	u.update([]string{"a", "b", "c"}, "", time.Now())
	assert.Equal(t, "a\nb\nc\n", b.String())
	b.Reset()
	u.event(time.Now(), "w2 KILLED")
	assert.Regexp(t, `^\x1b\[3F\x1b\[J.*w2 KILLED\na\nb\nc\n$`, b.String(), "erase the table, print the event, redraw")
	b.Reset()
	u.update([]string{"x"}, "", time.Now())
	assert.Equal(t, "\x1b[3F\x1b[Jx\n", b.String())
	b.Reset()
	u.freeze()
	u.say("verdict")
	assert.Equal(t, "\x1b[1F\x1b[Jx\nverdict\n", b.String(), "after freeze the table stays and is not redrawn")
}

func TestPlainOutputPrintsProgressAtMostOnceASecond(t *testing.T) {
	var b bytes.Buffer
	u := newUI(&b, false, func(string) string { return "" })
	assert.False(t, u.tty, "a buffer is not a terminal")
	now := time.Now()
	u.update([]string{"table"}, "progress: 1", now)
	u.update([]string{"table"}, "progress: 2", now.Add(500*time.Millisecond))
	u.update([]string{"table"}, "progress: 2", now.Add(2*time.Second))
	u.update([]string{"table"}, "progress: 3", now.Add(3*time.Second))
	assert.Equal(t, 3, strings.Count(b.String(), "progress"), b.String())
	assert.NotContains(t, b.String(), "table")
	assert.NotContains(t, b.String(), "\x1b")
	assert.Equal(t, "##++....", u.bar(2, 2, 8, 8))
}

func TestPipesAreNotTerminals(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, isTerminal(w))
	u := newUI(w, false, func(string) string { return "" })
	assert.False(t, u.tty)
}

func TestSpanShowsRowRanges(t *testing.T) {
	assert.Equal(t, "none", span(nil))
	assert.Equal(t, "7", span([]int64{7}))
	assert.Equal(t, "11-20", span([]int64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}))
	assert.Equal(t, "3, 7-9, 12", span([]int64{3, 7, 8, 9, 12}))
}
