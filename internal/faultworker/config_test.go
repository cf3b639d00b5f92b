package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestConfigTakesConnectionsFromTheEnvironmentOnly(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://app:envpw@h:1", "DATABASE_URL": "postgres://u:envpw@h/x"}
	var out bytes.Buffer
	c, err := parseConfig([]string{"-guard", "none", "-block", "7"}, func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.Equal(t, env["REDIS_URL"], c.redisURL)
	assert.Equal(t, env["DATABASE_URL"], c.databaseURL)
	assert.Equal(t, guardNone, c.guard)
	assert.Equal(t, 7, c.block)

	env = map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:1,127.0.0.1:2", "DATABASE_URL": "postgres://h/x"}
	c, err = parseConfig(nil, func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2"}, c.clusterAddrs)
	assert.Equal(t, guardOwner, c.guard, "owner fencing by default")

	env = map[string]string{"REDIS_SENTINEL_ADDRS": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "REDIS_SENTINEL_MASTER": "m1", "DATABASE_URL": "postgres://h/x"}
	c, err = parseConfig([]string{"-expiry-notifications"}, func(k string) string { return env[k] }, &out)
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, c.sentinelAddrs)
	assert.Equal(t, "m1", c.sentinelMaster)
	assert.True(t, c.expiry)
	rdb, err := openRedis(c)
	require.NoError(t, err)
	defer rdb.Close()
	_, isClient := rdb.(*redis.Client) // NewFailoverClient returns a *redis.Client
	assert.True(t, isClient, "a failover client for Sentinel")
}

func TestConfigWantsExactlyOneRedisAndAMasterNameWithSentinels(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"REDIS_URL": "redis://h:1", "REDIS_SENTINEL_ADDRS": "h:2", "REDIS_SENTINEL_MASTER": "m"},
			"set only one of REDIS_URL, REDIS_CLUSTER_ADDRS and REDIS_SENTINEL_ADDRS"},
		{map[string]string{"REDIS_SENTINEL_ADDRS": "h:2"}, "REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER go together"},
		{map[string]string{"REDIS_URL": "redis://h:1", "REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER go together"},
	} {
		tc.env["DATABASE_URL"] = "postgres://h/x"
		_, err := parseConfig(nil, func(k string) string { return tc.env[k] }, io.Discard)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

func TestConfigTakesTheRecovererFaults(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://h:1", "DATABASE_URL": "postgres://h/x", "RESET_DATABASE_URL": "postgres://proxy/x"}
	c, err := parseConfig([]string{"-recover-only", "-die-after-reset-of", "v1", "-delay-finish-of", "v2", "-finish-delay", "1s"},
		func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.True(t, c.recoverOnly)
	assert.Equal(t, "v1", c.dieAfterResetOf)
	assert.Equal(t, "v2", c.delayFinishOf)
	assert.Equal(t, "postgres://proxy/x", c.resetDatabaseURL)

	_, err = parseConfig([]string{"-delay-finish-of", "v2"}, func(k string) string { return env[k] }, io.Discard)
	require.ErrorContains(t, err, "-delay-finish-of and -finish-delay go together")
	_, err = parseConfig([]string{"-finish-delay", "-1s"}, func(k string) string { return env[k] }, io.Discard)
	require.ErrorContains(t, err, "-finish-delay -1s must not be negative")
}

func TestConfigNamesEveryProblem(t *testing.T) {
	_, err := parseConfig([]string{"-guard", "maybe", "-block", "0", "-poll", "0s"}, func(string) string { return "" }, io.Discard)
	require.Error(t, err)
	for _, want := range []string{"set REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS", "set DATABASE_URL",
		`-guard "maybe" must be owner, status or none`, "-block 0 must be at least 1", "-poll 0s must be positive"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestStartupErrorsNeverShowThePassword(t *testing.T) {
	port := testutil.FreePort(t, false)
	cfg := config{databaseURL: fmt.Sprintf("postgres://app:s3cretFW@127.0.0.1:%d/x?sslmode=disable&connect_timeout=2", port)}
	_, err := openPostgres(context.Background(), cfg, cfg.databaseURL)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PostgreSQL unreachable")
	assert.NotContains(t, err.Error(), "s3cretFW")

	_, err = openRedis(config{redisURL: "redis://u:s3cretFW@h:notaport"})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cretFW")
}

func TestDefaultFlagsMakeAValidWorkerForEveryGuard(t *testing.T) {
	getenv := func(k string) string {
		return map[string]string{"REDIS_URL": "redis://127.0.0.1:1", "DATABASE_URL": "postgres://127.0.0.1:1/x"}[k]
	}
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/x") // connects lazily
	require.NoError(t, err)
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, guard := range []string{guardOwner, guardStatus, guardNone} {
		c, err := parseConfig([]string{"-guard", guard, "-table", `odd"name; --`}, getenv, io.Discard)
		require.NoError(t, err)
		r, err := pgxreset.New(pool, c.resetterOptions()...)
		require.NoError(t, err, guard)
		_, err = recovery.New(rdb, r, c.options(slog.New(slog.DiscardHandler))...)
		require.NoError(t, err, guard)
	}
}
