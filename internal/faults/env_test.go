//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// The timings of every scenario, given to the workers as flags.
const (
	ttl              = 2 * time.Second
	interval         = 500 * time.Millisecond
	recoveryInterval = time.Second
	rowsTTL          = 6 * time.Second
	resetTimeout     = 2 * time.Second
	work             = 50 * time.Millisecond // per row
	block            = 10                    // rows per block

	// slack is what the detection bound allows beyond the heartbeat TTL and
	// the longest jittered recovery interval: the recovery scan itself
	// (a few Redis round trips and one UPDATE), process scheduling on a
	// loaded 2-core machine with race-instrumented workers, and the
	// suite's 10 ms polling.
	slack = time.Second
)

// detectionBound is the longest a dead worker's rows may stay in progress
// after it died: its heartbeat key expires within the TTL, and a scan
// follows within one recovery interval (+10% jitter).
const detectionBound = ttl + recoveryInterval*11/10 + slack

// scanBound is the longest from a peer being findable dead (its heartbeat
// gone, or the server that stopped the recovery back) to its rows reset.
const scanBound = recoveryInterval*11/10 + slack

// envConfig says what a scenario needs.
type envConfig struct {
	rows    int
	pg      *servers.Postgres // nil: the shared one
	cluster bool              // a 3-master Redis Cluster instead of one redis-server
	// clusterReplicas gives each Cluster master that many replicas, and
	// the Cluster a node timeout of clusterNodeTimeout (deploy_test.go).
	clusterReplicas int
	sentinel        bool          // a master, a replica and 3 sentinels (deploy_test.go)
	redisArgs       []string      // more redis-server options of the single server (persistence)
	table           string        // the rows table; "" is batchrows
	work            time.Duration // per row; 0 is work
	// ownerMode runs the workers in owner mode (an owner-fencing worker's
	// default); otherwise they get -rows-sets, the mode the scenarios
	// written before owner mode inspect (their rows sets).
	ownerMode bool
}

// env is one scenario's world: a schema with a seeded batch and a ledger,
// a Redis (with a password, unless a Cluster), a key prefix, and the worker
// processes. Everything is stopped when the test ends.
type env struct {
	t      *testing.T
	cfg    envConfig
	pool   *pgxpool.Pool
	schema string
	table  string // quoted identifier
	dbURL  string // with a password the throwaway server ignores: it must never be printed

	redisSrv *testutil.RedisServer // nil on Cluster
	redisURL string                // with the password of user app; "" on Cluster
	cluster  []string
	clusterT *testutil.Cluster  // nil unless a Cluster
	sent     *testutil.Sentinel // nil unless Sentinel
	rdb      redis.UniversalClient
	prefix   string

	secrets []string
	procs   []*proc
	// netns, while set, is the network namespace spawn starts workers in
	// (deploy_test.go).
	netns *netfault.Namespace
	res   *result
}

func newEnv(t *testing.T, scenario string, cfg envConfig) *env {
	t.Helper()
	if cfg.work == 0 {
		cfg.work = work
	}
	if cfg.table == "" {
		cfg.table = "batchrows"
	}
	e := &env{t: t, cfg: cfg, table: pgx.Identifier{cfg.table}.Sanitize(), prefix: testutil.Name("F")}
	e.res = &result{Scenario: scenario, Rows: cfg.rows, began: time.Now()}
	t.Cleanup(func() { e.res.record(t) })

	pg := cfg.pg
	if pg == nil {
		if sharedPG == nil {
			testutil.Unavailable(t, "cannot start PostgreSQL: %v", pgErr)
		}
		pg = sharedPG
	}
	pgPassword := testutil.Name("pgpw")
	u, err := url.Parse(pg.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), pgPassword)
	e.dbURL = u.String()
	e.secrets = append(e.secrets, pgPassword)
	e.setupDatabase(pg.URL)

	switch {
	case cfg.cluster:
		c := testutil.StartClusterWithReplicas(t, 3, cfg.clusterReplicas, clusterNodeTimeout(cfg))
		e.cluster, e.clusterT = c.Addrs, c
		e.rdb = c.FollowingClient(t) // the suite's own reads follow the failovers it causes
	case cfg.sentinel:
		e.sent = testutil.StartSentinel(t, 1, 3, sentinelDownAfter)
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: e.sent.MasterName, SentinelAddrs: e.sent.SentinelAddrs})
		t.Cleanup(func() { c.Close() })
		e.rdb = c
	default:
		pw := testutil.Name("rpw")
		// User app has a password; the default user keeps none, so the
		// test helpers' own readiness check works.
		args := append([]string{"--user", "app", "on", ">" + pw, "~*", "&*", "+@all"}, cfg.redisArgs...)
		e.redisSrv = testutil.StartRedis(t, args...)
		e.redisURL = fmt.Sprintf("redis://app:%s@%s", pw, e.redisSrv.Addr)
		e.secrets = append(e.secrets, pw)
		opt, err := redis.ParseURL(e.redisURL)
		require.NoError(t, err)
		c := redis.NewClient(opt)
		t.Cleanup(func() { c.Close() })
		e.rdb = c
	}
	return e
}

