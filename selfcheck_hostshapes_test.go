package recovery

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// (Review finding A.) a correct configuration (statuses right, Track
// before the COMMIT) whose fetch fails a row inside its transaction
// ('error') and commits. The first quick look sees the fetch committed
// with 'error'. Before the host's Untrack (a few ms later), another part
// of the application retries the errored row ('error' -> 'pending'), as a
// retry job does. Untrack's hook then reads the row at a new version, not
// in progress, and raises "misspelt?".
func TestRowFailedInsideTheFetchAndRequeuedByARetryJobBeforeUntrackIsNoAlarm(t *testing.T) {
	t.Parallel()
	db, w, _, alarms := jobsWorld(t, resetterImpls[0], false, "running", "pending", "RVA")
	ctx := context.Background()
	fetchJobs(t, db, w, 0, "error", 1, 2, 3)
	waitLook(t, w) // the quick look after the COMMIT
	// A retry job re-queues errored rows (or another worker re-fetches
	// and finishes them) before this host's Untrack.
	_, err := db.Exec(ctx, `UPDATE jobs SET state = 'pending' WHERE id = ANY($1)`, []int64{1, 2, 3})
	require.NoError(t, err)
	require.NoError(t, w.Untrack(1, 2, 3))
	untracked := time.Now() // after Untrack: a look begun later judges its rows
	requireNoAlarm(t, w, alarms, untracked)
}

// (Review finding B.) a host that tracks after its fetch's COMMIT
// (the documented mistake, which the sweep's note is meant to report as
// ErrUntrackedRows), with statuses configured right, whose processing
// transaction has already locked a row when Track reads it and gives the
// row back to the queue ('pending'). Track's read sees the row locked with
// its committed status 'running' (taken for the state before a fetch), the
// look sees it committed 'pending': ErrMisconfigured "statuses swapped?",
// pointing the operator at WithStatuses, which are right.
// (Review finding C.) a correct worker (Track before the COMMIT) is
// accused of tracking after the COMMIT when the fleet's keys are lost
// without a restart (FLUSHALL / FLUSHDB, or keys deleted: uptime
// unchanged, no evicted_keys) and a sweep look falls between the loss and
// the worker's next heartbeat, which writes its rows set back: the row,
// committed since the previous look, is in no set at one look and in the
// worker's at the next, same version. The worker's Healthy then fails
// with ErrUntrackedRows for a rows TTL (a liveness probe restarts it).
func TestCorrectWorkerIsNotAccusedOfUntrackedRowsAfterAFlush(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	ctx := context.Background()
	prefix := testutil.Name("RVC")
	opts := rowsSweepTimings(WithKeyPrefix(prefix))
	good, goodLogs := startWorker(t, rdb, r, "good", append(opts, WithBackstopSweep(false))...)
	sw, _ := newWorker(t, rdb, r, "sweeper", opts...)
	look := func() sweepReport {
		t.Helper()
		rep, err := sw.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep
	}
	look()
	// good's fetch: UPDATE, Track, COMMIT (correct).
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE "+schema+".jobs SET state = 'running' WHERE id = 1")
	require.NoError(t, err)
	require.NoError(t, good.Track(ctx, 1))
	require.NoError(t, tx.Commit(ctx))
	// The fleet's keys are lost (FLUSHDB of a shared Redis, keys
	// deleted), and a look runs before good's next heartbeat.
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.NoError(t, rdb.Del(ctx, keys...).Err())
	first := look()
	t.Logf("look after the flush: rows in progress %d, node held %v, stray waiting %d", first.rowsInProgress, first.nodeHeld, first.strayWaiting)
	waitBeat(t, good) // good's heartbeat writes its set back
	rep := look()
	t.Logf("next look: untrackedBy %v", rep.untrackedBy)
	note, _ := rdb.HGet(ctx, store.UntrackedKey(prefix), "good").Result()
	t.Logf("note for good: %q", note)
	signals(good).scan.WaitTurn(t) // good's scan turn reads the note
	assert.Empty(t, rep.untrackedBy, "a worker that tracked before its COMMIT is named")
	assert.NoError(t, good.Healthy())
	assert.NotContains(t, goodLogs.String(), `"level":"ERROR"`)
}

