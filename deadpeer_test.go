package recovery

// Tests of the one dead-peer path (deadpeer.go): claim, read, reset, finish,
// deregister. A comment naming F1-F8 or R1-R5 marks a regression test of the
// two adversarial reviews (docs/safety.md section 9); each drives the
// interleaving the review found, at the step it named, and fails on the code
// before its fix. The other review regressions sit beside the concept they
// test: release_test.go, rowtrack_test.go, twin_test.go, pgx_ledger_test.go,
// pgx_resetter_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestRecoveryResetsRowsOfDeadPeerThenDeletesItsKeys(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "workerA", "105", "106", "107", "108", "109")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, []int64{105, 106, 107, 108, 109}, r.resetOf("workerA"))
	assert.Equal(t, 1, rep.PeersChecked)
	assert.Equal(t, 1, len(rep.Dead))
	assert.Equal(t, int64(5), rep.RowsReset)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, report.PeerRecovery{InstanceID: "workerA", RowsFound: 5, RowsReset: 5}, rep.Recovered[0])
	assert.False(t, mr.Exists(keysOf("workerA").Rows), "rows set deleted after the reset")
	claim, _ := mr.Get(keysOf("workerA").Claim)
	assert.True(t, strings.HasPrefix(claim, "done:1:"), "the claim became a tombstone holding the result, for a retried Finish: %q", claim)
	ok, _ := mr.SIsMember(registryKey, "workerA")
	assert.False(t, ok, "dead peer deregistered")
	mr.FastForward(2 * b.opts.opTimeout)
	assert.False(t, mr.Exists(keysOf("workerA").Claim), "the tombstone lives two operation timeouts")
}

func TestDeadPeerWithoutRowsIsSimplyDeregistered(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "emptyPeer")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	assert.Zero(t, r.callCount(), "nothing to reset")
	require.Len(t, rep.Recovered, 1)
	assert.Zero(t, rep.Recovered[0].RowsFound)
	ok, _ := mr.SIsMember(registryKey, "emptyPeer")
	assert.False(t, ok)
}

func TestFailedRecoveryOfOnePeerKeepsItForTheNextScan(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "1", "2")
	plantDeadPeer(t, rdb, "ALYA", "p2", "3")
	r := &fakeResetter{}
	pgDown := errors.New("connection refused")
	r.setFail("p1", pgDown)
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.Error(t, err)
	assert.ErrorIs(t, err, pgDown)
	var pe *report.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "p1", pe.InstanceID)
	assert.Contains(t, err.Error(), "recover p1: reset 2 rows: connection refused")
	assert.Equal(t, []int64{3}, r.resetOf("p2"), "the other peer is still recovered")
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, "p2", rep.Recovered[0].InstanceID)
	got, _ := mr.Members(keysOf("p1").Rows)
	assert.ElementsMatch(t, []string{"1", "2"}, got, "rows set kept")
	ok, _ := mr.SIsMember(registryKey, "p1")
	assert.True(t, ok, "registry entry kept")
	note, _ := mr.Get(keysOf("p1").Claim)
	assert.Equal(t, "failed", note, "claim replaced by the note of a failed recovery, which any recoverer takes over at once")

	r.setFail("p1", nil)
	_, err = b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 2}, r.resetOf("p1"))
	assert.False(t, mr.Exists(keysOf("p1").Rows))
}

func TestNonNumericRowMembersAreSkipped(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "2", "abc", "1", "", "99999999999999999999", "-3", " 4", "0x10")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, []int64{-3, 1, 2}, r.resetOf("p1"))
	require.Len(t, rep.Recovered, 1)
	assert.ElementsMatch(t, []string{"abc", "", "99999999999999999999", " 4", "0x10"}, rep.Recovered[0].InvalidMembers)
	assert.False(t, mr.Exists(keysOf("p1").Rows))
}

func TestConcurrentRecoverersResetEachRowOnce(t *testing.T) {
	_, rdb := newMini(t)
	rows := make([]any, 100)
	for i := range rows {
		rows[i] = int64(i + 1)
	}
	plantDeadPeer(t, rdb, "ALYA", "dead", rows...)
	r := &fakeResetter{delay: 20 * time.Millisecond}
	recoverAtOnce(t, 10, func(i int) *Worker {
		w, _ := newWorker(t, rdb, r, "rec"+string(rune('a'+i)))
		return w
	})

	assert.Equal(t, 1, r.callCount(), "one recoverer per dead peer")
	assert.Len(t, r.resetOf("dead"), 100)
}

