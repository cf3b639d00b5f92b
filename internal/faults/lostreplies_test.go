//go:build faults

package faults

// Scenarios of issue 10 (F1, F2, F4, F8) with real worker processes: the
// interleavings an adversarial review found, each injected at the step it
// names. docs/safety.md §9 names the root package's in-process
// regressions of the same faults.

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/store"
)

// postgresProxy puts a TCP proxy in front of the scenario's PostgreSQL
// and returns it with the database URL that goes through it.
func (e *env) postgresProxy() (*netfault.Proxy, string) {
	e.t.Helper()
	u, err := url.Parse(e.dbURL)
	require.NoError(e.t, err)
	proxy, err := netfault.NewProxy(u.Host)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr
	return proxy, u.String()
}

// spawnStarted starts workers with environment overrides and the
// scenario's flags plus extra, and waits until each has started.
func (e *env) spawnStarted(ids []string, overrides map[string]string, extra ...string) []*proc {
	e.t.Helper()
	var ps []*proc
	for _, id := range ids {
		ps = append(ps, e.spawn(id, overrides, e.workerArgs(id, extra...)...))
	}
	for _, p := range ps {
		p.waitLog(e.t, "faultworker started", 20*time.Second)
	}
	return ps
}

// peerLines returns the log records with message msg about peer, from
// every worker of ps.
func peerLines(ps []*proc, msg, peer string) []map[string]any {
	var out []map[string]any
	for _, p := range ps {
		for _, l := range p.lines(msg) {
			if l["peer_id"] == peer {
				out = append(out, l)
			}
		}
	}
	return out
}

// rowsReset sums rows_reset over log records.
func rowsReset(lines []map[string]any) int {
	n := 0
	for _, l := range lines {
		if v, ok := l["rows_reset"].(float64); ok {
			n += int(v)
		}
	}
	return n
}

// registered reports whether id is in the worker registry.
func (e *env) registered(id string) bool {
	e.t.Helper()
	member, err := e.rdb.SIsMember(context.Background(), e.registry(), id).Result()
	require.NoError(e.t, err)
	return member
}

// rowsSet returns the members of id's rows set.
func (e *env) rowsSet(id string) map[string]bool {
	e.t.Helper()
	members, err := e.rdb.SMembers(context.Background(), e.keysOf(id).Rows).Result()
	require.NoError(e.t, err)
	set := map[string]bool{}
	for _, m := range members {
		set[m] = true
	}
	return set
}

// missingFrom returns the rows of ids that are not in set.
func missingFrom(set map[string]bool, ids []int64) []int64 {
	var out []int64
	for _, id := range ids {
		if !set[strconv.FormatInt(id, 10)] {
			out = append(out, id)
		}
	}
	return out
}

