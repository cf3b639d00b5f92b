//go:build faults

package faults

// Scenarios of issue 10 for F3 (one process per instance ID) and F7 (no
// death verdict from a Redis restarted with data less than a TTL ago),
// with real worker processes and a real redis-server. twin_test.go and
// nodeage_test.go in the root package hold the in-process tests of the
// same faults.

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
)

// logTime returns the time of a worker's JSON log record.
func logTime(t *testing.T, rec map[string]any) time.Time {
	t.Helper()
	s, _ := rec["time"].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err, "time of log record %v", rec)
	return at
}

// doneCount returns how many rows the ledger holds as done.
func (e *env) doneCount() int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.query(&n, `SELECT count(*) FROM ledger WHERE outcome = 'done'`))
	return n
}

// f7RowsTTL is the rows TTL of scenario F7. The victim's rows set comes
// back from the snapshot with the expiry it had at the SAVE (its last
// heartbeat + rows TTL); it must outlive the dump's age (TTL + 0.5 s),
// the grace after the restart (a TTL, + up to 1 s as uptime_in_seconds is
// whole seconds) and a scan: with the suite's 6 s it would expire about
// when the grace ends (docs/reliability.md).
const f7RowsTTL = 20 * time.Second

// f7Work is the work per row in scenario F7: a block (8 s) outlasts the
// snapshot's age at the restart, so the live workers still hold rows of
// the block they had tracked at the SAVE when the server comes back, and
// the restored rows sets name them.
const f7Work = 800 * time.Millisecond

// f7Bound is the longest from the restart to a dead worker's rows reset:
// the grace (TTL + 1 s of uptime rounding), then a scan.
const f7Bound = ttl + time.Second + scanBound

