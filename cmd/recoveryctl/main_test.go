package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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
	"github.com/alya/recovery/postgres"
)

// These tests run recoveryctl's run function against a real redis-server
// (standalone and Cluster) and, for recover, a real PostgreSQL.

func TestMain(m *testing.M) {
	if os.Getenv(victimEnv) != "" {
		os.Exit(runVictim())
	}
	if os.Getenv(trackerEnv) != "" {
		os.Exit(runTracker())
	}
	os.Exit(testutil.MainCheckingLeaks(m))
}

// victimEnv makes the test binary a worker of the library that a test
// kills with SIGKILL: REDIS_URL and RECOVERY_KEY_PREFIX say where, the
// variable's value is its instance ID. It heartbeats every 100ms with a
// TTL of 3s, says "started" on stdout, and runs until killed.
const victimEnv = "RECOVERYCTL_TEST_VICTIM"

func runVictim() int {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w, err := recovery.New(redis.NewClient(opt), &refuser{}, recovery.WithKeyPrefix(os.Getenv(ops.EnvKeyPrefix)),
		recovery.WithInstanceID(os.Getenv(victimEnv)), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      3 * time.Second,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
		}))
	if err == nil {
		err = w.Start(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("started")
	select {}
}

// ctl runs recoveryctl with args and the environment env.
func ctl(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	return out.String(), errOut.String(), code
}

// refuser is the Resetter of a live test worker: it refuses every reset,
// so a peer planted as dead keeps its rows set and registry entry whatever
// the worker's own scan does (a failed recovery releases its claim).
type refuser struct{ calls atomic.Int32 }

func (r *refuser) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "refuser", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (r *refuser) Check(context.Context, bool) (recovery.ResetterInfo, error) {
	return recovery.ResetterInfo{Name: "refuser", InProgressStatus: "inprog", QueuedStatus: "queued"}, nil
}

// errRefused is what every reset of a refuser returns.
var errRefused = errors.New("test workers do not reset rows")

func (r *refuser) ResetRows(context.Context, recovery.RowsReset) (recovery.ResetResult, error) {
	r.calls.Add(1)
	return recovery.ResetResult{}, errRefused
}

func (r *refuser) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	r.calls.Add(1)
	return recovery.ResetResult{}, errRefused
}

func (r *refuser) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	r.calls.Add(1)
	return recovery.ResetResult{}, errRefused
}

func (r *refuser) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	r.calls.Add(1)
	return recovery.ResetResult{}, errRefused
}

func (r *refuser) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

func (r *refuser) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (r *refuser) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

// liveWorker starts a real worker of the library that tracks rows, shut
// down when the test ends. Plant dead peers with rows before calling it:
// it waits until its first scan has tried them and let go of its claim.
func liveWorker(t *testing.T, rdb redis.UniversalClient, prefix, id string, deadPeer string, rows ...int64) {
	t.Helper()
	log, _ := testutil.Logger(t)
	r := &refuser{}
	w, err := recovery.New(rdb, r, recovery.WithKeyPrefix(prefix), recovery.WithInstanceID(id),
		recovery.WithTimings(recovery.Timings{RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}), recovery.WithLogger(log))
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() { _ = w.Shutdown(context.Background()) })
	require.Eventually(t, func() bool {
		// A failed recovery leaves the note "failed" in place of its claim.
		v, err := rdb.Get(context.Background(), store.InstanceKeys(prefix, deadPeer).Claim).Result()
		return r.calls.Load() > 0 && (errors.Is(err, redis.Nil) || v == "failed")
	}, 5*time.Second, 5*time.Millisecond, "the worker's first scan is over")
	require.NoError(t, w.Track(context.Background(), rows...))
}

// plantAlive writes what a live worker keeps in Redis: a heartbeat with
// its TTL, a registry entry and a rows set.
func plantAlive(t *testing.T, rdb redis.UniversalClient, prefix, id string, rows ...any) {
	t.Helper()
	ctx := context.Background()
	k := store.InstanceKeys(prefix, id)
	require.NoError(t, rdb.Set(ctx, k.Heartbeat, store.HeartbeatValue, time.Minute).Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), id).Err())
	if len(rows) > 0 {
		require.NoError(t, rdb.SAdd(ctx, k.Rows, rows...).Err())
		require.NoError(t, rdb.Expire(ctx, k.Rows, 3*time.Minute).Err())
	}
}

// plantDead leaves what a killed worker leaves: a registry entry and a
// rows set, no heartbeat.
func plantDead(t *testing.T, rdb redis.UniversalClient, prefix, id string, rows ...any) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), id).Err())
	if len(rows) > 0 {
		require.NoError(t, rdb.SAdd(ctx, store.InstanceKeys(prefix, id).Rows, rows...).Err())
	}
}

type workersOut struct {
	Prefix         string         `json:"prefix"`
	Registry       string         `json:"registry"`
	Workers        []instanceJSON `json:"workers"`
	InvalidMembers []string       `json:"invalid_members"`
}

