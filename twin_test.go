package recovery

// Instance-ID collisions (issue 10, F3): two live processes with one ID
// are refused; a crashed predecessor's rows under a reused ID are
// recovered, not kept alive. Real redis-server (and PostgreSQL), real
// processes where the issue names them.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// A second Worker with the ID of a running one, in the same process, is
// refused within a heartbeat interval + operation timeout, and writes
// nothing: the first keeps its heartbeat and its lease.
func TestStartRefusesAnInstanceIDAnotherLiveWorkerHeartbeats(t *testing.T) {
	ctx := context.Background()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("twin")
	first, _ := startWorker(t, rdb, &fakeResetter{}, "pod-0", WithKeyPrefix(prefix))
	second, _ := newWorker(t, rdb, &fakeResetter{}, "pod-0", WithKeyPrefix(prefix))

	began := time.Now()
	err := second.Start(ctx)
	took := time.Since(began)

	require.ErrorIs(t, err, ErrInstanceIDInUse)
	assert.Less(t, took, 2*time.Second, "refused within the watch (500ms + 250ms + 50ms), well before the TTL")
	v, err := rdb.Get(ctx, store.InstanceKeys(prefix, "pod-0").Heartbeat).Result()
	require.NoError(t, err)
	assert.Equal(t, first.beatValue, v, "the refused Worker wrote nothing")
	assert.ErrorIs(t, second.Track(ctx, 1), ErrNotStarted)
	beats := first.Stats().Heartbeats
	waitTurns(t, &signals(first).beat, 5*time.Second, func() bool { return first.Stats().Heartbeats >= beats+2 },
		"two heartbeats of the first")
	assert.NoError(t, first.CheckLease())
}

// Two Workers started at the same moment with one ID and no heartbeat yet:
// the heartbeat script lets exactly one write.
func TestTwoWorkersStartingTogetherWithOneIDOneIsRefused(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("twin")
	for round := range 5 {
		id := "same-" + string(rune('a'+round))
		a, _ := newWorker(t, rdb, &fakeResetter{}, id, WithKeyPrefix(prefix))
		b, _ := newWorker(t, rdb, &fakeResetter{}, id, WithKeyPrefix(prefix))
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, w := range []*Worker{a, b} {
			wg.Go(func() { errs[i] = w.Start(context.Background()) })
		}
		wg.Wait()
		var ok, inUse int
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrInstanceIDInUse):
				inUse++
			default:
				t.Fatalf("unexpected error: %v", err)
			}
		}
		assert.Equal(t, 1, ok, "round %d: one starts", round)
		assert.Equal(t, 1, inUse, "round %d: the other is refused", round)
	}
}

// A worker whose heartbeat finds another process's value (a twin started
// while this one could not refresh, or an old worker writing "alive")
// loses its lease for good, says so once, and leaves the twin's keys
// alone, also at Shutdown.
func TestWorkerWhoseInstanceIDWasTakenOverLosesItsLeaseForGood(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("twin")
	events := &recorder{}
	w, logs := startWorker(t, rdb, &fakeResetter{}, "pod-1", WithKeyPrefix(prefix), WithObserver(events.Observe))
	require.NoError(t, w.Track(ctx, 1, 2))
	hb := store.InstanceKeys(prefix, "pod-1").Heartbeat
	require.NoError(t, rdb.Set(ctx, hb, "alive", time.Minute).Err())                 // an old-version twin's heartbeat
	require.NoError(t, rdb.Del(ctx, store.InstanceKeys(prefix, "pod-1").Rows).Err()) // its rows set, not ours

	waitTurns(t, &signals(w).beat, 3*time.Second, func() bool { return errors.Is(w.CheckLease(), ErrInstanceIDInUse) })
	assert.ErrorIs(t, w.Healthy(), ErrLeaseLost)
	assert.ErrorIs(t, w.Track(ctx, 3), ErrInstanceIDInUse)
	tries := len(events.of(EventHeartbeatFailed))
	waitTurns(t, &signals(w).deliver, 10*time.Second, func() bool { return len(events.of(EventHeartbeatFailed)) >= tries+3 },
		"three more heartbeat attempts")

	assert.Equal(t, "alive", rdb.Get(ctx, hb).Val(), "never overwritten")
	assert.Zero(t, rdb.Exists(ctx, store.InstanceKeys(prefix, "pod-1").Rows).Val(), "our rows never written into the twin's set")
	assert.Len(t, events.of(EventInstanceIDTaken), 1, "one event")
	assert.Equal(t, 1, logs.Count("another process heartbeats this instance ID"), "one Error line")
	assert.ErrorIs(t, w.CheckLease(), ErrInstanceIDInUse, "sticky")

	require.NoError(t, w.Shutdown(ctx))
	assert.Equal(t, "alive", rdb.Get(ctx, hb).Val(), "Shutdown leaves the twin's heartbeat")
	assert.True(t, registered(t, rdb, prefix, "pod-1"), "and its registry entry")
}

