//go:build faults

package faults

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Scenario CP1: a worker's resetter shares the host's pool, of one
// connection, and the host holds that connection in a long transaction
// (-stall-completion) when a peer dies. The starved worker is told at
// Start, and its recovery of the peer says it waited for a connection
// from its pool (postgres.ErrPoolExhausted), not "begin: context deadline
// exceeded". Once it is gone, a worker with room in its pool recovers
// every row; nothing is lost or done twice.
func TestScenarioCP1ResetterStarvedOfThePoolItSharesWithTheHost(t *testing.T) {
	e := newEnv(t, "CP1 resetter starved of the pool it shares with the host", envConfig{rows: 200, ownerMode: true})
	oneConn := withParam(t, e.dbURL, "pool_max_conns", "1")
	victim := e.start([]string{"cp1-victim"})[0]
	starved := e.spawnStarted([]string{"cp1-starved"}, map[string]string{"DATABASE_URL": oneConn},
		"-stall-completion", "1h")[0]
	const startWarn = "the resetter's connection pool had fewer connections free at Start than recovery uses at once (2); a host that shares the pool can hold them all, leaving dead peers' rows in progress until one is free: give the resetter a pool of its own (docs/operations.md)"
	require.Len(t, starved.lines(startWarn), 1, "told at Start")
	starved.waitLog(t, "fault: stalling in the completion transaction, holding the row's lock", 20*time.Second)
	e.waitMidBlock(victim)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)

	killedAt := time.Now()
	victim.kill(t)
	const waited = "recovery of dead peer found no free connection in the resetter's pool before its reset timeout; will retry: every connection was in use (the host's, when it shares the pool); give the resetter a pool of its own"
	starved.waitLog(t, waited, detectionBound+resetTimeout+slack)
	saidAfter := time.Since(killedAt)
	line := starved.lines(waited)[0]
	assert.Equal(t, victim.id, line["peer_id"])
	assert.Contains(t, line["error"], "for a connection from its pool (1 of 1 in use): give the resetter its own pool")
	assert.NotContains(t, line["error"], "begin: context deadline exceeded")
	assert.Len(t, e.inprogOf(victim.id), len(stranded), "no row came back while the only connection was held")

	starved.kill(t) // its connection closes: the stalled transaction rolls back
	e.start([]string{"cp1-w1"})
	e.finish(true)
	e.res.note("victim held %d rows; the starved worker said why %.2fs after the kill (bound %.1fs): %s",
		len(stranded), saidAfter.Seconds(), (detectionBound + resetTimeout + slack).Seconds(), line["error"])
}

// withParam returns the connection string dbURL with the parameter key
// set to value (a pool setting, or a session setting the server applies).
func withParam(t *testing.T, dbURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}