func TestWorkersShowsAliveAndDeadInstancesWithTheirRows(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-1", "1", "2", "3")
	liveWorker(t, rdb, prefix, "alive-1", "dead-1", 7, 8)
	require.NoError(t, rdb.SAdd(context.Background(), store.RegistryKey(prefix), "not valid").Err())

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "workers")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(out, "\n")
	require.GreaterOrEqual(t, len(lines), 4, out)
	assert.Regexp(t, `^INSTANCE\s+STATE\s+LAST BEAT\s+HEARTBEAT TTL\s+ROWS\s+ROWS TTL`, lines[0])
	assert.Regexp(t, `^alive-1\s+alive\s+\S+ ago\s+\S+\s+2\s+`, lines[1])
	// The live worker's scan failed to reset them (refuser): the claim
	// renewed the rows set's TTL (Timings.RowsTTL 3h) and left its note.
	assert.Regexp(t, `^dead-1\s+dead, last recovery failed\s+over 1m0s ago\s+-\s+3\s+3h0m0s`, lines[2])
	assert.Contains(t, out, "2 registered in "+prefix+"_WORKER_REGISTRY: 1 alive, 1 dead")
	assert.Contains(t, out, `"not valid"`)

	// The same, as JSON, with flags after the command.
	out, errOut, code = ctl(t, map[string]string{"REDIS_URL": url}, "workers", "--json", "--prefix", prefix)
	require.Equal(t, exitOK, code, errOut)
	var got workersOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, prefix+"_WORKER_REGISTRY", got.Registry)
	assert.Equal(t, []string{"not valid"}, got.InvalidMembers)
	require.Len(t, got.Workers, 2)
	alive, dead := got.Workers[0], got.Workers[1]
	assert.Equal(t, "alive-1", alive.InstanceID)
	assert.True(t, alive.Alive)
	require.NotNil(t, alive.HeartbeatTTLMs)
	assert.Greater(t, *alive.HeartbeatTTLMs, int64(50_000), "default TTL 60s, just refreshed")
	assert.EqualValues(t, 2, alive.Rows)
	assert.Equal(t, "dead-1", dead.InstanceID)
	assert.False(t, dead.Alive)
	assert.Nil(t, dead.HeartbeatTTLMs, "no heartbeat key: null")
	assert.EqualValues(t, 3, dead.Rows)
	assert.Equal(t, "failed", dead.Claim)
	assert.False(t, dead.BeingRecovered, "a failed recovery's note is no claim")
	assert.Equal(t, "none", alive.Claim)
}

func TestWorkersOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	prefix := testutil.Name("CTL")
	// Enough instances that their keys spread over every node.
	for i := range 6 {
		plantAlive(t, rdb, prefix, "alive-"+strconv.Itoa(i), strconv.Itoa(i))
	}
	plantDead(t, rdb, prefix, "dead-1", "1", "2")

	out, errOut, code := ctl(t, nil, "--cluster", strings.Join(cluster.Addrs, ","), "--prefix", prefix, "--json", "workers")
	require.Equal(t, exitOK, code, errOut)
	var got workersOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Workers, 7)
	for _, w := range got.Workers[:6] {
		assert.True(t, w.Alive, w.InstanceID)
		assert.EqualValues(t, 1, w.Rows, w.InstanceID)
	}
	assert.False(t, got.Workers[6].Alive)
	assert.EqualValues(t, 2, got.Workers[6].Rows)
}

func TestPrefixKeepsFleetsApart(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-1", "1")

	other := testutil.Name("OTHER")
	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", other, "workers")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "0 registered")
	assert.NotContains(t, out, "dead-1")
	assert.Contains(t, errOut, `no worker registered under prefix "`+other+`": `+other+"_WORKER_REGISTRY is empty or absent; is --prefix the fleet's WithKeyPrefix?")

	// The JSON on stdout stays parseable; the warning goes to stderr.
	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", other, "--json", "workers")
	require.Equal(t, exitOK, code, errOut)
	var got workersOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Empty(t, got.Workers)
	assert.Contains(t, errOut, "no worker registered under prefix")

	// A prefix that matches says nothing of the kind.
	_, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "workers")
	require.Equal(t, exitOK, code, errOut)
	assert.NotContains(t, errOut, "no worker registered")
}