// (Review finding D.) a correct host with fast rows whose completion
// is two autocommit statements (the status, then a bookkeeping write such
// as finished_at or a result column; here the same row touched again),
// then Untrack. The quick look falls after the first: it takes 'finished'
// for the fetch's outcome; the second write gives the row a new version,
// and Untrack's hook raises "misspelt?". No other party is involved.
func TestCompletionInTwoStatementsIsNoAlarm(t *testing.T) {
	t.Parallel()
	db, w, _, alarms := jobsWorld(t, resetterImpls[0], false, "running", "pending", "RVD")
	ctx := context.Background()
	ids := []int64{1, 2, 3}
	fetchJobs(t, db, w, 0, "", ids...)
	_, err := db.Exec(ctx, `UPDATE jobs SET state = 'finished' WHERE id = ANY($1)`, ids) // the outcome
	require.NoError(t, err)
	waitLook(t, w)                                                                 // the quick look sees 'finished'
	_, err = db.Exec(ctx, `UPDATE jobs SET state = state WHERE id = ANY($1)`, ids) // bookkeeping (finished_at, result)
	require.NoError(t, err)
	require.NoError(t, w.Untrack(ids...))
	untracked := time.Now() // after Untrack: a look begun later judges its rows
	requireNoAlarm(t, w, alarms, untracked)
}

// (Review finding E.) rows left to the backstop sweep after a lost
// lease keep the lease lost until the host releases or untracks them. With
// WithDeferredUntrack, a running worker's Untrack only forgets the rows
// (inflight.forget), which does not clear them from inflight.abandoned:
// the host that finished its rows during the pause and untracks them
// after it (the documented way on for finished rows) keeps a lost lease
// for good: CheckLease and Track refuse, Healthy fails.
func TestUntrackOfRowsLeftToTheSweepEndsTheLossWithDeferredUntrack(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 10, "RVE")
	ctx := context.Background()
	r := &blindResetter{pgResetterAPI: resetterImpls[0].Must(t, db)}
	r.blind.Store(true)
	wc := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = wc.Close() })
	fr := &freezer{}
	wc.AddHook(fr)
	// lifeTimings' TTL 2 s and heartbeat every 500 ms: p's lease and w's
	// stay valid beside other tests until the freeze.
	timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      500 * time.Millisecond,
		SelfCheckWindow:   200 * time.Millisecond,
	})}
	w, logs := startWorker(t, wc, r, "w", append(timing, WithDeferredUntrack(50*time.Millisecond))...)
	p, _ := startWorker(t, rdb, r, "p", timing...)

	setStatus(t, db, "inprog", 1, 2, 3, 4)
	require.NoError(t, w.Track(ctx, 1, 2, 3, 4))
	fr.freeze() // paused
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, w.ownKeys().Heartbeat).Result()
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "w's heartbeat expires")
	_, err := p.recoverNow(ctx)
	require.NoError(t, err)
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool {
		return logs.Count("rows held when the lease was lost are left to the backstop sweep") == 1
	})
	r.blind.Store(false)
	// The host finishes (or gives up) its block and untracks it, as
	// Untrack's doc says; it never calls Release for rows it untracked.
	require.NoError(t, w.Untrack(1, 2, 3, 4))
	assert.Zero(t, w.Stats().TrackedRows)
	defer func() {
		if t.Failed() {
			err := w.CheckLease()
			w.rows.mu.Lock()
			t.Logf("CheckLease %v; inflight: stale %d, abandoned %d", err, len(w.rows.stale), len(w.rows.abandoned))
			w.rows.mu.Unlock()
		}
	}()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"every row held at the loss untracked, and the hold after the regain over")
	t.Logf("after 5 s: CheckLease %v, Track %v", w.CheckLease(), w.Track(ctx, 5))
}

