package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testsignal"
	"github.com/alya/recovery/internal/testutil"
)

// TestMain stops the shared servers and then proves that no goroutine of
// any Worker outlived its Shutdown.
// The slow integration tests (a second or more of waiting on TTLs and
// recoveries) call t.Parallel when each has servers or a key prefix and
// schema of its own and none of its assertions is a bound on elapsed time;
// tests that assert such a bound, or give a call a deadline of a second or
// less (a Start with 600 ms, a 50 ms operation timeout), stay sequential,
// so other tests' load cannot push them over it. A test whose interleaving
// only needs a live worker's lease to hold may run in parallel with
// timings scaled up for it (life_test.go, life_ousted_test.go: TTLs of 2 s,
// Redis calls of 200 ms or more, every wait scaled alike), and so may one
// whose bound is a fraction of a heartbeat interval it sets long enough
// (half of 4 s). Parallel tests start after the sequential ones have
// finished; make test runs eight at a time (-parallel 8).
func TestMain(m *testing.M) { os.Exit(testutil.MainCheckingLeaks(m)) }

// newMini returns a miniredis and a client for it, both closed when the
// test ends. It answers INFO memory as a server that never evicts.
func newMini(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	testutil.NoEviction(mr)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return mr, c
}

// fast are short timings for tests: TTL 2s, heartbeat every 500ms,
// recovery every second, rows TTL 4s.
func fast(extra ...Option) []Option {
	return append([]Option{
		WithTimings(Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           4 * time.Second,
			ResetTimeout:      5 * time.Second,
		}),
	}, extra...)
}

// newWorker builds a Worker with the fast timings, a test logger and the
// given ID, and shuts it down when the test ends.
func newWorker(t *testing.T, rdb redis.UniversalClient, r Resetter, id string, opts ...Option) (*Worker, *testutil.LogBuffer) {
	t.Helper()
	log, buf := testutil.Logger(t)
	all := append(fast(WithInstanceID(id), WithLogger(log), withTestSignals()), opts...)
	w, err := New(rdb, r, all...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Shutdown(ctx)
	})
	return w, buf
}

// startWorker is newWorker followed by a successful Start.
func startWorker(t *testing.T, rdb redis.UniversalClient, r Resetter, id string, opts ...Option) (*Worker, *testutil.LogBuffer) {
	t.Helper()
	w, buf := newWorker(t, rdb, r, id, opts...)
	require.NoError(t, w.Start(context.Background()))
	return w, buf
}

// fakeResetter is the one Resetter double of the unit tests. It records
// every reset of rows by ID (peer, rows, time, outcome); what a call does
// is set by its fields, all optional, each for the tests that need it:
//
//   - inner does the reset (a pgxreset.Resetter, say); without it every row passed
//     counts as reset. Only the rows and the instance reach inner (no
//     incarnation, so no ledger), and only the count of rows changed comes
//     back, whatever else inner has.
//   - setFail makes the calls for one peer fail with an error.
//   - delay waits before each reset, ending early with the call's context.
//   - hold, a gate, stops the first call until the test opens it, ignoring
//     the call's context as a driver stuck in a system call would.
//   - before runs at each call before the reset (a peer coming back, a
//     check that fails the test).
//   - fenced makes its Info say that its resets are guarded by owner.
//   - info, when set, is what Info returns instead.
//
// It has no schema check, lists no rows in progress and reads no rows
// (errors.ErrUnsupported): no owner mode, no backstop sweep, no self-check.
type fakeResetter struct {
	inner  Resetter
	info   *ResetterInfo
	delay  time.Duration
	hold   *gate
	before func(peer string)
	fenced bool

	mu    sync.Mutex
	fail  map[string]error // by dead instance ID
	calls []resetCall
}

// resetCall is one reset: when it came, with what, and whether it
// succeeded.
type resetCall struct {
	peer string
	ids  []int64
	at   time.Time
	ok   bool
}

// Info says what the fake guarantees: owner fencing when fenced, nothing
// else.
func (f *fakeResetter) Info() ResetterInfo {
	if f.info != nil {
		return *f.info
	}
	return ResetterInfo{Name: "fakeResetter", OwnerFencing: f.fenced, InProgressStatus: "inprog", QueuedStatus: "queued"}
}

