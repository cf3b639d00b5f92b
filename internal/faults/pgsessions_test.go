//go:build faults

package faults

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// l1IdleTimeout is the idle_in_transaction_session_timeout of the victim's
// sessions in scenario L1: what ends the session its vanished host left
// open. Long enough that rows stuck behind the lock would miss the
// detection bound by far.
const l1IdleTimeout = 15 * time.Second

// Scenario L1 (issue 20, item 5): a worker's host vanishes while a
// completion transaction of it holds a row lock. The worker's PostgreSQL
// connections go through a proxy that, once the host "vanishes", keeps the
// server side of a connection open after its client died (no FIN reaches
// PostgreSQL, as after a power loss); then the worker is SIGKILLed while
// stalled in the completion transaction, after its UPDATE locked the row.
// The session stays idle in transaction, holding the lock, until
// idle_in_transaction_session_timeout ends it (l1IdleTimeout; without it,
// TCP keepalive: about 2 h 11 min).
//
// The survivors must reset every other row of the victim within the
// detection bound (a reset never waits on the lock), keep the victim
// registered while the locked row stays in progress, and reset that row
// within a scan of the session's end. Nothing is lost or done twice.
func TestScenarioL1HostVanishesHoldingARowLock(t *testing.T) {
	e := newEnv(t, "L1 host vanishes mid-completion, row lock held", envConfig{rows: 200, ownerMode: true})
	proxy, viaProxy := e.postgresProxy()
	idleEnds := withParam(t, viaProxy, "idle_in_transaction_session_timeout", fmt.Sprint(l1IdleTimeout.Milliseconds()))

	victim := e.spawnStarted([]string{"l1-victim"}, map[string]string{"DATABASE_URL": idleEnds},
		"-stall-completion", "1h")[0]
	survivors := e.start([]string{"l1-w1", "l1-w2"})
	const stalling = "fault: stalling in the completion transaction, holding the row's lock"
	victim.waitLog(t, stalling, 20*time.Second)
	locked := int64(victim.lines(stalling)[0]["row_id"].(float64))
	stranded := e.inprogOf(victim.id)
	require.Contains(t, stranded, locked)
	others := slices.DeleteFunc(slices.Clone(stranded), func(id int64) bool { return id == locked })
	require.NotEmpty(t, others, "the victim holds more rows than the locked one")

	proxy.Vanish()
	killedAt := time.Now()
	victim.kill(t)
	var sessions int
	require.NoError(t, e.query(&sessions, `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND query LIKE 'UPDATE %'`))
	require.Equal(t, 1, sessions, "the vanished host's session is still open, idle in its transaction")

	e.res.Detection = e.waitReset(victim.id, others, killedAt, detectionBound)
	e.res.Bound = detectionBound
	assert.True(t, e.registered(victim.id), "kept registered while its locked row is in progress")
	assert.Equal(t, 1, e.count(`rowid = $1 AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, locked, victim.id),
		"the locked row waits for the session to end")
	lockedBound := l1IdleTimeout + scanBound + slack
	lockedBack := e.waitReset(victim.id, []int64{locked}, killedAt, lockedBound)
	e.waitGone(victim.id, scanBound+slack)
	warned := len(peerLines(survivors, "recovery of dead peer left rows another session holds locked (a transaction left open, perhaps on a host that vanished); it is retried at every scan until that session ends", victim.id))
	assert.Positive(t, warned, "a survivor said why the row stayed")
	e.finish(true)
	e.res.note("victim held %d rows, row %d locked; the other %d back %.2fs after the kill (bound %.1fs), the locked one %.2fs (session ended by idle_in_transaction_session_timeout %v; bound %.1fs); Warn lines %d",
		len(stranded), locked, len(others), e.res.Detection.Seconds(), detectionBound.Seconds(),
		lockedBack.Seconds(), l1IdleTimeout, lockedBound.Seconds(), warned)
}

// Scenario R1 (issue 20, item 7): a worker whose database session is
// read-only (default_transaction_read_only on for its role, as on a
// replica or a read endpoint) is refused at Start: it exits non-zero with
// ErrReadOnly's message, having registered nothing, and the fleet goes on.
func TestScenarioR1ReadOnlySessionRefusedAtStart(t *testing.T) {
	e := newEnv(t, "R1 read-only session refused at Start", envConfig{rows: 60, ownerMode: true})
	readOnly := withParam(t, e.dbURL, "default_transaction_read_only", "on")
	bad := e.spawn("bad-r1", map[string]string{"DATABASE_URL": readOnly}, e.workerArgs("bad-r1")...)
	code := bad.wait(t, 20*time.Second)
	assert.NotZero(t, code, "refused")
	assert.Contains(t, bad.out.String(), "recovery: database session is read-only: transaction_read_only is on")
	assert.False(t, e.registered("bad-r1"), "nothing written to Redis")

	e.start([]string{"r1-w1"})
	e.finish(true)
	e.res.note("the read-only worker exited %d at Start; the fleet finished every row", code)
}
