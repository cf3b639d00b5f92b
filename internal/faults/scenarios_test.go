//go:build faults

package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// Scenario 1: SIGKILL one of three workers in the middle of a block. Its
// rows come back within the detection bound, its keys are cleaned up, the
// two others finish the batch, nothing is done twice. It runs with rows
// sets and in owner mode (O1), where no worker ever writes a rows set.
func TestScenario01SigkillOneOfThreeMidBlock(t *testing.T) {
	for _, v := range []struct {
		name      string
		ownerMode bool
	}{
		{"1 SIGKILL one of three mid-block", false},
		{"O1 owner mode: SIGKILL one of three mid-block", true},
	} {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, v.name, envConfig{rows: 300, ownerMode: v.ownerMode})
			ids := []string{"s1-w1", "s1-w2", "s1-w3"}
			ws := e.start(ids)
			victim := ws[0]
			e.waitMidBlock(victim)
			if v.ownerMode {
				e.noRowsSets(ids...)
			}
			killedAt := time.Now()
			victim.kill(t)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded, "killed mid-block")

			e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
			e.res.Bound = detectionBound
			e.res.note("stranded=%d", len(stranded))
			e.waitGone(victim.id, e.goneWithin())
			if v.ownerMode {
				e.noRowsSets(ids...)
			}
			e.finish(true)
		})
	}
}

// Scenario 2: SIGKILL every worker mid-block, then start new ones: every
// stranded row comes back and the batch is finished.
func TestScenario02SigkillEveryWorkerThenStartNewOnes(t *testing.T) {
	e := newEnv(t, "2 SIGKILL every worker, start new ones", envConfig{rows: 300})
	old := e.start([]string{"s2-old1", "s2-old2", "s2-old3"})
	e.waitMidBlock(old[0])
	killedAt := time.Now()
	for _, p := range old {
		p.kill(t)
	}
	stranded := map[string][]int64{}
	total := 0
	for _, p := range old {
		stranded[p.id] = e.inprogOf(p.id)
		total += len(stranded[p.id])
	}
	require.NotEmpty(t, stranded[old[0].id], "killed mid-block")

	e.start([]string{"s2-new1", "s2-new2", "s2-new3"})
	for _, p := range old {
		if d := e.waitReset(p.id, stranded[p.id], killedAt, detectionBound); d > e.res.Detection {
			e.res.Detection = d
		}
	}
	e.res.Bound = detectionBound
	e.res.note("stranded=%d over 3 dead workers", total)
	for _, p := range old {
		e.waitGone(p.id, 2*time.Second)
	}
	e.finish(true)
}

// Scenario 3: SIGTERM in the middle of a block. The worker finishes the
// block, exits 0, and its heartbeat and registry entry are gone the moment
// it exits; nothing of it is ever recovered.
func TestScenario03SigtermFinishesTheBlock(t *testing.T) {
	e := newEnv(t, "3 SIGTERM mid-block", envConfig{rows: 300})
	ws := e.start([]string{"s3-w1", "s3-w2", "s3-w3"})
	victim := ws[0]
	e.waitMidBlock(victim)
	held := e.inprogOf(victim.id)
	termAt := time.Now()
	victim.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, victim.wait(t, 15*time.Second), "exit status after SIGTERM")
	exitAfter := time.Since(termAt)

	ctx := context.Background()
	k := e.keysOf(victim.id)
	n, err := e.rdb.Exists(ctx, k.Heartbeat).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "heartbeat deleted by the time the process exits")
	member, err := e.rdb.SIsMember(ctx, e.registry(), victim.id).Result()
	require.NoError(t, err)
	assert.False(t, member, "deregistered by the time the process exits")
	card, err := e.rdb.SCard(ctx, k.Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, card, "every row of the block untracked")

	var byVictim int
	require.NoError(t, e.query(&byVictim, `SELECT count(*) FROM ledger WHERE rowid = ANY($1) AND instance = $2 AND outcome = 'done'`, held, victim.id))
	assert.Equal(t, len(held), byVictim, "the rows in progress at SIGTERM were finished by the worker itself")
	e.res.note("rows_in_progress_at_sigterm=%d exit_after_sigterm=%.2fs", len(held), exitAfter.Seconds())

	e.finish(true)
	assert.Zero(t, e.count(`recoveries > 0`), "no row was ever recovered")
	for _, p := range ws[1:] {
		assert.Empty(t, p.lines("recovered rows of dead peer"), "%s recovered nothing", p.id)
	}
}

