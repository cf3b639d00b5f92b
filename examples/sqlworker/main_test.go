package main

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// runMainEnv makes the test binary run main() instead of the tests, so a
// test can start the real program as a process and signal or kill it.
const runMainEnv = "SQLWORKER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(testutil.MainCheckingLeaks(m))
}

// fixture is a database of the test's own (the program's schema name,
// batch, is fixed), a Redis and a key prefix of its own.
type fixture struct {
	db       *sql.DB
	rdb      *redis.Client
	dbURL    string
	redisURL string
	prefix   string
}

func setup(t *testing.T) fixture {
	t.Helper()
	base := testutil.PostgresURL(t)
	admin, err := sql.Open("postgres", base)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	name := testutil.Name("sqlworker_")
	_, err = admin.Exec("CREATE DATABASE " + name)
	require.NoError(t, err, "a database of the test's own")
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name + " WITH (FORCE)") })
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	f := fixture{dbURL: u.String(), redisURL: testutil.RedisURL(t), prefix: testutil.Name("SW")}
	f.db, err = openDB(f.dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { f.db.Close() })
	opt, err := redis.ParseURL(f.redisURL)
	require.NoError(t, err)
	f.rdb = redis.NewClient(opt)
	t.Cleanup(func() { f.rdb.Close() })
	return f
}

// args are fast settings: TTL 1s, heartbeat every 250ms, recovery every
// 500ms, blocks of 10.
func (f fixture) args(id string, work time.Duration, extra ...string) []string {
	return append([]string{"-instance-id", id, "-prefix", f.prefix, "-block", "10", "-poll", "50ms",
		"-work", work.String(), "-heartbeat-ttl", "1s", "-heartbeat-interval", "250ms",
		"-recovery-interval", "500ms", "-shutdown-timeout", "5s"}, extra...)
}

// start runs the program as a child process with the fixture's URLs in
// its environment.
func (f fixture) start(t *testing.T, args ...string) (*exec.Cmd, *testutil.LogBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "REDIS_URL="+f.redisURL, "DATABASE_URL="+f.dbURL)
	out := &testutil.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sqlworker %v:\n%s", args, out.String())
		}
	})
	return cmd, out
}

// wait waits for the process to exit and returns its exit error.
func wait(t *testing.T, cmd *exec.Cmd, timeout time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		t.Fatalf("did not exit within %v", timeout)
		return nil
	}
}

func (f fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(query, args...).Scan(&n))
	return n
}

// tracked returns the jobs instance id has in its Redis rows set.
func (f fixture) tracked(t *testing.T, id string) []int64 {
	t.Helper()
	members, err := f.rdb.SMembers(context.Background(), store.InstanceKeys(f.prefix, id).Rows).Result()
	require.NoError(t, err)
	var ids []int64
	for _, m := range members {
		n, err := strconv.ParseInt(m, 10, 64)
		require.NoError(t, err)
		ids = append(ids, n)
	}
	return ids
}

// TestAJobOfAWorkerKilledMidBlockIsFinishedOnceByItsPeer: two worker
// processes share 60 jobs; one is killed with SIGKILL in the middle of
// its block. The survivor's recovery returns the jobs the victim left
// running to pending (recording them in the reset ledger), finishes them
// and every other job, and prints the verdict: each job finished once.
func TestAJobOfAWorkerKilledMidBlockIsFinishedOnceByItsPeer(t *testing.T) {
	f := setup(t)
	victim, _ := f.start(t, f.args("sw-victim", 100*time.Millisecond, "-migrate", "-seed", "60")...)
	// Kill it once it finished 3 jobs of its first block of 10.
	var left []int64
	require.Eventually(t, func() bool {
		left = f.tracked(t, "sw-victim")
		return len(left) > 0 && len(left) <= 7
	}, 15*time.Second, 5*time.Millisecond)
	peer, out := f.start(t, f.args("sw-peer", 20*time.Millisecond, "-exit-when-done")...)
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	_ = victim.Wait()
	killedAt := time.Now()

	require.NoError(t, wait(t, peer, 30*time.Second), "the peer exits 0: its verdict passed")
	t.Logf("the peer finished every job %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	assert.Contains(t, out.String(), "verdict: PASS: 60/60 jobs finished (0 error), finished twice: 0 (60 outputs)")
	assert.Contains(t, out.String(), "peer_id=sw-victim", "the peer logged the recovery")

	assert.Equal(t, 60, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'finished'`))
	assert.Equal(t, 60, f.count(t, `SELECT count(DISTINCT job_id) FROM batch.results`))
	assert.Equal(t, 60, f.count(t, `SELECT count(*) FROM batch.results`), "no job finished twice")
	// The victim's running jobs when it died: its rows set at the kill less
	// a completion it may have committed just before.
	reset := f.count(t, `SELECT count(*) FROM batch.recovery_ledger WHERE instance_id = 'sw-victim'`)
	assert.Positive(t, reset, "the recovery was recorded in the reset ledger")
	assert.LessOrEqual(t, reset, len(left))
	assert.Equal(t, reset, f.count(t, `SELECT count(*) FROM batch.jobs WHERE recoveries = 1`), "each reset job was reset once")
	assert.Zero(t, f.count(t, `SELECT count(*) FROM batch.jobs WHERE recoveries > 1`))
}

func TestSIGTERMFinishesTheBlockThenShutsDown(t *testing.T) {
	f := setup(t)
	cmd, out := f.start(t, f.args("sw-term", 100*time.Millisecond, "-migrate", "-seed", "100")...)
	require.Eventually(t, func() bool { return len(f.tracked(t, "sw-term")) > 0 }, 15*time.Second, 5*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, wait(t, cmd, 15*time.Second), "exit status 0")

	assert.Zero(t, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'running'`), "the block was finished, not abandoned")
	finished := f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'finished'`)
	assert.Positive(t, finished)
	assert.Zero(t, finished%10, "whole blocks of 10 only: %d", finished)
	assert.Equal(t, 100-finished, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'pending' AND recoveries = 0`), "the rest was never taken")
	n, err := f.rdb.Exists(context.Background(), store.InstanceKeys(f.prefix, "sw-term").Heartbeat).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "Shutdown deleted the heartbeat")
	assert.Contains(t, out.String(), "sqlworker stopped")
	assert.NotContains(t, out.String(), "verdict", "no verdict when interrupted")
}

