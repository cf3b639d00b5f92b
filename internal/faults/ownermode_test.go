//go:build faults

package faults

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Owner mode (issue 14): the workers' default with owner fencing. No rows
// set exists; a dead worker's rows are reset by owner; the owners of rows
// in progress in PostgreSQL are always part of what recovery looks at.

// sweepBound is the longest a dead worker's rows may stay in progress when
// only the backstop sweep can find it (Redis lost its registry entry): its
// heartbeat gone (a TTL), then two sweeps a TTL apart, each up to a
// recovery interval (+10%) after the last, and the sweep turn held by a
// worker that may have to wait out a dead holder's turn (2.2 intervals).
const sweepBound = 2*ttl + recoveryInterval*11/10*2 + recoveryInterval*22/10 + slack

// noRowsSets asserts that no worker of ids has a rows set.
func (e *env) noRowsSets(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		n, err := e.rdb.Exists(context.Background(), e.keysOf(id).Rows).Result()
		require.NoError(e.t, err)
		assert.Zero(e.t, n, "owner mode: %s has no rows set", id)
	}
}

// Scenario O3: a worker is SIGKILLed and redis-server restarts empty right
// after, before anyone recovered it: the registry, its heartbeat and every
// key are gone, so no scan can ever find it. In rows-set mode its rows
// would stay in progress for good (without WithBackstopSweep); in owner
// mode the owners in PostgreSQL bring them back within the sweep bound.
func TestScenarioO3OwnerModeRedisForgetsADeadWorker(t *testing.T) {
	e := newEnv(t, "O3 owner mode: SIGKILL, then Redis restarted empty", envConfig{rows: 300, ownerMode: true})
	ws := e.start([]string{"o3-w1", "o3-w2", "o3-w3"})
	victim := ws[0]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	e.redisSrv.Restart()
	member, err := e.rdb.SIsMember(context.Background(), e.registry(), victim.id).Result()
	require.NoError(t, err)
	require.False(t, member, "Redis forgot the dead worker")

	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, sweepBound)
	e.res.Bound = sweepBound
	e.res.note("stranded=%d found_by=sweep", len(stranded))
	e.finish(true)
}

// Scenario M1: a fleet in the middle of a rolling upgrade. Two workers run
// as releases before owner mode did (-rows-sets: rows sets with owner
// fencing), two in owner mode; one of each is SIGKILLed mid-block. The
// rows-set worker's rows are recovered by whoever scans (an owner-mode
// recoverer resets by owner); the owner-mode worker's rows, which no rows
// set lists, by an owner-mode recoverer, or, should a rows-set recoverer
// have deregistered it first, by the sweep. Nothing lost, nothing done
// twice.
func TestScenarioM1MixedFleetDuringARollingUpgrade(t *testing.T) {
	e := newEnv(t, "M1 mixed fleet: rows-set and owner-mode workers, one of each killed", envConfig{rows: 400, ownerMode: true})
	old := e.start([]string{"m1-old1", "m1-old2"}, "-rows-sets")
	cur := e.start([]string{"m1-new1", "m1-new2"})
	e.waitMidBlock(old[0])
	e.waitMidBlock(cur[0])
	killedAt := time.Now()
	old[0].kill(t)
	cur[0].kill(t)
	strandedOld := e.inprogOf(old[0].id)
	strandedNew := e.inprogOf(cur[0].id)
	require.NotEmpty(t, strandedOld)
	require.NotEmpty(t, strandedNew)

	dOld := e.waitReset(old[0].id, strandedOld, killedAt, detectionBound)
	dNew := e.waitReset(cur[0].id, strandedNew, killedAt, sweepBound)
	e.res.Detection = max(dOld, dNew)
	e.res.Bound = sweepBound
	e.res.note("stranded_rows_set_worker=%d (%.2fs) stranded_owner_mode_worker=%d (%.2fs)",
		len(strandedOld), dOld.Seconds(), len(strandedNew), dNew.Seconds())
	e.finish(true)
}
