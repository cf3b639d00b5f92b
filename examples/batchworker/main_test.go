package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// runMainEnv makes the test binary run main() instead of the tests, so a
// test can start the real program as a process and signal or kill it.
const runMainEnv = "BATCHWORKER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
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

// fixture is a schema with one seeded batch, a Redis and a key prefix of
// the test's own.
type fixture struct {
	pool     *pgxpool.Pool
	rdb      *redis.Client
	dbURL    string
	redisURL string
	schema   string
	prefix   string
}

// dbPassword is put into the database URL of the throwaway server (which
// trusts every loopback connection and ignores it) to prove it is never
// printed.
const dbPassword = "s3cretBW"

func setup(t *testing.T, rows int) fixture {
	t.Helper()
	ctx := context.Background()
	f := fixture{pool: testutil.Postgres(t), redisURL: testutil.RedisURL(t), prefix: testutil.Name("BW")}
	f.schema = f.pool.Config().ConnConfig.RuntimeParams["search_path"]
	f.dbURL = testutil.PostgresURL(t)
	if os.Getenv("DATABASE_URL") == "" {
		u, err := url.Parse(f.dbURL)
		require.NoError(t, err)
		u.User = url.UserPassword(u.User.Username(), dbPassword)
		f.dbURL = u.String()
	}
	opt, err := redis.ParseURL(f.redisURL)
	require.NoError(t, err)
	f.rdb = redis.NewClient(opt)
	t.Cleanup(func() { f.rdb.Close() })
	require.NoError(t, createSchema(ctx, f.pool))
	if rows > 0 {
		_, err := seedBatch(ctx, f.pool, rows)
		require.NoError(t, err)
	}
	return f
}

// config returns fast settings: TTL 1s, heartbeat every 250ms, recovery
// every 500ms, blocks of 10, 2ms of work per row, exit when done.
func (f fixture) config(id string) config {
	return config{
		redisURL: f.redisURL, databaseURL: f.dbURL, schema: f.schema,
		instanceID: id, prefix: f.prefix, block: 10, poll: 50 * time.Millisecond,
		work: 2 * time.Millisecond, rowTimeout: 10 * time.Second,
		heartbeatTTL: time.Second, heartbeatInterval: 250 * time.Millisecond,
		recoveryInterval: 500 * time.Millisecond, shutdownTimeout: 5 * time.Second,
		exitWhenDone: true,
	}
}

// args are the same settings as command-line flags.
func (f fixture) args(id string, work time.Duration, extra ...string) []string {
	return append([]string{"-schema", f.schema, "-instance-id", id, "-prefix", f.prefix,
		"-block", "10", "-poll", "50ms", "-work", work.String(),
		"-heartbeat-ttl", "1s", "-heartbeat-interval", "250ms", "-recovery-interval", "500ms",
		"-shutdown-timeout", "5s"}, extra...)
}

type rowState struct {
	status, owner, result string
}

func (f fixture) rows(t *testing.T) map[int64]rowState {
	t.Helper()
	rows, err := f.pool.Query(context.Background(),
		`SELECT rowid, status, coalesce(owner, ''), coalesce(result, '') FROM batchrows`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[int64]rowState{}
	for rows.Next() {
		var id int64
		var s rowState
		require.NoError(t, rows.Scan(&id, &s.status, &s.owner, &s.result))
		out[id] = s
	}
	require.NoError(t, rows.Err())
	return out
}

func (f fixture) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM batchrows WHERE `+where, args...).Scan(&n))
	return n
}

// assertGone checks that instance id left no heartbeat and no registry
// entry behind.
func (f fixture) assertGone(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	n, err := f.rdb.Exists(ctx, store.InstanceKeys(f.prefix, id).Heartbeat).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "heartbeat of %s deleted", id)
	member, err := f.rdb.SIsMember(ctx, store.RegistryKey(f.prefix), id).Result()
	require.NoError(t, err)
	assert.False(t, member, "%s deregistered", id)
}

// startProcess runs the program as a child process with the fixture's URLs
// in its environment; its stderr is returned as a buffer.
func startProcess(t *testing.T, f fixture, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "REDIS_URL="+f.redisURL, "DATABASE_URL="+f.dbURL)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("batchworker output:\n%s", out.String())
		}
	})
	return cmd, out
}

// killMidBlock starts the program as instance id, with work per row, and
// kills it with SIGKILL in the middle of its first block: 3 rows done,
// the rest in progress. It returns when, and what the process printed.
func killMidBlock(t *testing.T, f fixture, id string, work time.Duration) (time.Time, *syncBuffer) {
	t.Helper()
	cmd, out := startProcess(t, f, f.args(id, work)...)
	require.Eventually(t, func() bool {
		return f.count(t, `status = 'done' AND split_part(owner, '{', 1) = $1`, id) >= 3
	}, 15*time.Second, 10*time.Millisecond)
	killedAt := time.Now()
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	return killedAt, out
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

func TestTwoWorkersProcessEveryRowExactlyOnce(t *testing.T) {
	f := setup(t, 300)
	log, logs := testutil.Logger(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range []string{"bw-1", "bw-2"} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run(ctx, f.config(id), log) }()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	for id, r := range f.rows(t) {
		require.Equal(t, "done", r.status, "row %d", id)
		assert.Equal(t, strings.ToUpper(fmt.Sprintf("row %d", id)), r.result, "row %d", id)
		instance, _, _ := strings.Cut(r.owner, "{") // OwnerValue(): <instance ID>{<life>}
		assert.Contains(t, []string{"bw-1", "bw-2"}, instance, "row %d", id)
	}
	var batch string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT status FROM batches`).Scan(&batch))
	assert.Equal(t, "done", batch, "the batch is marked done once its last row is")
	assert.Equal(t, 0, logs.Count("no longer this worker's"), "no row taken from a live worker")
	f.assertGone(t, "bw-1")
	f.assertGone(t, "bw-2")
	for _, id := range []string{"bw-1", "bw-2"} {
		n, err := f.rdb.SCard(ctx, store.InstanceKeys(f.prefix, id).Rows).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "every row of %s untracked", id)
	}
}