func TestClaimHeldByAnotherRecovererIsRespectedUntilItExpires(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	// A recoverer took the claim and died before finishing.
	require.NoError(t, mr.Set(keysOf("dead").Claim, "someone-else"))
	mr.SetTTL(keysOf("dead").Claim, 10*time.Second)
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"dead"}, rep.Skipped)
	assert.Zero(t, r.callCount())

	mr.FastForward(10 * time.Second)
	rep, err = b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Skipped)
	assert.Equal(t, []int64{1}, r.resetOf("dead"), "taken over once the dead recoverer's claim expired")
}

// A peer that comes back keeps its rows set as it writes it: the reset
// rows are fenced by owner or recorded in the ledger, and removing members
// could remove rows the peer tracked again after the reset (F8).
func TestPeerThatComesBackDuringRecoveryKeepsItsRegistrationAndNewRows(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "paused", "1", "2")
	// The peer resumes from a long pause while its rows are reset.
	r := &fakeResetter{before: func(string) {
		_ = mr.Set(keysOf("paused").Heartbeat, "alive")
		_, _ = mr.SAdd(keysOf("paused").Rows, "3") // it tracked a new block
	}}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.True(t, rep.Recovered[0].PeerCameBack)
	got, _ := mr.Members(keysOf("paused").Rows)
	assert.ElementsMatch(t, []string{"1", "2", "3"}, got, "the set is left as the peer keeps it")
	ok, _ := mr.SIsMember(registryKey, "paused")
	assert.True(t, ok)
}

func TestHugeRowsSetIsReadInPiecesAndRecoveredWhole(t *testing.T) {
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const n = 50000 // a hashtable set: SSCAN pages through it
	pipe := rdb.Pipeline()
	for i := 0; i < n; i += 5000 {
		batch := make([]any, 5000)
		for j := range batch {
			batch[j] = int64(i + j + 1)
		}
		pipe.SAdd(ctx, keysOf("huge").Rows, batch...)
	}
	pipe.SAdd(ctx, registryKey, "huge")
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "rec")

	rep, err := w.recoverNow(ctx)

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, n, rep.Recovered[0].RowsFound, "every row once, though SSCAN may repeat")
	assert.Len(t, r.resetOf("huge"), n)
	_, cmds := counter.snapshot()
	sscans := 0
	for _, c := range cmds {
		if c == "sscan" {
			sscans++
		}
	}
	assert.Greater(t, sscans, 1, "read in pieces")
}

// skipper is a go-redis hook that drops the first members of the second
// SSCAN page, as a cursor carried to another Cluster node by a slot
// migration may skip members.
type skipper struct {
	mu    sync.Mutex
	pages int
}

func (s *skipper) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *skipper) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if sc, ok := cmd.(*redis.ScanCmd); ok && cmd.Name() == "sscan" && err == nil {
			s.mu.Lock()
			s.pages++
			if s.pages == 2 {
				keys, cursor := sc.Val()
				sc.SetVal(keys[100:], cursor)
			}
			s.mu.Unlock()
		}
		return err
	}
}

func (s *skipper) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestRowsSetReadWithSkippedMembersIsNotFinishedAndIsReadAgain(t *testing.T) {
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const n = 25000 // three SSCAN pages
	members := make([]any, n)
	for i := range members {
		members[i] = int64(i + 1)
	}
	require.NoError(t, rdb.SAdd(ctx, keysOf("moved").Rows, members...).Err())
	require.NoError(t, rdb.SAdd(ctx, registryKey, "moved").Err())
	rdb.AddHook(&skipper{})
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "rec")

	_, err := w.recoverNow(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "members read")
	assert.Zero(t, r.callCount(), "nothing reset from an incomplete read")
	card, err := rdb.SCard(ctx, keysOf("moved").Rows).Result()
	require.NoError(t, err)
	assert.EqualValues(t, n, card, "the set is kept")

	rep, err := w.recoverNow(ctx) // the next read is whole
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Len(t, r.resetOf("moved"), n)
}

