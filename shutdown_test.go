package recovery

import (
	"context"
	"crypto/sha1"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

func TestShutdownRemovesHeartbeatAndRegistry(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Track(context.Background(), 1, 2))
	require.NoError(t, w.Untrack(1, 2)) // the block is finished

	require.NoError(t, w.Shutdown(context.Background()))

	assert.False(t, mr.Exists(keysOf("w1").Heartbeat))
	ok, _ := mr.SIsMember(registryKey, "w1")
	assert.False(t, ok, "peers see at once that it left")
	assert.NoError(t, rdb.Ping(context.Background()).Err(), "the caller's client is not closed")
	assert.ErrorIs(t, w.CheckLease(), ErrShutdown)
}

func TestShutdownStopsEveryGoroutine(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithTimings(Timings{RecoveryInterval: 50 * time.Millisecond}))
	waitTurns(t, &signals(w).scan, 5*time.Second, func() bool { return w.Stats().Scans >= 3 },
		"the loops are running: the recovery loop has scanned a few times")
	require.Equal(t, 3, workerGoroutines(), "two loops and their waiter")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.Zero(t, workerGoroutines(), "no goroutine outlives Shutdown")
}

func TestShutdownIsIdempotentAndSafeConcurrently(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.Shutdown(context.Background())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	assert.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists(keysOf("w1").Heartbeat))
	assert.ErrorIs(t, w.Start(context.Background()), ErrShutdown)
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown)
}

func TestShutdownWithoutStart(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.ErrorIs(t, w.Start(context.Background()), ErrShutdown)
	assert.Empty(t, mr.Keys(), "a worker that never started writes nothing")
}

func TestShutdownReturnsContextErrorWhenItEndsFirstAndCanBeRetried(t *testing.T) {
	mr, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1")
	r := &fakeResetter{hold: newGate()} // stuck in a reset, deaf to its context
	w, _ := startWorker(t, rdb, r, "w1")
	<-r.hold.entered // the recovery loop is stuck in a reset

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := w.Shutdown(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, mr.Exists(keysOf("w1").Heartbeat), "not cleaned up while a loop still runs")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrShutdown, "shut down for callers all the same")

	close(r.hold.release)
	require.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists(keysOf("w1").Heartbeat), "a later call finishes the clean-up")
}

func TestShutdownCleanupFailureIsReportedAndRetried(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	mr.SetError("ERR down")
	err := w.Shutdown(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "shut down w1: remove heartbeat and registry entry")
	mr.SetError("")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.False(t, mr.Exists(keysOf("w1").Heartbeat))
}

func TestShutdownWithRowsStillTrackedLeavesThemForPeers(t *testing.T) {
	mr, rdb := newMini(t)
	a, logs := startWorker(t, rdb, &fakeResetter{}, "A")
	require.NoError(t, a.Track(context.Background(), 101, 102))
	require.NoError(t, a.Shutdown(context.Background())) // the deadline came before the block was done

	assert.False(t, mr.Exists(keysOf("A").Heartbeat), "the heartbeat goes at once")
	ok, _ := mr.SIsMember(registryKey, "A")
	assert.True(t, ok, "still registered, so peers look for its rows")
	assert.Equal(t, 1, logs.Count("shut down with rows still tracked"))

	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "B")
	_, err := b.recoverNow(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int64{101, 102}, r.resetOf("A"), "recovered by the next scan, no TTL to wait for")
}

// pipelineGate is a go-redis hook that stops the first pipeline whose
// first command is the Leave script on key (Shutdown's clean-up) until
// open is closed,
// and closes reached when it gets there.
type pipelineGate struct {
	key     string
	once    sync.Once
	reached chan struct{}
	open    chan struct{}
}

// isLeaveOf reports whether c is the EVAL of the leave script on key.
func isLeaveOf(c redis.Cmder, key string) bool {
	a := c.Args()
	if c.Name() != "eval" || len(a) < 4 || a[3] != key {
		return false
	}
	src, _ := a[1].(string)
	return fmt.Sprintf("%x", sha1.Sum([]byte(src))) == store.Script("leave").Hash()
}

func newPipelineGate(key string) *pipelineGate {
	return &pipelineGate{key: key, reached: make(chan struct{}), open: make(chan struct{})}
}

