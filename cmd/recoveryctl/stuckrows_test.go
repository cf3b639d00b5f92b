package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres/pgxreset"
)

// trackerEnv makes the test binary a worker as a newcomer writes one: it
// configures itself from the environment (ops.FromEnv: REDIS_URL,
// DATABASE_URL, RECOVERY_*), puts rows 1, 2 and 3 in progress and tracks
// them in one transaction, says "started" on stdout, and runs until
// killed. Its heartbeat TTL is 1s; the variable's value is its instance ID.
const trackerEnv = "RECOVERYCTL_TEST_TRACKER"

func runTracker() int {
	if err := track(context.Background(), os.Getenv(trackerEnv)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("started")
	select {}
}

func track(ctx context.Context, id string) error {
	env, err := ops.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	r, err := pgxreset.New(pool, env.Postgres.Options()...)
	if err != nil {
		return err
	}
	w, err := recovery.New(redis.NewClient(opt), r, recovery.WithKeyPrefix(env.KeyPrefix), recovery.WithInstanceID(id),
		recovery.WithTimings(recovery.Timings{HeartbeatTTL: time.Second, RecoveryInterval: 500 * time.Millisecond}))
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	table := pgx.Identifier{env.Postgres.Schema, "batchrows"}.Sanitize()
	if _, err := tx.Exec(ctx, `UPDATE `+table+` SET status = 'inprog' WHERE rowid IN (1, 2, 3)`); err != nil {
		return err
	}
	if err := w.Track(ctx, 1, 2, 3); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// newcomerSchema creates the classic schema: batches and batchrows with
// text statuses and no owner column, and the reset ledger; 10 rows queued.
func newcomerSchema(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	_, err := db.Exec(context.Background(), `
CREATE TABLE batches (batchid bigint PRIMARY KEY, status text NOT NULL DEFAULT 'inprog');
CREATE TABLE batchrows (rowid bigint PRIMARY KEY, batchid bigint NOT NULL REFERENCES batches, status text NOT NULL DEFAULT 'queued');
CREATE TABLE recovery_ledger (instance_id text NOT NULL, incarnation text NOT NULL, row_id bigint NOT NULL,
	reset_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (instance_id, incarnation, row_id));
INSERT INTO batches VALUES (1);
INSERT INTO batchrows (rowid, batchid) SELECT g, 1 FROM generate_series(1, 10) g;`)
	require.NoError(t, err)
	return db.Config().ConnConfig.RuntimeParams["search_path"]
}

// startWorker starts the test binary as a worker process (victimEnv or
// trackerEnv in env) and waits until it says it started.
func startWorker(t *testing.T, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "started\n", line)
	return cmd
}

// TestRecoverResetsRowsNoLiveWorkerHolds is the newcomer's night, and
// steps 1, 2 and 5 of the runbook in docs/operations.md: a lone
// worker, SIGKILLed with three rows in progress, whose rows set expired
// before anyone ran recover. Redis remembers nothing of its rows; the
// database still has them in progress. recover --dry-run names them;
// recover with too short a --timeout for the sweep's second look fails
// naming them and keeps the dead worker registered, and so does the dry
// run with that --timeout, saying why; recover with time
// enough resets them as the backstop sweep does, then deregisters it.
func TestRecoverResetsRowsNoLiveWorkerHolds(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	schema := newcomerSchema(t, db)
	prefix := testutil.Name("CTL")
	dbURL := testutil.PostgresURL(t)
	cmd := startWorker(t, []string{trackerEnv + "=newcomer-1", "REDIS_URL=" + url, "DATABASE_URL=" + dbURL,
		ops.EnvKeyPrefix + "=" + prefix, "RECOVERY_SCHEMA=" + schema})
	require.Equal(t, map[int64]string{1: "inprog", 2: "inprog", 3: "inprog"}, inProgress(t, db))

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	keys := store.InstanceKeys(prefix, "newcomer-1")
	require.Eventually(t, func() bool { // poll: only the clock ends the rows set (a rows TTL, 3s)
		n, err := rdb.Exists(ctx, keys.Rows, keys.Incarnation, keys.Heartbeat).Result()
		return err == nil && n == 0
	}, 10*time.Second, 50*time.Millisecond, "the rows set expires")

	// The runbook (docs/operations.md, "Runbook: rows stuck in inprog"),
	// step 1 without an owner column, and step 2.
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status = 'inprog'`).Scan(&n))
	assert.Equal(t, 3, n)
	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "workers")
	t.Logf("workers:\n%s%s", out, errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^newcomer-1\s+dead\s+over 1s ago\s+-\s+0\s+-`, out, "dead a TTL (the one it announced) ago, no rows set")

	// Step 5: recover.
	env := map[string]string{"DATABASE_URL": dbURL, "RECOVERY_SCHEMA": schema}
	base := []string{"--redis-url", url, "--prefix", prefix, "recover"}

	out, errOut, code = ctl(t, env, append(base, "--dry-run")...)
	t.Logf("recover --dry-run:\n%s%s", out, errOut)
	assert.Equal(t, exitOK, code, "the real run with this --timeout would reset them: %s", errOut)
	assert.Contains(t, out, "PostgreSQL: 3 rows in progress, 3 of them in no rows set: no live worker holds them (1 2 3)")

	// --timeout shorter than the sweep's gap (a rows TTL of the fleet's
	// 1s heartbeat TTL: 3s). The dry run fails as the real run would, and
	// says so: it promises no reset, and shows the dead worker kept, not
	// deregistered, in text and JSON.
	out, errOut, code = ctl(t, env, append(base, "--dry-run", "--timeout", "2s")...)
	t.Logf("recover --dry-run --timeout 2s:\n%s%s", out, errOut)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "3 rows (1 2 3) were not reset")
	assert.Regexp(t, `no live worker holds them \(1 2 3\); the dry run could not finish the backstop sweep's second look, \S+ after the first, within --timeout: recover would not reset them`, out)
	assert.NotContains(t, out, "recover would reset them")
	assert.Contains(t, out, "would keep newcomer-1 registered")
	assert.NotContains(t, out, "would deregister newcomer-1")
	out, errOut, code = ctl(t, env, append(base, "--dry-run", "--timeout", "2s", "--json")...)
	assert.Equal(t, exitFail, code, errOut)
	var plan recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &plan), out)
	require.NotNil(t, plan.Sweep)
	assert.True(t, plan.Sweep.PastTimeout)
	assert.Equal(t, []string{"newcomer-1"}, plan.Sweep.Kept)
	assert.Zero(t, plan.RowsReset, "no reset promised")
	if assert.Len(t, plan.Peers, 1) {
		assert.Equal(t, "kept", plan.Peers[0].Action)
	}

	// The real run: the rows are named, recover fails, and the dead
	// worker stays registered.
	out, errOut, code = ctl(t, env, append(base, "--timeout", "2s")...)
	t.Logf("recover --timeout 2s:\n%s%s", out, errOut)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "rows in progress that no live worker holds are stuck: 3 rows (1 2 3) were not reset")
	assert.Contains(t, out, "kept newcomer-1 registered")
	member, err := rdb.SIsMember(ctx, store.RegistryKey(prefix), "newcomer-1").Result()
	require.NoError(t, err)
	assert.True(t, member, "a dead worker whose rows are unaccounted for stays registered")
	assert.Len(t, inProgress(t, db), 3, "nothing changed")

	out, errOut, code = ctl(t, env, append(base, "--json")...)
	t.Logf("recover --json:\n%s%s", out, errOut)
	require.Equal(t, exitOK, code, errOut)
	var got recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.NotNil(t, got.Sweep)
	assert.Equal(t, []int64{1, 2, 3}, got.Sweep.RowsUnheld)
	assert.Empty(t, got.Sweep.RowsStuck)
	assert.True(t, got.Sweep.Waited)
	assert.EqualValues(t, 3, got.Sweep.RowsReset)
	assert.EqualValues(t, 3, got.RowsReset)
	assert.Empty(t, inProgress(t, db), "rows back in the queue")
	member, err = rdb.SIsMember(ctx, store.RegistryKey(prefix), "newcomer-1").Result()
	require.NoError(t, err)
	assert.False(t, member, "deregistered once its rows are accounted for")

	// With no instance registered any more, recover cannot tell this
	// fleet from a wrong --prefix: it refuses unless told the fleet is down.
	_, errOut, code = ctl(t, env, base...)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "has no registered instance")
	out, errOut, code = ctl(t, env, append(base, "--fleet-down")...)
	t.Logf("recover again:\n%s%s", out, errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "PostgreSQL: no rows in progress")

	// The history tells who reset them (its details are the history's).
	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history")
	t.Logf("history:\n%s%s", out, errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)\sstray_rows_reset\s+-\s+recoveryctl-\S+`, out)
}

// inProgress returns the rows in progress with their status.
func inProgress(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	out := map[int64]string{}
	for id, s := range itemStatuses(t, db) {
		if s == "inprog" {
			out[id] = s
		}
	}
	return out
}

func itemStatuses(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT rowid, status FROM batchrows`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id int64
		s  string
	}, error) {
		var v struct {
			id int64
			s  string
		}
		return v, r.Scan(&v.id, &v.s)
	})
	require.NoError(t, err)
	out := map[int64]string{}
	for _, v := range got {
		out[v.id] = v.s
	}
	return out
}