// Shutdown deletes only its own heartbeat: a process that took the ID over
// after the last heartbeat keeps its.
func TestShutdownLeavesAHeartbeatAnotherProcessWrote(t *testing.T) {
	ctx := context.Background()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("twin")
	w, _ := startWorker(t, rdb, &fakeResetter{}, "pod-2", WithKeyPrefix(prefix), WithTimings(Timings{HeartbeatInterval: time.Second}))
	hb := store.InstanceKeys(prefix, "pod-2").Heartbeat
	require.NoError(t, rdb.Set(ctx, hb, "alive:other", time.Minute).Err())
	require.NoError(t, w.Shutdown(ctx))
	assert.Equal(t, "alive:other", rdb.Get(ctx, hb).Val())
}

// twinWorkerBin builds internal/twinworker once per test binary, with the
// test binary's own build flags (-race), so that its dependencies come
// from the build cache.
var twinWorkerBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "twinworker")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "twinworker")
	args := append(append([]string{"build"}, testutil.GoBuildFlags()...), "-o", bin, "./internal/twinworker")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		return "", errors.New(string(out))
	}
	return bin, nil
})

// twinProc is a running twinworker.
type twinProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startTwin runs argv (ending with the twinworker and its flags) and
// returns once it printed "started", "tracked" (with -track) or "error".
func startTwin(t *testing.T, argv ...string) (*twinProc, string, []string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &twinProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	tracking := strings.Contains(strings.Join(argv, " "), "-track")
	var got []string
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return p, "exited", got
			}
			got = append(got, l)
			switch {
			case strings.HasPrefix(l, "error"):
				return p, "error", got
			case l == "tracked", l == "started" && !tracking:
				return p, l, got
			}
		case <-deadline:
			t.Fatalf("twinworker said only %q", got)
		}
	}
}

func twinArgs(t *testing.T, addr, prefix string, extra ...string) []string {
	t.Helper()
	bin, err := twinWorkerBin()
	require.NoError(t, err)
	return append([]string{bin, "-redis", addr, "-prefix", prefix}, extra...)
}

// unshareArgs wraps argv to run in new UTS and PID namespaces with
// hostname h, so it is PID 1 on host h.
func unshareArgs(t *testing.T, h string, argv []string) []string {
	t.Helper()
	path, err := exec.LookPath("unshare")
	if err == nil {
		err = exec.Command(path, "--uts", "--pid", "--fork", "true").Run()
	}
	if err != nil {
		testutil.Unavailable(t, "unshare --uts --pid (root, util-linux): %v", err)
	}
	return append([]string{path, "--uts", "--pid", "--fork", "sh", "-c", `hostname "$0" && exec "$@"`, h}, argv...)
}