// Check checks nothing and tells nothing of what the fake serves.
func (f *fakeResetter) Check(context.Context, bool) (ResetterInfo, error) { return f.Info(), nil }

// ResetRows resets the rows of req.RowIDs for req.InstanceID (see reset).
func (f *fakeResetter) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	call := resetCall{peer: req.InstanceID, ids: slices.Clone(req.RowIDs), at: time.Now()}
	n, err := f.reset(ctx, req.InstanceID, req.RowIDs)
	call.ok = err == nil
	f.mu.Lock()
	f.calls = append(f.calls, call)
	f.mu.Unlock()
	return ResetResult{Changed: n}, err
}

// ResetOwner is not supported.
func (f *fakeResetter) ResetOwner(context.Context, OwnerReset) (ResetResult, error) {
	return ResetResult{}, fmt.Errorf("fakeResetter resets by row IDs only: %w", errors.ErrUnsupported)
}

// ResetVersions is not supported.
func (f *fakeResetter) ResetVersions(context.Context, VersionsReset) (ResetResult, error) {
	return ResetResult{}, fmt.Errorf("fakeResetter resets by row IDs only: %w", errors.ErrUnsupported)
}

// PlanReset is not supported.
func (f *fakeResetter) PlanReset(context.Context, PlanRequest) (ResetResult, error) {
	return ResetResult{}, fmt.Errorf("fakeResetter plans nothing: %w", errors.ErrUnsupported)
}

// InProgressOwners is not supported.
func (f *fakeResetter) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

// InProgressRows is not supported.
func (f *fakeResetter) InProgressRows(context.Context) ([]RowState, error) {
	return nil, errors.ErrUnsupported
}

// RowStates is not supported: the self-check stops at its first read.
func (f *fakeResetter) RowStates(context.Context, []int64) ([]RowState, error) {
	return nil, errors.ErrUnsupported
}

func (f *fakeResetter) reset(ctx context.Context, peer string, ids []int64) (int64, error) {
	if f.hold != nil {
		f.hold.pass()
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if f.before != nil {
		f.before(peer)
	}
	f.mu.Lock()
	err := f.fail[peer]
	f.mu.Unlock()
	switch {
	case err != nil:
		return 0, err
	case f.inner != nil:
		res, err := f.inner.ResetRows(ctx, RowsReset{InstanceID: peer, RowIDs: ids})
		return res.Changed, err
	}
	return int64(len(ids)), nil
}

// setFail makes every later call for peer fail with err; nil ends that.
func (f *fakeResetter) setFail(peer string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = make(map[string]error)
	}
	f.fail[peer] = err
}

// resetOf returns the IDs reset for peer, over all successful calls, sorted.
func (f *fakeResetter) resetOf(peer string) []int64 {
	var ids []int64
	for _, c := range f.of(peer) {
		if c.ok {
			ids = append(ids, c.ids...)
		}
	}
	slices.Sort(ids)
	return ids
}

// callCount returns how many calls succeeded.
func (f *fakeResetter) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.ok {
			n++
		}
	}
	return n
}

// of returns every call for peer, failed ones included, in order.
func (f *fakeResetter) of(peer string) []resetCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []resetCall
	for _, c := range f.calls {
		if c.peer == peer {
			out = append(out, c)
		}
	}
	return out
}

// perRow returns how many times each row was passed to ResetRows, failed
// calls included.
func (f *fakeResetter) perRow() map[int64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]int{}
	for _, c := range f.calls {
		for _, id := range c.ids {
			out[id]++
		}
	}
	return out
}

// gate holds the first caller of pass until the test opens it: entered is
// closed when the caller arrives, and closing release lets it go on.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) pass() {
	g.once.Do(func() { close(g.entered); <-g.release })
}

// keysOf returns the key names of instance id under the default prefix.
func keysOf(id string) store.Keys { return store.InstanceKeys(defaultKeyPrefix, id) }

// registryKey is the name of the registry under the default prefix.
var registryKey = store.RegistryKey(defaultKeyPrefix)