func TestRowsListsTheRowIDsOfAnInstance(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-1", "30", "4", "200", "junk")

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "rows", "dead-1")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "instance dead-1: dead, last beat over 1m0s ago, heartbeat TTL -, 4 rows tracked")
	assert.Contains(t, out, "4\n30\n200\n", "numeric order")
	assert.Contains(t, out, `"junk"`)

	out, errOut, code = ctl(t, nil, "rows", "--json", "dead-1", "--redis-url", url, "--prefix", prefix)
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		instanceJSON
		RowIDs         []int64  `json:"row_ids"`
		InvalidMembers []string `json:"invalid_members"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, []int64{4, 30, 200}, got.RowIDs)
	assert.Equal(t, []string{"junk"}, got.InvalidMembers)
	assert.True(t, got.Registered)
	assert.False(t, got.Alive)
}

func TestRowsOfAnUnknownInstanceIsAnError(t *testing.T) {
	url := testutil.RedisURL(t)
	prefix := testutil.Name("CTL")
	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "rows", "nobody")
	assert.Equal(t, exitFail, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, `unknown instance "nobody": not in `+prefix+`_WORKER_REGISTRY and no keys of it under prefix "`+prefix+`"`)

	_, errOut, code = ctl(t, nil, "--redis-url", url, "rows", "a{b}")
	assert.Equal(t, exitUsage, code, "an ID that cannot be a key is a usage error")
	assert.Contains(t, errOut, `instance ID "a{b}"`)

	_, _, code = ctl(t, nil, "--redis-url", url, "rows")
	assert.Equal(t, exitUsage, code)
}

// enumItems creates testutil.EnumItemsSchema in db's own schema with the
// rows given as id → {state, worker} ("" worker is NULL), and returns the
// schema and the recoveryctl flags of a resetter for it.
func enumItems(t *testing.T, db *pgxpool.Pool, rows map[int64][2]string) (schema string, flags []string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, testutil.EnumItemsSchema)
	require.NoError(t, err)
	for id, r := range rows {
		var worker any
		if r[1] != "" {
			worker = r[1]
		}
		_, err := db.Exec(ctx, `INSERT INTO items (item_id, state, worker) VALUES ($1, $2, $3)`, id, r[0], worker)
		require.NoError(t, err)
	}
	schema = db.Config().ConnConfig.RuntimeParams["search_path"]
	return schema, []string{"--schema", schema, "--table", "items", "--id-column", "item_id",
		"--status-column", "state", "--inprog-status", "running", "--queued-status", "pending", "--owner-column", "worker"}
}

// itemStates returns every row of items as id → "state/worker".
func itemStates(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT item_id, state::text, coalesce(worker, '') FROM items`)
	require.NoError(t, err)
	out := map[int64]string{}
	var (
		id            int64
		state, worker string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &worker}, func() error {
		out[id] = state + "/" + worker
		return nil
	})
	require.NoError(t, err)
	return out
}

func TestRecoverDryRunOnAnEnumTablePromisesExactlyTheRowsThatChange(t *testing.T) {
	t.Parallel()
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t)}
	_, flags := enumItems(t, db, map[int64][2]string{
		1: {"running", "dead-1"}, 2: {"running", "dead-1"}, 3: {"running", "dead-1"},
		4: {"done", ""},          // dead-1 finished it before it died
		5: {"running", "other"},  // re-taken by another worker since
		6: {"pending", ""},       // already queued
		7: {"running", "dead-2"}, // a dead peer whose last recovery failed
		9: {"running", "alive-1"},
	})
	prefix := testutil.Name("CTL")
	plantAlive(t, rdb, prefix, "alive-1", "9")
	plantDead(t, rdb, prefix, "dead-1", "1", "2", "3", "4", "5", "6", "junk")
	plantDead(t, rdb, prefix, "dead-2", "7")
	require.NoError(t, rdb.Set(ctx, store.InstanceKeys(prefix, "dead-2").Claim, "failed", time.Minute).Err())
	plantDead(t, rdb, prefix, "dead-empty")
	plantDead(t, rdb, prefix, "dead-claimed", "8")
	require.NoError(t, rdb.Set(ctx, store.InstanceKeys(prefix, "dead-claimed").Claim, "token", time.Minute).Err())
	ids := []string{"dead-1", "dead-2", "dead-empty", "dead-claimed"}
	redisBefore, dbBefore := dump(t, rdb, prefix, ids...), itemStates(t, db)

	args := append([]string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--dry-run"}, flags...)
	out, errOut, code := ctl(t, env, args...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "dry run: 5 registered instances checked, 4 dead, 4 rows would be reset; nothing was changed")
	assert.Contains(t, out, "would reset dead-1: 3 of 6 tracked rows (1 2 3); 3 are settled")
	assert.Contains(t, out, `1 members of its rows set are not row IDs and are skipped: "junk"`)
	assert.Contains(t, out, "would reset dead-2: 1 of 1 tracked rows (7)", "a failed recovery's note is no claim: the next scan takes it")
	assert.Contains(t, out, "would deregister dead-empty")
	assert.Contains(t, out, "would skip dead-claimed")
	assert.NotContains(t, out, "alive-1")

	out, errOut, code = ctl(t, env, append(args, "--json")...)
	require.Equal(t, exitOK, code, errOut)
	var got recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.True(t, got.DryRun)
	plans := map[string]peerJSON{}
	for _, p := range got.Peers {
		plans[p.InstanceID] = p
	}
	assert.Equal(t, "reset", plans["dead-1"].Action)
	assert.Equal(t, []int64{1, 2, 3}, plans["dead-1"].RowsToReset, "not the finished row 4, not row 5 another worker holds, not the queued row 6")
	assert.Equal(t, []int64{1, 2, 3, 4, 5, 6}, plans["dead-1"].RowIDs)
	assert.Empty(t, plans["dead-1"].RowsNotReset)
	assert.Equal(t, []int64{7}, plans["dead-2"].RowsToReset)
	assert.Equal(t, "failed", plans["dead-2"].Claim)
	assert.Equal(t, "deregister", plans["dead-empty"].Action)
	assert.Equal(t, "skip", plans["dead-claimed"].Action)
	assert.EqualValues(t, 4, got.RowsReset)

	assert.Equal(t, redisBefore, dump(t, rdb, prefix, ids...), "a dry run writes nothing to Redis")
	assert.Equal(t, dbBefore, itemStates(t, db), "a dry run commits nothing")

	// The real run does what the dry run said, no more.
	out, errOut, code = ctl(t, env, append([]string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--json"}, flags...)...)
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.EqualValues(t, 4, got.RowsReset)
	assert.Equal(t, map[int64]string{
		1: "pending/", 2: "pending/", 3: "pending/", 4: "done/", 5: "running/other", 6: "pending/",
		7: "pending/", 9: "running/alive-1",
	}, itemStates(t, db))
	reg, err := rdb.SMembers(ctx, store.RegistryKey(prefix)).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"alive-1", "dead-claimed"}, reg)
}