// Scenario F7: three workers with owner fencing; one is SIGKILLed
// mid-block and a SAVE is taken at once, its heartbeat still alive. Right
// after the SAVE the test takes the victim's recovery claim, as a
// recoverer busy with it when Redis went down would hold it: no live
// worker can recover the victim before the restart, and the claim is not
// in the snapshot (the in-process test refuses the resets instead; a
// reset that hangs in a cut proxy may land after the restart on a verdict
// the old server gave, which is no F7 verdict). The two others keep
// working past the TTL, so every heartbeat in the snapshot has expired
// when redis-server is SIGKILLed and restarted from it: the registry and
// the rows sets come back, no heartbeat does. The moment it answers,
// both live workers are told to recover now (SIGUSR1), before their next
// heartbeat: the server reports them dead, and the uptime check must hold
// every verdict for a TTL. Nothing of theirs may be reset (with owner
// fencing a reset under a live worker shows as a refused completion);
// the victim's rows stay in progress until a TTL after the restart and
// are reset within a scan of the grace's end.
func TestScenarioF7RedisRestartedFromASnapshotOlderThanTheTTL(t *testing.T) {
	e := newEnv(t, "F7 redis-server restarted from a snapshot older than the TTL", envConfig{rows: 40, work: f7Work})
	ws := e.start([]string{"f7-v", "f7-w1", "f7-w2"}, "-rows-ttl", f7RowsTTL.String())
	victim, live := ws[0], ws[1:]
	e.waitMidBlock(victim)
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	ctx := context.Background()
	n, err := e.rdb.Exists(ctx, e.keysOf(victim.id).Heartbeat).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the victim's heartbeat is alive in the snapshot")
	heldAtSave := map[string][]int64{}
	for _, p := range live {
		heldAtSave[p.id] = e.inprogOf(p.id)
	}
	require.NoError(t, e.rdb.Save(ctx).Err())
	savedAt := time.Now()
	require.NoError(t, e.rdb.Set(ctx, e.keysOf(victim.id).Claim, "f7-recoverer-lost-with-the-restart", time.Minute).Err())

	// Keep working past the TTL: the snapshot's heartbeats all expire.
	doneAtSave := e.doneCount()
	time.Sleep(time.Until(savedAt.Add(ttl + 500*time.Millisecond)))
	require.Greater(t, e.doneCount(), doneAtSave, "the live workers kept working after the snapshot")
	require.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id),
		"the victim is still to recover at the restart (its claim was held)")

	atRisk := 0 // rows in the snapshot's rows sets that live workers still hold
	for _, p := range live {
		atRisk += e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, heldAtSave[p.id], p.id)
	}
	require.NotZero(t, atRisk, "the live workers still hold rows tracked before the snapshot")
	restartAt := time.Now()
	e.redisSrv.RestartKeepingData()
	upAfter := time.Since(restartAt)
	dumpAge := restartAt.Sub(savedAt)
	for _, p := range live {
		p.signal(t, syscall.SIGUSR1) // recover now, before this worker's next heartbeat
	}

	// No verdict for a TTL after the restart: the victim's rows are still
	// in progress just before it ends.
	time.Sleep(time.Until(restartAt.Add(ttl - 50*time.Millisecond)))
	assert.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id),
		"the victim's rows reset less than a heartbeat TTL after the restart")
	e.res.Detection = e.waitReset(victim.id, stranded, restartAt, f7Bound)
	e.res.Bound = f7Bound
	e.waitGone(victim.id, e.goneWithin())

	held := 0
	for _, p := range live {
		hs := p.lines("dead peers not judged yet: the Redis server restarted or was promoted less than a heartbeat TTL ago, so live workers may not have written their heartbeat again")
		assert.LessOrEqual(t, len(hs), 1, "%s logged the hold once per restart", p.id)
		held += len(hs)
	}
	assert.NotZero(t, held, "a live worker held its verdicts after the restart")

	e.finish(true)
	recoveredLive, lost := 0, 0
	for _, p := range live {
		recoveredLive += len(peerLines(live, "recovered rows of dead peer", p.id))
		lost += len(p.lines("heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones"))
	}
	assert.Zero(t, recoveredLive, "no live worker was recovered")
	assert.Zero(t, e.res.Discarded, "no completion refused: no row was reset under a live worker")
	assert.Zero(t, e.res.ProcessedTwice, "no row processed twice")
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 1`, stranded), "each of the victim's rows reset once")
	assert.Zero(t, e.count(`recoveries > 0 AND NOT rowid = ANY($1)`, stranded), "no other row reset")
	e.res.note("detection measured from the restart (bound: TTL + 1s uptime rounding + scan); stranded=%d; live rows at risk (in the restored rows sets, held at the restart)=%d; snapshot %.2fs old at the restart; redis-server answering %.2fs after the kill; hold logged by %d of 2 live workers; leases lost %d",
		len(stranded), atRisk, dumpAge.Seconds(), upAfter.Seconds(), held, lost)
}

// Scenario F3, twin: a second process is started with the instance ID of
// a live worker. Its Start sees the heartbeat refreshed by the first and
// fails with ErrInstanceIDInUse; it exits 1 having written nothing (the
// heartbeat holds the first's value all along, the incarnation is the
// first's) and taken no row. The first never notices and finishes the
// batch alone.
func TestScenarioF3SecondProcessWithALiveWorkersInstanceIDIsRefused(t *testing.T) {
	e := newEnv(t, "F3 second process with a live worker's instance ID", envConfig{rows: 200})
	const id = "f3-twin"
	first := e.start([]string{id})[0]
	ctx := context.Background()
	k := e.keysOf(id)
	beat, err := e.rdb.Get(ctx, k.Heartbeat).Result()
	require.NoError(t, err)
	incarnation, err := e.rdb.Get(ctx, k.Incarnation).Result()
	require.NoError(t, err)

	spawnedAt := time.Now()
	// Labelled bad-: the suite's checker expects it to have failed.
	twin := e.spawn("bad-twin", nil, e.workerArgs(id)...)
	reads, foreign := 0, 0
	for !twin.exited() {
		v, err := e.rdb.Get(ctx, k.Heartbeat).Result()
		reads++
		if err != nil || v != beat {
			foreign++
		}
		require.Less(t, time.Since(spawnedAt), 20*time.Second, "the twin is still running")
		time.Sleep(2 * time.Millisecond)
	}
	refusedAfter := time.Since(spawnedAt)
	assert.Equal(t, 1, twin.state.ExitCode(), "the twin's exit status")
	msg := firstError(twin)
	assert.Contains(t, msg, recovery.ErrInstanceIDInUse.Error())
	assert.Contains(t, msg, "was refreshed by another process")
	assert.Empty(t, twin.lines("faultworker started"), "the twin never started")
	assert.Zero(t, foreign, "the heartbeat held the first process's value in all %d reads while the twin ran", reads)
	got, err := e.rdb.Get(ctx, k.Incarnation).Result()
	require.NoError(t, err)
	assert.Equal(t, incarnation, got, "the incarnation is still the first process's")

	// The first keeps processing: a block more done after the twin left.
	doneAtRefusal := e.doneCount()
	require.Eventually(t, func() bool { return e.doneCount() >= doneAtRefusal+block }, 10*time.Second, 10*time.Millisecond,
		"the first process kept processing")
	e.finish(true)
	assert.Empty(t, first.lines("heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones"),
		"the first process kept its lease")
	assert.NotContains(t, first.out.String(), "another process heartbeats this instance ID")
	assert.Zero(t, e.count(`recoveries > 0`), "no row was ever reset")
	assert.Zero(t, e.res.Discarded)
	e.res.note("twin refused and exited %.2fs after it was spawned (watch: interval + op timeout + interval/10 = 0.8s); heartbeat read %d times meanwhile; error %q",
		refusedAfter.Seconds(), reads, msg)
}

// Scenario F3, fixed ID restarted: a worker with a fixed instance ID (a
// StatefulSet pod) is SIGKILLed mid-block and started again at once with
// the same ID, alone in the fleet. Its Start waits out the old heartbeat
// (nothing is reset and it does not start before the key expires), then
// recovers the predecessor's rows itself (reset once), and the new
// process does the rest of the batch: every row done once.
func TestScenarioF3FixedInstanceIDRestartedAfterSIGKILL(t *testing.T) {
	e := newEnv(t, "F3 fixed instance ID SIGKILLed mid-block, restarted", envConfig{rows: 200})
	const id = "f3-pod-0"
	old := e.start([]string{id})[0]
	e.waitMidBlock(old)
	killedAt := time.Now()
	old.kill(t)
	stranded := e.inprogOf(id)
	require.NotEmpty(t, stranded)
	ctx := context.Background()
	k := e.keysOf(id)
	tracked, err := e.rdb.SCard(ctx, k.Rows).Result()
	require.NoError(t, err)
	pttl, err := e.rdb.PTTL(ctx, k.Heartbeat).Result()
	require.NoError(t, err)
	require.Positive(t, pttl, "the predecessor's heartbeat is still alive")
	expiresAt := time.Now().Add(pttl)
	doneAtKill := e.doneCount()

	restarted := e.spawn(id, nil, e.workerArgs(id)...)
	// Until the old heartbeat expires: no reset, not started.
	early := 0
	for time.Now().Before(expiresAt.Add(-20 * time.Millisecond)) {
		if e.count(`recoveries > 0`) > 0 || len(restarted.lines("faultworker started")) > 0 {
			early++
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.Zero(t, early, "a row was reset, or the new process started, while the predecessor's heartbeat lived")

	deadline := killedAt.Add(detectionBound + 10*time.Second)
	for e.count(`rowid = ANY($1) AND recoveries = 1`, stranded) < len(stranded) {
		require.False(t, time.Now().After(deadline), "the predecessor's rows not reset %v after the kill", time.Since(killedAt))
		require.False(t, restarted.exited(), "the restarted process exited:\n%s", tail(restarted.out.String(), 20))
		time.Sleep(10 * time.Millisecond)
	}
	e.res.Detection, e.res.Bound = time.Since(killedAt), detectionBound
	assert.LessOrEqual(t, e.res.Detection, detectionBound)
	restarted.waitLog(t, "faultworker started", 10*time.Second)
	startedAt := logTime(t, restarted.lines("faultworker started")[0])
	assert.False(t, startedAt.Before(expiresAt.Add(-10*time.Millisecond)),
		"started %v before the predecessor's heartbeat expired", expiresAt.Sub(startedAt))
	rec := restarted.lines("recovered rows a previous process left under this instance ID")
	if assert.Len(t, rec, 1, "the new process's Start recovered its predecessor") {
		assert.EqualValues(t, tracked, rec[0]["rows_found"])
		assert.EqualValues(t, len(stranded), rec[0]["rows_reset"])
	}
	waited := len(restarted.lines("a previous process with this instance ID stopped refreshing its heartbeat; waiting for it to expire before starting"))

	e.finish(true)
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 1`, stranded), "each of the predecessor's rows reset once")
	assert.Zero(t, e.count(`recoveries > 0 AND NOT rowid = ANY($1)`, stranded), "no other row reset")
	assert.Zero(t, e.res.Discarded)
	stopped := restarted.lines("faultworker stopped")
	if assert.Len(t, stopped, 1) {
		assert.EqualValues(t, e.cfg.rows-doneAtKill, stopped[0]["rows_done"], "the new process did every row not done at the kill")
	}
	e.res.note("stranded=%d tracked=%d; heartbeat had %.2fs left at the kill; new process started %.2fs after the kill, %.3fs after that heartbeat expired; waiting warned: %d; rows done by the new process %d",
		len(stranded), tracked, pttl.Seconds(), startedAt.Sub(killedAt).Seconds(), startedAt.Sub(expiresAt).Seconds(), waited, e.cfg.rows-doneAtKill)
}