// (Review finding F.) the fleet record names its server for good (no
// TTL, the server field set once). A fleet whose database moved to a new
// server (dump and restore, a logical-replication blue/green switch, a
// new cluster for a major upgrade: each has a new system_identifier),
// with every worker of the old server shut down cleanly, is refused at
// every Start with ErrFleetMismatch until an operator deletes the record.
// (Review) item 3: the recovery hold of an unverified worker reads
// only the first 100 of a dead peer's rows (sorted by ID). A peer that
// processes a block of 150 in ID order and untracks it at the end (a
// common host: one Untrack per block) dies with rows 1-100 done, one of
// them given back (queued), and rows 101-150 in progress. An idle worker
// (it has not fetched since it started, so it is unverified) holds the
// recovery at every scan, and a held recovery renews the peer's rows set
// (keepScript), so the set never expires and the backstop sweep, which
// sees rows 101-150 held by a set, never takes them: they stay in
// progress for as long as no running worker has verified its
// configuration (12 s here, rows TTL 3 s; 115 held recoveries counted in
// Stats.Errors). The control has row 50 done: no hold, 110 ms.
func TestAnUnverifiedWorkerRecoversAPeerOfManyRowsWithinABound(t *testing.T) {
	for _, requeued := range []bool{false, true} {
		t.Run(fmt.Sprintf("requeued=%v", requeued), func(t *testing.T) {
			rdb, db, prefix := onRealServers(t, 150, "RVG")
			waitUptime(t, rdb, 2*time.Second)
			r := resetterImpls[0].Must(t, db)
			opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
				HeartbeatTTL:      300 * time.Millisecond,
				HeartbeatInterval: 100 * time.Millisecond,
				OperationTimeout:  100 * time.Millisecond,
				RecoveryInterval:  100 * time.Millisecond,
				RowsTTL:           3 * time.Second,
			})}
			ids := make([]int64, 150)
			for i := range ids {
				ids[i] = int64(i + 1)
			}
			idle, logs := startWorker(t, rdb, r, "idle", opts...)
			victim(t, rdb, db, r, "dead", opts, ids...)
			died := time.Now()
			setStatus(t, db, "done", ids[:100]...)
			if requeued {
				setStatus(t, db, "queued", 50)
			}
			ok := assert.Eventually(t, func() bool {
				st := statusesOf(t, db, 101, 150)
				return st[101] == "queued" && st[150] == "queued"
			}, 12*time.Second, 20*time.Millisecond)
			t.Logf("rows 101-150 back in the queue %v after the death (ok %v); idle verdict %d, errors %d, held logs %d",
				time.Since(died).Round(10*time.Millisecond), ok, idle.checker.verdict.Load(), idle.Stats().Errors,
				logs.Count("configuration not verified yet"))
			k := store.InstanceKeys(prefix, "dead")
			t.Logf("dead's rows set: %d members, PTTL %v; registered %v", rdb.SCard(context.Background(), k.Rows).Val(),
				rdb.PTTL(context.Background(), k.Rows).Val(), registered(t, rdb, prefix, "dead"))
			assert.Less(t, time.Since(died), 2*time.Second, "within the crash bound")
		})
	}
}