// TestRecoverFailsNamingRowsStillStuck: rows in progress that no rows set
// holds, one of them held locked by another session through both of the
// sweep's looks: recover resets the other, and exits 1 naming the locked
// one; it never reports success while a row it was asked about is stuck.
func TestRecoverFailsNamingRowsStillStuck(t *testing.T) {
	url := testutil.RedisURL(t)
	ctx := context.Background()
	// The sweep judges nothing on a Redis server up for less than a
	// heartbeat TTL (1s here): live workers may not have written their
	// rows sets to it yet.
	waitUptime(t, client(t, url))
	db := testutil.Postgres(t)
	schema := newcomerSchema(t, db)
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid IN (4, 5)`)
	require.NoError(t, err)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM batchrows WHERE rowid = 5 FOR UPDATE`)
	require.NoError(t, err)

	// No worker ever ran: the fleet record is empty, so --heartbeat-ttl
	// gives the fleet's TTL, and with it the sweep's gap (3 × 1s).
	out, errOut, code := ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t), "RECOVERY_SCHEMA": schema},
		"--redis-url", url, "--prefix", testutil.Name("CTL"), "--heartbeat-ttl", "1s", "recover", "--fleet-down", "--json")
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "rows in progress that no live worker holds are stuck: 1 rows (5) are still in progress after the backstop sweep's second look (1 held locked by another session")
	var got recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.NotNil(t, got.Sweep)
	assert.Equal(t, []int64{4, 5}, got.Sweep.RowsUnheld)
	assert.Equal(t, []int64{5}, got.Sweep.RowsStuck)
	assert.EqualValues(t, 1, got.Sweep.RowsReset)
	assert.Equal(t, 1, got.Sweep.Locked)
	assert.EqualValues(t, 3000, got.Sweep.GapMs)
	require.NoError(t, tx.Rollback(ctx))
	assert.Equal(t, map[int64]string{5: "inprog"}, inProgress(t, db))
}

