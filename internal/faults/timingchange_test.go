//go:build faults

package faults

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t1Work is the work per row of scenario T1's long-timed worker: its block
// (15 s) outlasts the time from the restart to its second heartbeat, so
// the rows it holds at the restart are still in its hands when a verdict
// that ignored its TTL would have reset them.
const t1Work = 1500 * time.Millisecond

// Scenario T1 (issue 20, item 3): a rolling change of timings, then Redis
// restarts empty. One worker still runs the old timings (TTL 12 s, a
// heartbeat every 7 s, recovery interval 2 s), two the new ones (TTL 2 s).
// redis-server restarts empty right after the old worker's heartbeat: its
// next one comes 7 s later. The new workers' backstop sweep finds its rows
// in PostgreSQL and no heartbeat; judged by their own TTL (no verdict
// from a server up for less than it, then two sightings a TTL apart) they
// would reset them about 5 s after the restart, under its valid lease. Every heartbeat
// announces the worker's timings; verdicts wait for the fleet's longest
// TTL, which the new workers remember across the restart.
func TestScenarioT1RollingTimingChangeThenRedisRestartsEmpty(t *testing.T) {
	e := newEnv(t, "T1 rolling timing change (TTL 12 s and 2 s), Redis restarted empty", envConfig{rows: 200, ownerMode: true})
	old := e.start([]string{"t1-old"}, "-heartbeat-ttl", "12s", "-heartbeat-interval", "7s",
		"-recovery-interval", "2s", "-rows-ttl", "40s", "-work", t1Work.String())[0]
	e.start([]string{"t1-new1", "t1-new2"})
	e.waitMidBlock(old)
	// Two heartbeats of the new workers: each has learnt the old one's
	// TTL from the fleet record.
	time.Sleep(2 * interval)

	ctx := context.Background()
	hb := e.keysOf(old.id).Heartbeat
	require.Eventually(t, func() bool {
		left, err := e.rdb.PTTL(ctx, hb).Result()
		return err == nil && left > 12*time.Second-100*time.Millisecond
	}, 9*time.Second, 5*time.Millisecond, "the old worker's heartbeat")
	held := e.inprogOf(old.id)
	require.NotEmpty(t, held, "the old worker holds rows at the restart")
	restarted := time.Now()
	e.redisSrv.Restart()

	// Its second heartbeat after the restart, and the new workers' sweeps
	// meanwhile; then its block ends (15 s) and every row was tried.
	time.Sleep(15*time.Second + 2*t1Work)
	var byOthers, discarded int
	require.NoError(t, e.query(&byOthers, `SELECT count(DISTINCT rowid) FROM ledger WHERE rowid = ANY($1) AND instance <> $2`, held, old.id))
	require.NoError(t, e.query(&discarded, `SELECT count(*) FROM ledger WHERE rowid = ANY($1) AND instance = $2 AND outcome = 'discarded'`, held, old.id))
	e.res.note("held_at_restart=%d reset_under_live_worker=%d discarded=%d watched=%.1fs",
		len(held), byOthers, discarded, time.Since(restarted).Seconds())
	assert.Zero(t, byOthers, "rows the live old-timings worker held at the restart, processed by another worker")
	assert.Zero(t, discarded, "rows the live old-timings worker held at the restart, reset under it")
	e.finish(true)
}