func TestSafetyTenRecoverersResetEachRowOfADeadPeerOnce(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 200)
	prefix := testutil.Name("S")
	ids := make([]any, 200)
	for i := range ids {
		ids[i] = int64(i + 1)
		take(t, db, "dead", int64(i+1))
	}
	plantDeadPeer(t, rdb, prefix, "dead", ids...)
	r := &fakeResetter{inner: fencedResetter(t, db)}
	recoverAtOnce(t, 10, func(int) *Worker {
		w, _ := newWorker(t, rdb, r, testutil.Name("rec"), WithKeyPrefix(prefix))
		return w
	})

	per := r.perRow()
	assert.Len(t, per, 200)
	for id, n := range per {
		assert.Equal(t, 1, n, "row %d passed to ResetRows %d times", id, n)
	}
	for id := int64(1); id <= 200; id++ {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s)
	}
}

// The design's race: B resets rows 105-109, C fetches them again, and a slow
// D that read the rows set before B's DEL resets them under C. With claims D
// cannot read the set while B works on it, and finds nothing after. This
// holds without owner fencing.
func TestSafetyTheBCDInterleavingCannotHappen(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 110)
	prefix := testutil.Name("S")
	take(t, db, "A", 105, 106, 107, 108, 109)
	plantDeadPeer(t, rdb, prefix, "A", "105", "106", "107", "108", "109")
	plain, err := pgxreset.New(db) // no owner fencing
	require.NoError(t, err)
	slowB := &fakeResetter{inner: plain, hold: newGate()} // B stops inside its reset
	counted := &fakeResetter{inner: plain}
	b, _ := newWorker(t, rdb, slowB, "B", WithKeyPrefix(prefix))
	d, _ := newWorker(t, rdb, counted, "D", WithKeyPrefix(prefix))

	bDone := make(chan error)
	go func() { _, err := b.recoverNow(context.Background()); bDone <- err }()
	<-slowB.hold.entered // B holds the claim and is about to reset

	rep, err := d.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"A"}, rep.Skipped, "D may not touch A while B recovers it")

	close(slowB.hold.release)
	require.NoError(t, <-bDone)
	take(t, db, "C", 105, 106, 107, 108, 109) // C fetches the recovered rows

	rep, err = d.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Zero(t, len(rep.Dead), "A is gone from the registry")
	assert.Empty(t, counted.perRow(), "D never reset anything")
	for id := int64(105); id <= 109; id++ {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s)
		assert.Equal(t, "C", *o, "row %d still C's", id)
	}
}