// Two processes with the same hostname and PID (containers with one
// `hostname:`, each PID 1) start in the same second: the default ID keeps
// them apart; given one fixed ID, the second is refused.
func TestTwoProcessesWithTheSameHostnameAndPIDInNamespaces(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	addr := rdb.Options().Addr
	prefix := testutil.Name("ns")

	var ids []string
	for range 2 {
		_, state, out := startTwin(t, unshareArgs(t, "twinhost", twinArgs(t, addr, prefix))...)
		require.Equal(t, "started", state, "%q", out)
		require.True(t, strings.HasPrefix(out[0], "id twinhost-1-"), "PID 1 on host twinhost: %q", out[0])
		ids = append(ids, strings.TrimPrefix(out[0], "id "))
	}
	assert.NotEqual(t, ids[0], ids[1], "the random part tells them apart")
	for _, id := range ids {
		assert.Equal(t, int64(1), rdb.Exists(context.Background(), store.InstanceKeys(prefix, id).Heartbeat).Val(), "each heartbeats its own key")
	}

	// A TTL of 4 s (the watch before the refusal still lasts about a
	// heartbeat interval, 500 ms): the test runs in parallel with others,
	// and the bound is "before a TTL", not a latency.
	fixed := twinArgs(t, addr, prefix, "-id", "fixed", "-ttl", "4s")
	_, state, out := startTwin(t, unshareArgs(t, "twinhost", fixed)...)
	require.Equal(t, "started", state, "%q", out)
	began := time.Now()
	_, state, out = startTwin(t, unshareArgs(t, "twinhost", fixed)...)
	require.Equal(t, "error", state, "%q", out)
	assert.Contains(t, out[len(out)-1], ErrInstanceIDInUse.Error())
	assert.Less(t, time.Since(began), 4*time.Second, "refused before a TTL")
}