// exitedBySignal waits until one of ps ends by a signal and returns it.
func exitedBySignal(t *testing.T, ps []*proc, timeout time.Duration) *proc {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, p := range ps {
			if p.exited() && p.killedByTest() {
				return p
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no worker was killed within %v", timeout)
	return nil
}

// waitTakenAgain waits until none of ids is queued: every row reset by a
// recovery has been taken again by a live worker (or finished).
func (e *env) waitTakenAgain(ids []int64, timeout time.Duration) time.Duration {
	e.t.Helper()
	start := time.Now()
	require.Eventually(e.t, func() bool {
		return e.count(`rowid = ANY($1) AND status = 'queued'`, ids) == 0
	}, timeout, 5*time.Millisecond, "rows reset by the recovery taken again by live workers")
	return time.Since(start)
}

// Scenario F1: a worker is SIGKILLed mid-block while PostgreSQL is
// unreachable for every worker (a black-hole proxy between the workers
// and the database) for three rows TTLs. Recovery fails on every scan;
// the dead worker's rows set must outlive the outage (the claim renews
// it) and the worker must stay registered; once PostgreSQL is back every
// row comes back, and the worker is deregistered only after its rows were
// reset. (Before the fix the set expired one rows TTL after the last
// heartbeat and the next scan deregistered the worker: its rows stayed in
// progress for good.)
func TestScenarioF1PostgresUnreachableForSeveralRowsTTLs(t *testing.T) {
	e := newEnv(t, "F1 PostgreSQL unreachable 3x rows TTL, SIGKILL", envConfig{rows: 300})
	proxy, viaProxy := e.postgresProxy()
	ws := e.spawnStarted([]string{"f1-w1", "f1-w2", "f1-w3"}, map[string]string{"DATABASE_URL": viaProxy}, "-reset-timeout", "2s")
	victim, survivors := ws[0], ws[1:]
	e.waitMidBlock(victim)
	cutAt := time.Now()
	proxy.Cut()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)

	outage := 3*rowsTTL + ttl
	require.Eventually(t, func() bool {
		return len(peerLines(survivors, "recovery of dead peer failed; will retry", victim.id)) > 0
	}, outage, 10*time.Millisecond, "a survivor tried to recover %s during the outage and failed", victim.id)
	failedAfter := time.Since(cutAt)
	time.Sleep(time.Until(cutAt.Add(outage)))

	assert.Empty(t, missingFrom(e.rowsSet(victim.id), stranded), "rows set of %s holds every stranded row after %v of failed recoveries", victim.id, outage)
	assert.True(t, e.registered(victim.id), "%s still registered", victim.id)
	assert.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id),
		"nothing reset while PostgreSQL is unreachable")
	failures := len(peerLines(survivors, "recovery of dead peer failed; will retry", victim.id))

	restoredAt := time.Now()
	proxy.Restore()
	// Poll the registry, then the rows: a deregistration seen while a row
	// is still in progress is the order the fix forbids.
	deadline := restoredAt.Add(scanBound + 10*time.Second)
	early := 0
	for {
		member := e.registered(victim.id)
		left := e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id)
		if !member && left > 0 {
			early++
		}
		if left == 0 {
			e.res.Detection = time.Since(restoredAt)
			break
		}
		require.False(t, time.Now().After(deadline), "%d rows of %s still in progress %v after PostgreSQL came back", left, victim.id, time.Since(restoredAt))
		time.Sleep(10 * time.Millisecond)
	}
	e.res.Bound = scanBound
	assert.LessOrEqual(t, e.res.Detection, scanBound, "rows reset within a scan of PostgreSQL coming back")
	assert.Zero(t, early, "%s deregistered while its rows were still in progress", victim.id)
	e.waitGone(victim.id, e.goneWithin())
	e.finish(true)
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 1`, stranded), "each stranded row reset exactly once")
	e.res.note("detection measured from PostgreSQL back; outage %.1fs = 3 rows TTLs + TTL; first failed recovery %.2fs after the kill; failure lines %d; stranded=%d",
		outage.Seconds(), failedAfter.Seconds(), failures, len(stranded))
}

// f2Work is the work per row in the F2 scenarios: slow enough that rows
// taken again are still in their new holder's hands when the retry of the
// recovery comes.
const f2Work = 400 * time.Millisecond

// f2Retry makes every survivor recover now (SIGUSR1), the moment the
// rows reset by the first recovery are in live workers' hands, and
// returns how many of them were. Without owner fencing a second reset of
// those rows would put them back in the queue under those workers.
func (e *env) f2Retry(victim string, stranded []int64, survivors []*proc) int {
	e.t.Helper()
	inHand := e.count(`rowid = ANY($1) AND status = 'inprog' AND owner <> $2`, stranded, victim)
	require.NotZero(e.t, inHand, "rows taken again and still being worked on when the recovery is retried")
	for _, p := range survivors {
		if !p.exited() {
			p.signal(e.t, syscall.SIGUSR1)
		}
	}
	return inHand
}

// f2Check is what both F2 scenarios assert at the end: every row reset by
// the first recovery, whose outcome Redis never learnt, was reset once
// and kept by the live worker that took it again.
// tracked is the size of the victim's rows set at its death: the
// stranded rows, and any row it finished but had not untracked yet.
func (e *env) f2Check(victim string, stranded []int64, tracked int64, ws []*proc) {
	t := e.t
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 1`, stranded), "each stranded row reset once, whatever happened after its COMMIT")
	assert.Zero(t, e.recoveredTwice(), "no row recovered twice (a worker's release of it aside)")
	assert.Zero(t, e.res.ProcessedTwice, "no row processed twice")
	assert.Zero(t, e.res.Discarded, "no completion refused: no row was reset under a live worker")
	again := peerLines(ws, "recovered rows of dead peer", victim)
	if assert.Len(t, again, 1, "one recovery of %s completed", victim) {
		assert.EqualValues(t, tracked, again[0]["rows_found"])
		assert.EqualValues(t, 0, again[0]["rows_reset"], "the recovery after the lost outcome found every row reset already (reset ledger)")
	}
}

