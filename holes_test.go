package recovery

// Regressions of the interleavings an adversarial review found (issue 10,
// F1, F2, F4, F8) and of recovery dropping rows it could not reset (issue
// 11): each against a real redis-server and PostgreSQL, the fault injected
// at the exact step named. Each fails on the code before the fix.

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/testutil"

	"github.com/alya/recovery/internal/store"
)

// onRealServers returns a real Redis, a fresh PostgreSQL schema holding a
// batch of rows 1..n (testutil.BatchSchema, reset ledger included), and a
// fresh key prefix starting with prefix.
func onRealServers(t *testing.T, n int, prefix string) (*redis.Client, *pgxpool.Pool, string) {
	t.Helper()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, n)
	return rdb, db, testutil.Name(prefix)
}

// pgProxy returns a netfault proxy in front of the PostgreSQL behind db,
// closed when the test ends; testutil.PoolVia connects through it.
func pgProxy(t *testing.T, db *pgxpool.Pool) *netfault.Proxy {
	t.Helper()
	proxy, err := netfault.NewProxy(pgAddr(db))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	return proxy
}

// pgAddr returns host:port of the server behind pool.
func pgAddr(pool *pgxpool.Pool) string {
	c := pool.Config().ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

// rowsOf returns the members of instance id's rows set.
func rowsOf(t *testing.T, rdb redis.UniversalClient, prefix, id string) []string {
	t.Helper()
	m, err := rdb.SMembers(context.Background(), prefix+"_{"+id+"}_ROWS").Result()
	require.NoError(t, err)
	return m
}

func registered(t *testing.T, rdb redis.UniversalClient, prefix, id string) bool {
	t.Helper()
	ok, err := rdb.SIsMember(context.Background(), prefix+"_WORKER_REGISTRY", id).Result()
	require.NoError(t, err)
	return ok
}

// recoveries returns rowid -> recovery count.
func recoveries(t *testing.T, db *pgxpool.Pool) map[int64]int {
	t.Helper()
	return byRow[int](t, db, `SELECT rowid, recoveries FROM batchrows`)
}

// victim starts a worker that takes rows ids (in progress in the table and
// tracked) and is then killed, as SIGKILL would; its heartbeat is deleted,
// as if its TTL had run out.
func victim(t *testing.T, rdb redis.UniversalClient, db *pgxpool.Pool, r RowResetter, id string, opts []Option, ids ...int64) *Worker {
	t.Helper()
	v, _ := startWorker(t, rdb, r, id, opts...)
	setStatus(t, db, "inprog", ids...)
	require.NoError(t, v.Track(context.Background(), ids...))
	v.crash()
	require.NoError(t, rdb.Del(context.Background(), v.ownKeys().Heartbeat).Err())
	return v
}

// F1: a dead peer's rows set used to expire rows TTL after its last
// heartbeat, whatever happened to its recovery; a PostgreSQL outage longer
// than that lost its rows for good.
func TestSafetyRowsOfADeadPeerSurviveAPostgresOutageOfSeveralRowsTTLs(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "F1")
	proxy := pgProxy(t, db)
	const rowsTTL = 1600 * time.Millisecond
	timing := []Option{WithKeyPrefix(prefix), WithHeartbeatTTL(time.Second), WithHeartbeatInterval(300 * time.Millisecond),
		WithRecoveryInterval(300 * time.Millisecond), WithRowsTTL(rowsTTL), WithResetTimeout(300 * time.Millisecond)}
	direct, err := NewPgxResetter(db)
	require.NoError(t, err)
	victim(t, rdb, db, direct, "victim", timing, 1, 2, 3, 4, 5)

	proxy.Cut() // PostgreSQL unreachable for the recoverer
	viaProxy, err := NewPgxResetter(testutil.PoolVia(t, db, proxy.Addr))
	require.NoError(t, err)
	// Started during the outage: without the schema check, which needs
	// PostgreSQL.
	r, _ := startWorker(t, rdb, viaProxy, "recoverer", append(timing, WithoutSchemaCheck())...)
	time.Sleep(4 * rowsTTL)

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
	n, err := rdb.Exists(ctx, prefix+"_{victim}_ROWS", prefix+"_{victim}_INCARNATION").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// lostReply runs one RecoverNow of dead peer "dead" (rows 1 and 2) by a
// worker whose connection to Redis loses the reply to the given script
// once, after the server ran it; go-redis retries it.
func lostReply(t *testing.T, script *redis.Script) (RecoveryReport, error, *fakeResetter, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	direct := srv.Client(t)
	proxy, err := netfault.NewProxy(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	plantDeadPeer(t, direct, "ALYA", "dead", "1", "2")
	require.NoError(t, script.Load(ctx, direct).Err(), "loaded, so the worker sends EVALSHA with the script's hash")
	r := &fakeResetter{}
	w, _ := newWorker(t, rdb, r, "recoverer")

	dropped := proxy.DropReplyTo([]byte(script.Hash()))
	rep, err := w.RecoverNow(ctx)
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

// F4: a retried finish used to find the claim gone and report it lost.
func TestSafetyAFinishWhoseReplyWasLostReportsItsFirstResult(t *testing.T) {
	rep, err, r, direct := lostReply(t, store.Script("finish"))

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, []int64{1, 2}, r.resetOf("dead"))
	assert.Equal(t, 1, r.callCount(), "reset once")
	assert.False(t, registered(t, direct, "ALYA", "dead"), "deregistered in the same scan")
}

// hookResetter runs after once its inner resetter has committed a reset.
type hookResetter struct {
	*PgxResetter
	after func()
}

func (h *hookResetter) ResetIncarnation(ctx context.Context, req ResetRequest) (ResetResult, error) {
	res, err := h.PgxResetter.ResetIncarnation(ctx, req)
	if err == nil && h.after != nil {
		h.after()
		h.after = nil
	}
	return res, err
}

// F2, crash: the recoverer's reset commits and the recoverer dies before
// Redis hears of it. The rows are taken again by a live worker; without
// owner fencing the next recoverer used to reset them under it.
func TestSafetyAResetCommittedByARecovererKilledBeforeFinishIsNotAppliedAgain(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "F2")
	pg, err := NewPgxResetter(db, WithRecoveryCountColumn("recoveries"))
	require.NoError(t, err)
	require.True(t, pg.UsesLedger())
	timing := []Option{WithKeyPrefix(prefix), WithResetTimeout(time.Second)}
	victim(t, rdb, db, pg, "victim", timing, 1, 2, 3, 4, 5)

	// R1's Redis client dies right after the COMMIT: no finish, no
	// release; its claim stays until it expires, as after SIGKILL.
	r1client := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, ContextTimeoutEnabled: true})
	killer := &hookResetter{PgxResetter: pg, after: func() { r1client.Close() }}
	r1, _ := newWorker(t, r1client, killer, "r1", timing...)
	_, err = r1.RecoverNow(ctx)
	require.Error(t, err, "R1 cannot finish")
	got := statuses(t, db)
	for id := int64(1); id <= 5; id++ {
		require.Equal(t, "queued", got[id], "R1's reset committed")
	}

	setStatus(t, db, "inprog", 1, 2, 3, 4, 5) // a live worker takes them again

	r2, _ := newWorker(t, rdb, pg, "r2", timing...)
	require.Eventually(t, func() bool {
		rep, err := r2.RecoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 10*time.Second, 100*time.Millisecond, "R2 recovers the victim once R1's claim expired")
	got = statuses(t, db)
	counts := recoveries(t, db)
	for id := int64(1); id <= 5; id++ {
		assert.Equal(t, "inprog", got[id], "row %d stays with the live worker that took it", id)
		assert.Equal(t, 1, counts[id], "row %d counted as recovered once", id)
	}
	assert.False(t, registered(t, rdb, prefix, "victim"))
	assert.Empty(t, rowsOf(t, rdb, prefix, "victim"))
}