// A fixed ID (a StatefulSet pod) restarted right after SIGKILL: the new
// process waits out its predecessor's heartbeat (less than a TTL), gets
// the rows the predecessor tracked reset under the predecessor's
// incarnation, and starts with a rows set of its own. Before, its
// heartbeat kept the predecessor's rows set alive and nobody recovered it.
func TestFixedInstanceIDRestartedAfterSIGKILLRecoversItsPredecessorsRows(t *testing.T) {
	ctx := context.Background()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 5)
	prefix := testutil.Name("restart")
	setStatus(t, db, "inprog", 1, 2, 3)

	p, state, out := startTwin(t, twinArgs(t, rdb.Options().Addr, prefix, "-id", "pod-0", "-track", "1,2,3")...)
	require.Equal(t, "tracked", state, "%q", out)
	k := store.InstanceKeys(prefix, "pod-0")
	oldInc := rdb.Get(ctx, k.Incarnation).Val()
	require.NotEmpty(t, oldInc)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = p.cmd.Wait()
	left := rdb.PTTL(ctx, k.Heartbeat).Val()
	require.Positive(t, left, "the predecessor's heartbeat still lives")

	resetter, err := pgxreset.New(db)
	require.NoError(t, err)
	w, logs := newWorker(t, rdb, resetter, "pod-0", WithKeyPrefix(prefix))
	require.NoError(t, w.Start(ctx), "no crash loop: Start waits out its own predecessor")
	took := time.Since(killed)

	assert.GreaterOrEqual(t, took, left-50*time.Millisecond, "nothing reset before the predecessor's key expired")
	assert.Less(t, took, 2*time.Second+time.Second, "within a TTL (2s) + the reset")
	for id := int64(1); id <= 3; id++ {
		assert.Equal(t, "queued", statuses(t, db)[id], "row %d of the predecessor", id)
	}
	var ledgered int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger WHERE instance_id = 'pod-0' AND incarnation = $1`,
		oldInc).Scan(&ledgered))
	assert.Equal(t, 3, ledgered, "reset under the predecessor's incarnation")
	assert.Empty(t, rowsOf(t, rdb, prefix, "pod-0"), "the new process's rows set holds none of them")
	assert.NotEqual(t, oldInc, rdb.Get(ctx, k.Incarnation).Val(), "a rows set of its own")
	assert.Equal(t, w.beatValue, rdb.Get(ctx, k.Heartbeat).Val())
	assert.Equal(t, 1, logs.Count("recovered rows a previous process left under this instance ID"))
	assert.NoError(t, w.CheckLease())
}

// A predecessor that died longer than a TTL ago and was not recovered yet
// (no peer runs): Start recovers its rows at once, without waiting.
func TestStartRecoversARowsSetLeftUnderItsInstanceIDWithoutAHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testutil.Redis(t)
	prefix := testutil.Name("restart")
	plantDeadPeer(t, rdb, prefix, "pod-3", "7", "8")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "pod-3", WithKeyPrefix(prefix))

	require.NoError(t, w.Start(ctx))

	assert.Equal(t, []int64{7, 8}, r.resetOf("pod-3"))
	assert.Empty(t, rowsOf(t, rdb, prefix, "pod-3"))
	require.NoError(t, w.Track(ctx, 9))
	beats := w.Stats().Heartbeats
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().Heartbeats > beats }, "a heartbeat")
	assert.Equal(t, []string{"9"}, rowsOf(t, rdb, prefix, "pod-3"))
}

var _ redis.UniversalClient = (*redis.Client)(nil)

// R2 (fixed). A fixed instance ID restarted before its predecessor's heartbeat
// expired inherits the predecessor's rows set and never recovers it.
//
// docs/design.md asks only that an ID set with WithInstanceID be unique "at
// any one time"; a StatefulSet pod (w-0) restarted after an OOM kill meets
// that. Its restart usually takes less than the 60 s TTL:
//
//	w-0 (life 1): takes rows 1-3, Tracks them; OOM-killed
//	w-0 (life 2): Start within the TTL: SET heartbeat, new incarnation;
//	              the old heartbeat never expires, so no peer ever finds
//	              life 1 dead; its rows 1-3 stay in the set under life 2's
//	              incarnation, unknown to life 2's memory
//	w-0 (life 2): processes other rows; Shutdown with nothing tracked:
//	              DEL heartbeat, SREM registry; the set {1,2,3} is orphaned
//
// Rows 1-3 stay in progress for ever (no sweep: the default). Even while
// life 2 runs they are held for as long as it lives. The incarnation was
// meant to name "the life of the rows set"; a new life should start a new
// set (or hand the old members to recovery) instead of adopting it.
func TestSafetyFixedInstanceIDRestartedWithinTheTTLGetsItsPredecessorsRowsRecovered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RV2")
	life1, _ := startWorker(t, rdb, fencedResetter(t, db), "w-0", WithKeyPrefix(prefix))
	take(t, db, "w-0", 1, 2, 3)
	require.NoError(t, life1.Track(ctx, 1, 2, 3))
	life1.crash() // OOM kill: its heartbeat lives on for up to a TTL

	life2, _ := startWorker(t, rdb, fencedResetter(t, db), "w-0", WithKeyPrefix(prefix))
	take(t, db, "w-0", 4)
	require.NoError(t, life2.Track(ctx, 4))
	setStatus(t, db, "done", 4)
	require.NoError(t, life2.Untrack(4))
	require.NoError(t, life2.Shutdown(ctx), "a clean shutdown, nothing tracked")

	peer, _ := startWorker(t, rdb, fencedResetter(t, db), "peer", WithKeyPrefix(prefix))
	assert.Eventually(t, func() bool {
		_, _ = peer.recoverNow(ctx)
		got := statuses(t, db)
		return got[1] == "queued" && got[2] == "queued" && got[3] == "queued"
	}, 3*2*time.Second, 200*time.Millisecond, // three heartbeat TTLs of the fast timings
		"rows 1-3 of the killed first life must be recovered; they are stuck")
	t.Logf("left in Redis: rows set %v, registered %v", rowsOf(t, rdb, prefix, "w-0"), registered(t, rdb, prefix, "w-0"))
}
