//go:build faults

package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
)

// redisProxy puts a TCP proxy in front of the scenario's redis-server and
// returns it with the Redis URL that goes through it.
func (e *env) redisProxy() (*netfault.Proxy, string) {
	e.t.Helper()
	proxy, err := netfault.NewProxy(e.redisSrv.Addr)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { proxy.Close() })
	return proxy, strings.Replace(e.redisURL, e.redisSrv.Addr, proxy.Addr, 1)
}

// slowReply is how late Redis answers in scenario SR1: longer than the
// operation timeout (250 ms at the suite's timings), as the review's
// replies delayed by 1-3 s.
const slowReply = 1500 * time.Millisecond

// Scenario SR1: every Redis reply comes 1.5 s late (a proxy between the
// workers and redis-server holds each), for twice the TTL, and a worker is
// killed as it begins. Nothing can be recovered meanwhile, safely: the
// survivors fence themselves (lease lost) and no live worker's row is
// reset; each survivor's Warn says which assumption of the bound failed
// (Redis answering within the operation timeout). Once Redis answers in
// time again, the dead worker's rows come back within a scan.
func TestScenarioSR1RedisAnswersLaterThanTheOperationTimeout(t *testing.T) {
	e := newEnv(t, "SR1 Redis answers 1.5s late for 2x TTL, then in time", envConfig{rows: 300})
	proxy, viaProxy := e.redisProxy()
	ws := e.spawnStarted([]string{"sr1-w1", "sr1-w2", "sr1-w3"}, map[string]string{"REDIS_URL": viaProxy})
	victim, survivors := ws[0], ws[1:]
	e.waitMidBlock(victim)
	slowAt := time.Now()
	proxy.SlowReplies(slowReply)
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)

	time.Sleep(time.Until(slowAt.Add(2 * ttl))) // the fault itself: two TTLs of late replies
	assert.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND status = 'inprog'`, stranded),
		"nothing can be recovered while Redis answers late")
	const assumption = "Redis did not answer within the operation timeout 250ms: the crash bound assumes it does"
	said := 0
	for _, p := range survivors {
		for _, l := range p.lines("heartbeat failed; retrying") {
			if s, _ := l["error"].(string); strings.Contains(s, assumption) {
				said++
			}
		}
	}
	assert.Positive(t, said, "a survivor's heartbeat Warn named the assumption that failed")

	restoredAt := time.Now()
	proxy.SlowReplies(0)
	e.res.Detection = e.waitReset(victim.id, stranded, restoredAt, detectionBound)
	e.res.Bound = detectionBound
	e.waitGone(victim.id, e.goneWithin())
	e.finish(true)
	e.res.note("detection measured from Redis answering in time again; stranded=%d, every reply held %v for %v; heartbeat Warns naming the assumption: %d",
		len(stranded), slowReply, 2*ttl, said)
}