// (Review) what held up: fetch shapes of correct hosts that raise no
// alarm and verify the configuration (blocks of 50 ms): Track before the
// UPDATE after SELECT ... FOR UPDATE SKIP LOCKED, REPEATABLE READ and
// SERIALIZABLE fetches, a fetch that updates its rows twice, two
// concurrent fetchers with SKIP LOCKED, on text and enum statuses.
func TestCorrectFetchShapesRaiseNoAlarm(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name  string
		iso   string
		fetch func(ctx context.Context, tx pgx.Tx, w *Worker, n int) []int64
	}{
		{"track before the update", "", func(ctx context.Context, tx pgx.Tx, w *Worker, n int) []int64 {
			ids := selectForUpdate(ctx, t, tx, n)
			require.NoError(t, w.Track(ctx, ids...))
			_, err := tx.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id = ANY($1)`, ids)
			require.NoError(t, err)
			return ids
		}},
		{"repeatable read", "REPEATABLE READ", updateTwiceOrOnce(t, false)},
		{"serializable", "SERIALIZABLE", updateTwiceOrOnce(t, false)},
		{"updated twice", "", updateTwiceOrOnce(t, true)},
	}
	for _, enum := range []bool{false, true} {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("%s/enum=%v", sh.name, enum), func(t *testing.T) {
				db, w, _, alarms := jobsWorld(t, resetterImpls[0], enum, "running", "pending", "RVH")
				ctx := context.Background()
				other, _ := startWorker(t, testutil.Redis(t), w.resetter, "other", slowBeats(testutil.Name("RVH2"))...)
				var failed atomic.Int32
				for range 10 {
					var wg sync.WaitGroup
					for _, wk := range []*Worker{w, other} {
						wg.Add(1)
						go func() {
							defer wg.Done()
							tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(sh.iso)})
							if !assert.NoError(t, err) {
								return
							}
							defer func() { _ = tx.Rollback(ctx) }()
							ids := sh.fetch(ctx, tx, wk, 3)
							if err := tx.Commit(ctx); err != nil || len(ids) == 0 {
								// A serialization failure: the host rolls back,
								// untracks and fetches again.
								if err != nil {
									failed.Add(1)
								}
								_ = wk.Untrack(ids...)
								return
							}
							time.Sleep(50 * time.Millisecond) // pace: the host's work on its block
							_, err = db.Exec(ctx, `UPDATE jobs SET state = 'finished' WHERE id = ANY($1)`, ids)
							assert.NoError(t, err)
							assert.NoError(t, wk.Untrack(ids...))
						}()
					}
					wg.Wait()
				}
				waitLookAfter(t, w, time.Now())
				t.Logf("fetches that failed to commit: %d of 20", failed.Load())
				select {
				case e := <-alarms:
					t.Fatalf("false alarm: %v", e.Err)
				default:
				}
				require.NoError(t, w.Healthy())
				t.Logf("verdict %d (1: verified, 0: not yet)", w.checker.verdict.Load())
				assert.NotEqual(t, int32(2), w.checker.verdict.Load())
			})
		}
	}
}

func selectForUpdate(ctx context.Context, t *testing.T, tx pgx.Tx, n int) []int64 {
	rows, err := tx.Query(ctx, `SELECT id FROM jobs WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func updateTwiceOrOnce(t *testing.T, twice bool) func(ctx context.Context, tx pgx.Tx, w *Worker, n int) []int64 {
	return func(ctx context.Context, tx pgx.Tx, w *Worker, n int) []int64 {
		rows, err := tx.Query(ctx, `UPDATE jobs SET state = 'running' WHERE id IN (SELECT id FROM jobs WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id`, n)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Logf("fetch failed (the host retries): %v", err)
			return nil // a serialization failure: the transaction is rolled back
		}
		require.NoError(t, w.Track(ctx, ids...))
		if twice {
			_, err = tx.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id = ANY($1)`, ids)
			require.NoError(t, err)
		}
		return ids
	}
}

// (Review, what finding D cost.) after the false "misspelt?" alarm of
// a correct host, its worker holds every recovery of a dead peer (the
// alarm holds verdicts, deadpeer.go): a peer's rows, tracked correctly,
// stay in progress.
func TestACompletionInTwoStatementsLeavesPeerRecoveriesUnheld(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	publicJobsTable(t, db, false)
	r := jobsResetter(t, resetterImpls[0], db, "running", "pending")
	obs, alarms := misconfiguredSignal()
	prefix := testutil.Name("RVJ")
	w, _ := startWorker(t, rdb, r, "w", append(slowBeats(prefix), obs)...)
	ctx := context.Background()
	// Finding D: a correct host, completion in two statements.
	fetchJobs(t, db, w, 0, "", 1, 2, 3)
	_, err := db.Exec(ctx, `UPDATE jobs SET state = 'finished' WHERE id = ANY($1)`, []int64{1, 2, 3})
	require.NoError(t, err)
	waitLook(t, w) // the quick look sees 'finished'
	_, err = db.Exec(ctx, `UPDATE jobs SET state = state WHERE id = ANY($1)`, []int64{1, 2, 3})
	require.NoError(t, err)
	require.NoError(t, w.Untrack(1, 2, 3))
	select {
	case <-alarms:
	case <-time.After(2 * time.Second):
		t.Skip("no false alarm this time")
	}
	// A correct peer dies with rows 500-502 in progress.
	v, _ := startWorker(t, rdb, r, "v", slowBeats(prefix)...)
	fetchJobs(t, db, v, 0, "", 500, 501, 502)
	v.crash()
	require.NoError(t, rdb.Del(ctx, v.ownKeys().Heartbeat).Err())
	rep, err := w.recoverNow(ctx)
	t.Logf("RecoverNow: %+v, %v", rep, err)
	var states []string
	require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(state::text ORDER BY id) FROM jobs WHERE id IN (500, 501, 502)`).Scan(&states))
	assert.Equal(t, []string{"pending", "pending", "pending"}, states, "the dead peer's rows back in the queue")
}

// (Review) item 3 as the brief puts it: an idle fleet (its worker
// never fetches, so it never verifies) and a dead peer whose rows were
// all finished but one, given back to the queue, before the peer could
// untrack them. The recovery is held at every scan, the held set's TTL is
// renewed, so the peer stays registered with its set, and every scan
// counts an error, for as long as the fleet stays idle: here 3 rows TTLs.
// Worse, the held set (one queued row, none in progress) makes the
// backstop sweep hold as "statuses swapped" (suspect, heldRowsStale), so
// a row in progress in no set (row 7) is never reset either. Control
// (row 4 done): the peer recovered at once, row 7 reset in 1.1 s.
func TestAnIdleUnverifiedFleetRecoversADeadPeerWithARequeuedRow(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 10, "RVK")
	waitUptime(t, rdb, 2*time.Second)
	r := resetterImpls[0].Must(t, db)
	opts := rowsSweepTimings(WithKeyPrefix(prefix))
	idle, _ := startWorker(t, rdb, r, "idle", opts...)
	victim(t, rdb, db, r, "dead", opts, 1, 2, 3, 4)
	setStatus(t, db, "done", 1, 2, 3)
	setStatus(t, db, "queued", 4)
	crashed := time.Now()
	recovered := false
	defer func() { // when the wait below failed: what kept the peer
		if !recovered {
			k := store.InstanceKeys(prefix, "dead")
			t.Logf("after %v: dead registered %v, its set %d members (PTTL %v), idle's errors %d, verdict %d",
				time.Since(crashed).Round(10*time.Millisecond), registered(t, rdb, prefix, "dead"), rdb.SCard(context.Background(), k.Rows).Val(),
				rdb.PTTL(context.Background(), k.Rows).Val(), idle.Stats().Errors, idle.checker.verdict.Load())
		}
	}()
	// Within 3 s (3 rows TTLs), seen at the end of one of idle's scans.
	waitTurns(t, &signals(idle).scan, 3*time.Second, func() bool { return !registered(t, rdb, prefix, "dead") },
		"the dead peer, nothing of it in progress, is recovered within a bound")
	recovered = true
	t.Logf("dead peer recovered within %v; idle's errors %d", time.Since(crashed).Round(10*time.Millisecond), idle.Stats().Errors)

	// Row 7 is in progress in no rows set (its worker's set was lost long
	// ago): the backstop sweep's case. The sweep sees the sets hold rows
	// (the dead peer's), none of them in progress and one queued: it
	// holds as "statuses swapped?".
	setStatus(t, db, "inprog", 7)
	stuck := time.Now()
	ok := assert.Eventually(t, func() bool { return statusesOf(t, db, 7)[7] == "queued" }, 6*time.Second, 50*time.Millisecond,
		"row 7 reset by the sweep within a rows TTL and its looks")
	t.Logf("row 7 queued: %v after %v; stray rows reset: %d, idle's errors %d", ok, time.Since(stuck).Round(10*time.Millisecond),
		idle.Stats().StrayRowsReset, idle.Stats().Errors)
}

// (Review) finding B2: a correct host (Track before the COMMIT) whose
// fetch also takes rows stuck 'running' (its own visibility timeout:
// WHERE state = 'pending' OR (state = 'running' AND taken_at < ...), a
// common job-queue shape) and gives such a row back inside the fetch
// ('pending', e.g. a row it must not run now). Track's read sees the row
// locked at its committed status 'running', the look sees the fetch
// commit 'pending': "statuses swapped?" (with one Untrack per block; a
// host that untracks the given-back row at once is not judged).
func TestFetchGivingBackAStaleRunningRowIsNotStatusesSwapped(t *testing.T) {
	t.Parallel()
	db, w, _, alarms := jobsWorld(t, resetterImpls[0], false, "running", "pending", "RVL")
	ctx := context.Background()
	_, err := db.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id = 7`) // stuck long ago, in no set
	require.NoError(t, err)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id IN (5, 6, 7)`) // the fetch, stale row 7 included
	require.NoError(t, err)
	require.NoError(t, w.Track(ctx, 5, 6, 7))
	_, err = tx.Exec(ctx, `UPDATE jobs SET state = 'pending' WHERE id = 7`) // given back inside the fetch
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	waitLook(t, w) // the quick look after the COMMIT; then rows 5 and 6 are processed
	_, err = db.Exec(ctx, `UPDATE jobs SET state = 'finished' WHERE id IN (5, 6)`)
	require.NoError(t, err)
	require.NoError(t, w.Untrack(5, 6, 7)) // one Untrack per block
	untracked := time.Now()                // after Untrack: a look begun later judges its rows
	requireNoAlarm(t, w, alarms, untracked)
	t.Logf("verdict %d", w.checker.verdict.Load())
}