// TestLosingTheLeaseGivesTheRestOfTheBlockBack: once the lease is lost
// the block's Close gives the jobs not done back to pending at once,
// through the reset ledger (safe in any state), even with Redis gone.
func TestLosingTheLeaseGivesTheRestOfTheBlockBack(t *testing.T) {
	f := setup(t)
	srv := testutil.StartRedis(t)
	t.Setenv("REDIS_URL", "redis://"+srv.Addr)
	t.Setenv("DATABASE_URL", f.dbURL)
	log, logs := testutil.Logger(t)
	cfg := config{block: 20, work: 100 * time.Millisecond, poll: 50 * time.Millisecond, shutdown: 500 * time.Millisecond,
		ttl: time.Second, heartbeat: 250 * time.Millisecond, recoveryInterval: 500 * time.Millisecond,
		instanceID: "sw-lease", prefix: f.prefix, migrate: true, seed: 20}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, cfg, log) }()

	require.Eventually(t, func() bool {
		return f.db.QueryRow(`SELECT 1 FROM batch.results LIMIT 1`).Scan(new(int)) == nil
	}, 15*time.Second, 5*time.Millisecond)
	srv.Kill() // no more heartbeats: the lease ends 0.9s after the last one
	require.Eventually(t, func() bool { return logs.Count("released rows") == 1 }, 15*time.Second, 10*time.Millisecond,
		"the block's Close gave the rest back")
	assert.Equal(t, 1, logs.Count("heartbeat lease lost mid-block; giving the rest of the block back"))
	finished := f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'finished'`)
	assert.Less(t, finished, 20, "it stopped processing once the lease was lost")
	assert.Equal(t, 20-finished, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'pending'`), "the rest is pending again")
	assert.Zero(t, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'running'`))

	cancel()
	select {
	case err := <-errc:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "shut down crash recovery", "Shutdown cannot reach Redis")
	case <-time.After(15 * time.Second):
		t.Fatal("the worker did not stop")
	}
}

// TestConnectionsEndIdleTransactions: the program's connections carry an
// idle_in_transaction_session_timeout, unless DATABASE_URL sets its own.
func TestConnectionsEndIdleTransactions(t *testing.T) {
	f := setup(t)
	var v string
	require.NoError(t, f.db.QueryRow(`SHOW idle_in_transaction_session_timeout`).Scan(&v))
	assert.Equal(t, idleInTransaction, v)

	u, err := url.Parse(f.dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("idle_in_transaction_session_timeout", "7s")
	u.RawQuery = q.Encode()
	db, err := openDB(u.String())
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.QueryRow(`SHOW idle_in_transaction_session_timeout`).Scan(&v))
	assert.Equal(t, "7s", v, "the URL's own value wins")

	_, err = openDB("postgres://u:s3cretZ@h:notaport/x")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cretZ")
}

// TestSIGTERMBetweenTrackAndCommitStillFinishesTheBlock: a SIGTERM that
// arrives while Track waits for Redis, after the block's UPDATE and before
// its COMMIT, must not give the block back: the fetch's transaction runs
// under a context SIGTERM does not cancel (database/sql rolls a
// transaction back when its context ends). Redis holds Track's reply back
// for 400 ms, and the host is told to stop as soon as Redis has the rows.
func TestSIGTERMBetweenTrackAndCommitStillFinishesTheBlock(t *testing.T) {
	f := setup(t)
	srv := testutil.StartRedis(t)
	proxy, err := netfault.NewProxy(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	t.Setenv("REDIS_URL", "redis://"+proxy.Addr)
	t.Setenv("DATABASE_URL", f.dbURL)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	log, logs := testutil.Logger(t)
	const id = "sw-window"
	cfg := config{block: 10, work: 10 * time.Millisecond, poll: 50 * time.Millisecond, shutdown: 5 * time.Second,
		ttl: 5 * time.Second, heartbeat: time.Second, recoveryInterval: time.Second,
		instanceID: id, prefix: f.prefix, migrate: true, seed: 30}
	rowsKey := store.InstanceKeys(f.prefix, id).Rows
	held := proxy.DelayReplyTo([]byte(rowsKey), 400*time.Millisecond)
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, cfg, log) }()

	require.Eventually(t, func() bool { return rdb.SCard(context.Background(), rowsKey).Val() > 0 },
		15*time.Second, time.Millisecond, "Track reached Redis")
	sigterm() // while Track's reply is held: before the COMMIT
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the reply to Track was never held")
	}
	select {
	case err = <-errc:
	case <-time.After(15 * time.Second):
		t.Fatal("the worker did not stop after SIGTERM")
	}
	require.NoError(t, err)
	assert.Zero(t, logs.Count("released rows"), "no block was given back: %s", logs.String())
	assert.Zero(t, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'running'`), "the block was finished, not abandoned")
	assert.Equal(t, 10, f.count(t, `SELECT count(*) FROM batch.jobs WHERE state = 'finished'`), "the one block fetched is finished")
}
