//go:build faults

package faults

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Host patterns (issue 32): the ways real hosts hold the library, in real
// processes against real servers, in owner mode and in rows-set mode.

// hostModes are the modes each host pattern runs in: owner mode; rows sets
// with owner fencing (-rows-sets); rows sets without an owner column (the
// status guard and the reset ledger), where a resumed worker's completion
// is not fenced, so only the rows done twice are measured.
var hostModes = []struct {
	name        string
	ownerMode   bool
	guard       string
	exactlyOnce bool
}{
	{"owner mode", true, "owner", true},
	{"rows sets, owner fencing", false, "owner", true},
	{"rows sets, no owner column", false, "status", false},
}

// firstLogTime is when worker p logged its first record with message msg.
func firstLogTime(t *testing.T, p *proc, msg string) time.Time {
	t.Helper()
	recs := p.lines(msg)
	require.NotEmpty(t, recs, "worker %s logged %q", p.id, msg)
	return logTime(t, recs[0])
}

// stopPastTheTTL SIGSTOPs worker p in the middle of a block, waits until
// its peers have reset the rows it held and a whole TTL has passed, and
// returns those rows; the caller resumes it.
func (e *env) stopPastTheTTL(p *proc) []int64 {
	e.t.Helper()
	e.waitMidBlock(p)
	stoppedAt := time.Now()
	p.signal(e.t, syscall.SIGSTOP)
	stranded := e.inprogOf(p.id)
	require.NotEmpty(e.t, stranded)
	e.res.Detection = e.waitReset(p.id, stranded, stoppedAt, detectionBound)
	e.res.Bound = detectionBound
	time.Sleep(time.Until(stoppedAt.Add(ttl))) // real time: stopped for a whole TTL at least
	return stranded
}

// Scenario H1: a host that abandons its block on a lost lease without
// Release (-host forgetful). A worker is SIGSTOPped past its TTL, peers
// recover its rows, and it is resumed: the worker gives back the rows its
// host left itself, takes rows again (in owner mode within a heartbeat
// interval of the regain, in rows-set mode when the hold ends) and every
// row is done exactly once. Before, its lease stayed lost for good.
func TestScenarioH1ForgetfulHostSigstopPastTheTTL(t *testing.T) {
	for _, m := range hostModes {
		t.Run("H1 forgetful host, SIGSTOP past the TTL ("+m.name+")", func(t *testing.T) {
			e := newEnv(t, "H1 forgetful host, SIGSTOP past the TTL ("+m.name+")", envConfig{rows: 400, ownerMode: m.ownerMode})
			ws := e.start([]string{"h1-w1", "h1-w2", "h1-w3"}, "-host", "forgetful", "-guard", m.guard)
			victim := ws[0]
			stranded := e.stopPastTheTTL(victim)
			var doneBefore int
			require.NoError(t, e.query(&doneBefore, `SELECT count(*) FROM ledger WHERE instance = $1 AND outcome = 'done'`, victim.id))
			victim.signal(t, syscall.SIGCONT)

			victim.waitLog(t, "giving back rows held when the lease was lost: the host did not release them (defer Block.Close, or Release the rows of an abandoned block)", 15*time.Second)
			regainedMsg := "heartbeat lease regained; worker re-registered; taking no rows until a recovery that claimed it meanwhile must have ended"
			if m.ownerMode {
				regainedMsg = "heartbeat lease regained; worker re-registered in a new life; rows of the ended life must be given back"
			}
			regained := firstLogTime(t, victim, regainedMsg)
			gaveBack := firstLogTime(t, victim, "giving back rows held when the lease was lost: the host did not release them (defer Block.Close, or Release the rows of an abandoned block)")
			e.finish(m.exactlyOnce)
			var doneAfter int
			require.NoError(t, e.query(&doneAfter, `SELECT count(*) FROM ledger WHERE instance = $1 AND outcome = 'done'`, victim.id))
			e.res.note("stranded=%d gave_back_after_regain=%.2fs victim_done_before=%d after_resume=%d",
				len(stranded), gaveBack.Sub(regained).Seconds(), doneBefore, doneAfter-doneBefore)
			assert.Greater(t, doneAfter, doneBefore, "the resumed worker takes rows again")
			if m.ownerMode {
				assert.Less(t, gaveBack.Sub(regained), interval, "owner mode: given back within a heartbeat interval of the regain")
			}
			assert.Empty(t, victim.lines("giving back the rows held when the lease was lost failed; retrying"))
		})
	}
}