// TestRecoverFailsNamingRowsTheDatabaseRefused: rows in progress that no
// rows set holds, one of them refused by a BEFORE UPDATE trigger that
// returns NULL: recover resets the other, exits 1 naming the refused one
// as refused by the database, and keeps the dead instance that left no
// rows set registered.
func TestRecoverFailsNamingRowsTheDatabaseRefused(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	waitUptime(t, rdb)
	db := testutil.Postgres(t)
	schema := newcomerSchema(t, db)
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid IN (4, 5);
CREATE FUNCTION refuse_five() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF OLD.rowid = 5 THEN RETURN NULL; END IF; RETURN NEW; END $$;
CREATE TRIGGER refuse_five BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION refuse_five();`)
	require.NoError(t, err)
	prefix := testutil.Name("CTL")
	// A dead instance that left no rows set: the rows may be its.
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "gone-1").Err())

	out, errOut, code := ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t), "RECOVERY_SCHEMA": schema},
		"--redis-url", url, "--prefix", prefix, "--heartbeat-ttl", "1s", "recover", "--fleet-down", "--json")
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "rows in progress that no live worker holds are stuck: 1 rows (5) are still in progress after the backstop sweep's second look (1 refused by the database (5): a BEFORE UPDATE trigger returned NULL")
	var got recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.NotNil(t, got.Sweep)
	assert.Equal(t, []int64{4, 5}, got.Sweep.RowsUnheld)
	assert.Equal(t, []int64{5}, got.Sweep.RowsStuck)
	assert.Equal(t, []int64{5}, got.Sweep.RowsRefused)
	assert.EqualValues(t, 1, got.Sweep.RowsReset)
	assert.Equal(t, []string{"gone-1"}, got.Sweep.Kept)
	assert.Equal(t, map[int64]string{5: "inprog"}, inProgress(t, db))
	member, err := rdb.SIsMember(ctx, store.RegistryKey(prefix), "gone-1").Result()
	require.NoError(t, err)
	assert.True(t, member, "kept registered while a row it may have held is stuck")
}

// waitUptime waits until the Redis server has been up for 2s: the sweep
// judges nothing on a server up for less than a heartbeat TTL (1s in these
// tests), as live workers may not have written their keys to it yet.
func waitUptime(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	require.Eventually(t, func() bool { // poll: only the clock ages the server
		info, err := rdb.Info(context.Background(), "server").Result()
		return err == nil && !strings.Contains(info, "uptime_in_seconds:0\r") && !strings.Contains(info, "uptime_in_seconds:1\r")
	}, 5*time.Second, 50*time.Millisecond)
}

// TestRecoverByOwnerResetsRowsOfOwnersRedisDoesNotKnow: with an owner
// column, rows in progress whose owner Redis knows nothing of (its
// registry entry lost) are reset by owner at the sweep's second look, a
// heartbeat TTL after the first; with too short a --timeout recover names
// the owner and exits 1.
func TestRecoverByOwnerResetsRowsOfOwnersRedisDoesNotKnow(t *testing.T) {
	url := testutil.RedisURL(t)
	ctx := context.Background()
	waitUptime(t, client(t, url))
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 4)
	schema := db.Config().ConnConfig.RuntimeParams["search_path"]
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'ghost-1' WHERE rowid IN (1, 2)`)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t)}
	args := []string{"--redis-url", url, "--prefix", testutil.Name("CTL"), "--heartbeat-ttl", "1s", "recover", "--fleet-down",
		"--schema", schema, "--owner-column", "owner"}

	// The prefix has no fleet record nor registered instance, as a wrong
	// --prefix would: by owner too, recover refuses unless told the fleet
	// is down, and ghost-1's rows stay in progress.
	noFlag := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--fleet-down" })
	_, errOut, code := ctl(t, env, noFlag...)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "has no fleet record")
	assert.Len(t, inProgress(t, db), 2)

	out, errOut, code := ctl(t, env, append(args, "--timeout", "1s")...)
	t.Logf("recover --timeout 1s:\n%s%s", out, errOut)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, `the rows of 1 owners without a heartbeat ("ghost-1") were not reset`)
	assert.Len(t, inProgress(t, db), 2)

	out, errOut, code = ctl(t, env, args...)
	t.Logf("recover:\n%s%s", out, errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `PostgreSQL: rows in progress of 1 owners without a heartbeat ("ghost-1"); at a second look 1s later, 2 rows were reset by owner`)
	assert.Empty(t, inProgress(t, db))
}

// TestRecoverWithoutOwnerColumnLeavesOwnerModeMembersRowsAlone: during an
// owner-column rollout, a live member announcing owner mode holds rows no
// rows set lists. recover without --owner-column does not take them for
// stray rows (the sweep by row version yields to such members): it resets
// nothing, says why, and exits 1.
func TestRecoverWithoutOwnerColumnLeavesOwnerModeMembersRowsAlone(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	schema := newcomerSchema(t, db)
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid IN (6, 7)`)
	require.NoError(t, err)
	prefix := testutil.Name("CTL")
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "m:owner-1",
		fmt.Sprintf("1000 1000 1000 owner %d", time.Now().Add(time.Minute).UnixMilli())).Err())

	_, errOut, code := ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t), "RECOVERY_SCHEMA": schema},
		"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "live members announce owner mode (owner-1)")
	assert.Len(t, inProgress(t, db), 2, "their rows are left alone")
}