// F1: a dead peer's rows set used to expire rows TTL after its last
// heartbeat, whatever happened to its recovery; a PostgreSQL outage longer
// than that lost its rows for good.
func TestSafetyRowsOfADeadPeerSurviveAPostgresOutageOfSeveralRowsTTLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "F1")
	proxy := pgProxy(t, db)
	const rowsTTL = 1600 * time.Millisecond
	timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      time.Second,
		HeartbeatInterval: 300 * time.Millisecond,
		RecoveryInterval:  300 * time.Millisecond,
		RowsTTL:           rowsTTL,
		ResetTimeout:      300 * time.Millisecond,
	})}
	direct, err := pgxreset.New(db)
	require.NoError(t, err)
	victim(t, rdb, db, direct, "victim", timing, 1, 2, 3, 4, 5)

	proxy.Cut() // PostgreSQL unreachable for the recoverer
	viaProxy, err := pgxreset.New(testutil.PoolVia(t, db, proxy.Addr))
	require.NoError(t, err)
	// Started during the outage: without the schema check, which needs
	// PostgreSQL.
	r, _ := startWorker(t, rdb, viaProxy, "recoverer", append(timing, WithoutSchemaCheck())...)
	// Four rows TTLs of failed recoveries; the set must outlive them all.
	// The recoverer's scan loop is what tries and fails: it must have
	// scanned throughout (a turn every recovery interval plus the failed
	// recovery's timeouts, about 600 ms: some ten across the window; at
	// least one a rows TTL).
	scans := signals(r).scan.Span(t, 4*rowsTTL)
	require.GreaterOrEqual(t, len(scans), 4, "the recoverer scanned throughout the 4 rows TTLs")

	assert.Len(t, rowsOf(t, rdb, prefix, "victim"), 5, "the rows set outlives 4 rows TTLs of failed recoveries")
	assert.True(t, registered(t, rdb, prefix, "victim"), "still registered")
	assert.Zero(t, r.Stats().PeersRecovered, "never counted as recovered")
	assert.NotZero(t, r.Stats().Errors)
	for id := int64(1); id <= 5; id++ {
		assert.Equal(t, "inprog", statuses(t, db)[id])
	}

	proxy.Restore()
	require.Eventually(t, func() bool {
		got := statuses(t, db)
		for id := int64(1); id <= 5; id++ {
			if got[id] != "queued" {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "every row comes back once PostgreSQL does")
	require.Eventually(t, func() bool { return !registered(t, rdb, prefix, "victim") }, 5*time.Second, 20*time.Millisecond,
		"deregistered only after its rows were reset")
	n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "victim").Rows, store.InstanceKeys(prefix, "victim").Incarnation).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// behindProxy starts a redis-server of the test's own and returns a
// client straight to it, a fault proxy in front of it, and a client
// through the proxy (with context deadlines, as the library's callers
// should have).
func behindProxy(t *testing.T) (direct *redis.Client, proxy *netfault.Proxy, rdb *redis.Client) {
	t.Helper()
	srv := testutil.StartRedis(t)
	proxy, err := netfault.NewProxy(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	rdb = redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return srv.Client(t), proxy, rdb
}

// lostReply runs one RecoverNow of dead peer "dead" (rows 1 and 2) by a
// worker whose connection to Redis loses the reply to the given script
// once, after the server ran it; go-redis retries it.
func lostReply(t *testing.T, script *redis.Script) (report.RecoveryReport, error, *fakeResetter, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	direct, proxy, rdb := behindProxy(t)
	plantDeadPeer(t, direct, "ALYA", "dead", "1", "2")
	require.NoError(t, script.Load(ctx, direct).Err(), "loaded, so the worker sends EVALSHA with the script's hash")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "recoverer")

	dropped := proxy.DropReplyTo([]byte(script.Hash()))
	rep, err := w.recoverNow(ctx)
	select {
	case <-dropped:
	default:
		t.Fatal("the reply to the script was never dropped")
	}
	return rep, err, r, direct
}

// F4: a retried claim used to find the caller's own claim and answer
// "held", so the peer was skipped and blocked for the claim TTL.
func TestSafetyAClaimWhoseReplyWasLostIsStillTaken(t *testing.T) {
	rep, err, r, direct := lostReply(t, store.Script("claim"))

	require.NoError(t, err)
	assert.Empty(t, rep.Skipped, "the retry finds its own claim")
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, []int64{1, 2}, r.resetOf("dead"))
	assert.False(t, registered(t, direct, "ALYA", "dead"))
}

// Simulation seed 619: a claim whose reply came after the operation
// timeout had run all the same, and go-redis does not retry after a
// deadline. The recovery failed, and every later try (a new token) found
// the claim held by the one that timed out: the peer waited out the
// claim TTL. The claim is now sent again with its token, which answers as
// the first call did.
func TestAClaimWhoseReplyTimedOutIsTakenInTheSameScan(t *testing.T) {
	ctx := context.Background()
	direct, proxy, rdb := behindProxy(t)
	plantDeadPeer(t, direct, "ALYA", "dead", "1", "2")
	claim := store.Script("claim")
	require.NoError(t, claim.Load(ctx, direct).Err(), "loaded, so the worker sends EVALSHA with the script's hash")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "recoverer", WithTimings(Timings{OperationTimeout: 200 * time.Millisecond}))

	held := proxy.DelayReplyTo([]byte(claim.Hash()), 500*time.Millisecond)
	rep, err := w.recoverNow(ctx)
	select {
	case <-held: // the late reply goes to a connection go-redis gave up on
	case <-time.After(5 * time.Second):
		t.Fatal("the claim's reply was never held back")
	}
	require.NoError(t, err)
	assert.Empty(t, rep.Skipped, "the claim sent again finds its own token")
	require.Len(t, rep.Recovered, 1, "%+v", rep)
	assert.Equal(t, []int64{1, 2}, r.resetOf("dead"))
	assert.False(t, registered(t, direct, "ALYA", "dead"))
}

// lateClaimReplies is a go-redis hook: the claim script runs on the
// server, and then the caller sees its deadline pass instead of the reply,
// for the first n claims. Before the deadline is reported, between runs
// it calls between (if set) once, after the first claim.
type lateClaimReplies struct {
	n       atomic.Int32
	between func()
	once    sync.Once
}

func (h *lateClaimReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateClaimReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateClaimReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if cmd.Name() == "evalsha" && len(args) > 1 && args[1] == store.Script("claim").Hash() && h.n.Add(-1) >= 0 {
			if h.between != nil {
				h.once.Do(h.between)
			}
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return err
	}
}