// F2, lost acknowledgement: the connection drops after the COMMIT reached
// PostgreSQL and before its reply came back; the recoverer sees an error
// and cannot know the reset committed.
func TestSafetyAResetWhoseCommitReplyWasLostIsNotAppliedAgain(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "F2")
	proxy := pgProxy(t, db)
	direct, err := NewPgxResetter(db, WithRecoveryCountColumn("recoveries"))
	require.NoError(t, err)
	timing := []Option{WithKeyPrefix(prefix), WithResetTimeout(time.Second)}
	victim(t, rdb, db, direct, "victim", timing, 1, 2, 3)

	viaProxy, err := NewPgxResetter(testutil.PoolVia(t, db, proxy.Addr), WithRecoveryCountColumn("recoveries"))
	require.NoError(t, err)
	r, _ := newWorker(t, rdb, viaProxy, "recoverer", timing...)
	dropped := proxy.DropReplyTo([]byte("commit"))
	_, err = r.RecoverNow(ctx)
	select {
	case <-dropped:
	case <-time.After(5 * time.Second):
		t.Fatalf("the COMMIT's reply was never dropped; recovery said %v", err)
	}
	require.Error(t, err, "the recoverer does not know whether its reset committed")
	for id := int64(1); id <= 3; id++ {
		require.Equal(t, "queued", statuses(t, db)[id], "it did")
	}
	assert.True(t, registered(t, rdb, prefix, "victim"), "kept for the next scan")

	setStatus(t, db, "inprog", 1, 2, 3) // a live worker takes them again
	rep, err := r.RecoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Zero(t, rep.RowsReset, "nothing reset twice")
	counts := recoveries(t, db)
	for id := int64(1); id <= 3; id++ {
		assert.Equal(t, "inprog", statuses(t, db)[id], "row %d stays with the live worker", id)
		assert.Equal(t, 1, counts[id])
	}
	assert.False(t, registered(t, rdb, prefix, "victim"))
}