func TestRecoverKeepsTheRowsSetAndRegistryEntryWhenAStatusIsMisspelt(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t)}
	_, flags := enumItems(t, db, map[int64][2]string{1: {"running", "dead-1"}, 2: {"running", "dead-1"}})
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-1", "1", "2")
	redisBefore, dbBefore := dump(t, rdb, prefix, "dead-1"), itemStates(t, db)
	misspelt := slices.Clone(flags)
	misspelt[slices.Index(misspelt, "running")] = "runing"

	// On an enum, the catalogue shows it before anything is touched.
	_, errOut, code := ctl(t, env, append([]string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down"}, misspelt...)...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Regexp(t, `in-progress status "runing" \(WithStatuses\) is not a label of enum \S*job_state`, errOut)
	assert.Contains(t, errOut, "--no-schema-check")
	assert.Equal(t, redisBefore, dump(t, rdb, prefix, "dead-1"))
	assert.Equal(t, dbBefore, itemStates(t, db))

	// Without the check, PostgreSQL refuses the value: the recovery fails
	// and keeps everything for the next try.
	_, errOut, code = ctl(t, env, append([]string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--no-schema-check"}, misspelt...)...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "could not be recovered; their rows stay tracked")
	assert.Equal(t, redisBefore["registry"], dump(t, rdb, prefix, "dead-1")["registry"])
	assert.Equal(t, redisBefore[store.InstanceKeys(prefix, "dead-1").Rows], dump(t, rdb, prefix, "dead-1")[store.InstanceKeys(prefix, "dead-1").Rows])
	assert.Equal(t, dbBefore, itemStates(t, db))

	// A text status column has no labels to check: the misspelt status
	// matches no row, the rows are neither reset nor finished, and recover
	// says so, exits 1 and keeps the rows set and registry entry.
	_, err := db.Exec(ctx, `CREATE TABLE textitems (item_id bigint PRIMARY KEY, state text NOT NULL, worker text);
		INSERT INTO textitems VALUES (1, 'running', 'dead-1'), (2, 'running', 'dead-1'), (3, 'done', NULL)`)
	require.NoError(t, err)
	require.NoError(t, rdb.SAdd(ctx, store.InstanceKeys(prefix, "dead-1").Rows, "3").Err())
	misspelt[slices.Index(misspelt, "items")] = "textitems"
	base := []string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down"}
	// The dry run says so, and exits 1 as the real run will.
	out, errOut, code := ctl(t, env, append(append(base, "--dry-run"), misspelt...)...)
	require.Equal(t, exitFail, code, errOut)
	assert.Contains(t, out, `would keep dead-1: 2 of 3 tracked rows can be neither reset nor shown finished (row 1 status "running", row 2 status "running"); 0 would be reset (none)`)
	assert.Contains(t, errOut, "recoveryctl recover: recovery: rows neither reset nor settled: a scan would keep 2 rows of 1 dead instances")
	assert.Contains(t, errOut, "and recover would exit 1")
	out, errOut, code = ctl(t, env, append(append(base, "--dry-run", "--json"), misspelt...)...)
	require.Equal(t, exitFail, code, errOut)
	var plan recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &plan), out)
	assert.Equal(t, 2, plan.RowsNotReset)

	out, errOut, code = ctl(t, env, append(base, misspelt...)...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, out, `2 of 3 tracked rows were neither reset nor finished (row 1 status "running", row 2 status "running"); 0 were reset; its rows set and registry entry are kept`)
	assert.Contains(t, errOut, "rows neither reset nor settled: 2 rows of 1 dead instances were neither reset nor finished")
	assert.Contains(t, errOut, "--inprog-status")
	after := dump(t, rdb, prefix, "dead-1")
	assert.Equal(t, []string{"dead-1"}, after["registry"], "still registered")
	assert.Equal(t, []string{"1", "2", "3"}, after[store.InstanceKeys(prefix, "dead-1").Rows], "rows set kept")
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM textitems WHERE state = 'running'`).Scan(&n))
	assert.Equal(t, 2, n)

	// Fixed, the same command recovers them.
	fixed := slices.Clone(misspelt)
	fixed[slices.Index(fixed, "runing")] = "running"
	_, errOut, code = ctl(t, env, append(base, fixed...)...)
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM textitems WHERE state = 'pending' AND worker IS NULL`).Scan(&n))
	assert.Equal(t, 2, n)
}

// configValues is c as plain values, without what postgres.ConfigFromEnv
// remembers of where they came from.
func configValues(c postgres.Config) postgres.Config {
	return postgres.Config{Schema: c.Schema, Table: c.Table, IDColumn: c.IDColumn, StatusColumn: c.StatusColumn,
		InProgressStatus: c.InProgressStatus, QueuedStatus: c.QueuedStatus, DoneStatuses: c.DoneStatuses,
		OwnerColumn: c.OwnerColumn, RecoveryCountColumn: c.RecoveryCountColumn, MaxRecoveries: c.MaxRecoveries,
		TerminalStatus: c.TerminalStatus, ResetLedger: c.ResetLedger, NoResetLedger: c.NoResetLedger}
}

