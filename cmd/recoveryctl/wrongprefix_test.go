package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
)

// TestRecoverRefusesAPrefixThatIsNotTheFleets: a live worker holds rows 1,
// 2 and 3 under prefix A; the operator runs recover against the same
// database under prefix B (--prefix forgotten or wrong). B has no fleet
// record and no registered instance, so every row in progress would look
// held by no rows set: recover and recover --dry-run refuse, naming the
// prefix and what the resetter serves, and the live worker's rows stay in
// progress. Under A with another table, recover refuses the mismatch,
// --fleet-down or not. Once the fleet is truly dead (the worker
// SIGKILLed), recover under B with --fleet-down resets the rows.
func TestRecoverRefusesAPrefixThatIsNotTheFleets(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	db := testutil.Postgres(t)
	schema := newcomerSchema(t, db)
	prefixA, prefixB := testutil.Name("CTLA"), testutil.Name("CTLB")
	dbURL := testutil.PostgresURL(t)
	cmd := startWorker(t, []string{trackerEnv + "=live-1", "REDIS_URL=" + url, "DATABASE_URL=" + dbURL,
		ops.EnvKeyPrefix + "=" + prefixA, "RECOVERY_SCHEMA=" + schema})
	require.Equal(t, map[int64]string{1: "inprog", 2: "inprog", 3: "inprog"}, inProgress(t, db))

	env := map[string]string{"DATABASE_URL": dbURL, "RECOVERY_SCHEMA": schema}
	// --heartbeat-ttl 1s and a --timeout that leaves time for the sweep's
	// second look: without the check, recover would reset the live rows.
	wrong := []string{"--redis-url", url, "--prefix", prefixB, "--heartbeat-ttl", "1s", "--timeout", "30s", "recover"}
	for _, extra := range [][]string{{"--dry-run"}, nil} {
		out, errOut, code := ctl(t, env, append(wrong, extra...)...)
		t.Logf("recover %v under %s:\n%s%s", extra, prefixB, out, errOut)
		assert.Equal(t, exitFail, code, extra)
		assert.Contains(t, errOut, `prefix "`+prefixB+`" has no fleet record`)
		assert.Contains(t, errOut, "the resetter serves database=")
		assert.Contains(t, errOut, "--fleet-down")
		assert.Empty(t, out)
	}
	assert.Equal(t, map[int64]string{1: "inprog", 2: "inprog", 3: "inprog"}, inProgress(t, db), "the live worker's rows untouched")

	// The fleet's prefix with another table: the record serves batchrows.
	other := []string{"--redis-url", url, "--prefix", prefixA, "--heartbeat-ttl", "1s", "--timeout", "30s", "recover",
		"--table", "batches", "--id-column", "batchid"}
	for _, extra := range [][]string{nil, {"--fleet-down"}} {
		_, errOut, code := ctl(t, env, append(other, extra...)...)
		assert.Equal(t, exitFail, code, extra)
		assert.Contains(t, errOut, "recovery: key prefix serves another fleet")
		assert.Contains(t, errOut, `the fleet record of prefix "`+prefixA+`" serves database=`)
		assert.Contains(t, errOut, "table=batchrows")
		assert.Contains(t, errOut, "the resetter serves database=")
	}
	assert.Equal(t, map[int64]string{1: "inprog", 2: "inprog", 3: "inprog"}, inProgress(t, db), "the live worker's rows untouched")
	member, err := rdb.SIsMember(ctx, store.RegistryKey(prefixA), "live-1").Result()
	require.NoError(t, err)
	assert.True(t, member)

	// The whole fleet down, said so: recover under B resets its rows.
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	// Dead as the newcomer's worker is: its keys expired, and the test's
	// Redis older than a heartbeat TTL (younger, the sweep judges nothing).
	keys := store.InstanceKeys(prefixA, "live-1")
	require.Eventually(t, func() bool { // real time: only the clock ends the rows set (a rows TTL, 3s)
		n, err := rdb.Exists(ctx, keys.Rows, keys.Incarnation, keys.Heartbeat).Result()
		return err == nil && n == 0
	}, 10*time.Second, 50*time.Millisecond, "the rows set expires")
	out, errOut, code := ctl(t, env, append(wrong, "--fleet-down")...)
	t.Logf("recover --fleet-down under %s:\n%s%s", prefixB, out, errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Empty(t, inProgress(t, db), "rows back in the queue")
}