// Scenario F2, crash: without owner fencing (guard status), the worker
// that recovers a dead peer SIGKILLs itself right after its reset
// committed, before the finish script (-die-after-reset-of). The dead
// peer's rows set and registry entry survive; live workers take the rows
// again. Their new holders work slowly, and the dead recoverer's claim
// lasts 10.75 s (reset timeout 10 s + 3 x 250 ms), so the test ends the
// claim itself (PEXPIRE 1 ms, what its expiry does) once the rows are in
// live hands, and makes every survivor recover the victim again at once:
// none may reset the rows under their new holders.
func TestScenarioF2RecovererKilledBetweenCommitAndFinish(t *testing.T) {
	e := newEnv(t, "F2 recoverer SIGKILLed after its reset COMMIT (guard status)", envConfig{rows: 80, work: f2Work})
	const victimID = "f2k-v"
	victim := e.start([]string{victimID}, "-guard", "status")[0]
	survivors := e.start([]string{"f2k-x1", "f2k-x2", "f2k-x3"}, "-guard", "status", "-die-after-reset-of", victimID)
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	tracked, err := e.rdb.SCard(context.Background(), e.keysOf(victim.id).Rows).Result()
	require.NoError(t, err)

	recoverer := exitedBySignal(t, survivors, detectionBound+5*time.Second)
	diedAfter := time.Since(killedAt)
	recoverer.waitLog(t, "fault: killing this process after its reset committed, before the finish script", time.Second)
	assert.Zero(t, e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id), "the dead recoverer's reset committed")
	e.res.Detection, e.res.Bound = diedAfter, detectionBound
	assert.LessOrEqual(t, diedAfter, detectionBound)
	assert.True(t, e.registered(victim.id), "%s still registered: its recovery never finished", victim.id)

	takenAfter := e.waitTakenAgain(stranded, 5*time.Second)
	require.True(t, e.registered(victim.id), "rows taken again before any second recovery of %s", victim.id)
	ctx := context.Background()
	claim := e.keysOf(victim.id).Claim
	held, err := e.rdb.PExpire(ctx, claim, time.Millisecond).Result()
	require.NoError(t, err)
	require.True(t, held, "the dead recoverer's claim was still there")
	require.Eventually(t, func() bool {
		n, err := e.rdb.Exists(ctx, claim).Result()
		return err == nil && n == 0
	}, time.Second, time.Millisecond, "the dead recoverer's claim expired")
	inHand := e.f2Retry(victim.id, stranded, survivors)
	e.waitGone(victim.id, scanBound+2*time.Second)
	e.finish(true)
	e.f2Check(victim.id, stranded, tracked, survivors)
	e.res.note("stranded=%d; recoverer %s killed itself %.2fs after the kill; rows taken again %.2fs later, %d of them in hand at the retry; detection = kill to the first reset",
		len(stranded), recoverer.id, diedAfter.Seconds(), takenAfter.Seconds(), inHand)
}