func TestEveryResetterFlagAndVariableReachesTheResetterConfig(t *testing.T) {
	want := postgres.Config{
		Schema: "work", Table: "items", IDColumn: "item_id", StatusColumn: "state",
		InProgressStatus: "running", QueuedStatus: "pending", DoneStatuses: []string{"done", "cancelled"},
		OwnerColumn: "worker", RecoveryCountColumn: "retries", MaxRecoveries: 3, TerminalStatus: "dead",
		ResetLedger: "my_ledger", NoResetLedger: true,
	}
	flags := []string{"recover", "--schema", "work", "--table", "items", "--id-column", "item_id",
		"--status-column", "state", "--inprog-status", "running", "--queued-status", "pending",
		"--done-statuses", "done, cancelled", "--owner-column", "worker", "--recovery-count-column", "retries",
		"--max-recoveries", "3", "--terminal-status", "dead", "--reset-ledger", "my_ledger", "--no-reset-ledger",
		"--prefix", "FLEET"}
	var errOut bytes.Buffer
	_, _, o, code := parseArgs(flags, func(string) string { return "" }, &errOut)
	require.Equal(t, -1, code, errOut.String())
	assert.EqualExportedValues(t, want, o.pgx)
	assert.Equal(t, "FLEET", o.prefix)

	env := map[string]string{
		postgres.EnvSchema: "work", postgres.EnvTable: "items", postgres.EnvIDColumn: "item_id",
		postgres.EnvStatusColumn: "state", postgres.EnvInProgressStatus: "running", postgres.EnvQueuedStatus: "pending",
		postgres.EnvDoneStatuses: "done,cancelled", postgres.EnvOwnerColumn: "worker",
		postgres.EnvRecoveryCountColumn: "retries", postgres.EnvMaxRecoveries: "3", postgres.EnvTerminalStatus: "dead",
		postgres.EnvResetLedger: "my_ledger", postgres.EnvNoResetLedger: "true", ops.EnvKeyPrefix: "FLEET",
	}
	_, _, o, code = parseArgs([]string{"recover"}, func(k string) string { return env[k] }, &errOut)
	require.Equal(t, -1, code, errOut.String())
	fromEnv, err := postgres.ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	assert.Equal(t, fromEnv, o.pgx, "the host's RECOVERY_* variables, and that they came from there")
	assert.Equal(t, want, configValues(o.pgx), "the host's RECOVERY_* variables")
	assert.Equal(t, "FLEET", o.prefix)

	// A flag overrides its variable.
	_, _, o, code = parseArgs([]string{"recover", "--table", "other", "--prefix", "P"}, func(k string) string { return env[k] }, &errOut)
	require.Equal(t, -1, code, errOut.String())
	assert.Equal(t, "other", o.pgx.Table)
	assert.Equal(t, "P", o.prefix)

	// A variable that cannot be parsed is a usage error naming it.
	_, errS, c := ctl(t, map[string]string{postgres.EnvMaxRecoveries: "many"}, "recover")
	assert.Equal(t, exitUsage, c)
	assert.Contains(t, errS, `RECOVERY_MAX_RECOVERIES="many" is not an integer`)

	// Options the resetter refuses are usage errors, before any connection.
	_, errS, c = ctl(t, map[string]string{"DATABASE_URL": "postgres://u:s3cret@127.0.0.1:1/x"},
		"--redis-url", "redis://127.0.0.1:1", "recover", "--terminal-status", "dead")
	assert.Equal(t, exitUsage, c)
	assert.Contains(t, errS, "max recoveries 0 must be at least 1")
	assert.NotContains(t, errS, "s3cret")
}

func TestRecoverResetsTheRowsOfDeadInstancesInPostgres(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	schema := db.Config().ConnConfig.RuntimeParams["search_path"]
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid IN (1, 2, 3, 4)`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'done' WHERE rowid = 5`)
	require.NoError(t, err)
	prefix := testutil.Name("CTL")
	plantAlive(t, rdb, prefix, "alive-1", "4")                    // row 4 is a live worker's
	plantDead(t, rdb, prefix, "dead-1", "1", "2", "3", "5", "11") // row 11: gone, no row has it

	out, errOut, code := ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t)},
		"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--schema", schema, "--json")
	require.Equal(t, exitOK, code, errOut)
	var got recoverJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.False(t, got.DryRun)
	assert.Equal(t, 2, got.PeersChecked)
	assert.Equal(t, 1, got.DeadPeers)
	assert.EqualValues(t, 3, got.RowsReset)
	require.Len(t, got.Peers, 1)
	assert.Equal(t, "recovered", got.Peers[0].Action)
	assert.Equal(t, 5, got.Peers[0].RowsFound)
	assert.Equal(t, []int64{11}, got.Peers[0].RowsGone, "a row no row has any more is gone, not reset")
	var text strings.Builder
	printRecover(&text, got)
	assert.Contains(t, text.String(), "recovered dead-1: 5 rows tracked, 3 reset to queued\n"+
		"  gone: 1 tracked rows no longer exist in the table (deleted since taken; nothing to reset): 11\n")

	status := map[int64]string{}
	rows, err := db.Query(ctx, `SELECT rowid, status FROM batchrows`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var s string
		require.NoError(t, rows.Scan(&id, &s))
		status[id] = s
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, "queued", status[1])
	assert.Equal(t, "queued", status[3])
	assert.Equal(t, "inprog", status[4], "a live worker's row is left alone")
	assert.Equal(t, "done", status[5], "a finished row stays finished")

	n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "dead-1").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "rows set deleted")
	member, err := rdb.SIsMember(ctx, store.RegistryKey(prefix), "dead-1").Result()
	require.NoError(t, err)
	assert.False(t, member, "deregistered")
	hb, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "recoveryctl").Heartbeat).Result()
	require.NoError(t, err)
	assert.Zero(t, hb)
	reg, err := rdb.SMembers(ctx, store.RegistryKey(prefix)).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"alive-1"}, reg, "recoveryctl never registers itself")

	// A second scan finds nothing to do; the text form says so.
	out, errOut, code = ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t)},
		"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--schema", schema)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, "1 registered instances checked, 0 dead, 0 rows reset\n"+
		"PostgreSQL: 1 rows in progress, every one in a live worker's rows set\n", out)
}

