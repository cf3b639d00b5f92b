package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
)

// TestWatchPipedPrintsPlainFrames: piped, watch prints one plain block per
// frame, without a single escape sequence: the workers with their state,
// TTLs and rows, who holds the scan turn, and the last recoveries.
func TestWatchPipedPrintsPlainFrames(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	recoveringFleet(t, rdb, prefix)
	plantAlive(t, rdb, prefix, "busy-1", "5", "6")

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "watch", "--count", "2", "--interval", "50ms", "--last", "3")
	require.Equal(t, exitOK, code, errOut)
	assert.NotContains(t, out, "\x1b")
	frames := regexp.MustCompile(`(?m)^recovery fleet `).Split(out, -1)[1:]
	require.Len(t, frames, 2, out)
	for _, f := range frames {
		assert.Contains(t, f, prefix+" on Redis at "+url)
		// dead-2's recovery failed: it stays registered.
		assert.Contains(t, f, "3 workers: 2 alive, 1 dead; scan turn: rec-1 (")
		assert.NotContains(t, f, "sweep turn", "no owner column: this fleet cannot sweep")
		assert.Regexp(t, `(?m)^busy-1\s+alive\s+\S+ ago\s+\S+\s+2\s+`, f)
		assert.Regexp(t, `(?m)^dead-2\s+dead, last recovery failed\s+over 1m0s ago\s+-\s+1\s+`, f)
		assert.Regexp(t, `(?m)^rec-1\s+alive\s+`, f)
		assert.Contains(t, f, "last 3 of the history ("+prefix+"_HISTORY):")
		assert.Regexp(t, `(?m)^\S+ \S+\s+recovery_failed\s+dead-2\s+rec-1\s+failed: `, f+"\n")
	}
}

// TestWatchInATerminal runs watch in a real terminal, tmux's, and reads
// the screen back: it redraws in place (one header however many frames),
// shows a recovery that happens while it runs, and ends on Ctrl-C with
// status 0.
func TestWatchInATerminal(t *testing.T) {
	t.Parallel()
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		testutil.Unavailable(t, "tmux not on PATH (scripts/install-deps.sh installs it)")
	}
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	w := recoveringFleet(t, rdb, prefix)

	dir := t.TempDir()
	bin := filepath.Join(dir, "recoveryctl")
	// The test binary's own flags (-race under make test): recoveryctl's
	// dependencies then come from the build cache, not a second compile.
	args := append(append([]string{"build"}, testutil.GoBuildFlags()...), "-o", bin, ".")
	build := exec.Command("go", args...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build recoveryctl: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "tmux.sock")
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-S", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		return string(out), err
	}
	status := filepath.Join(dir, "status")
	// The shell ignores the Ctrl-C, as a login shell would, so it can
	// report the status; recoveryctl's own handler takes SIGINT back.
	script := "trap '' INT; " + bin + " --redis-url " + url + " --prefix " + prefix + " watch --interval 200ms --last 6; echo $? > " + status
	out, err := tm("new-session", "-d", "-s", "watch", "-x", "132", "-y", "30", "sh", "-c", script)
	require.NoError(t, err, out)
	t.Cleanup(func() { _, _ = tm("kill-server") })

	screen := func() string {
		out, err := tm("capture-pane", "-p", "-t", "watch")
		if err != nil {
			return ""
		}
		return out
	}
	require.Eventually(t, func() bool { return strings.Contains(screen(), "recovery_failed") },
		10*time.Second, 50*time.Millisecond, "first frame: %s", screen())

	// A worker dies while watch runs; rec-1 recovers it.
	plantDead(t, rdb, prefix, "dead-3", "7", "8")
	_, err = ops.RecoverNow(context.Background(), w)
	require.Error(t, err, "dead-2 still fails")
	var s string
	require.Eventually(t, func() bool {
		s = screen()
		return regexp.MustCompile(`rows_recovered\s+dead-3\s+rec-1\s+2 rows: 2 reset`).MatchString(s)
	}, 10*time.Second, 50*time.Millisecond, "the recovery of dead-3 shows: %s", screen())
	time.Sleep(600 * time.Millisecond) // a few more frames
	s = screen()
	assert.Equal(t, 1, strings.Count(s, "recovery fleet "+prefix), "redrawn in place, not scrolled:\n%s", s)
	assert.Equal(t, 1, strings.Count(s, "INSTANCE"), s)
	assert.True(t, strings.HasPrefix(s, "recovery fleet "+prefix), "the frame starts at the top:\n%s", s)
	assert.Regexp(t, `(?m)^dead-2\s+dead, last recovery failed`, s)
	assert.Regexp(t, `(?m)^rec-1\s+alive\s+\S+ ago\s+\d+(\.\d)?s\s+0\s+`, s)
	assert.NotRegexp(t, `(?m)^dead-3\s`, s, "recovered and deregistered")
	if path := os.Getenv("RECOVERY_WATCH_SCREEN"); path != "" { // for the README
		require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
	}

	_, err = tm("send-keys", "-t", "watch", "C-c")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(status)
		return err == nil && strings.TrimSpace(string(b)) != ""
	}, 5*time.Second, 20*time.Millisecond, "watch ends on Ctrl-C")
	b, _ := os.ReadFile(status)
	assert.Equal(t, "0", strings.TrimSpace(string(b)), "Ctrl-C is the normal end of a watch")
}

