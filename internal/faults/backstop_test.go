//go:build faults

package faults

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 21: without an owner column, the database is the backstop. Each
// scenario runs workers with -guard status (a resetter without an owner
// column: rows-set mode, the backstop sweep on by default) and a fault
// after which no rows set holds some rows in progress. Their rows must be
// back in the queue within backstopBound. With FAULTS_NO_BACKSTOP=1 the
// workers run WithBackstopSweep(false), as releases before it did: the
// scenarios then fail, and say how many rows stayed in progress.

// backstopBound is the longest from the moment no rows set holds a row
// (and a sweeping worker is up) to its reset: two looks a rows TTL apart,
// each up to a jittered recovery interval late, and the slack.
const backstopBound = rowsTTL + 2*recoveryInterval*11/10 + slack

// backstopArgs are the flags of a backstop scenario's workers.
func backstopArgs(extra ...string) []string {
	args := []string{"-guard", "status"}
	if os.Getenv("FAULTS_NO_BACKSTOP") == "1" {
		args = append(args, "-no-backstop")
	}
	return append(args, extra...)
}

// inprogRows returns every row in progress.
func (e *env) inprogRows() []int64 {
	e.t.Helper()
	var ids []int64
	require.NoError(e.t, e.query(&ids, `SELECT coalesce(array_agg(rowid ORDER BY rowid), '{}') FROM `+e.table+` WHERE status = 'inprog'`))
	return ids
}

// waitBackstop waits until none of ids (in progress under owner) is, and
// records the time since since in the result.
func (e *env) waitBackstop(owner string, ids []int64, since time.Time) {
	e.t.Helper()
	e.res.Detection = e.waitReset(owner, ids, since, backstopBound)
	e.res.Bound = backstopBound
}

// redisOldEnough waits until Redis has been up long enough for the sweep
// to trust it (a heartbeat TTL, counted in whole seconds) and for a look
// or two after that: the sweep tells a host that does not Track only about
// rows committed while it was looking.
func (e *env) redisOldEnough() {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info, err := e.rdb.Info(context.Background(), "server").Result()
		if err != nil {
			return false
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
				n, err := strconv.Atoi(v)
				return err == nil && time.Duration(n)*time.Second >= ttl+time.Second+2*recoveryInterval
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond)
}

// toldUntracked checks that a live worker logged ErrUntrackedRows.
func (e *env) toldUntracked(live []*proc) {
	e.t.Helper()
	for _, p := range live {
		if strings.Contains(p.out.String(), "rows in progress that no worker tracked") {
			return
		}
	}
	e.t.Errorf("no live worker logged ErrUntrackedRows")
}

// Scenario B1: the whole fleet SIGKILLed together mid-block and down for
// longer than the rows TTL (a bad deploy): every rows set is gone when new
// workers start.
func TestScenarioB1WholeFleetDownPastTheRowsTTL(t *testing.T) {
	e := newEnv(t, "B1 whole fleet down past the rows TTL, no owner column", envConfig{rows: 300})
	old := e.start([]string{"b1-old1", "b1-old2", "b1-old3"}, backstopArgs()...)
	e.waitMidBlock(old[0])
	for _, p := range old {
		p.kill(t)
	}
	stranded := e.inprogRows()
	require.NotEmpty(t, stranded)
	time.Sleep(rowsTTL + ttl) // the fleet stays down: every rows set expires
	for _, p := range old {
		n, err := e.rdb.Exists(context.Background(), e.keysOf(p.id).Rows).Result()
		require.NoError(t, err)
		require.Zero(t, n, "rows set of %s expired", p.id)
	}
	back := time.Now()
	e.start([]string{"b1-new1", "b1-new2", "b1-new3"}, backstopArgs()...)
	e.waitBackstop(old[0].id, stranded, back)
	e.waitReset(old[1].id, e.inprogOf(old[1].id), back, backstopBound)
	e.waitReset(old[2].id, e.inprogOf(old[2].id), back, backstopBound)
	e.res.note("stranded=%d (no rows set left), measured from the new fleet's start", len(stranded))
	e.finish(true)
}