func TestRecoverWithOwnerFencingLeavesRowsOthersHold(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 4)
	schema := db.Config().ConnConfig.RuntimeParams["search_path"]
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead-1' WHERE rowid IN (1, 2)`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'other' WHERE rowid = 3`)
	require.NoError(t, err)
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-1", "1", "2", "3") // a stale member: row 3 is someone else's now
	plantAlive(t, rdb, prefix, "other")

	out, errOut, code := ctl(t, map[string]string{"DATABASE_URL": testutil.PostgresURL(t)},
		"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--schema", schema,
		"--owner-column", "owner", "--recovery-count-column", "recoveries")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "recovered dead-1: 3 rows tracked, 2 reset to queued")
	var status, owner string
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT status, owner, recoveries FROM batchrows WHERE rowid = 3`).Scan(&status, &owner, &n))
	assert.Equal(t, []any{"inprog", "other", 0}, []any{status, owner, n}, "a row another worker holds is left alone")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE rowid IN (1, 2) AND status = 'queued' AND owner IS NULL AND recoveries = 1`).Scan(&n))
	assert.Equal(t, 2, n, "the dead instance's own rows are queued, owner cleared, counted")
}

func TestRecoverWithoutADatabaseIsAUsageError(t *testing.T) {
	_, errOut, code := ctl(t, nil, "--redis-url", "redis://127.0.0.1:1", "recover")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "recover needs --database-url or DATABASE_URL")
}

func TestUnreachableServersAreNamedWithoutTheirPasswords(t *testing.T) {
	port := testutil.FreePort(t, false)
	redisURL := fmt.Sprintf("redis://admin:s3cretR@127.0.0.1:%d/0", port)
	_, errOut, code := ctl(t, map[string]string{"REDIS_URL": redisURL}, "workers")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, fmt.Sprintf("Redis at redis://admin:xxxxx@127.0.0.1:%d/0 unreachable", port))
	assert.Contains(t, errOut, "connection refused")
	assert.NotContains(t, errOut, "s3cretR")

	_, errOut, code = ctl(t, nil, "--cluster", fmt.Sprintf("127.0.0.1:%d", port), "--redis-url", redisURL, "workers")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, "unreachable")
	assert.NotContains(t, errOut, "s3cretR")

	// A reachable Redis, an unreachable PostgreSQL.
	url := testutil.RedisURL(t)
	pgPort := testutil.FreePort(t, false)
	dbURL := fmt.Sprintf("postgres://app:s3cretP@127.0.0.1:%d/x?sslmode=disable", pgPort)
	_, errOut, code = ctl(t, map[string]string{"DATABASE_URL": dbURL}, "--redis-url", url, "recover")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errOut, fmt.Sprintf("PostgreSQL at postgres://app:xxxxx@127.0.0.1:%d/x?sslmode=disable unreachable", pgPort))
	assert.NotContains(t, errOut, "s3cretP")

	// Malformed URLs are usage errors, and still masked.
	_, errOut, code = ctl(t, nil, "--redis-url", "redis://u:s3cretM@host:notaport", "workers")
	assert.Equal(t, exitUsage, code)
	assert.NotContains(t, errOut, "s3cretM")
}

func TestHelpNeverShowsCredentialsFromTheEnvironment(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://:s3cretH@h:1", "DATABASE_URL": "postgres://u:s3cretD@h/x"}
	out, errOut, code := ctl(t, env, "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "recoveryctl [flags] workers")
	assert.NotContains(t, out+errOut, "s3cret")
	_, errOut, code = ctl(t, env, "recover", "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "-dry-run")
	assert.NotContains(t, errOut, "s3cret")
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"workers", "extra"},
		{"--no-such-flag", "workers"},
		{"workers", "--timeout", "0s"},
	} {
		_, errOut, code := ctl(t, nil, args...)
		assert.Equal(t, exitUsage, code, "%q: %s", args, errOut)
	}
}

func TestParseInterleavedTakesFlagsAnywhere(t *testing.T) {
	o := &options{}
	fs := newTestFlagSet(o)
	pos, err := parseInterleaved(fs, []string{"--json", "a", "--prefix", "P", "b", "--", "--c"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "--c"}, pos)
	assert.True(t, o.json)
	assert.Equal(t, "P", o.prefix)
}

func newTestFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.registerCommon(fs)
	return fs
}