// Scenario 4: SIGSTOP a worker mid-block for longer than the TTL, then
// SIGCONT. Its peers presume it dead and recover its rows; when it resumes
// it finds its lease lost. With owner fencing no row may be done twice;
// with weaker completion guards the duplicates are measured.
//
// The owner guard runs twice: with rows sets (-rows-sets, as written before
// owner mode) and in owner mode (O2).
func TestScenario04SigstopPastTheTTLThenSigcont(t *testing.T) {
	for _, v := range []struct {
		name, guard string
		ownerMode   bool
	}{
		{"4 SIGSTOP past the TTL, SIGCONT (guard owner)", "owner", false},
		{"4 SIGSTOP past the TTL, SIGCONT (guard status)", "status", false},
		{"4 SIGSTOP past the TTL, SIGCONT (guard none)", "none", false},
		{"O2 owner mode: SIGSTOP past the TTL, SIGCONT", "owner", true},
	} {
		guard := v.guard
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, v.name, envConfig{rows: 200, ownerMode: v.ownerMode})
			ws := e.start([]string{"s4-w1", "s4-w2", "s4-w3"}, "-guard", guard)
			victim := ws[0]
			e.waitMidBlock(victim)
			stoppedAt := time.Now()
			victim.signal(t, syscall.SIGSTOP)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded)
			e.res.Detection = e.waitReset(victim.id, stranded, stoppedAt, detectionBound)
			e.res.Bound = detectionBound

			// Resume it once its rows are in other hands (taken again, or
			// done): the worst moment for a worker that believes it still
			// owns them.
			require.Eventually(t, func() bool {
				return e.count(`rowid = ANY($1) AND status = 'queued'`, stranded) == 0
			}, 10*time.Second, 10*time.Millisecond, "stranded rows taken again by peers")
			time.Sleep(time.Until(stoppedAt.Add(ttl))) // and stopped for a whole TTL at least
			stoppedFor := time.Since(stoppedAt)
			victim.signal(t, syscall.SIGCONT)
			victim.waitLog(t, "heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones", 5*time.Second)

			e.finish(guard == "owner")
			var victimDiscarded int
			require.NoError(t, e.query(&victimDiscarded, `SELECT count(*) FROM ledger WHERE instance = $1 AND outcome = 'discarded'`, victim.id))
			e.res.note("stranded=%d stopped_for=%.1fs discarded_by_resumed_worker=%d", len(stranded), stoppedFor.Seconds(), victimDiscarded)
			if guard == "owner" {
				// With owner fencing the loss stays until the rows held at
				// it are given back, so the resumed host's next CheckLease
				// says so and it releases the rest of its block: only the
				// row it was in is worked on twice (and discarded).
				assert.LessOrEqual(t, victimDiscarded, 1, "rows worked on after the lease was lost")
			}
			// With owner fencing, or without an owner column through the
			// reset ledger (issue 21), the resumed worker can give the rest
			// of its block back, and its self-check does not take the rows
			// peers recovered for a misconfiguration.
			// Without an owner column, a rows set gone when the heartbeat
			// came back (here: the peers' recovery finished it) leaves the
			// block to the backstop sweep, and Release only forgets it
			// (docs/safety.md §3).
			released := append(victim.lines("released rows"),
				victim.lines("released rows left to the backstop sweep: nothing reset for them")...)
			assert.NotEmpty(t, released, "the resumed worker released the rest of its block")
			assert.Zero(t, rowsReset(released), "peers recovered those rows and took them again: none is reset under them")
			assert.Empty(t, victim.lines("giving up handing rows back; they stay tracked"))
			assert.Empty(t, victim.lines("self-check: the rows this worker tracks do not look like its rows in progress; a crash would leave them stuck"))
		})
	}
}