// schemaSQL is the host schema of the design, with the owner and
// recoveries columns of docs/safety.md, and the ledger: one row per
// processing of a row, written in the transaction that marks it done
// (outcome done), or after the guard refused it (outcome discarded).
const schemaSQL = `
CREATE TABLE batches (
	batchid bigint PRIMARY KEY,
	status  text NOT NULL DEFAULT 'inprog'
);
CREATE TABLE %[1]s (
	rowid      bigint PRIMARY KEY,
	batchid    bigint NOT NULL REFERENCES batches,
	status     text NOT NULL DEFAULT 'queued',
	owner      text,
	recoveries int NOT NULL DEFAULT 0
);
CREATE INDEX ON %[1]s (status);
CREATE TABLE ledger (
	id       bigserial PRIMARY KEY,
	rowid    bigint NOT NULL,
	instance text NOT NULL,
	outcome  text NOT NULL,
	at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO batches (batchid) VALUES (1);
`

func (e *env) setupDatabase(adminURL string) {
	t := e.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.schema = testutil.Name("f_")
	admin, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+e.schema)
	admin.Close(ctx)
	require.NoError(t, err)

	pc, err := pgxpool.ParseConfig(adminURL)
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["search_path"] = e.schema
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	pc.MaxConns = 4
	e.pool, err = pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(func() {
		e.pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, adminURL); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+e.schema+" CASCADE")
			c.Close(ctx)
		}
	})
	_, err = e.pool.Exec(ctx, fmt.Sprintf(schemaSQL, e.table))
	require.NoError(t, err)
	// The reset ledger, which workers without an owner column need.
	r, err := pgxreset.New(e.pool)
	require.NoError(t, err)
	require.NoError(t, r.CreateLedger(ctx))
	_, err = e.pool.Exec(ctx, `INSERT INTO `+e.table+` (rowid, batchid) SELECT g, 1 FROM generate_series(1, $1::bigint) g`, e.cfg.rows)
	require.NoError(t, err)
}

// keysOf returns the Redis keys of instance id.
func (e *env) keysOf(id string) store.Keys { return store.InstanceKeys(e.prefix, id) }

func (e *env) registry() string { return store.RegistryKey(e.prefix) }

// proc is one worker process.
type proc struct {
	id    string
	cmd   *exec.Cmd
	out   *testutil.LogBuffer
	done  chan struct{}
	state *os.ProcessState // set when done is closed
}

// workerArgs are the flags every worker gets, then extra.
func (e *env) workerArgs(id string, extra ...string) []string {
	args := []string{
		"-instance-id", id, "-prefix", e.prefix, "-schema", e.schema, "-table", e.cfg.table,
		"-block", fmt.Sprint(block), "-work", e.cfg.work.String(),
		"-heartbeat-ttl", ttl.String(), "-heartbeat-interval", interval.String(),
		"-recovery-interval", recoveryInterval.String(), "-rows-ttl", rowsTTL.String(),
		// A claim TTL of 2s + 3 × 250ms: how long a worker whose lost lease
		// came back takes no rows (heartbeat.go), as short as the timings.
		"-reset-timeout", resetTimeout.String(),
	}
	if !e.cfg.ownerMode {
		args = append(args, "-rows-sets")
	}
	return append(args, extra...)
}