// From the adversarial review of seed 619's fix: a retried claim went
// straight to the claim script, which checks only the heartbeat key. The
// first claim ran; the peer came back (its heartbeat cancels the claim);
// Redis restarted from a snapshot taken before that, losing the return but
// keeping the claim; the retry found no heartbeat and its own token, and
// reset the rows of a live worker, without the hold a fresh judgement of a
// restarted server applies. Before a retry the peer is now judged again.
func TestARetriedClaimIsJudgedAgainFirst(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	direct := srv.Client(t)
	prefix := testutil.Name("RJ")
	k := store.InstanceKeys(prefix, "p")
	plantDeadPeer(t, direct, prefix, "p", "1", "2")
	require.NoError(t, direct.Set(ctx, k.Incarnation, "inc-1", 0).Err())
	require.NoError(t, store.Script("claim").Load(ctx, direct).Err())

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	hook := &lateClaimReplies{between: func() {
		require.NoError(t, direct.Save(ctx).Err()) // the snapshot: the claim, no heartbeat
		// p comes back: its heartbeat, which cancels the claim ...
		require.NoError(t, direct.Set(ctx, k.Heartbeat, "alive:p", 2*time.Second).Err())
		require.NoError(t, direct.Del(ctx, k.Claim).Err())
		srv.RestartKeepingData() // ... lost with the restart
		require.NoError(t, store.Script("claim").Load(ctx, direct).Err())
	}}
	hook.n.Store(1)
	rdb.AddHook(hook)

	r := &fakeResetter{}
	w, logs := newWorker(t, rdb, r, "recoverer", WithKeyPrefix(prefix), WithTimings(Timings{HeartbeatTTL: 2 * time.Second, OperationTimeout: 300 * time.Millisecond}))
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, r.resetOf("p"), "not judged: the server restarted with data less than a TTL ago")
	assert.Empty(t, rep.Recovered)
	assert.Equal(t, 1, logs.Count("the Redis server restarted or was promoted less than a heartbeat TTL ago"))
	assert.Zero(t, direct.Exists(ctx, k.Claim).Val(), "the claim it may hold is dropped")
	assert.True(t, registered(t, direct, prefix, "p"), "p is judged again later")
}

// A claim whose every send timed out may have run: giving up, the
// recoverer drops it, so the next recoverer (a new token) need not wait
// out the claim TTL.
func TestAClaimGivenUpAfterThreeTimeoutsIsDropped(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	direct := srv.Client(t)
	prefix := testutil.Name("RD")
	plantDeadPeer(t, direct, prefix, "p", "1", "2")
	require.NoError(t, store.Script("claim").Load(ctx, direct).Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	hook := &lateClaimReplies{}
	hook.n.Store(claimTries)
	rdb.AddHook(hook)

	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "recoverer", WithKeyPrefix(prefix))
	_, err := w.recoverNow(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, int32(0), hook.n.Load(), "sent %d times", claimTries)
	assert.Zero(t, direct.Exists(ctx, store.InstanceKeys(prefix, "p").Claim).Val(), "the claim it took is dropped")

	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1, "the next try claims at once")
	assert.Equal(t, []int64{1, 2}, r.resetOf("p"))
}

// F4: a retried finish used to find the claim gone and report it lost.
func TestSafetyAFinishWhoseReplyWasLostReportsItsFirstResult(t *testing.T) {
	rep, err, r, direct := lostReply(t, store.Script("finish"))

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, []int64{1, 2}, r.resetOf("dead"))
	assert.Equal(t, 1, r.callCount(), "reset once")
	assert.False(t, registered(t, direct, "ALYA", "dead"), "deregistered in the same scan")
}

