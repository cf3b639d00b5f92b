package recovery

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

func TestRecoveryResetsRowsOfDeadPeerThenDeletesItsKeys(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "workerA", "105", "106", "107", "108", "109")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, []int64{105, 106, 107, 108, 109}, r.resetOf("workerA"))
	assert.Equal(t, 1, rep.PeersChecked)
	assert.Equal(t, 1, len(rep.Dead))
	assert.Equal(t, int64(5), rep.RowsReset)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, PeerRecovery{InstanceID: "workerA", RowsFound: 5, RowsReset: 5}, rep.Recovered[0])
	assert.False(t, mr.Exists("ALYA_{workerA}_ROWS"), "rows set deleted after the reset")
	claim, _ := mr.Get("ALYA_{workerA}_RECOVERY")
	assert.True(t, strings.HasPrefix(claim, "done:1:"), "the claim became a tombstone holding the result, for a retried Finish: %q", claim)
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "workerA")
	assert.False(t, ok, "dead peer deregistered")
	mr.FastForward(2 * b.opts.opTimeout)
	assert.False(t, mr.Exists("ALYA_{workerA}_RECOVERY"), "the tombstone lives two operation timeouts")
}

func TestRecoveryLeavesRowsOfLivePeers(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	a, _ := startWorker(t, rdb, r, "workerA")
	require.NoError(t, a.Track(context.Background(), 1, 2, 3))
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, 1, rep.PeersChecked)
	assert.Zero(t, len(rep.Dead))
	assert.Zero(t, r.callCount())
	got, _ := mr.Members("ALYA_{workerA}_ROWS")
	assert.ElementsMatch(t, []string{"1", "2", "3"}, got)
}

func TestKilledWorkerIsRecoveredOnceItsHeartbeatExpires(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	a, _ := startWorker(t, rdb, r, "workerA", WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	require.NoError(t, a.Track(context.Background(), 100, 101, 102, 103, 104, 105, 106, 107, 108, 109))
	for _, id := range []int64{100, 101, 102, 103, 104} {
		require.NoError(t, a.Untrack(id))
	}
	a.crash()
	b, _ := newWorker(t, rdb, r, "workerB")

	mr.FastForward(1900 * time.Millisecond)
	rep, err := b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Zero(t, len(rep.Dead), "heartbeat still there: not dead yet")
	assert.Zero(t, r.callCount())

	mr.FastForward(100 * time.Millisecond)
	rep, err = b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, len(rep.Dead))
	assert.Equal(t, []int64{105, 106, 107, 108, 109}, r.resetOf("workerA"))
}

func TestWorkerNeverRecoversItself(t *testing.T) {
	mr, rdb := newMini(t)
	r := &fakeResetter{}
	w, _ := startWorker(t, rdb, r, "self", WithRecoveryInterval(time.Hour), WithRowsTTL(2*time.Hour))
	require.NoError(t, w.Track(context.Background(), 1))
	mr.Del("ALYA_{self}_HEARTBEAT") // as if our own key expired in a pause

	rep, err := w.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.Zero(t, rep.PeersChecked)
	assert.Zero(t, r.callCount())
	ok, _ := mr.SIsMember("ALYA_{self}_ROWS", "1")
	assert.True(t, ok)
}

func TestDeadPeerWithoutRowsIsSimplyDeregistered(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "emptyPeer")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.Zero(t, r.callCount(), "nothing to reset")
	require.Len(t, rep.Recovered, 1)
	assert.Zero(t, rep.Recovered[0].RowsFound)
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "emptyPeer")
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

	rep, err := b.RecoverNow(context.Background())

	require.Error(t, err)
	assert.ErrorIs(t, err, pgDown)
	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "p1", pe.InstanceID)
	assert.Contains(t, err.Error(), "recover p1: reset 2 rows of p1: connection refused")
	assert.Equal(t, []int64{3}, r.resetOf("p2"), "the other peer is still recovered")
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, "p2", rep.Recovered[0].InstanceID)
	got, _ := mr.Members("ALYA_{p1}_ROWS")
	assert.ElementsMatch(t, []string{"1", "2"}, got, "rows set kept")
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "p1")
	assert.True(t, ok, "registry entry kept")
	note, _ := mr.Get("ALYA_{p1}_RECOVERY")
	assert.Equal(t, "failed", note, "claim replaced by the note of a failed recovery, which any recoverer takes over at once")

	r.setFail("p1", nil)
	_, err = b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 2}, r.resetOf("p1"))
	assert.False(t, mr.Exists("ALYA_{p1}_ROWS"))
}

func TestNonNumericRowMembersAreSkipped(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "2", "abc", "1", "", "99999999999999999999", "-3", " 4", "0x10")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.Equal(t, []int64{-3, 1, 2}, r.resetOf("p1"))
	require.Len(t, rep.Recovered, 1)
	assert.ElementsMatch(t, []string{"abc", "", "99999999999999999999", " 4", "0x10"}, rep.Recovered[0].InvalidMembers)
	assert.False(t, mr.Exists("ALYA_{p1}_ROWS"))
}