// plantDeadPeer writes what a worker that was killed leaves behind: a
// registry entry and a rows set, and no heartbeat.
func plantDeadPeer(t *testing.T, rdb redis.UniversalClient, prefix, id string, rows ...any) {
	t.Helper()
	ctx := context.Background()
	// The rows set first: a running worker's scan between the two writes
	// would otherwise find a registered peer with nothing to recover and
	// deregister it.
	if len(rows) > 0 {
		require.NoError(t, rdb.SAdd(ctx, store.InstanceKeys(prefix, id).Rows, rows...).Err())
	}
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), id).Err())
}

// handshake are the commands go-redis sends when it opens a connection;
// they go through the hooks too, but are not traffic of the code measured.
var handshake = map[string]bool{"hello": true, "client": true}

// commandCounter is a go-redis hook that counts round trips and commands.
type commandCounter struct {
	mu         sync.Mutex
	roundTrips int
	commands   []string
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake[cmd.Name()] {
			return next(ctx, cmd)
		}
		c.mu.Lock()
		c.roundTrips++
		c.commands = append(c.commands, cmd.Name())
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		counted := false
		for _, cmd := range cmds {
			if !handshake[cmd.Name()] {
				c.commands = append(c.commands, cmd.Name())
				counted = true
			}
		}
		if counted {
			c.roundTrips++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (c *commandCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roundTrips, c.commands = 0, nil
}

func (c *commandCounter) snapshot() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roundTrips, slices.Clone(c.commands)
}

// idleClient is a client that is never used to reach a server, for tests
// of New's validation; closed when the test ends.
func idleClient(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	return c
}

// crash stops the worker's loops the way SIGKILL would: no heartbeat
// deletion, no deregistration, rows set left as it is. Later Shutdown calls
// do nothing.
func (w *Worker) crash() {
	w.mu.Lock()
	w.state.Store(stateShutdown)
	stop, done := w.stopLoops, w.loopsDone
	w.cleaned = true
	w.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// workerGoroutines counts the goroutines started by a Worker now running.
func workerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/alya/recovery.(*Worker).Start.func") {
			n++
		}
	}
	return n
}

// freezer is a go-redis hook that makes every call block while frozen, as
// if the process were paused or the network gone; a blocked call ends when
// its context does.
type freezer struct {
	mu     sync.Mutex
	frozen chan struct{} // nil when not frozen; closed to thaw
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen == nil {
		f.frozen = make(chan struct{})
	}
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen != nil {
		close(f.frozen)
		f.frozen = nil
	}
}

func (f *freezer) wait(ctx context.Context) error {
	f.mu.Lock()
	ch := f.frozen
	f.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *freezer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *freezer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := f.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (f *freezer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := f.wait(ctx); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// discardLogger drops everything, for tests that create many workers.
var discardLogger = slog.New(slog.DiscardHandler)

// recoverAtOnce builds n workers with mk and releases their RecoverNow calls
// at the same moment, for the tests of one recoverer per dead peer.
func recoverAtOnce(t *testing.T, n int, mk func(i int) *Worker) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		w := mk(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := w.recoverNow(context.Background())
			assert.NoError(t, err)
		}()
	}
	close(start)
	wg.Wait()
}

// rowsOf returns the members of instance id's rows set.
func rowsOf(t *testing.T, rdb redis.UniversalClient, prefix, id string) []string {
	t.Helper()
	m, err := rdb.SMembers(context.Background(), store.InstanceKeys(prefix, id).Rows).Result()
	require.NoError(t, err)
	return m
}

func registered(t *testing.T, rdb redis.UniversalClient, prefix, id string) bool {
	t.Helper()
	ok, err := rdb.SIsMember(context.Background(), store.RegistryKey(prefix), id).Result()
	require.NoError(t, err)
	return ok
}

// victim starts a worker that takes rows ids (in progress in the table and
// tracked) and is then killed, as SIGKILL would; its heartbeat is deleted,
// as if its TTL had run out.
func victim(t *testing.T, rdb redis.UniversalClient, db *pgxpool.Pool, r Resetter, id string, opts []Option, ids ...int64) *Worker {
	t.Helper()
	v, _ := startWorker(t, rdb, r, id, opts...)
	setStatus(t, db, "inprog", ids...)
	require.NoError(t, v.Track(context.Background(), ids...))
	v.crash()
	require.NoError(t, rdb.Del(context.Background(), v.ownKeys().Heartbeat).Err())
	return v
}