// Issue 11: a status misconfigured on the recoverer used to end with the
// rows set deleted and the peer deregistered "with 0 rows reset": the rows
// stayed in progress forever.
func TestSafetyRecoveryKeepsTheRowsItCouldNotResetAndRecoversThemOnceFixed(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "NR")
	right, err := pgxreset.New(db)
	require.NoError(t, err)
	v, _ := startWorker(t, rdb, right, "victim", WithKeyPrefix(prefix))
	setStatus(t, db, "inprog", 1, 2, 3, 4)
	require.NoError(t, v.Track(ctx, 1, 2, 3, 4))
	setStatus(t, db, "done", 4) // finished; the process died before Untrack
	v.crash()
	require.NoError(t, rdb.Del(ctx, v.ownKeys().Heartbeat).Err())

	misspelled, err := pgxreset.New(db, postgres.WithStatuses("in_progress", "queued"))
	require.NoError(t, err)
	rec := &recorder{}
	r, logs := newWorker(t, rdb, misspelled, "r", WithKeyPrefix(prefix), WithObserver(rec.Observe))
	rep, err := r.recoverNow(ctx)

	require.ErrorIs(t, err, ErrRowsNotReset)
	assert.Contains(t, err.Error(), `row 1 has status "inprog"`)
	require.Len(t, rep.Failed, 1)
	assert.Equal(t, []RowState{{ID: 1, Status: "inprog"}, {ID: 2, Status: "inprog"}, {ID: 3, Status: "inprog"}}, rep.Failed[0].NotReset,
		"the finished row 4 is settled, not reported")
	assert.Empty(t, rep.Recovered)
	assert.Len(t, rowsOf(t, rdb, prefix, "victim"), 4, "rows set kept")
	assert.True(t, registered(t, rdb, prefix, "victim"), "registry entry kept")
	assert.Equal(t, uint64(3), r.Stats().RowsNotReset)
	assert.Zero(t, r.Stats().PeersRecovered)
	require.NoError(t, r.Shutdown(ctx)) // delivers the events
	require.Len(t, rec.of(EventRowsNotReset), 1)
	assert.Equal(t, 3, rec.of(EventRowsNotReset)[0].RowsNotReset)
	assert.Equal(t, 4, rec.of(EventRowsNotReset)[0].Rows)
	_ = logs

	fixed, _ := newWorker(t, rdb, right, "fixed", WithKeyPrefix(prefix))
	rep, err = fixed.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(3), rep.RowsReset)
	got := statuses(t, db)
	assert.Equal(t, "queued", got[1])
	assert.Equal(t, "queued", got[3])
	assert.Equal(t, "done", got[4])
	assert.False(t, registered(t, rdb, prefix, "victim"))
}

func TestLostRowsSetAfterAFailedRecoveryIsReportedNotCountedAsRecovered(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2")
	plantDeadPeer(t, rdb, "ALYA", "idle") // died without rows: no record at all
	r := &fakeResetter{}
	pgDown := errors.New("connection refused")
	r.setFail("dead", pgDown)
	w, logs := newWorker(t, rdb, r, "w")

	rep, err := w.recoverNow(context.Background())
	require.ErrorIs(t, err, pgDown)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, "idle", rep.Recovered[0].InstanceID)
	assert.True(t, rep.Recovered[0].NoRecord, "an idle dead peer is deregistered")
	mr.Del(keysOf("dead").Rows) // Redis loses it (or it expired) before the next try

	rep, err = w.recoverNow(context.Background())
	require.ErrorIs(t, err, ErrRowsSetLost)
	assert.False(t, registered(t, rdb, "ALYA", "dead"), "nothing left to retry: deregistered")
	assert.Zero(t, w.Stats().PeersRecovered, "neither the lost peer nor the idle one counts as recovered")
	require.Len(t, rep.Failed, 1)
	assert.True(t, rep.Failed[0].NoRecord)
	assert.Empty(t, rep.Recovered)

	// The dead-peer path logs it at Error.
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"rows set of dead peer vanished`))
}

// R3 (fixed). F1's alarm never fires for a worker of this version: its rows set can
// vanish after a failed recovery and the peer is counted as recovered.
//
// Claim answers ClaimTakenLost only when the rows set AND the incarnation
// are both gone. A worker of the second version always has an incarnation
// key (every heartbeat writes it; an idle worker has one and no rows set),
// and every claim renews both, so when the set alone is lost (eviction
// under an allkeys-* policy, an operator's DEL) the claim answers
// ClaimTaken:
//
//	R: claim V (renews set + incarnation); reset fails (PostgreSQL down); Fail: note "failed"
//	Redis loses V's rows set (not its incarnation)
//	R: claim: note "failed", incarnation exists -> ClaimTaken (not Lost)
//	R: reads 0 rows; Finish deletes the incarnation; V deregistered;
//	   counted in PeersRecovered, no ErrRowsSetLost, no Error log
//
// The existing test plants an old-version peer (no incarnation), which is
// the only case the alarm covers.
func TestRowsSetLostAfterAFailedRecoveryOfANewVersionPeerIsReported(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2")
	require.NoError(t, rdb.Set(ctx, keysOf("dead").Incarnation, "life-1", 0).Err(), "what every heartbeat of this version writes")
	r := &fakeResetter{}
	pgDown := errors.New("connection refused")
	r.setFail("dead", pgDown)
	w, _ := newWorker(t, rdb, r, "w")

	_, err := w.recoverNow(ctx)
	require.ErrorIs(t, err, pgDown)
	require.True(t, mr.Exists(keysOf("dead").Rows))
	mr.Del(keysOf("dead").Rows) // lost; the incarnation is not

	rep, err := w.recoverNow(ctx)
	assert.ErrorIs(t, err, ErrRowsSetLost, "rows 1 and 2 were never reset and nothing knows them any more")
	assert.Zero(t, w.Stats().PeersRecovered, "not a recovery")
	assert.Empty(t, rep.Recovered)
}