func (g *pipelineGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *pipelineGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *pipelineGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && isLeaveOf(cmds[0], g.key) {
			hit := false
			g.once.Do(func() { hit = true })
			if hit {
				close(g.reached)
				<-g.open
			}
		}
		return next(ctx, cmds)
	}
}

// TestShutdownNeverWritesBackARowAConcurrentUntrackRemoved reproduces a
// finding of issue 10: Shutdown took its snapshot of the tracked rows
// without the lock Untrack holds, so an Untrack that removed row 7 (in
// memory, then SREM) while Shutdown's clean-up was on its way was undone by
// Shutdown's SADD: the finished row stayed in the rows set, to be reset by
// the peer that recovers the registry entry Shutdown kept for it. The hook
// holds Shutdown's clean-up right after its snapshot while the Untrack runs.
func TestShutdownNeverWritesBackARowAConcurrentUntrackRemoved(t *testing.T) {
	mr, rdb := newMini(t)
	gate := newPipelineGate(keysOf("w1").Heartbeat)
	rdb.AddHook(gate)
	// An operation timeout longer than the gate's hold below.
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithTimings(Timings{OperationTimeout: 500 * time.Millisecond}))
	require.NoError(t, w.Track(context.Background(), 7))

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- w.Shutdown(context.Background()) }()
	<-gate.reached // Shutdown has its snapshot, {7}, and its SADD is on its way

	untrackDone := make(chan error, 1)
	go func() { untrackDone <- w.Untrack(7) }() // the host finished row 7
	untrackedDuringCleanup := false
	select {
	case err := <-untrackDone: // without the lock: Untrack's SREM lands first
		require.NoError(t, err)
		untrackedDuringCleanup = true
	case <-time.After(150 * time.Millisecond): // with it: Untrack waits for the clean-up
	}
	close(gate.open)
	require.NoError(t, <-shutdownDone)
	if !untrackedDuringCleanup {
		require.NoError(t, <-untrackDone)
	}

	assert.False(t, untrackedDuringCleanup, "Untrack must wait until Shutdown's clean-up has been answered")
	ok, err := mr.SIsMember(keysOf("w1").Rows, "7")
	if err != nil { // miniredis: the set is gone once empty
		ok = false
	}
	assert.False(t, ok, "a row untracked during Shutdown is not in the rows set afterwards")
	assert.Zero(t, w.Stats().TrackedRows)
}

func TestShutdownCleanupIsBoundedByTheOperationTimeout(t *testing.T) {
	mr, rdb := newMini(t)
	fr := &freezer{}
	rdb.AddHook(fr)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithTimings(Timings{OperationTimeout: 100 * time.Millisecond}))
	fr.freeze() // Redis hangs: the clean-up's reply never comes

	start := time.Now()
	err := w.Shutdown(context.Background()) // no deadline of its own
	took := time.Since(start)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the operation timeout ended it")
	assert.Contains(t, err.Error(), "shut down w1")
	assert.Less(t, took, time.Second, "bounded by the 100ms operation timeout, not the caller's context")

	fr.thaw()
	require.NoError(t, w.Shutdown(context.Background()), "a later call finishes the clean-up")
	assert.False(t, mr.Exists(keysOf("w1").Heartbeat))
}

func TestSafetyHungPostgresCannotBlockShutdown(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	ctx := context.Background()
	take(t, db, "dead", 1)
	_, err := db.Exec(ctx, `
		CREATE FUNCTION hang() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;
		CREATE TRIGGER hang BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION hang();`)
	require.NoError(t, err)
	prefix := testutil.Name("S")
	plantDeadPeer(t, rdb, prefix, "dead", "1")
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix), WithTimings(Timings{ResetTimeout: time.Minute}))
	require.Eventually(t, func() bool {
		var n int
		_ = db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'WITH locked%'`).Scan(&n)
		return n > 0
	}, 5*time.Second, 10*time.Millisecond, "the reset is stuck in PostgreSQL")

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(sctx))
	assert.Less(t, time.Since(start), 3*time.Second, "Shutdown cancels the stuck reset")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "the cancelled reset changed nothing")
}