// Without owner fencing, Release records its reset in the ledger under the
// worker's incarnation. A row released and then taken again by the same
// worker must still be recovered when that worker dies: the incarnation
// changes before it is tracked again.
func TestSafetyARowReleasedAndTakenAgainIsRecoveredWhenItsWorkerDies(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RL")
	pg, err := NewPgxResetter(db)
	require.NoError(t, err)
	w, _ := startWorker(t, rdb, pg, "w", WithKeyPrefix(prefix))
	setStatus(t, db, "inprog", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	before, err := rdb.Get(ctx, prefix+"_{w}_INCARNATION").Result()
	require.NoError(t, err)

	require.NoError(t, w.Release(ctx, 1, 2))
	require.Equal(t, "queued", statuses(t, db)[1])
	setStatus(t, db, "inprog", 1) // w fetches row 1 again
	require.NoError(t, w.Track(ctx, 1))
	after, err := rdb.Get(ctx, prefix+"_{w}_INCARNATION").Result()
	require.NoError(t, err)
	assert.NotEqual(t, before, after, "a new incarnation before the row is tracked again")
	assert.Equal(t, []string{"1"}, rowsOf(t, rdb, prefix, "w"))
	w.crash()
	require.NoError(t, rdb.Del(ctx, w.ownKeys().Heartbeat).Err())

	r, _ := newWorker(t, rdb, pg, "r", WithKeyPrefix(prefix))
	require.Eventually(t, func() bool {
		_, err := r.RecoverNow(ctx)
		return err == nil && statuses(t, db)[1] == "queued"
	}, 10*time.Second, 100*time.Millisecond, "row 1 is not stuck")
	assert.Equal(t, "queued", statuses(t, db)[2])
}

// Issue 11: a status misconfigured on the recoverer used to end with the
// rows set deleted and the peer deregistered "with 0 rows reset": the rows
// stayed in progress forever.
func TestSafetyRecoveryKeepsTheRowsItCouldNotResetAndRecoversThemOnceFixed(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "NR")
	right, err := NewPgxResetter(db)
	require.NoError(t, err)
	v, _ := startWorker(t, rdb, right, "victim", WithKeyPrefix(prefix))
	setStatus(t, db, "inprog", 1, 2, 3, 4)
	require.NoError(t, v.Track(ctx, 1, 2, 3, 4))
	setStatus(t, db, "done", 4) // finished; the process died before Untrack
	v.crash()
	require.NoError(t, rdb.Del(ctx, v.ownKeys().Heartbeat).Err())

	misspelled, err := NewPgxResetter(db, WithStatuses("in_progress", "queued"))
	require.NoError(t, err)
	rec := &recorder{}
	r, logs := newWorker(t, rdb, misspelled, "r", WithKeyPrefix(prefix), WithObserver(rec))
	rep, err := r.RecoverNow(ctx)

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
	rep, err = fixed.RecoverNow(ctx)
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

	rep, err := w.RecoverNow(context.Background())
	require.ErrorIs(t, err, pgDown)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, "idle", rep.Recovered[0].InstanceID)
	assert.True(t, rep.Recovered[0].NoRecord, "an idle dead peer is deregistered")
	mr.Del("ALYA_{dead}_ROWS") // Redis loses it (or it expired) before the next try

	rep, err = w.RecoverNow(context.Background())
	require.ErrorIs(t, err, ErrRowsSetLost)
	assert.False(t, registered(t, rdb, "ALYA", "dead"), "nothing left to retry: deregistered")
	assert.Zero(t, w.Stats().PeersRecovered, "neither the lost peer nor the idle one counts as recovered")
	require.Len(t, rep.Failed, 1)
	assert.True(t, rep.Failed[0].NoRecord)
	assert.Empty(t, rep.Recovered)

	// The dead-peer path logs it at Error.
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"rows set of dead peer vanished`))
}
