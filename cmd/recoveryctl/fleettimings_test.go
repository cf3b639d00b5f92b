package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
)

// TestWorkersTakeEachWorkersTimingsFromTheFleetRecord: without
// --heartbeat-ttl, a worker killed a moment ago (heartbeat TTL 3s, which
// it announced in the fleet record) shows its true last-heartbeat age, not
// "?" nor "over 1m0s ago" from the library's default TTL; once its key has
// expired it is dead "over 3s ago". A flag still overrides the record.
func TestWorkersTakeEachWorkersTimingsFromTheFleetRecord(t *testing.T) {
	url := testutil.RedisURL(t)
	prefix := testutil.Name("CTL")
	cmd := startWorker(t, []string{victimEnv + "=victim-1", "REDIS_URL=" + url, ops.EnvKeyPrefix + "=" + prefix})
	args := []string{"--redis-url", url, "--prefix", prefix, "workers"}

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = cmd.Wait()
	out, errOut, code := ctl(t, nil, append(args, "--json")...)
	since := time.Since(killed)
	require.Equal(t, exitOK, code, errOut)
	var got workersOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Workers, 1)
	w := got.Workers[0]
	assert.EqualValues(t, 3000, w.AnnouncedTTLMs)
	require.NotNil(t, w.LastBeatMs, "the age is known from the TTL the worker announced")
	assert.LessOrEqual(t, time.Duration(*w.LastBeatMs)*time.Millisecond, since+150*time.Millisecond,
		"the time since the last heartbeat, at most an interval (100ms) before the kill")

	out, _, _ = ctl(t, nil, args...)
	assert.Regexp(t, `(?m)^victim-1\s+(alive|late)\s+\d+(ms|\.\d+s|s) ago\s+`, out)
	assert.Contains(t, out, "LAST BEAT: the heartbeat TTL each instance announced in the fleet record")

	// The flags override the record: with --heartbeat-ttl 10s, under 3s
	// left is over 7s ago, past 1.5 × --heartbeat-interval 1s.
	out, _, _ = ctl(t, nil, append(args, "--heartbeat-ttl", "10s", "--heartbeat-interval", "1s")...)
	assert.Contains(t, out, "LAST BEAT: --heartbeat-ttl 10s minus the heartbeat TTL left")
	assert.Regexp(t, `(?m)^victim-1\s+late\s+\d+(\.\d+)?s ago\s+`, out)

	require.Eventually(t, func() bool { // poll: only the clock ends the key (3s)
		out, _, _ = ctl(t, nil, args...)
		return strings.Contains(out, "0 alive, 1 dead")
	}, 5*time.Second, 50*time.Millisecond)
	assert.Regexp(t, `(?m)^victim-1\s+dead\s+over 3s ago\s+-\s+`, out)
}

// TestWorkersShowsAKilledWorkerLateThenDeadFromTheFleetRecordAlone:
// without a flag, a killed worker turns late, then dead, from the timings
// it announced in the fleet record (heartbeat TTL 3s). The record holds no
// interval, so late assumes half the TTL, the library's default (1.5s,
// late past 2.25s), though this worker beat every 100ms: late comes
// later than --heartbeat-interval 100ms would say, never sooner.
func TestWorkersShowsAKilledWorkerLateThenDeadFromTheFleetRecordAlone(t *testing.T) {
	url := testutil.RedisURL(t)
	prefix := testutil.Name("CTL")
	cmd := startWorker(t, []string{victimEnv + "=victim-1", "REDIS_URL=" + url, ops.EnvKeyPrefix + "=" + prefix})
	args := []string{"--redis-url", url, "--prefix", prefix, "workers"}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = cmd.Wait()

	var got workersOut
	require.Eventually(t, func() bool { // poll: only the clock makes it late
		out, errOut, code := ctl(t, nil, append(args, "--json")...)
		require.Equal(t, exitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.Len(t, got.Workers, 1)
		return got.Workers[0].Late || !got.Workers[0].Alive
	}, 5*time.Second, 20*time.Millisecond)
	since := time.Since(killed)
	w := got.Workers[0]
	require.True(t, w.Late, "late before dead: from 2.25s to 3s after the last heartbeat")
	require.NotNil(t, w.LastBeatMs)
	assert.Greater(t, *w.LastBeatMs, int64(2250), "late past 1.5 × half the announced TTL")
	assert.LessOrEqual(t, time.Duration(*w.LastBeatMs)*time.Millisecond, since+150*time.Millisecond,
		"the time since the last heartbeat, at most an interval before the kill")
	out, _, _ := ctl(t, nil, args...)
	assert.Regexp(t, `(?m)^victim-1\s+late\s+\d+(\.\d+)?s ago\s+`, out)
	assert.Contains(t, out, "half the TTL, the library's default")

	require.Eventually(t, func() bool { // poll: only the clock ends the key (3s)
		out, _, _ = ctl(t, nil, args...)
		return strings.Contains(out, "0 alive, 1 dead")
	}, 5*time.Second, 50*time.Millisecond)
	assert.Regexp(t, `(?m)^victim-1\s+dead\s+over 3s ago\s+-\s+`, out)
}