// Scenario F2, lost acknowledgement: without owner fencing, the reply to
// a recoverer's reset COMMIT is lost (a proxy in front of PostgreSQL for
// the recoverers' resets drops it and closes the connection): the reset
// committed, the recoverer sees an error and gives the claim up. The
// proxy then stays cut until live workers took the rows again; once it is
// restored every survivor recovers the victim again at once, and none may
// reset the rows under their new holders.
func TestScenarioF2CommitReplyOfAResetLost(t *testing.T) {
	e := newEnv(t, "F2 COMMIT reply of a reset lost (guard status)", envConfig{rows: 80, work: f2Work})
	proxy, viaProxy := e.postgresProxy()
	const victimID = "f2c-v"
	victim := e.start([]string{victimID}, "-guard", "status")[0]
	// Only the resets go through the proxy, not the hosts' own commits.
	survivors := e.spawnStarted([]string{"f2c-x1", "f2c-x2", "f2c-x3"}, map[string]string{"RESET_DATABASE_URL": viaProxy},
		"-guard", "status", "-reset-timeout", "2s")
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	tracked, err := e.rdb.SCard(context.Background(), e.keysOf(victim.id).Rows).Result()
	require.NoError(t, err)
	dropped := proxy.DropReplyTo([]byte("commit"))

	select {
	case <-dropped:
	case <-time.After(detectionBound + 5*time.Second):
		t.Fatal("no reset's COMMIT went through the proxy")
	}
	proxy.Cut()
	e.res.Detection, e.res.Bound = time.Since(killedAt), detectionBound
	require.Eventually(t, func() bool {
		return e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id) == 0
	}, time.Second, 5*time.Millisecond, "the reset whose reply was lost committed")
	require.Eventually(t, func() bool {
		return len(peerLines(survivors, "recovery of dead peer failed; will retry", victim.id)) > 0
	}, 5*time.Second, 5*time.Millisecond, "the recoverer reported the unknown outcome as a failure")
	assert.True(t, e.registered(victim.id), "%s kept for the next scan", victim.id)

	takenAfter := e.waitTakenAgain(stranded, 5*time.Second)
	require.True(t, e.registered(victim.id), "rows taken again before any second recovery of %s", victim.id)
	restoredAt := time.Now()
	proxy.Restore()
	inHand := e.f2Retry(victim.id, stranded, survivors)
	e.waitGone(victim.id, scanBound+5*time.Second)
	recoveredAfter := time.Since(restoredAt)
	e.finish(true)
	e.f2Check(victim.id, stranded, tracked, survivors)
	e.res.note("stranded=%d; rows taken again %.2fs after the lost reply, %d of them in hand at the retry; second recovery %.2fs after the proxy was restored; detection = kill to the lost COMMIT",
		len(stranded), takenAfter.Seconds(), inHand, recoveredAfter.Seconds())
}