func TestRowsOfWaitingBatchesAreNotFetched(t *testing.T) {
	f := setup(t, 5)
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `UPDATE batches SET status = 'wait'`)
	require.NoError(t, err)
	_, err = seedBatch(ctx, f.pool, 3) // rows 6-8, batch 2
	require.NoError(t, err)
	log, _ := testutil.Logger(t)
	require.NoError(t, run(ctx, f.config("bw-1"), log), "exits: nothing left outside the waiting batch")
	assert.Equal(t, 5, f.count(t, `status = 'queued' AND batchid = 1`))
	assert.Equal(t, 3, f.count(t, `status = 'done' AND batchid = 2`))
}

func TestSIGTERMFinishesTheBlockThenShutsDown(t *testing.T) {
	f := setup(t, 100)
	cmd, out := startProcess(t, f, f.args("bw-term", 100*time.Millisecond)...)
	require.Eventually(t, func() bool { return f.count(t, `status = 'inprog'`) > 0 }, 15*time.Second, 10*time.Millisecond)
	termAt := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit status 0")
	case <-time.After(15 * time.Second):
		t.Fatal("did not exit after SIGTERM")
	}
	t.Logf("exited %v after SIGTERM", time.Since(termAt).Round(time.Millisecond))

	assert.Zero(t, f.count(t, `status = 'inprog'`), "the block was finished, not abandoned")
	doneRows := f.count(t, `status = 'done'`)
	assert.Positive(t, doneRows)
	assert.Zero(t, doneRows%10, "whole blocks of 10 only: %d", doneRows)
	assert.Equal(t, 100-doneRows, f.count(t, `status = 'queued' AND owner IS NULL`), "the rest was never taken")
	f.assertGone(t, "bw-term")
	assert.Contains(t, out.String(), "batchworker stopped")
	assert.NotContains(t, out.String(), dbPassword, "no credentials in the output")
	assert.NotContains(t, out.String(), f.redisURL)
}

func TestRowsOfAKilledWorkerAreFinishedByAPeer(t *testing.T) {
	f := setup(t, 60)
	killedAt, _ := killMidBlock(t, f, "bw-victim", 200*time.Millisecond)
	// A COMMIT the process sent just before it died may still be applied.
	time.Sleep(200 * time.Millisecond)
	stranded := f.count(t, `status = 'inprog' AND split_part(owner, '{', 1) = 'bw-victim'`)
	require.Positive(t, stranded, "killed mid-block")

	log, logs := testutil.Logger(t)
	require.NoError(t, run(context.Background(), f.config("bw-peer"), log))
	t.Logf("peer finished everything %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	for id, r := range f.rows(t) {
		assert.Equal(t, "done", r.status, "row %d", id)
	}
	assert.Equal(t, stranded, f.count(t, `recoveries = 1 AND split_part(owner, '{', 1) = 'bw-peer'`), "the stranded rows were recovered once, then finished by the peer")
	assert.Equal(t, 60-stranded, f.count(t, `recoveries = 0`))
	assert.Contains(t, logs.String(), `"peer_id":"bw-victim"`, "the peer logged the recovery")
	f.assertGone(t, "bw-victim") // deregistered by the peer's recovery
}