// client returns a client for url, closed when the test ends.
func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// dump returns the keys of the given instances and the registry, for
// comparing before and after.
func dump(t *testing.T, rdb redis.UniversalClient, prefix string, ids ...string) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	reg, err := rdb.SMembers(ctx, store.RegistryKey(prefix)).Result()
	require.NoError(t, err)
	out["registry"] = sortedStrings(reg)
	for _, id := range ids {
		k := store.InstanceKeys(prefix, id)
		rows, err := rdb.SMembers(ctx, k.Rows).Result()
		require.NoError(t, err)
		out[k.Rows] = sortedStrings(rows)
		claim, _ := rdb.Get(ctx, k.Claim).Result()
		out[k.Claim] = claim
	}
	return out
}

func sortedStrings(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// Issue 20: workers shows what the fleet under the prefix serves, and the
// heartbeat TTLs its members announced when they differ.
func TestWorkersShowsTheFleetRecord(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTLF")
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "serves", "database=test schema=public table=batchrows",
		"server", "system_identifier=42", "m:a", "2000 9000 1900 owner 99999999999999", "m:b", "20000 35000 19000 rows-set 99999999999999").Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "a", "b").Err())

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "workers")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "the fleet serves database=test schema=public table=batchrows on system_identifier=42 ("+prefix+"_FLEET)")
	assert.Contains(t, out, "heartbeat TTLs announced: 2s (a); 20s (b)")

	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "workers", "--json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Serves  string         `json:"serves"`
		Server  string         `json:"server"`
		Workers []instanceJSON `json:"workers"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, "database=test schema=public table=batchrows", got.Serves)
	assert.Equal(t, "system_identifier=42", got.Server)
	require.Len(t, got.Workers, 2)
	assert.Equal(t, int64(20000), got.Workers[1].AnnouncedTTLMs)
	assert.Equal(t, "rows-set", got.Workers[1].Mode)
}

// TestErrorsNameTheVariableASettingCameFrom: a schema that does not exist
// is named by RECOVERY_SCHEMA when the environment gave it, and by its
// option when a flag did.
func TestErrorsNameTheVariableASettingCameFrom(t *testing.T) {
	url := testutil.RedisURL(t)
	testutil.Postgres(t)
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t), postgres.EnvSchema: "no_such_schema",
		postgres.EnvMaxRecoveries: "3", postgres.EnvTerminalStatus: "dead"}
	base := []string{"--redis-url", url, "--prefix", testutil.Name("CTL"), "recover"}

	_, errOut, code := ctl(t, env, append(base, "--recovery-count-column", "n")...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "schema no_such_schema (RECOVERY_SCHEMA) does not exist")
	assert.NotContains(t, errOut, "WithSchema")

	_, errOut, code = ctl(t, env, append(base, "--recovery-count-column", "n", "--schema", "other_schema")...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "schema other_schema (WithSchema) does not exist", "the flag's value is not the variable's")

	// Refused before any connection, naming the variable too.
	_, errOut, code = ctl(t, env, base...)
	assert.Equal(t, exitUsage, code, errOut)
	assert.Contains(t, errOut, "max recoveries 3 (RECOVERY_MAX_RECOVERIES) needs a recovery count column (WithRecoveryCountColumn or RECOVERY_RECOVERY_COUNT_COLUMN)")
}

// TestWorkersShowsAKilledWorkerLateThenDead kills a real worker process
// with SIGKILL: its heartbeat key lives on for the TTL, but at once LAST
// BEAT grows from the kill and, past 1.5 heartbeat intervals, workers says
// "late"; once the key has expired, "dead".
func TestWorkersShowsAKilledWorkerLateThenDead(t *testing.T) {
	url := testutil.RedisURL(t)
	prefix := testutil.Name("CTL")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"=victim-1", "REDIS_URL="+url, ops.EnvKeyPrefix+"="+prefix)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "started\n", line)

	args := []string{"--redis-url", url, "--prefix", prefix, "--heartbeat-ttl", "3s", "--heartbeat-interval", "100ms", "workers"}
	out, errOut, code := ctl(t, nil, args...)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^victim-1\s+alive\s+\d+ms ago\s+`, out, "heartbeating")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = cmd.Wait()
	var late workersOut
	require.Eventually(t, func() bool {
		out, errOut, code := ctl(t, nil, append(args, "--json")...)
		require.Equal(t, exitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &late))
		return late.Workers[0].Late
	}, 2*time.Second, 20*time.Millisecond, "late well before the key expires")
	since := time.Since(killed)
	w := late.Workers[0]
	assert.True(t, w.Alive, "the key lives on")
	require.NotNil(t, w.LastBeatMs)
	assert.Greater(t, *w.LastBeatMs, int64(150), "past 1.5 intervals")
	assert.LessOrEqual(t, time.Duration(*w.LastBeatMs)*time.Millisecond, since+150*time.Millisecond,
		"LAST BEAT is the time since the last heartbeat, at most an interval before the kill")
	out, _, _ = ctl(t, nil, args...)
	assert.Regexp(t, `(?m)^victim-1\s+late\s+\S+ ago\s+`, out)
	assert.Contains(t, out, "1 registered in "+prefix+"_WORKER_REGISTRY: 1 alive (1 of them late), 0 dead")

	require.Eventually(t, func() bool {
		out, _, _ = ctl(t, nil, args...)
		return strings.Contains(out, "0 alive, 1 dead")
	}, 5*time.Second, 50*time.Millisecond)
	assert.Regexp(t, `(?m)^victim-1\s+dead\s+over 3s ago\s+-\s+`, out)
}