// workerEnv is the environment of a worker: the connection strings and
// nothing else of the test's own environment but what Go needs.
func (e *env) workerEnv(overrides map[string]string) []string {
	// The race runtime sleeps 1 s at exit by default: that would count
	// in the time a SIGTERMed worker takes to exit.
	vars := map[string]string{"DATABASE_URL": e.dbURL, "GORACE": "atexit_sleep_ms=50"}
	switch {
	case e.cfg.cluster:
		vars["REDIS_CLUSTER_ADDRS"] = strings.Join(e.cluster, ",")
	case e.cfg.sentinel:
		vars["REDIS_SENTINEL_ADDRS"] = strings.Join(e.sent.SentinelAddrs, ",")
		vars["REDIS_SENTINEL_MASTER"] = e.sent.MasterName
	default:
		vars["REDIS_URL"] = e.redisURL
	}
	for k, v := range overrides {
		vars[k] = v
	}
	out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// spawn starts a worker process without waiting for it to come up.
func (e *env) spawn(id string, overrides map[string]string, args ...string) *proc {
	e.t.Helper()
	p := &proc{id: id, out: &testutil.LogBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(workerBin, args...)
	if e.netns != nil {
		p.cmd = e.netns.Command(workerBin, args...)
	}
	p.cmd.Env = e.workerEnv(overrides)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = servers.ChildAttr(nil, true) // dies with the suite
	require.NoError(e.t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	e.procs = append(e.procs, p)
	e.t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
		if e.t.Failed() {
			e.t.Logf("output of worker %s (last lines):\n%s", p.id, tail(p.out.String(), 40))
		}
	})
	return p
}

// start starts workers with the scenario's flags plus extra, and waits
// until each has started crash recovery.
func (e *env) start(ids []string, extra ...string) []*proc {
	e.t.Helper()
	ps := make([]*proc, len(ids))
	for i, id := range ids {
		ps[i] = e.spawn(id, nil, e.workerArgs(id, extra...)...)
	}
	for _, p := range ps {
		p.waitLog(e.t, "faultworker started", 20*time.Second)
	}
	return ps
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig), "signal %v to %s", sig, p.id)
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	<-p.done
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.state.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("worker %s did not exit within %v", p.id, timeout)
		return -1
	}
}