// (Review) what held up: the short-block check through PgBouncer in
// transaction pooling mode, each resetter configured as the docs say:
// swapped statuses are caught on the first block of 50 ms; a correct
// configuration raises no alarm and is verified.
func TestShortBlockCheckThroughPgBouncer(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		for _, swapped := range []bool{true, false} {
			t.Run(fmt.Sprintf("swapped=%v", swapped), func(t *testing.T) {
				rdb := testutil.Redis(t)
				db := testutil.Postgres(t)
				b := testutil.PgBouncer(t, db)
				publicJobsTable(t, db, false)
				inprog, queued := "running", "pending"
				if swapped {
					inprog, queued = queued, inprog
				}
				r := bouncedResetter(t, impl, db, b.Addr, postgres.WithTable("jobs"), postgres.WithIDColumn("id"), postgres.WithStatusColumn("state"), postgres.WithStatuses(inprog, queued))
				require.NoError(t, r.CreateLedger(context.Background()))
				obs, alarms := misconfiguredSignal()
				w, _ := startWorker(t, rdb, r, "w", append(slowBeats(testutil.Name("RVM")), obs)...)
				// Track's read of the rows being fetched is bounded and
				// judges nothing when it does not answer in time (a loaded
				// machine, PgBouncer in between): the first block whose
				// read answered is the one caught.
				pre := &signals(w).preread
				for block := int64(0); ; block++ {
					require.Less(t, block, int64(20), "no read of the rows being fetched answered within its bound in 20 blocks")
					ids := []int64{3*block + 1, 3*block + 2, 3*block + 3}
					pre.Clear()
					fetchJobs(t, db, w, 0, "", ids...)
					ok, made := pre.Take()
					waitLook(t, w) // the quick look after the COMMIT
					finishJobs(t, db, w, "finished", ids...)
					untracked := time.Now() // after Untrack: a look begun later judges its rows
					waitUntrackLook(t, w, untracked)
					if !swapped || (made && ok) {
						break
					}
				}
				if swapped {
					require.ErrorIs(t, w.Healthy(), ErrMisconfigured, "swapped statuses caught on the first block whose read answered")
					return
				}
				require.NoError(t, w.Healthy(), "no false alarm")
				assert.Equal(t, int32(1), w.checker.verdict.Load())
				select {
				case e := <-alarms:
					t.Fatalf("false alarm: %v", e.Err)
				default:
				}
			})
		}
	})
}