func TestInvalidRegistryMembersAreReportedAndLeftAlone(t *testing.T) {
	mr, rdb := newMini(t)
	long := strings.Repeat("x", 10*1024)
	for _, m := range []string{"", "a{b}c", "with space", long} {
		_, err := mr.SAdd("ALYA_WORKER_REGISTRY", m)
		require.NoError(t, err)
	}
	plantDeadPeer(t, rdb, "ALYA", "good", "1")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"", "a{b}c", "with space", long}, rep.InvalidMembers)
	assert.Equal(t, []int64{1}, r.resetOf("good"))
	n, _ := mr.SMembers("ALYA_WORKER_REGISTRY")
	assert.Len(t, n, 4, "garbage is not ours to delete")
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
	require.NoError(t, mr.Set("ALYA_{dead}_RECOVERY", "someone-else"))
	mr.SetTTL("ALYA_{dead}_RECOVERY", 10*time.Second)
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"dead"}, rep.Skipped)
	assert.Zero(t, r.callCount())

	mr.FastForward(10 * time.Second)
	rep, err = b.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Skipped)
	assert.Equal(t, []int64{1}, r.resetOf("dead"), "taken over once the dead recoverer's claim expired")
}

// comeBackResetter brings the peer's heartbeat back while it resets, as a
// peer resuming from a long pause would.
type comeBackResetter struct {
	fakeResetter
	revive func()
}

func (c *comeBackResetter) ResetRows(ctx context.Context, peer string, ids []int64) (int64, error) {
	c.revive()
	return c.fakeResetter.ResetRows(ctx, peer, ids)
}

// A peer that comes back keeps its rows set as it writes it: the reset
// rows are fenced by owner or recorded in the ledger, and removing members
// could remove rows the peer tracked again after the reset (F8).
func TestPeerThatComesBackDuringRecoveryKeepsItsRegistrationAndNewRows(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "paused", "1", "2")
	r := &comeBackResetter{revive: func() {
		_ = mr.Set("ALYA_{paused}_HEARTBEAT", "alive")
		_, _ = mr.SAdd("ALYA_{paused}_ROWS", "3") // it tracked a new block
	}}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.RecoverNow(context.Background())

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.True(t, rep.Recovered[0].PeerCameBack)
	got, _ := mr.Members("ALYA_{paused}_ROWS")
	assert.ElementsMatch(t, []string{"1", "2", "3"}, got, "the set is left as the peer keeps it")
	ok, _ := mr.SIsMember("ALYA_WORKER_REGISTRY", "paused")
	assert.True(t, ok)
}

func TestRecoveryRunsAtStartAndEveryInterval(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "early", "1")
	r := &fakeResetter{}
	// miniredis expires keys only when told to: no scan lease here.
	_, _ = startWorker(t, rdb, r, "workerB", WithRecoveryInterval(300*time.Millisecond), WithScanLease(false))
	require.Eventually(t, func() bool { return len(r.resetOf("early")) == 1 }, time.Second, 5*time.Millisecond,
		"the first scan runs at Start")

	plantDeadPeer(t, rdb, "ALYA", "late", "2")
	require.Eventually(t, func() bool { return len(r.resetOf("late")) == 1 }, 2*time.Second, 5*time.Millisecond,
		"later deaths are found by the periodic scan")
}

func TestRecoveryLoopLogsAFailingPeerOncePerOutage(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "1")
	r := &fakeResetter{}
	r.setFail("p1", errors.New("db down"))
	_, logs := startWorker(t, rdb, r, "workerB", WithRecoveryInterval(100*time.Millisecond), WithScanLease(false))

	require.Eventually(t, func() bool { return logs.Count("recovery scan done") >= 5 }, 3*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.Count("recovery of dead peer failed"))

	r.setFail("p1", nil)
	require.Eventually(t, func() bool { return logs.Count("recovered rows of dead peer") == 1 }, 3*time.Second, 5*time.Millisecond)
	assert.Contains(t, logs.String(), `"peer_id":"p1"`)
	assert.Contains(t, logs.String(), `"rows_reset":1`)
}

func TestRecoverNowBeforeStartWorksAndAfterShutdownIsRefused(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "operator")

	_, err := w.RecoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{1}, r.resetOf("dead"))

	require.NoError(t, w.Shutdown(context.Background()))
	_, err = w.RecoverNow(context.Background())
	assert.ErrorIs(t, err, ErrShutdown)
}

func TestRecoveryScanFailsCleanlyWhenRedisIsDown(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w")
	mr.SetError("ERR down")
	_, err := w.RecoverNow(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "read registry ALYA_WORKER_REGISTRY")
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
		pipe.SAdd(ctx, "ALYA_{huge}_ROWS", batch...)
	}
	pipe.SAdd(ctx, "ALYA_WORKER_REGISTRY", "huge")
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	counter := &commandCounter{}
	rdb.AddHook(counter)
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "rec")

	rep, err := w.RecoverNow(ctx)

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
	require.NoError(t, rdb.SAdd(ctx, "ALYA_{moved}_ROWS", members...).Err())
	require.NoError(t, rdb.SAdd(ctx, "ALYA_WORKER_REGISTRY", "moved").Err())
	rdb.AddHook(&skipper{})
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "rec")

	_, err := w.RecoverNow(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "members read")
	assert.Zero(t, r.callCount(), "nothing reset from an incomplete read")
	card, err := rdb.SCard(ctx, "ALYA_{moved}_ROWS").Result()
	require.NoError(t, err)
	assert.EqualValues(t, n, card, "the set is kept")

	rep, err := w.RecoverNow(ctx) // the next read is whole
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Len(t, r.resetOf("moved"), n)
}