// TestRecoverDryRunFailsWhereTheRunWould: a dead instance whose rows set
// vanished after a failed recovery would be deregistered by a scan, which
// fails (recovery.ErrRowsSetLost); the dry run, which changes nothing,
// exits 1 too, naming it. The real run, which cannot list the rows in
// progress here, keeps it registered and fails.
func TestRecoverDryRunFailsWhereTheRunWould(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	testutil.Postgres(t)
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t)}
	prefix := testutil.Name("CTL")
	plantDead(t, rdb, prefix, "dead-lost")
	require.NoError(t, rdb.Set(context.Background(), store.InstanceKeys(prefix, "dead-lost").Claim, "failed", time.Minute).Err())
	base := []string{"--redis-url", url, "--prefix", prefix, "recover", "--fleet-down", "--no-schema-check"}

	out, errOut, code := ctl(t, env, append(base, "--dry-run")...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, out, "would deregister dead-lost: its rows set vanished after a failed recovery")
	assert.Contains(t, errOut, "rows set of a dead peer lost before its rows were reset: dead-lost: a scan would deregister them, and recover would exit 1")

	// The real run cannot tell the rows in progress (no table): it keeps
	// the dead instance registered rather than forget it.
	out, errOut, code = ctl(t, env, base...)
	assert.Equal(t, exitFail, code, errOut)
	assert.Contains(t, errOut, "backstop sweep: list rows in progress")
	assert.Contains(t, out, "kept dead-lost registered")
	member, err := rdb.SIsMember(context.Background(), store.RegistryKey(prefix), "dead-lost").Result()
	require.NoError(t, err)
	assert.True(t, member)
}

// TestWorkersShowsHowLongEachWorkerHasHeldItsOldestRow: a live worker's
// heartbeat reports how long it has held its oldest row, and workers and
// rows show it, aged on Redis's clock; a worker holding none shows none; a
// worker of an earlier release (no report) and a report a stranger
// overwrote show unknown, and nothing fails.
func TestWorkersShowsHowLongEachWorkerHasHeldItsOldestRow(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	ctx := context.Background()
	start := func(id string) *recovery.Worker {
		log, _ := testutil.Logger(t)
		w, err := recovery.New(rdb, &refuser{}, recovery.WithKeyPrefix(prefix), recovery.WithInstanceID(id), recovery.WithLogger(log),
			recovery.WithTimings(recovery.Timings{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: time.Second,
				RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}))
		require.NoError(t, err)
		require.NoError(t, w.Start(ctx))
		t.Cleanup(func() { _ = w.Shutdown(context.Background()) })
		return w
	}
	holder, idle := start("holder-1"), start("idle-1")
	tracked := time.Now()
	require.NoError(t, holder.Track(ctx, 7, 8))
	plantAlive(t, rdb, prefix, "old-1", "3") // a worker of an earlier release
	plantAlive(t, rdb, prefix, "odd-1")
	require.NoError(t, rdb.HSet(ctx, store.InstanceKeys(prefix, "odd-1").OldestRow, "x", "y").Err())
	_ = idle

	var got workersOut
	require.Eventually(t, func() bool { // poll: the age grows with the clock
		out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "--heartbeat-ttl", "1s", "--heartbeat-interval", "100ms", "workers", "--json")
		require.Equal(t, exitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		return len(got.Workers) == 4 && got.Workers[0].OldestRowMs != nil && *got.Workers[0].OldestRowMs >= 500
	}, 10*time.Second, 50*time.Millisecond, "holder-1 reports a row held half a second")
	byID := map[string]instanceJSON{}
	for _, w := range got.Workers {
		byID[w.InstanceID] = w
	}
	h := byID["holder-1"]
	assert.True(t, h.OldestRowKnown)
	assert.LessOrEqual(t, *h.OldestRowMs, time.Since(tracked).Milliseconds()+1000, "no older than the Track (to the second)")
	assert.True(t, byID["idle-1"].OldestRowKnown)
	assert.Nil(t, byID["idle-1"].OldestRowMs, "holds none")
	for _, id := range []string{"old-1", "odd-1"} {
		assert.False(t, byID[id].OldestRowKnown, id)
		assert.Nil(t, byID[id].OldestRowMs, id)
	}

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "--heartbeat-ttl", "1s", "--heartbeat-interval", "100ms", "workers")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^INSTANCE\s+STATE\s+LAST BEAT\s+HEARTBEAT TTL\s+ROWS\s+ROWS TTL\s+OLDEST ROW$`, out)
	assert.Regexp(t, `(?m)^holder-1\s+alive.*\s\d+(\.\d+)?m?s$`, out)
	assert.Regexp(t, `(?m)^idle-1\s+alive.*\snone$`, out)
	assert.Regexp(t, `(?m)^old-1\s+alive.*\sunknown$`, out)
	assert.Regexp(t, `(?m)^odd-1\s+alive.*\sunknown$`, out)

	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "--heartbeat-ttl", "1s", "--heartbeat-interval", "100ms", "rows", "holder-1")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `^instance holder-1: alive, .*, oldest row held \d+(\.\d+)?m?s\n7\n8\n$`, out)
}