// A rows set a scan saw, gone when the peer's recovery comes to it (it
// expired, or was evicted): with the sweep off nothing else would ever
// reset its rows, so the recovery fails with ErrRowsSetLost naming how
// many rows the set held, logged at Error, instead of finding "no record"
// and deregistering the peer in silence.
func TestRowsSetGoneBeforeItsRecoveryIsAnErrorNamingItsRows(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2", "3", "4", "5")
	require.NoError(t, rdb.Set(ctx, keysOf("dead").Claim, "another-recoverer", time.Minute).Err())
	w, logs := newWorker(t, rdb, &fakeResetter{}, "w", WithBackstopSweep(false))

	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"dead"}, rep.Skipped, "another recoverer holds the claim")
	mr.Del(keysOf("dead").Rows)  // expired (or evicted) meanwhile
	mr.Del(keysOf("dead").Claim) // and that recoverer died

	rep, err = w.recoverNow(ctx)
	require.ErrorIs(t, err, ErrRowsSetLost)
	assert.Contains(t, err.Error(), "5 rows")
	assert.Empty(t, rep.Recovered)
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"rows set of dead peer vanished`))
	assert.False(t, registered(t, rdb, "ALYA", "dead"), "nothing left to retry: deregistered")

	// A peer recovered in full is forgotten: dying again idle is no loss.
	plantDeadPeer(t, rdb, "ALYA", "again", "7")
	_, err = w.recoverNow(ctx)
	require.NoError(t, err)
	plantDeadPeer(t, rdb, "ALYA", "again")
	_, err = w.recoverNow(ctx)
	require.NoError(t, err)
}

// The lost set is reported by whichever worker recovers the peer, not
// only by the one whose scan saw it: the scan that renewed the set wrote
// its size into the peer's rows-seen key. Worker 1's scan sees the set
// (another recoverer holds the claim); the set is then evicted; worker 2,
// which never saw it, recovers the peer and reports the 5 rows.
func TestRowsSetGoneBeforeItsRecoveryIsAnErrorNamingItsRowsWhoeverRecoversIt(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2", "3", "4", "5")
	require.NoError(t, rdb.Set(ctx, keysOf("dead").Claim, "another-recoverer", time.Minute).Err())
	w1, _ := newWorker(t, rdb, &fakeResetter{}, "w1", WithBackstopSweep(false))
	rep, err := w1.recoverNow(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"dead"}, rep.Skipped, "another recoverer holds the claim")
	mr.Del(keysOf("dead").Rows)  // evicted
	mr.Del(keysOf("dead").Claim) // and that recoverer died

	w2, logs := newWorker(t, rdb, &fakeResetter{}, "w2", WithBackstopSweep(false))
	rep, err = w2.recoverNow(ctx)
	require.ErrorIs(t, err, ErrRowsSetLost)
	assert.Contains(t, err.Error(), "5 rows")
	assert.Empty(t, rep.Recovered)
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"rows set of dead peer vanished`))
	assert.False(t, registered(t, rdb, "ALYA", "dead"), "nothing left to retry: deregistered")
	assert.False(t, mr.Exists(keysOf("dead").RowsSeen), "the finish deletes the rows-seen key")
}