// expireWithin deletes the keys under prefix whose TTL runs out within d,
// as the clock would have by then: a test of what follows their expiry
// need not wait for it. Keys without a TTL, or with a longer one, stay
// (their TTLs are not shortened); so do the fleet record's member entries,
// which expire by the times written in them.
func expireWithin(t *testing.T, rdb *redis.Client, prefix string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"_*", 0).Iterator()
	for iter.Next(ctx) {
		ttl, err := rdb.PTTL(ctx, iter.Val()).Result()
		require.NoError(t, err)
		if ttl > 0 && ttl <= d {
			require.NoError(t, rdb.Del(ctx, iter.Val()).Err())
		}
	}
	require.NoError(t, iter.Err())
}

// hookResetter is a pgxreset.Resetter or sqlreset.Resetter that runs after once, right
// after a reset of rows by ID (a dead peer's, a Release) committed. It is
// not a fakeResetter with an inner resetter: the Worker must see
// everything the resetter is (its ledger, owner fencing), which embedding
// the Resetter keeps.
type hookResetter struct {
	pgResetterAPI
	after func()
}

func (h *hookResetter) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	res, err := h.pgResetterAPI.ResetRows(ctx, req)
	if err == nil && h.after != nil {
		h.after()
		h.after = nil
	}
	return res, err
}

// waitUptime waits until the Redis server of rdb has been up for d, as
// INFO counts it (whole seconds): the backstop sweep judges nothing from a
// server up for less than a heartbeat TTL (registry.go).
func waitUptime(t *testing.T, rdb redis.UniversalClient, d time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := rdb.Info(context.Background(), "server").Result()
		if err != nil {
			return false
		}
		f, err := parseNodeFacts(info + "\nrole:master\n")
		return err == nil && f.uptime >= d
	}, d+5*time.Second, 50*time.Millisecond)
}

// signals are w's test signals (events.go), on for every Worker that
// newWorker builds.
func signals(w *Worker) *testSignals { return w.sig }

// waitLook waits for a self-check turn of w that read its rows, none
// locked: the quick look after a fetch's COMMIT.
func waitLook(t *testing.T, w *Worker) {
	t.Helper()
	signals(w).look.WaitFor(t, func(l lookTurn) bool { return l.read })
}

// waitLookAfter waits for a self-check turn of w begun after at (the look
// an Untrack asks for, say), or for the end of the self-check.
func waitLookAfter(t *testing.T, w *Worker, at time.Time) {
	t.Helper()
	signals(w).look.WaitFor(t, func(l lookTurn) bool { return l.began.After(at) || l.over })
}

// waitUntrackLook waits for the self-check turn of w that judges the rows
// of an Untrack that returned at untracked: the first turn begun after it
// (the Untrack has handed its rows over by then), or an earlier turn that
// ended with a verdict (it took the rows while the Untrack was returning).
// A self-check that has its verdict already (verified, or the alarm) looks
// no more: then it returns at once.
func waitUntrackLook(t *testing.T, w *Worker, untracked time.Time) {
	t.Helper()
	if w.checker.verdict.Load() != 0 {
		return
	}
	signals(w).look.WaitFor(t, func(l lookTurn) bool {
		return l.began.After(untracked) || l.over || w.checker.verdict.Load() != 0
	})
}

// succeeded counts the turns, as a loop's test signal gave them, that ended
// without error.
func succeeded(turns []error) int {
	n := 0
	for _, err := range turns {
		if err == nil {
			n++
		}
	}
	return n
}

// waitBeat waits for a heartbeat of w, begun after the call, that
// succeeded.
func waitBeat(t *testing.T, w *Worker) {
	t.Helper()
	s := &signals(w).beat
	s.Clear()
	s.WaitOrTimeout(t) // a heartbeat under way at the call may end first
	s.WaitFor(t, func(err error) bool { return err == nil })
}

// waitTurns waits up to d until cond holds, checking it now and at the end
// of each turn of the loop that emits s (a test signal of events.go):
// cond reads what that loop changes. msgAndArgs say what is awaited.
func waitTurns[T any](t *testing.T, s *testsignal.Signal[T], d time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	if cond() {
		return
	}
	defer func() {
		if t.Failed() && len(msgAndArgs) > 0 {
			t.Log(msgAndArgs...)
		}
	}()
	s.WaitForWithin(t, d, func(T) bool { return cond() })
}