// Scenario B2: Redis flushed (FLUSHALL) right after a worker was
// SIGKILLed: its rows set and registry entry are gone; the live workers
// write theirs back at their next heartbeat.
func TestScenarioB2RedisFlushedAfterAWorkerDied(t *testing.T) {
	e := newEnv(t, "B2 SIGKILL, then FLUSHALL, no owner column", envConfig{rows: 300})
	ws := e.start([]string{"b2-w1", "b2-w2", "b2-w3"}, backstopArgs()...)
	victim := ws[0]
	// The bound leaves out the wait for a Redis server that started less
	// than a heartbeat TTL ago (docs/safety.md §5b): this scenario's server
	// is new, and a flush in its first seconds measured that wait too
	// (10.5 s against 9.2 s).
	e.redisOldEnough()
	e.waitMidBlock(victim)
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	require.NoError(t, e.rdb.FlushAll(context.Background()).Err())
	flushed := time.Now()
	e.waitBackstop(victim.id, stranded, flushed)
	e.res.note("stranded=%d", len(stranded))
	e.finish(true)
}

// Scenario B3: a misspelt in-progress status ('in_prog') in every
// worker's resetter, the fleet killed, and fixed by a restart that took
// longer than the rows TTL.
func TestScenarioB3MisspeltStatusFixedByASlowRestart(t *testing.T) {
	e := newEnv(t, "B3 misspelt status fixed by a restart longer than the rows TTL", envConfig{rows: 300})
	old := e.start([]string{"b3-old1", "b3-old2", "b3-old3"}, backstopArgs("-resetter-inprog", "in_prog")...)
	e.waitMidBlock(old[0])
	for _, p := range old {
		p.kill(t)
	}
	stranded := e.inprogRows()
	require.NotEmpty(t, stranded)
	time.Sleep(rowsTTL + ttl)
	back := time.Now()
	e.start([]string{"b3-new1", "b3-new2", "b3-new3"}, backstopArgs()...)
	e.waitBackstop(old[0].id, stranded, back)
	e.res.note("stranded=%d", len(stranded))
	e.finish(true)
}

// Scenario B4: a host that never calls Track, SIGKILLed mid-block. Its
// rows come back, and a live worker said so first (ErrUntrackedRows).
func TestScenarioB4TrackForgotten(t *testing.T) {
	e := newEnv(t, "B4 Track forgotten, host SIGKILLed", envConfig{rows: 300})
	good := e.start([]string{"b4-good1", "b4-good2"}, backstopArgs()...)
	e.redisOldEnough()
	bad := e.start([]string{"b4-bad"}, backstopArgs("-track", "never")...)[0]
	e.waitMidBlock(bad)
	killedAt := time.Now()
	bad.kill(t)
	stranded := e.inprogOf(bad.id)
	require.NotEmpty(t, stranded)
	e.waitBackstop(bad.id, stranded, killedAt)
	e.toldUntracked(good)
	e.res.note("stranded=%d", len(stranded))
	e.finish(true)
}

// Scenario B5: a host that tracks after its COMMIT, SIGKILLed between the
// two: its first block is in progress and in no rows set.
func TestScenarioB5TrackAfterCommitCrashInBetween(t *testing.T) {
	e := newEnv(t, "B5 Track after COMMIT, SIGKILL in between", envConfig{rows: 300})
	good := e.start([]string{"b5-good1", "b5-good2"}, backstopArgs()...)
	e.redisOldEnough()
	bad := e.spawn("bad-b5", nil, e.workerArgs("bad-b5", backstopArgs("-track", "after", "-die-after-commit")...)...)
	bad.wait(t, 20*time.Second)
	diedAt := time.Now()
	stranded := e.inprogOf(bad.id)
	require.NotEmpty(t, stranded)
	e.waitBackstop(bad.id, stranded, diedAt)
	e.toldUntracked(good)
	assert.True(t, bad.exited())
	e.res.note("stranded=%d", len(stranded))
	e.finish(true)
}