// Scenario F4: the reply to the claim script is lost after redis-server
// ran it (a proxy between the workers and Redis drops it and closes the
// connection; go-redis retries the EVALSHA). The retry must find the
// recoverer's own claim and go on, so the dead worker is recovered within
// the usual bound, not after the claim TTL (10.75 s here: reset timeout
// 10 s + 3 x the 250 ms operation timeout) that an orphaned claim would
// block every recoverer for.
func TestScenarioF4ReplyToTheClaimScriptLost(t *testing.T) {
	e := newEnv(t, "F4 reply to the claim script lost", envConfig{rows: 300})
	proxy, viaProxy := e.redisProxy()
	ws := e.spawnStarted([]string{"f4-w1", "f4-w2", "f4-w3"}, map[string]string{"REDIS_URL": viaProxy})
	victim, survivors := ws[0], ws[1:]
	ctx := context.Background()
	// Loaded, so the recoverer's EVALSHA runs the script (instead of
	// failing with NOSCRIPT, which would be the reply dropped).
	require.NoError(t, store.Script("claim").Load(ctx, e.rdb).Err())
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	dropped := proxy.DropReplyTo([]byte(store.Script("claim").Hash()))

	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	select {
	case <-dropped:
	default:
		t.Fatal("the reply to the claim script was never dropped")
	}
	e.waitGone(victim.id, e.goneWithin())
	e.finish(true)
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 1`, stranded), "each stranded row reset once")
	lines := peerLines(survivors, "recovered rows of dead peer", victim.id)
	assert.Len(t, lines, 1, "one recovery of %s", victim.id)
	assert.Equal(t, len(stranded), rowsReset(lines))
	e.res.note("stranded=%d; claim reply dropped, go-redis retried; claim TTL 10.75s", len(stranded))
}

// finishDelay is how long the recoverer of scenario F8 holds its finish
// script after its reset committed: long enough for the paused worker to
// resume and track a new block first. A worker whose lost lease came back
// takes no rows for a claim TTL (2s reset timeout + 3 × 250ms: model hole
// H1's fix), so the finish now comes after the recoverer's claim context
// has ended too.
const finishDelay = resetTimeout + 3*250*time.Millisecond + 2*time.Second

// Scenario F8: a worker is paused (SIGSTOP) past its TTL; the recoverer
// (a worker that takes no rows, -recover-only) resets its rows and holds
// its finish script (-delay-finish-of). The worker resumes, learns its
// lease was lost, gives its stale rows back and fetches a new block: the
// same row IDs, the lowest queued. It is SIGKILLed at once, before any
// heartbeat of its could write its rows again. The late finish sees its
// heartbeat back and must leave its rows set alone: it holds the new
// tracking. (Before the fix it removed every member it had read, these
// rows included, and the rows stayed in progress for good.)
func TestScenarioF8LateFinishKeepsTheTrackingOfAPeerThatCameBack(t *testing.T) {
	e := newEnv(t, "F8 late finish after the paused worker re-took its rows", envConfig{rows: 100})
	w := e.start([]string{"f8-w"})[0]
	rec := e.start([]string{"f8-r"}, "-recover-only", "-delay-finish-of", "f8-w", "-finish-delay", finishDelay.String())[0]
	e.waitMidBlock(w)
	stoppedAt := time.Now()
	w.signal(t, syscall.SIGSTOP)
	stranded := e.inprogOf(w.id)
	require.NotEmpty(t, stranded)
	e.res.Detection = e.waitReset(w.id, stranded, stoppedAt, detectionBound)
	e.res.Bound = detectionBound
	resetAt := time.Now()
	w.signal(t, syscall.SIGCONT)

	require.Eventually(t, func() bool {
		return e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, w.id) == len(stranded)
	}, finishDelay+3*time.Second, time.Millisecond, "the resumed worker took its old rows again")
	killedAt := time.Now()
	w.kill(t)
	retakenAfter := time.Since(resetAt)
	require.Empty(t, rec.lines("fault: finish script released"), "the finish is still held when the worker has re-taken its rows (%.2fs after the reset; delay %v)",
		retakenAfter.Seconds(), finishDelay)
	require.Empty(t, missingFrom(e.rowsSet(w.id), stranded), "the re-taken rows are tracked")

	rec.waitLog(t, "fault: finish script released", finishDelay+2*time.Second)
	// The resumed worker's heartbeat cancelled the recoverer's claim (the
	// Beat script), so the late finish finds it gone and leaves the rows
	// set: "claim ... was lost". (A finish that still held its claim would
	// have seen the heartbeat back: peer_came_back.) Either way it deletes
	// nothing, and the worker's heartbeat is still alive at this point.
	var outcome string
	require.Eventually(t, func() bool {
		for _, l := range peerLines([]*proc{rec}, "recovery of dead peer failed; will retry", w.id) {
			msg, _ := l["error"].(string)
			switch {
			case strings.Contains(msg, "was lost"):
				outcome = "claim cancelled by the resumed worker's heartbeat"
			case strings.Contains(msg, "deadline exceeded"):
				outcome = "the recoverer's claim context over"
			}
		}
		for _, l := range peerLines([]*proc{rec}, "recovered rows of dead peer", w.id) {
			if l["peer_came_back"] == true {
				outcome = "peer came back"
			}
		}
		return outcome != ""
	}, 2*time.Second, time.Millisecond, "the late finish ended without deleting")
	// The finish is released about 2 s after the kill, about when the
	// killed worker's heartbeat expires: the recoverer's retry of its failed
	// recovery may then already be the second recovery, which resets the
	// re-taken rows and empties the set (its only "recovered rows" line, as
	// the first attempt ended in the failed finish). Only a set emptied
	// without that reset is the late finish's doing.
	if missing := missingFrom(e.rowsSet(w.id), stranded); len(missing) > 0 {
		assert.Eventually(t, func() bool {
			lines := peerLines([]*proc{rec}, "recovered rows of dead peer", w.id)
			return len(lines) == 1 && rowsReset(lines) >= len(stranded)
		}, 2*time.Second, time.Millisecond, "rows %v left the worker's new tracking (%s) without a second recovery resetting them: the late finish removed them", missing, outcome)
	}

	// The worker's heartbeat expires; its second death is recovered from
	// the tracking the finish kept. A fresh worker finishes the batch.
	e.start([]string{"f8-x"})
	second := e.waitReset(w.id, stranded, killedAt, detectionBound)
	e.waitGone(w.id, 2*time.Second)
	e.finish(true)
	assert.Zero(t, e.count(`rowid = ANY($1) AND recoveries <> 2`, stranded), "each stranded row reset at the pause and after the kill")
	e.res.note("stranded=%d; re-taken by the resumed worker %.2fs after the reset, killed; finish held %v (%s); second recovery %.2fs after the kill",
		len(stranded), retakenAfter.Seconds(), finishDelay, outcome, second.Seconds())
}