// waitLog waits until the worker has logged a line with message msg.
func (p *proc) waitLog(t *testing.T, msg string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(p.lines(msg)) == 0 {
		if p.exited() {
			t.Fatalf("worker %s exited (%v) before logging %q:\n%s", p.id, p.state, msg, tail(p.out.String(), 20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s did not log %q within %v", p.id, msg, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lines returns the worker's JSON log records with message msg ("" for
// all of them).
func (p *proc) lines(msg string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(p.out.String(), "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) != nil {
			continue
		}
		if msg == "" || rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "..."
		}
	}
	return strings.Join(lines, "\n")
}

// query runs a one-value query, retrying for a few seconds while the
// database fails (connections broken by an outage are replaced on retry).
func (e *env) query(dst any, sql string, args ...any) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := e.pool.QueryRow(ctx, sql, args...).Scan(dst)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.query(&n, `SELECT count(*) FROM `+e.table+` WHERE `+where, args...))
	return n
}

// inprogOf returns the rows in progress owned by id.
func (e *env) inprogOf(id string) []int64 {
	e.t.Helper()
	var ids []int64
	require.NoError(e.t, e.query(&ids,
		`SELECT coalesce(array_agg(rowid ORDER BY rowid), '{}') FROM `+e.table+` WHERE status = 'inprog' AND split_part(owner, '{', 1) = $1`, id))
	return ids
}

// waitMidBlock waits until worker p is in the middle of a block: some of
// its rows done, some still in progress.
func (e *env) waitMidBlock(p *proc) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table+` WHERE status = 'inprog' AND split_part(owner, '{', 1) = $1`, p.id).Scan(&n)
		cancel()
		if err == nil && n >= 3 && n <= block-3 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("worker %s never seen mid-block", p.id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReset polls until none of ids is in progress under owner any more
// (recovery reset them; they may have been taken again since) and returns
// the time since since. It fails the test after limit.
func (e *env) waitReset(owner string, ids []int64, since time.Time, limit time.Duration) time.Duration {
	e.t.Helper()
	deadline := since.Add(limit + 10*time.Second) // measure past the bound, to report it
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.table+` WHERE rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`,
			ids, owner).Scan(&n)
		cancel()
		took := time.Since(since)
		if err == nil && n == 0 {
			assert.LessOrEqual(e.t, took, limit, "rows of %s reset within the bound", owner)
			return took
		}
		if time.Now().After(deadline) {
			e.logRedisOf(owner)
			e.t.Fatalf("%d rows of %s still in progress %v after the fault (bound %v; last error %v)", n, owner, took, limit, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logRedisOf logs what Redis holds of instance id, for a failure's
// message: whether the registry lists it, and which of its keys exist.
func (e *env) logRedisOf(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	k := e.keysOf(id)
	member, err := e.rdb.SIsMember(ctx, e.registry(), id).Result()
	e.t.Logf("Redis holds of %s: in the registry %v (%v)", id, member, err)
	for name, key := range map[string]string{"heartbeat": k.Heartbeat, "rows set": k.Rows, "claim": k.Claim} {
		n, err := e.rdb.Exists(ctx, key).Result()
		e.t.Logf("Redis holds of %s: %s %s exists %d (%v)", id, name, key, n, err)
	}
}

// goneWithin is how long after a dead worker's rows came back its keys may
// stay: in owner mode the liveness witness resets the rows within a
// second, and the keys go when the heartbeat has expired and a scan came
// (the detection bound); otherwise the recovery that reset them removes
// them.
func (e *env) goneWithin() time.Duration {
	if e.cfg.ownerMode {
		return detectionBound
	}
	return 2 * time.Second
}

// waitGone waits until instance id has neither rows set nor registry entry:
// its recovery finished.
func (e *env) waitGone(id string, timeout time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	k := e.keysOf(id)
	assert.Eventually(e.t, func() bool {
		n, err1 := e.rdb.Exists(ctx, k.Rows, k.Claim).Result()
		member, err2 := e.rdb.SIsMember(ctx, e.registry(), id).Result()
		return err1 == nil && err2 == nil && n == 0 && !member
	}, timeout, 10*time.Millisecond, "rows set, claim and registry entry of %s removed after its recovery", id)
}

// drainBound is how long the live workers may take to finish every row
// after the last fault: twice the work left at full speed, plus a
// detection bound and 5 s for scheduling.
func (e *env) drainBound(live int) time.Duration {
	if live < 1 {
		live = 1
	}
	perWorker := time.Duration(e.cfg.rows/live+block) * e.cfg.work
	return 2*perWorker + detectionBound + 5*time.Second
}

// finish is the invariant checker, run at the end of every scenario:
//
//   - no row lost: every row done within the drain bound, none left
//     queued or in progress;
//   - no row done twice: at most one 'done' in the ledger per row (when
//     exactlyOnce; otherwise the duplicates are only counted);
//   - every live worker stops on SIGTERM with exit status 0;
//   - no worker output holds a password, a panic or a data race.
//
// It fills and prints the scenario's result line.
func (e *env) finish(exactlyOnce bool) {
	t := e.t
	t.Helper()
	live := 0
	for _, p := range e.procs {
		if !p.exited() {
			live++
		}
	}
	bound := e.drainBound(live)
	drainStart := time.Now()
	deadline := drainStart.Add(bound)
	for {
		var left int
		err := e.query(&left, `SELECT count(*) FROM `+e.table+` WHERE status <> 'done'`)
		if err == nil && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			var states string
			_ = e.query(&states, `SELECT coalesce(string_agg(status || ':' || n, ' '), '') FROM (SELECT status, count(*) n FROM `+e.table+` GROUP BY status) s`)
			t.Errorf("rows lost: not every row done %v after the last fault (bound %v): %s (error %v)", time.Since(drainStart), bound, states, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.res.Drain = time.Since(drainStart)

	for _, p := range e.procs {
		if p.exited() {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // in case it is stopped
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range e.procs {
		if p.killedByTest() || p.expectFailure() {
			continue
		}
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Errorf("worker %s exited with status %d after SIGTERM", p.id, code)
		}
	}

	var done, distinct, twice, processedTwice, discarded int
	require.NoError(t, e.query(&done, `SELECT count(*) FROM ledger WHERE outcome = 'done'`))
	require.NoError(t, e.query(&distinct, `SELECT count(DISTINCT rowid) FROM ledger WHERE outcome = 'done'`))
	require.NoError(t, e.query(&twice, `SELECT count(*) FROM (SELECT rowid FROM ledger WHERE outcome = 'done' GROUP BY rowid HAVING count(*) > 1) d`))
	require.NoError(t, e.query(&processedTwice, `SELECT count(*) FROM (SELECT rowid FROM ledger GROUP BY rowid HAVING count(*) > 1) d`))
	require.NoError(t, e.query(&discarded, `SELECT count(*) FROM ledger WHERE outcome = 'discarded'`))
	e.res.DoneTwice, e.res.ProcessedTwice, e.res.Discarded = twice, processedTwice, discarded
	assert.Equal(t, e.cfg.rows, distinct, "every row in the ledger as done")
	if exactlyOnce {
		assert.Zero(t, twice, "rows done twice")
		assert.Equal(t, e.cfg.rows, done, "exactly one 'done' per row")
	}
	e.checkOutputs()
}

// checkOutputs fails the test if a worker printed a password, panicked or
// raced.
func (e *env) checkOutputs() {
	for _, p := range e.procs {
		out := p.out.String()
		for _, s := range e.secrets {
			assert.NotContains(e.t, out, s, "worker %s printed a password", p.id)
		}
		for _, bad := range []string{"panic:", "fatal error:", "WARNING: DATA RACE", "stopped after a panic"} {
			if bad == "panic:" && p.expectFailure() {
				continue // a worker made to crash (scenario H3)
			}
			assert.NotContains(e.t, out, bad, "worker %s output", p.id)
		}
	}
}

// killedByTest reports whether the process ended by a signal (the
// scenario killed it).
func (p *proc) killedByTest() bool {
	if p.state == nil {
		return false
	}
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// expectFailure is set for workers started to fail (bad input).
func (p *proc) expectFailure() bool { return strings.HasPrefix(p.id, "bad-") }