// A peer whose set a scan renewed while it was dead, that came back and
// then died idle, lost nothing: its heartbeat deleted the rows-seen key,
// so another worker deregisters it without an error.
func TestAPeerThatCameBackAndDiedIdleIsNoLoss(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "paused", "1", "2")
	require.NoError(t, rdb.Set(ctx, keysOf("paused").Claim, "another-recoverer", time.Minute).Err())
	w1, _ := newWorker(t, rdb, &fakeResetter{}, "w1", WithBackstopSweep(false))
	_, err := w1.recoverNow(ctx)
	require.NoError(t, err)
	require.True(t, mr.Exists(keysOf("paused").RowsSeen), "the scan that renewed the set wrote its size")

	// It comes back (one heartbeat), untracks its rows, and dies.
	st := store.NewRedis(rdb, "ALYA", time.Second)
	_, err = st.Beat(ctx, "paused", store.Heartbeat{Value: store.HeartbeatOf("tok"), TTL: time.Second,
		Incarnation: "life", IncarnationTTL: time.Minute, RowsTTL: time.Minute})
	require.NoError(t, err)
	assert.False(t, mr.Exists(keysOf("paused").RowsSeen), "its heartbeat deleted the rows-seen key")
	mr.Del(keysOf("paused").Rows)
	mr.Del(keysOf("paused").Heartbeat)

	w2, logs := newWorker(t, rdb, &fakeResetter{}, "w2", WithBackstopSweep(false))
	_, err = w2.recoverNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, logs.Count(`"level":"ERROR"`))
	assert.False(t, registered(t, rdb, "ALYA", "paused"))
}

// A scan with more than idleOneByOne idle dead peers removes them in bulk;
// a peer whose set a scan saw holding rows, gone since, is not one of
// them: its recovery reports the lost set.
func TestRowsSetGoneAmongIdlePeersIsStillAnErrorNamingItsRows(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2", "3")
	require.NoError(t, rdb.Set(ctx, keysOf("dead").Claim, "another-recoverer", time.Minute).Err())
	w, logs := newWorker(t, rdb, &fakeResetter{}, "w", WithBackstopSweep(false))
	_, err := w.recoverNow(ctx)
	require.NoError(t, err)
	mr.Del(keysOf("dead").Rows)
	mr.Del(keysOf("dead").Claim)
	for i := range idleOneByOne + 8 {
		plantDeadPeer(t, rdb, "ALYA", fmt.Sprintf("idle-%d", i))
	}

	rep, err := w.recoverNow(ctx)
	require.ErrorIs(t, err, ErrRowsSetLost)
	assert.Contains(t, err.Error(), "3 rows")
	assert.Equal(t, idleOneByOne+8, rep.IdleDeregistered, "the idle ones went in bulk")
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"rows set of dead peer vanished`))
}

// comebackStore is a store whose ReadRows lets the peer come back between
// the recoverer's claim and its read of the rows set: after the read
// (whose answer already lists what the peer tracks on its return) it runs
// the peer's heartbeat, which cancels the claim.
type comebackStore struct {
	store.Store
	peer string
}

func (s *comebackStore) ReadRows(ctx context.Context, peer string) (string, []string, error) {
	inc, members, err := s.Store.ReadRows(ctx, peer)
	if _, berr := s.Store.Beat(ctx, s.peer, store.Heartbeat{Value: store.HeartbeatOf("back"), TTL: time.Minute,
		Incarnation: inc, IncarnationTTL: time.Minute, RowsTTL: time.Minute}); berr != nil {
		return "", nil, berr
	}
	return inc, members, err
}

// Found by the deterministic simulation (seed 530, docs/reliability.md): a
// peer whose heartbeat came back between the claim and the read of its
// rows set has the set list rows it took since, under a valid lease; the
// owner guard cannot tell them from its old ones. The recoverer claims
// again after the read and leaves such a peer alone.
func TestRecoveryLeavesAPeerThatCameBackBetweenTheClaimAndTheRead(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, defaultKeyPrefix, "back", "7", "8")
	r := &fakeResetter{fenced: true}
	w, _ := newWorker(t, rdb, r, "scanner", WithRowsSets(),
		withStore(func(s store.Store) store.Store { return &comebackStore{Store: s, peer: "back"} }))

	rep, err := w.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"back"}, rep.Skipped, "left alone, as a peer found alive at the claim")
	assert.Empty(t, rep.Recovered)
	assert.Zero(t, r.callCount(), "nothing read after the peer came back is reset")
	assert.ElementsMatch(t, []string{"7", "8"}, rowsOf(t, rdb, defaultKeyPrefix, "back"), "its rows set is its own again")
	assert.True(t, registered(t, rdb, defaultKeyPrefix, "back"))
}