// (Review) item 3's premise: "until this worker has seen a row of its
// own in progress". A busy, correct host whose rows finish within a
// millisecond or two of the fetch's COMMIT (fast work, one Untrack per
// row) is never seen in progress: after 200 blocks its self-check is
// still unverified (the fast looks are spent), so its recovery holds of
// item 3 last as long as such a fleet runs.
func TestFastCorrectHostIsVerified(t *testing.T) {
	t.Parallel()
	db, w, _, alarms := jobsWorld(t, resetterImpls[0], false, "running", "pending", "RVN")
	for block := range 200 {
		fastBlock(t, db, w, block)
	}
	waitLookAfter(t, w, time.Now())
	select {
	case e := <-alarms:
		t.Fatalf("false alarm: %v", e.Err)
	default:
	}
	t.Logf("after 200 blocks: verdict %d, fast looks on %v, reads %d, sightings %d", w.checker.verdict.Load(), w.checker.fast.Load(),
		w.checker.checks.Load(), w.checker.sightings.Load())
	assert.Equal(t, int32(1), w.checker.verdict.Load(), "verified")
}

// (Review) item 2: a correct host whose very first fetch fails
// before it reaches Track (a serialization failure or deadlock on the
// UPDATE, a statement timeout) and whose clean-up untracks the block's
// IDs, as Track's doc advises for a failed fetch ("roll the fetch back
// (and Untrack the IDs)"): Untrack without any Track is taken for a host
// that forgot Track, and Healthy fails with ErrUntrackedRows for a rows
// TTL (180 s by default; a liveness probe restarts the worker).
// (Review) missed alarm probe: the fast host of
// TestFastCorrectHostIsVerified with a misspelt in-progress status
// and with swapped statuses.
func TestFastHostWithMisconfiguredStatusesIsCaught(t *testing.T) {
	for _, c := range []struct{ name, inprog, queued string }{{"misspelt", "in_progress", "pending"}, {"swapped", "pending", "running"}} {
		t.Run(c.name, func(t *testing.T) {
			db, w, _, alarms := jobsWorld(t, resetterImpls[0], false, c.inprog, c.queued, "RVP")
			// Track's read of the rows being fetched is bounded (it is on
			// the host's path) and judges nothing when it does not answer
			// in time, as on a loaded machine: the host is caught within
			// blocks whose read answered, however many went unread.
			pre := &signals(w).preread
			start := time.Now()
			answered := 0
			for block := 0; answered < 200 && block < 5000; block++ {
				pre.Clear()
				fastBlock(t, db, w, block)
				if ok, made := pre.Take(); made && ok {
					answered++
				}
				select {
				case <-alarms:
					t.Logf("caught at block %d (%d read in time), %v", block, answered, time.Since(start).Round(time.Millisecond))
					return
				default:
				}
			}
			t.Fatalf("not caught in %d blocks whose read answered (%v): verdict %d, reads %d", answered, time.Since(start).Round(time.Millisecond),
				w.checker.verdict.Load(), w.checker.checks.Load())
		})
	}
}

// requireNoAlarm waits for w's self-check turn begun after untracked (the
// look an Untrack asks for: the one that would raise a false alarm on its
// rows), then checks that w is healthy and no alarm was sent.
func requireNoAlarm(t *testing.T, w *Worker, alarms <-chan Event, untracked time.Time) {
	t.Helper()
	waitUntrackLook(t, w, untracked)
	require.NoError(t, w.Healthy(), "no false alarm on a correct configuration")
	select {
	case e := <-alarms:
		t.Fatalf("false alarm on a correct configuration: %v", e.Err)
	default:
	}
}

// fastBlock is block n of a fast host: rows 3n+1..3n+3 fetched (Track
// before the COMMIT), then each finished and untracked at once.
func fastBlock(t *testing.T, db *pgxpool.Pool, w *Worker, n int) {
	t.Helper()
	ids := []int64{int64(3*n + 1), int64(3*n + 2), int64(3*n + 3)}
	fetchJobs(t, db, w, 0, "", ids...)
	for _, id := range ids {
		_, err := db.Exec(context.Background(), `UPDATE jobs SET state = 'finished' WHERE id = $1`, id)
		require.NoError(t, err)
		require.NoError(t, w.Untrack(id))
	}
}