// Scenario 5: redis-server killed and restarted empty in the middle of the
// run. Every live worker is registered again, with its rows tracked,
// within about a heartbeat interval; a worker killed after that is
// recovered as usual.
func TestScenario05RedisRestartedEmpty(t *testing.T) {
	e := newEnv(t, "5 redis-server killed and restarted empty", envConfig{rows: 300})
	ws := e.start([]string{"s5-w1", "s5-w2", "s5-w3"})
	require.Eventually(t, func() bool { return e.count(`status = 'done'`) >= 30 }, 20*time.Second, 10*time.Millisecond)
	restartAt := time.Now()
	e.redisSrv.Restart()
	restarted := time.Since(restartAt)

	ctx := context.Background()
	require.Eventually(t, func() bool {
		for _, p := range ws {
			n, err := e.rdb.Exists(ctx, e.keysOf(p.id).Heartbeat).Result()
			member, err2 := e.rdb.SIsMember(ctx, e.registry(), p.id).Result()
			if err != nil || err2 != nil || n == 0 || !member {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond, "every worker registered again")
	back := time.Since(restartAt)
	assert.LessOrEqual(t, back, interval*12/10+restarted+slack, "registered again within a heartbeat interval (+20%% retry jitter) of the restart")
	for _, p := range ws {
		e.assertTracked(p)
	}

	victim := ws[0]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	e.res.note("re-registered_after_restart=%.2fs stranded_after_second_kill=%d", back.Seconds(), len(stranded))
	e.waitGone(victim.id, e.goneWithin())
	e.finish(true)
}

// assertTracked checks that every row p holds in progress is in its rows
// set, allowing for rows it finished between the two reads.
func (e *env) assertTracked(p *proc) {
	e.t.Helper()
	held := e.inprogOf(p.id)
	members, err := e.rdb.SMembers(context.Background(), e.keysOf(p.id).Rows).Result()
	require.NoError(e.t, err)
	inSet := map[string]bool{}
	for _, m := range members {
		inSet[m] = true
	}
	var missing []int64
	for _, id := range held {
		if !inSet[strconv.FormatInt(id, 10)] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 { // finished since the first read?
		assert.Zero(e.t, e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, missing, p.id),
			"rows of %s in progress but not in its rows set: %v", p.id, missing)
	}
}

// Scenario 6: Redis unreachable for twice the TTL (a black-hole TCP proxy
// between the workers and redis-server), then back. A worker killed at the
// start of the partition is recovered once Redis is reachable again; the
// others lose their lease, hand their blocks back, and re-register.
func TestScenario06RedisUnreachableForTwiceTheTTL(t *testing.T) {
	e := newEnv(t, "6 Redis unreachable for 2x TTL, then back", envConfig{rows: 300})
	proxy, viaProxy := e.redisProxy()
	var ws []*proc
	for _, id := range []string{"s6-w1", "s6-w2", "s6-w3"} {
		ws = append(ws, e.spawn(id, map[string]string{"REDIS_URL": viaProxy}, e.workerArgs(id)...))
	}
	for _, p := range ws {
		p.waitLog(t, "faultworker started", 20*time.Second)
	}
	victim := ws[0]
	e.waitMidBlock(victim)
	cutAt := time.Now()
	proxy.Cut()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)

	time.Sleep(time.Until(cutAt.Add(2 * ttl))) // the fault itself: two TTLs without Redis
	assert.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND status = 'inprog' AND split_part(owner, '{', 1) = $2`, stranded, victim.id),
		"nothing can be recovered while Redis is unreachable")
	restoredAt := time.Now()
	proxy.Restore()
	e.res.Detection = e.waitReset(victim.id, stranded, restoredAt, scanBound)
	e.res.Bound = scanBound

	ctx := context.Background()
	require.Eventually(t, func() bool {
		for _, p := range ws[1:] {
			member, err := e.rdb.SIsMember(ctx, e.registry(), p.id).Result()
			if err != nil || !member {
				return false
			}
		}
		return true
	}, interval*12/10+slack, 5*time.Millisecond, "survivors registered again within a heartbeat interval")
	back := time.Since(restoredAt)
	lost := 0
	for _, p := range ws[1:] {
		lost += len(p.lines("heartbeat lease lost: peers may recover this worker's rows; stop taking rows and release unfinished ones"))
	}
	assert.Equal(t, 2, lost, "both survivors noticed the lost lease once")
	e.waitGone(victim.id, e.goneWithin())
	e.finish(true)
	// After the partition every survivor's heartbeat had expired too: a
	// survivor may have been recovered by the other before it re-registered.
	survivorsRecovered := 0
	for _, p := range ws[1:] {
		for _, l := range p.lines("recovered rows of dead peer") {
			if l["peer_id"] != victim.id {
				survivorsRecovered++
			}
		}
	}
	e.res.note("detection measured from Redis back; stranded=%d survivors_re-registered_after=%.2fs live_survivors_recovered_by_a_peer=%d",
		len(stranded), back.Seconds(), survivorsRecovered)
}

// Scenario 7: PostgreSQL stopped while a dead peer is being recovered,
// then back. The failed recovery keeps the dead peer's rows set and
// registry entry and releases its claim; a later scan recovers it.
func TestScenario07PostgresStoppedDuringARecovery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx)
	if err != nil {
		testutil.Unavailable(t, "cannot start a dedicated PostgreSQL: %v", err)
	}
	t.Cleanup(pg.Stop)
	e := newEnv(t, "7 PostgreSQL stopped during a recovery, then back", envConfig{rows: 300, pg: pg})
	ws := e.start([]string{"s7-w1", "s7-w2", "s7-w3"})
	victim := ws[0]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	require.NoError(t, pg.Halt())
	haltedAt := time.Now()

	// A survivor finds the dead peer and its reset fails.
	deadline := time.Now().Add(detectionBound + 5*time.Second)
	var failedBy *proc
	for failedBy == nil {
		for _, p := range ws[1:] {
			for _, l := range p.lines("recovery of dead peer failed; will retry") {
				if l["peer_id"] == victim.id {
					failedBy = p
				}
			}
		}
		require.False(t, time.Now().After(deadline), "no survivor tried to recover %s while PostgreSQL was down", victim.id)
		time.Sleep(10 * time.Millisecond)
	}
	failedAfter := time.Since(killedAt)
	k := e.keysOf(victim.id)
	checkKept := func() {
		members, err := e.rdb.SMembers(ctx, k.Rows).Result()
		require.NoError(t, err)
		set := map[string]bool{}
		for _, m := range members {
			set[m] = true
		}
		for _, id := range stranded {
			assert.True(t, set[strconv.FormatInt(id, 10)], "row %d still in the rows set of %s", id, victim.id)
		}
		member, err := e.rdb.SIsMember(ctx, e.registry(), victim.id).Result()
		require.NoError(t, err)
		assert.True(t, member, "%s still registered", victim.id)
	}
	checkKept()
	// Down for one more recovery interval: later scans fail too, and the
	// claim of the failed one was released, not left to expire: the key
	// holds at most the note a failed recovery leaves (the fail script),
	// which the next recoverer takes over at once.
	time.Sleep(recoveryInterval * 11 / 10)
	checkKept()
	claim, err := e.rdb.Get(ctx, k.Claim).Result()
	if err != redis.Nil {
		require.NoError(t, err)
		assert.Equal(t, store.FailedClaim, claim, "no claim left behind by the failed recoveries, only the failure note")
	}

	require.NoError(t, pg.Resume(ctx))
	downFor := time.Since(haltedAt)
	resumedAt := time.Now()
	e.res.Detection = e.waitReset(victim.id, stranded, resumedAt, scanBound)
	e.res.Bound = scanBound
	e.waitGone(victim.id, e.goneWithin())
	e.res.note("detection measured from PostgreSQL back; first failed recovery %.2fs after the kill by %s; PostgreSQL down %.1fs; stranded=%d",
		failedAfter.Seconds(), failedBy.id, downFor.Seconds(), len(stranded))
	e.finish(true)
}

// Scenario 8: ten workers recover the same dead peer at once: each of them
// is told (SIGUSR1: RecoverNow) the moment the dead peer's heartbeat
// expires, with the scan lease off so their periodic scans race too. The
// claim lets exactly one of them reset the rows, once.
func TestScenario08TenWorkersRecoverTheSameDeadPeerAtOnce(t *testing.T) {
	e := newEnv(t, "8 ten workers recover one dead peer at once", envConfig{rows: 500, work: 100 * time.Millisecond})
	ids := []string{"s8-victim"}
	for i := 1; i <= 10; i++ {
		ids = append(ids, fmt.Sprintf("s8-r%02d", i))
	}
	ws := e.start(ids, "-scan-lease=false")
	victim, recoverers := ws[0], ws[1:]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	ctx := context.Background()
	tracked, err := e.rdb.SCard(ctx, e.keysOf(victim.id).Rows).Result()
	require.NoError(t, err)

	// The moment the heartbeat expires, all ten recover at once.
	require.Eventually(t, func() bool {
		n, err := e.rdb.Exists(ctx, e.keysOf(victim.id).Heartbeat).Result()
		return err == nil && n == 0
	}, 2*ttl, time.Millisecond)
	for _, p := range recoverers {
		p.signal(t, syscall.SIGUSR1)
	}
	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	e.waitGone(victim.id, e.goneWithin())
	for _, p := range recoverers {
		p.waitLog(t, "recover now", 10*time.Second)
	}
	e.finish(true)

	withRows, rowsFound := 0, 0
	for _, p := range recoverers {
		// Periodic scans and RecoverNow (SIGUSR1) alike: the library logs
		// each recovery it completed.
		for _, l := range p.lines("recovered rows of dead peer") {
			if l["peer_id"] != victim.id {
				continue
			}
			n := int(l["rows_found"].(float64))
			rowsFound += n
			if n > 0 {
				withRows++
			}
		}
	}
	assert.Equal(t, 1, withRows, "one recoverer reset the dead peer's rows")
	assert.Equal(t, int(tracked), rowsFound, "every tracked row passed to ResetRows once, in all")
	assert.Equal(t, len(stranded), e.count(`rowid = ANY($1) AND recoveries = 1`, stranded), "each stranded row reset exactly once")
	assert.Zero(t, e.count(`recoveries > 1 OR (recoveries = 1 AND NOT rowid = ANY($1))`, stranded), "no other row reset")
	e.res.note("stranded=%d tracked=%d recover_now_calls=10 recoverers_that_reset=%d", len(stranded), tracked, withRows)
}

// Scenario 9: the whole run on a real 3-master Redis Cluster through
// redis.NewClusterClient: a worker killed mid-block is recovered, and every
// worker's keys share one hash slot (CLUSTER KEYSLOT).
func TestScenario09RedisCluster(t *testing.T) {
	e := newEnv(t, "9 3-master Redis Cluster, SIGKILL one of three", envConfig{rows: 300, cluster: true})
	ws := e.start([]string{"s9-w1", "s9-w2", "s9-w3"})
	ctx := context.Background()
	slots := map[int64]bool{}
	for _, p := range ws {
		k := e.keysOf(p.id)
		want, err := e.rdb.ClusterKeySlot(ctx, p.id).Result()
		require.NoError(t, err)
		for _, key := range []string{k.Heartbeat, k.Rows, k.Claim} {
			got, err := e.rdb.ClusterKeySlot(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, want, got, "CLUSTER KEYSLOT %s", key)
		}
		n, err := e.rdb.Exists(ctx, k.Heartbeat).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "heartbeat of %s on the cluster", p.id)
		slots[want] = true
	}
	victim := ws[0]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	e.waitGone(victim.id, e.goneWithin())
	e.res.note("stranded=%d; each worker's keys in one slot (%d distinct slots for 3 workers)", len(stranded), len(slots))
	e.finish(true)
}

// Scenario 10a: garbage in Redis. The registry holds members that are no
// valid instance ID (empty, with braces, 10 KB long, with a tab), and a
// dead peer's rows set holds members that are no row ID. The workers log
// each problem once with the value clipped, never panic, and recover every
// real row.
func TestScenario10aGarbageInRedis(t *testing.T) {
	e := newEnv(t, "10a garbage registry members, non-numeric rows", envConfig{rows: 300})
	ctx := context.Background()
	garbage := []any{"", "a{b}c", strings.Repeat("G", 10<<10), "tab\tid", "{", "}"}
	require.NoError(t, e.rdb.SAdd(ctx, e.registry(), garbage...).Err())

	// A dead peer whose rows set mixes rows 1-10 with non-numbers.
	const junk = "s10-junk-peer"
	junkMembers := []any{"abc", "12x", "-", " 5", "1e3", "99999999999999999999999", ""}
	for id := 1; id <= 10; id++ {
		junkMembers = append(junkMembers, strconv.Itoa(id))
	}
	e.plantDeadPeer(junk, 1, 10, junkMembers)

	startedAt := time.Now()
	ws := e.start([]string{"s10a-w1", "s10a-w2", "s10a-w3"})
	e.res.Detection = e.waitReset(junk, ids(1, 10), startedAt, scanBound)
	e.res.Bound = scanBound
	e.waitGone(junk, 2*time.Second)
	e.finish(true)

	ignored := map[string]bool{}
	var junkLine map[string]any
	for _, p := range ws {
		for _, l := range p.lines("ignoring registry member that is not a valid instance ID") {
			ignored[l["member"].(string)] = true
		}
		for _, l := range p.lines("recovered rows of dead peer") {
			if l["peer_id"] == junk {
				junkLine = l
			}
		}
		for _, l := range strings.Split(p.out.String(), "\n") {
			assert.Less(t, len(l), 2048, "%s logged a line of %d bytes: garbage is clipped", p.id, len(l))
		}
	}
	assert.Len(t, ignored, len(garbage), "each garbage registry member reported: %v", ignored)
	assert.True(t, ignored[strings.Repeat("G", 64)+"..."], "the 10 KB member is clipped in the log")
	if assert.NotNil(t, junkLine, "recovery of the junk peer logged") {
		assert.EqualValues(t, 10, junkLine["rows_found"])
		assert.EqualValues(t, 10, junkLine["rows_reset"])
		assert.EqualValues(t, 7, junkLine["invalid_members"])
	}
	member, err := e.rdb.SIsMember(ctx, e.registry(), "a{b}c").Result()
	require.NoError(t, err)
	assert.True(t, member, "garbage registry members are left alone, not deleted")
	e.res.note("detection measured from the workers' start; %d garbage members reported once each; 7 non-numeric members skipped", len(ignored))
}

// hugeTimings are the worker flags of the 1,000,000-ID scenario: reading
// such a set takes redis-server about 0.4 s and the client about 0.7 s,
// more than the 250 ms operation timeout the suite's heartbeat interval
// implies, so the operation timeout (and with it the heartbeat interval it
// may not exceed, and the TTL) is raised.
//
// Everything a recoverer does under its claim (every SSCAN page, the
// reset) must end within the claim TTL, reset timeout + 3 × operation
// timeout: the reset timeout is raised to 10s too (the suite's 2s would
// give the claim too little time for a million members).
var hugeTimings = []string{"-heartbeat-ttl", "6s", "-heartbeat-interval", "2s", "-op-timeout", "2s", "-rows-ttl", "20s",
	"-reset-timeout", "10s"}

// Scenario 10b: a dead peer's rows set holds 1,000,000 IDs (rows 11-20
// and IDs of rows that do not exist). With an operation timeout long enough
// to read it, it is recovered in one pass: the ten real rows are reset,
// the rest is ignored by the guarded UPDATE.
func TestScenario10bMillionIDRowsSet(t *testing.T) {
	e := newEnv(t, "10b rows set of 1,000,000 IDs (op timeout 2s)", envConfig{rows: 300})
	const huge = "s10-huge-peer"
	e.plantHugePeer(huge)
	startedAt := time.Now()
	ws := e.start([]string{"s10b-w1", "s10b-w2", "s10b-w3"}, hugeTimings...)
	const bound = 10 * time.Second // first scan at start: read 1,000,000 members, 200 UPDATE chunks
	e.res.Detection = e.waitReset(huge, ids(11, 20), startedAt, bound)
	e.res.Bound = bound
	e.waitGone(huge, 5*time.Second)
	e.finish(true)

	var line map[string]any
	failures := 0
	for _, p := range ws {
		for _, l := range p.lines("recovered rows of dead peer") {
			if l["peer_id"] == huge {
				line = l
			}
		}
		failures += len(p.lines("heartbeat failed; retrying"))
	}
	if assert.NotNil(t, line, "recovery of the 1,000,000-ID peer logged") {
		assert.EqualValues(t, 1_000_000, line["rows_found"])
		assert.EqualValues(t, 10, line["rows_reset"])
	}
	e.res.note("detection measured from the workers' start; heartbeat outages while the set was read: %d", failures)
}

// Scenario 10b': the same 1,000,000-ID rows set with the suite's standard
// operation timeout (250 ms). The library reads a rows set in SSCAN pages,
// each under the operation timeout, so even a set far too large for one
// call within it is recovered, and redis-server is never blocked for long.
// (Before, one SMEMBERS had to fit in the timeout: this scenario failed on
// every scan and the rows stayed in progress.)
func TestScenario10bMillionIDRowsSetWithTheStandardOperationTimeout(t *testing.T) {
	e := newEnv(t, "10b' 1,000,000-ID rows set, op timeout 250ms", envConfig{rows: 300})
	const huge = "s10-huge-peer"
	e.plantHugePeer(huge)
	startedAt := time.Now()
	// The standard timings but the reset timeout: reading a million
	// members in 250ms pages takes longer than the suite's 2.75s claim.
	e.start([]string{"kb-w1", "kb-w2", "kb-w3"}, "-reset-timeout", "10s")
	e.res.Detection = e.waitReset(huge, ids(11, 20), startedAt, 10*time.Second)
	e.res.Bound = 10 * time.Second
	e.finish(true)
}

// plantHugePeer plants a dead peer id owning rows 11-20 whose rows set
// holds those and 999,990 IDs of rows that do not exist.
func (e *env) plantHugePeer(id string) {
	e.t.Helper()
	members := make([]any, 0, 1_000_000)
	for row := 11; row <= 20; row++ {
		members = append(members, strconv.Itoa(row))
	}
	for row := 1_000_001; len(members) < 1_000_000; row++ {
		members = append(members, strconv.Itoa(row))
	}
	e.plantDeadPeer(id, 11, 20, members)
	card, err := e.rdb.SCard(context.Background(), e.keysOf(id).Rows).Result()
	require.NoError(e.t, err)
	require.EqualValues(e.t, 1_000_000, card)
}

// plantDeadPeer leaves what a killed worker would: rows first..last in
// progress under id, a registry entry and a rows set with members, no
// heartbeat.
func (e *env) plantDeadPeer(id string, first, last int, members []any) {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `UPDATE `+e.table+` SET status = 'inprog', owner = $1 WHERE rowid BETWEEN $2 AND $3`, id, first, last)
	require.NoError(e.t, err)
	k := e.keysOf(id)
	for i := 0; i < len(members); i += 10_000 {
		require.NoError(e.t, e.rdb.SAdd(ctx, k.Rows, members[i:min(i+10_000, len(members))]...).Err())
	}
	require.NoError(e.t, e.rdb.SAdd(ctx, e.registry(), id).Err())
}

func ids(first, last int64) []int64 {
	var out []int64
	for id := first; id <= last; id++ {
		out = append(out, id)
	}
	return out
}

// Scenario 10c: the table option holds quotes and a semicolon (an SQL
// injection attempt). It is quoted as one identifier: the workers use the
// table of that name, a killed worker's rows are recovered, and the
// ledger it tried to drop is still there.
func TestScenario10cTableNameWithQuotesAndSemicolons(t *testing.T) {
	const table = `batch"rows'; DROP TABLE ledger; --`
	e := newEnv(t, "10c table option with quotes and semicolons", envConfig{rows: 200, table: table})
	ws := e.start([]string{"s10c-w1", "s10c-w2", "s10c-w3"})
	victim := ws[0]
	e.waitMidBlock(victim)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.NotEmpty(t, stranded)
	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
	e.res.Bound = detectionBound
	e.finish(true)
	var ledger, rows *string
	require.NoError(t, e.query(&ledger, `SELECT to_regclass('ledger')::text`))
	require.NoError(t, e.query(&rows, `SELECT to_regclass($1)::text`, e.table))
	assert.NotNil(t, ledger, "the ledger was not dropped")
	assert.NotNil(t, rows, "the oddly named table was the one used")
	for _, p := range ws {
		assert.NotContains(t, p.out.String(), "syntax error", "%s: no SQL built from the name", p.id)
	}
	e.res.note("table %q; stranded=%d recovered", table, len(stranded))
}

// Scenario 10d: a worker with a wrong Redis password and one with an
// unreachable PostgreSQL stop with a clear error, exit status 1, no panic,
// and print neither the wrong password nor the right ones; they take no
// row, and a correct worker then does the whole batch.
func TestScenario10dWrongRedisPasswordAndUnreachablePostgres(t *testing.T) {
	e := newEnv(t, "10d wrong Redis password, unreachable PostgreSQL", envConfig{rows: 50})
	wrong := testutil.Name("wrongpw")
	e.secrets = append(e.secrets, wrong)
	badRedis := e.spawn("bad-redis", map[string]string{"REDIS_URL": fmt.Sprintf("redis://app:%s@%s", wrong, e.redisSrv.Addr)},
		e.workerArgs("bad-redis")...)
	port := testutil.FreePort(t, false)
	deadPGPassword := testutil.Name("deadpgpw")
	e.secrets = append(e.secrets, deadPGPassword)
	badPG := e.spawn("bad-pg", map[string]string{"DATABASE_URL": fmt.Sprintf(
		"postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", deadPGPassword, port)},
		e.workerArgs("bad-pg")...)

	assert.Equal(t, 1, badRedis.wait(t, 15*time.Second), "wrong Redis password: exit status")
	assert.Contains(t, badRedis.out.String(), "start crash recovery")
	assert.Contains(t, badRedis.out.String(), "WRONGPASS")
	assert.Equal(t, 1, badPG.wait(t, 15*time.Second), "unreachable PostgreSQL: exit status")
	assert.Contains(t, badPG.out.String(), "PostgreSQL unreachable")
	assert.Contains(t, badPG.out.String(), "connect")
	assert.Zero(t, e.count(`owner IN ('bad-redis', 'bad-pg') OR status <> 'queued'`), "nothing taken")

	e.start([]string{"s10d-good"})
	e.finish(true)
	e.res.note("wrong password: %q; unreachable PostgreSQL: %q", firstError(badRedis), firstError(badPG))
}

// firstError returns the error of a worker's "faultworker failed" line.
func firstError(p *proc) string {
	for _, l := range p.lines("faultworker failed") {
		if s, ok := l["error"].(string); ok {
			return s
		}
	}
	return ""
}