// TestWatchOnRedisCluster: the same frame from a Cluster, whose keys are
// spread over three masters.
func TestWatchOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	prefix := testutil.Name("CTL")
	recoveringFleet(t, rdb, prefix)
	for _, id := range []string{"a-1", "b-2", "c-3", "d-4"} {
		plantAlive(t, rdb, prefix, id, "1")
	}
	out, errOut, code := ctl(t, nil, "--cluster", strings.Join(cluster.Addrs, ","), "--prefix", prefix, "watch", "--count", "1")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "6 workers: 5 alive, 1 dead; scan turn: rec-1 (")
	for _, id := range []string{"a-1", "b-2", "c-3", "d-4"} {
		assert.Regexp(t, `(?m)^`+id+`\s+alive\s+\S+ ago\s+\S+\s+1\s+`, out)
	}
	assert.Regexp(t, `rows_recovered\s+dead-1\s+rec-1\s+3 rows: 3 reset`, out)
}

// TestWatchNamesTurnsHeldByStrangers: a turn key no live worker holds (a
// string without a TTL over the scan turn, a hash over the sweep turn, a
// departed instance's ID) is shown as such, with what it holds; a live
// worker's turn is shown as before.
func TestWatchNamesTurnsHeldByStrangers(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	prefix := testutil.Name("CTL")
	plantAlive(t, rdb, prefix, "live-1")
	frame := func() string {
		out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "watch", "--count", "1", "--last", "0")
		require.Equal(t, exitOK, code, errOut)
		return out
	}

	require.NoError(t, rdb.Set(ctx, store.ScanTurnKey(prefix), "junk\x1b[2J", 0).Err())
	require.NoError(t, rdb.HSet(ctx, store.SweepTurnKey(prefix), "f", "v").Err())
	out := frame()
	assert.Contains(t, out, "scan turn: junk [2J (no expiry left, held by no live worker: no TTL; a worker's next take replaces it)")
	assert.Contains(t, out, "sweep turn: hash (no expiry left, held by no live worker: wrong type; a worker's next take replaces it)")
	assert.NotContains(t, out, "\x1b")

	require.NoError(t, rdb.Set(ctx, store.ScanTurnKey(prefix), "gone-1", time.Minute).Err())
	assert.Regexp(t, `scan turn: gone-1 \(\S+ left, held by no live worker: not a live worker;`, frame())

	require.NoError(t, rdb.Set(ctx, store.ScanTurnKey(prefix), "live-1", time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, store.SweepTurnKey(prefix), strings.Repeat("ab", 16), time.Minute).Err())
	assert.Regexp(t, `scan turn: live-1 \(\S+ left\), sweep turn: held \(\S+ left\)\n`, frame())
}