func TestACompletionIsDiscardedWhenTheRowIsNoLongerOwned(t *testing.T) {
	f := setup(t, 2)
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'someone-else' WHERE rowid = 1`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'me' WHERE rowid = 2`)
	require.NoError(t, err)
	h := &host{pool: f.pool}

	owned, err := h.complete(ctx, row{id: 1}, "me", "R1", nil)
	require.NoError(t, err)
	assert.False(t, owned)
	owned, err = h.complete(ctx, row{id: 2}, "me", "", errors.New("bad payload"))
	require.NoError(t, err)
	assert.True(t, owned)

	rows := f.rows(t)
	assert.Equal(t, rowState{"inprog", "someone-else", ""}, rows[1], "nothing committed for a row taken by another worker")
	assert.Equal(t, rowState{"failed", "me", "bad payload"}, rows[2], "a failed row records why")
}

func TestLosingTheLeaseGivesTheRestOfTheBlockBack(t *testing.T) {
	f := setup(t, 20)
	srv := testutil.StartRedis(t)
	cfg := f.config("bw-lease")
	cfg.redisURL = "redis://" + srv.Addr
	cfg.block, cfg.work, cfg.shutdownTimeout = 20, 100*time.Millisecond, 500*time.Millisecond
	cfg.exitWhenDone = false
	log, logs := testutil.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, cfg, log) }()

	require.Eventually(t, func() bool { return f.count(t, `status = 'done'`) >= 2 }, 10*time.Second, 10*time.Millisecond)
	srv.Kill() // no more heartbeats: the lease ends 0.9s after the last one
	require.Eventually(t, func() bool { return logs.Count("heartbeat lease lost mid-block") == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return f.count(t, `status = 'inprog'`) == 0 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	err := <-errc
	require.Error(t, err, "Shutdown cannot reach Redis")
	assert.Contains(t, err.Error(), "shut down crash recovery")

	doneRows := f.count(t, `status = 'done'`)
	assert.Less(t, doneRows, 20, "it stopped processing once the lease was lost")
	assert.Equal(t, 20-doneRows, f.count(t, `status = 'queued' AND owner IS NULL`), "the rest is queued again, owner cleared")
}

func TestConfigComesFromFlagsAndEnvironment(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://:envpw@h:1", "DATABASE_URL": "postgres://u:envpw@h/x"}
	getenv := func(k string) string { return env[k] }
	var out bytes.Buffer

	c, err := parseConfig(nil, getenv, &out)
	require.NoError(t, err)
	assert.Equal(t, env["REDIS_URL"], c.redisURL)
	assert.Equal(t, env["DATABASE_URL"], c.databaseURL)
	assert.Equal(t, 50, c.block)
	assert.Equal(t, 180*time.Second, c.rowsTTL(), "the library's default rows TTL")

	c, err = parseConfig([]string{"-redis-url", "redis://flag:1", "-block", "7", "-heartbeat-ttl", "10s",
		"-heartbeat-interval", "3s", "-recovery-interval", "10s"}, getenv, &out)
	require.NoError(t, err)
	assert.Equal(t, "redis://flag:1", c.redisURL, "a flag wins over the environment")
	assert.Equal(t, 7, c.block)
	assert.Equal(t, 30*time.Second, c.rowsTTL())
	c.recoveryInterval = time.Minute
	assert.Greater(t, c.rowsTTL(), c.heartbeatTTL+c.recoveryInterval*11/10+min(c.recoveryInterval*8/10, c.heartbeatTTL),
		"rows TTL always outlives detection + recovery + the scan turn")

	_, err = parseConfig(nil, func(string) string { return "" }, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "set REDIS_URL or -redis-url; set DATABASE_URL or -database-url")
	_, err = parseConfig([]string{"-block", "0", "-poll", "0s"}, getenv, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-block 0 must be at least 1")
	assert.Contains(t, err.Error(), "-poll 0s must be positive")

	out.Reset()
	_, err = parseConfig([]string{"-help"}, getenv, &out)
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, out.String(), "-redis-url")
	assert.NotContains(t, out.String(), "envpw", "-help never shows the environment's URLs")
}

func TestConnectionErrorsNeverShowThePassword(t *testing.T) {
	port := testutil.FreePort(t, false)
	cfg := config{databaseURL: fmt.Sprintf("postgres://app:s3cretX@127.0.0.1:%d/x?sslmode=disable&connect_timeout=2", port)}
	_, err := openPostgres(context.Background(), cfg, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PostgreSQL unreachable")
	assert.NotContains(t, err.Error(), "s3cretX")

	cfg = config{redisURL: "redis://u:s3cretY@h:notaport"}
	_, err = openRedis(cfg)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cretY")
}