// Scenario H2: hosts written with the Block handle (-host block), each
// worker with two fetch goroutines, every 7th row's processing panicking
// (the host's own recover stops it), every 5th fetch failing between its
// UPDATE and its COMMIT; one worker is SIGSTOPped past its TTL and resumed.
// Each deferred Close gives back what its block did not finish: every row
// is done exactly once (once at least without an owner column) and none is
// stuck.
func TestScenarioH2BlockHostsWithTwoFetchersPanicsAndFailedFetches(t *testing.T) {
	for _, m := range hostModes {
		t.Run("H2 block hosts ("+m.name+")", func(t *testing.T) {
			e := newEnv(t, "H2 block hosts, 2 fetchers, panics, failed fetches, SIGSTOP ("+m.name+")", envConfig{rows: 400, ownerMode: m.ownerMode})
			ws := e.start([]string{"h2-w1", "h2-w2", "h2-w3"}, "-host", "block", "-fetchers", "2",
				"-panic-every", "7", "-fail-fetch-every", "5", "-guard", m.guard)
			victim := ws[0]
			stranded := e.stopPastTheTTL(victim)
			victim.signal(t, syscall.SIGCONT)
			e.finish(m.exactlyOnce)
			panics, failed := 0, 0
			for _, p := range ws {
				panics += len(p.lines("processing stopped by a recovered fault; the block's deferred Close gave the rest back"))
				failed += len(p.lines("fetching a block failed; retrying"))
				if p != victim { // a Close the SIGSTOP caught may run out of time: the worker gives those rows back itself
					assert.Empty(t, p.lines("giving the rest of a block back failed; it stays tracked"), "worker %s", p.id)
				}
			}
			e.res.note("stranded=%d recovered_panics=%d failed_fetches=%d", len(stranded), panics, failed)
			assert.NotZero(t, panics)
			assert.NotZero(t, failed)
		})
	}
}

// Scenario H3: a panic in processing that crashes the process: one worker's
// 25th row panics and nothing recovers it (-panic-crash). The panicking
// goroutine's deferred Close gives its block back before the process dies,
// so the rows come back at once, not a crash bound later, and every row is
// done exactly once by the others.
func TestScenarioH3APanicCrashesAWorkerAfterItsBlocksClose(t *testing.T) {
	for _, m := range hostModes {
		t.Run("H3 panic crashes a block host ("+m.name+")", func(t *testing.T) {
			e := newEnv(t, "H3 panic crashes a block host ("+m.name+")", envConfig{rows: 300, ownerMode: m.ownerMode})
			e.start([]string{"h3-w1", "h3-w2"}, "-host", "block", "-guard", m.guard)
			crasher := e.start([]string{"bad-h3-crash"}, "-host", "block", "-guard", m.guard,
				"-panic-every", "25", "-panic-crash")[0]
			assert.Equal(t, 2, crasher.wait(t, 30*time.Second), "the panic crashed the process")
			assert.Contains(t, crasher.out.String(), "panic: fault: processing row")
			assert.NotEmpty(t, crasher.lines("released rows"), "the block's deferred Close gave it back before the crash")
			assert.Empty(t, e.inprogOf(crasher.id), "nothing left in progress by the crashed worker")
			e.finish(m.exactlyOnce)
		})
	}
}
