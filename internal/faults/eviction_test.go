//go:build faults

package faults

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// Timings of scenario E1: a heartbeat every 1.5 s, so that it is older
// than the other application's short-lived keys and volatile-lru (whose
// clock counts seconds) picks it.
const (
	e1TTL      = 4 * time.Second
	e1Interval = 1500 * time.Millisecond
	e1Pressure = 2 * e1TTL // pressure kept on after the kill
	// e1Bound: from the end of the evictions to the victim's rows reset:
	// the first look after them, which may still see the count moved (the
	// scan turn may pass to a worker whose last look came earlier), the
	// hold (a TTL from that look), and a scan: three jittered recovery
	// intervals, the TTL and the slack.
	e1Bound = e1TTL + 3*recoveryInterval*11/10 + slack
)

// Scenario E1, managed Redis (issue 20, item 4): redis-server with
// maxmemory, volatile-lru and CONFIG renamed away, shared with another
// application whose keys fill it (data without a TTL, a cache with one).
// Workers started with -accept-eviction (WithEvictionAccepted) process a
// batch in owner mode while the server evicts keys with a TTL, their
// heartbeats among them; one is SIGKILLed mid-block. No live worker's row
// is reset (no completion refused, none processed twice) though their
// heartbeats are evicted; the victim's rows come back once the evictions
// stop, within the hold and a scan; every row is done exactly once.
func TestScenarioE1ManagedRedisEvictsHeartbeatsUnderMemoryPressure(t *testing.T) {
	e := newEnv(t, "E1 managed redis: volatile-lru evicts heartbeats", envConfig{
		rows: 150, work: 100 * time.Millisecond, ownerMode: true,
		redisArgs: []string{"--maxmemory", "16mb", "--maxmemory-policy", "volatile-lru",
			"--rename-command", "CONFIG", "", "--notify-keyspace-events", "Ke"},
	})
	rdb := e.rdb.(*redis.Client)
	ctx := context.Background()
	require.Error(t, rdb.ConfigGet(ctx, "maxmemory-policy").Err(), "CONFIG is renamed away")
	testutil.Ballast(t, rdb, "otherapp", 1<<20)

	ids := []string{"e1-v", "e1-w1", "e1-w2"}
	var beats []string
	var channels []string
	for _, id := range ids {
		beats = append(beats, e.keysOf(id).Heartbeat)
		channels = append(channels, "__keyspace@0__:"+e.keysOf(id).Heartbeat)
	}
	sub := rdb.Subscribe(ctx, channels...)
	t.Cleanup(func() { sub.Close() })
	_, err := sub.Receive(ctx)
	require.NoError(t, err)

	ws := e.start(ids, "-accept-eviction", "-heartbeat-ttl", e1TTL.String(),
		"-heartbeat-interval", e1Interval.String(), "-rows-ttl", (3 * e1TTL).String())
	victim, live := ws[0], ws[1:]
	pctx, stopPressure := context.WithCancel(ctx)
	pressed := make(chan int, 1)
	go func() { pressed <- testutil.Pressure(pctx, rdb, "otherapp") }()
	pressureAt := time.Now()
	first := testutil.AwaitEvicted(t, sub, 20*time.Second, beats...)
	firstAfter := time.Since(pressureAt)

	e.waitMidBlock(victim)
	victim.kill(t)
	killedAt := time.Now()
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	// Count the evictions of the live workers' heartbeats while the
	// pressure lasts.
	liveEvicted := 0
	if first != beats[0] {
		liveEvicted++
	}
	watch := time.NewTimer(time.Until(killedAt.Add(e1Pressure)))
	for done := false; !done; {
		select {
		case m := <-sub.Channel():
			if m.Payload == "evicted" && m.Channel != channels[0] {
				liveEvicted++
			}
		case <-watch.C:
			done = true
		}
	}
	stopPressure()
	written := <-pressed
	evicted := testutil.InfoField(t, rdb, "stats", "evicted_keys")
	testutil.DropPressure(t, rdb, "otherapp")
	stoppedAt := time.Now()

	e.res.Detection = e.waitReset(victim.id, stranded, stoppedAt, e1Bound)
	e.res.Bound = e1Bound
	e.finish(true)

	held := 0
	for _, p := range live {
		held += len(p.lines("dead peers not judged: the Redis server evicted keys less than a heartbeat TTL ago, so an absent heartbeat may be a live worker's"))
	}
	assert.NotZero(t, liveEvicted, "a live worker's heartbeat was evicted")
	assert.NotZero(t, held, "a live worker held its verdicts while the server evicted")
	assert.Zero(t, e.res.Discarded, "no completion refused: no row was reset under a live worker")
	assert.Zero(t, e.res.ProcessedTwice, "no row processed twice")
	assert.Zero(t, e.count(`recoveries > 0 AND NOT rowid = ANY($1)`, stranded), "no row of a live worker reset")
	e.res.note("detection measured from the end of the evictions (bound: TTL hold + 2 scans + slack); stranded=%d; first heartbeat eviction %.2fs into the pressure; live heartbeats evicted %d times; %d keys written, %d evicted; hold logged %d times",
		len(stranded), firstAfter.Seconds(), liveEvicted, written, evicted, held)
}
