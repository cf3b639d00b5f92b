package recovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/netfault"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Review of issue 20's finished guarantees, as an adversary (review2).

// Item 3's memory is the process's own: a worker that starts after Redis
// restarted empty has learnt nothing, and the record it reads is empty
// until the slow member's next heartbeat. In a rolling deploy that
// shortens the TTL, the new processes start exactly then. This is a
// documented limit (docs/safety.md §13, A3), not covered: the test shows
// what happens, as documented.
//
// Interleaving: a long-TTL worker (20 s, a heartbeat every 10 s) beats;
// Redis restarts empty; a short-TTL worker (1 s) starts. Its owner sweep
// finds the long one's rows in PostgreSQL and no heartbeat, holds its own
// TTL from the server's start, sights twice its own TTL apart and resets
// the rows about 3 s after the restart (up to 9 s on a loaded machine),
// under the long one's lease. The
// long worker's next heartbeat (10 s after the restart) writes its
// heartbeat again within its TTL, so its lease stays valid and it is not
// told; the owner guard refuses its completions of the rows reset under
// it, so nothing is completed twice, but their processing is lost work
// and another worker may take them meanwhile (processed twice, completed
// once).
func TestAWorkerStartedAfterAnEmptyRestartJudgesTheFleetByItsOwnTTL(t *testing.T) {
	ctx := context.Background()
	// The long worker scans and sweeps once a minute: its sweep never takes
	// the sweep turn from the short worker after the restart (with its
	// 2 s interval it did, on a loaded machine, and held it: the short
	// worker never swept).
	srv, db, prefix, long, beats := longTTLWorldBeating(t, "R20a", 10*time.Second,
		WithTimings(Timings{RecoveryInterval: time.Minute, RowsTTL: 5 * time.Minute}))

	// The long worker just beat (Start's heartbeat, milliseconds ago): its
	// next heartbeat is 10 s away. (Waiting for the loop's first beat
	// instead cost 10 s of a sequential test.)
	<-beats
	drain(beats)
	restarted := time.Now()
	srv.Restart()

	short, _ := newWorker(t, srv.Client(t), fencedResetter(t, db), "short", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 300 * time.Millisecond,
			RecoveryInterval:  300 * time.Millisecond,
			ResetTimeout:      time.Second,
		}))
	require.NoError(t, short.Start(ctx))
	require.True(t, short.Stats().OwnerMode)
	ttl, _, _ := short.fleet.mem.longest()
	assert.Equal(t, time.Second, max(ttl, short.opts.heartbeatTTL), "the record was empty: the short worker knows only its own TTL")

	require.Eventually(t, func() bool { return longRowsReset(t, db) == 5 }, 9*time.Second, 20*time.Millisecond,
		"documented (docs/safety.md §13, A3): the short worker resets the live long-TTL worker's rows before its next heartbeat")
	resetAfter := time.Since(restarted)
	t.Logf("5 of 5 rows of the live long-TTL worker reset %v after the empty restart (its next heartbeat 10 s after it)", resetAfter.Round(100*time.Millisecond))
	assert.Less(t, resetAfter, 10*time.Second, "before the long worker's next heartbeat")
	select {
	case <-beats:
		t.Error("the long worker beat again before its rows were reset")
	default:
	}

	<-beats // the long worker's first heartbeat after the restart
	assert.NoError(t, long.CheckLease(), "the long worker is not told: its heartbeat came back within its TTL")
	tag, err := db.Exec(ctx, `UPDATE batchrows SET status = 'done' WHERE rowid = 1 AND status = 'inprog' AND owner = 'long'`)
	require.NoError(t, err)
	assert.Zero(t, tag.RowsAffected(), "the owner guard refuses the long worker's completion of a row reset under it")
}

// vanishingConn is a pgxreset.Execer over one connection whose host vanishes
// right before COMMIT: the socket closes without a Terminate message, as
// a host's power loss leaves it, after every statement of the reset ran.
type vanishingConn struct{ *pgx.Conn }

func (c vanishingConn) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := c.Conn.Begin(ctx)
	return vanishingTx{Tx: tx, c: c.Conn}, err
}

type vanishingTx struct {
	pgx.Tx
	c *pgx.Conn
}

func (t vanishingTx) Commit(context.Context) error {
	_ = t.c.PgConn().Conn().Close()
	return errors.New("the host vanished before COMMIT")
}

// A5 assumes no session holds a row lock forever, and Start warns when the
// database sets no idle_in_transaction_session_timeout. But the
// resetter's own transaction is such a session: a recoverer whose host
// vanishes mid-reset (the server keeps its socket until TCP keepalive
// gives up, about 2 h 11 min) leaves every row it reset so far locked, and
// with the reset ledger the incarnation's advisory lock too. Every later
// recoverer skips those rows (or, with the ledger, the whole incarnation),
// until the server ends the session.
//
// With the code before the fix: all 5 rows still locked, and reported so,
// 5 s after the vanished recoverer's reset timeout (1 s) ran out. The fix
// bounds the reset's own transaction (SET LOCAL
// idle_in_transaction_session_timeout to the time its context leaves).
func TestARecovererThatVanishesMidResetDoesNotStrandTheRowsItLocked(t *testing.T) {
	for _, mode := range []struct {
		name   string
		opts   []postgres.Option
		verify func(ctx context.Context, r *pgxreset.Resetter) (ResetResult, error)
	}{
		{"by owner", []postgres.Option{postgres.WithOwnerColumn("owner")}, func(ctx context.Context, r *pgxreset.Resetter) (ResetResult, error) {
			return r.ResetOwner(ctx, OwnerReset{Owner: "dead"})
		}},
		{"ledger", nil, func(ctx context.Context, r *pgxreset.Resetter) (ResetResult, error) {
			return r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1, 2, 3, 4, 5}})
		}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 5)
			take(t, db, "dead", 1, 2, 3, 4, 5)

			cfg := db.Config().ConnConfig.Copy()
			proxy, err := netfault.NewProxy(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
			require.NoError(t, err)
			t.Cleanup(func() { _ = proxy.Close() })
			proxy.Vanish()
			host, port, _ := net.SplitHostPort(proxy.Addr)
			p, _ := strconv.Atoi(port)
			cfg.Host, cfg.Port = host, uint16(p)
			cfg.Fallbacks = nil
			app := testutil.Name("vanished")
			cfg.RuntimeParams["application_name"] = app
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)

			vanished, err := pgxreset.New(vanishingConn{conn}, mode.opts...)
			require.NoError(t, err)
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = mode.verify(rctx, vanished)
			cancel()
			require.Error(t, err, "the vanished recoverer's COMMIT never came")
			var open int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND application_name = $1`, app).Scan(&open))
			require.Equal(t, 1, open, "its session is still open, idle in its transaction")
			vanishedAt := time.Now()

			r, err := pgxreset.New(db, mode.opts...)
			require.NoError(t, err)
			// Nothing of ours ends the vanished session: PostgreSQL does, at
			// the idle_in_transaction_session_timeout its reset set. Retry
			// until then, within 6 s of the vanishing, every 100 ms.
			var (
				mu      sync.Mutex // the condition runs on Eventually's goroutine
				last    ResetResult
				lastErr error
				reset   int64
			)
			assert.Eventually(t, func() bool {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				res, err := mode.verify(rctx, r)
				cancel()
				mu.Lock()
				defer mu.Unlock()
				last, lastErr = res, err
				reset += res.Changed
				return reset >= 5
			}, 6*time.Second-time.Since(vanishedAt), 100*time.Millisecond, "PostgreSQL ended the vanished session and its rows were reset")
			mu.Lock()
			defer mu.Unlock()
			t.Logf("all 5 rows reset %v after the recoverer vanished", time.Since(vanishedAt).Round(100*time.Millisecond))
			assert.Equal(t, int64(5), reset, "rows reset %v after the recoverer vanished (its reset timeout 1 s); last: %d locked, error %v",
				time.Since(vanishedAt).Round(100*time.Millisecond), lockedRows(last.NotReset), lastErr)
		})
	}
}

// The backstop sweep without an owner column (docs/safety.md §5b) resets
// stray rows by row version with the same FOR UPDATE SKIP LOCKED as every
// reset, but ResetVersions reports no skipped row: the sweep logs a
// locked row as "rows_changed", forgets it, and finds it again at the next
// look as a new stray row whose gap (a rows TTL, 180 s by default) starts
// over. A5 promises locked rows are reported as not reset and retried at
// every look.
//
// Before the fix: the locked row was logged as changed, and still in
// progress at the first look after the lock ended (reset only a whole gap
// later). Now it is reported locked and tried again at every look.
func TestBackstopSweepByVersionRetriesALockedStrayRowAtTheNextLook(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	ctx := context.Background()
	setJobs(t, db, schema, "running", 1, 2) // a fleet gone: in no rows set
	w, logs := newWorker(t, rdb, r, "sweeper", rowsSweepTimings(WithKeyPrefix(testutil.Name("R20v")))...)
	rep, err := w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, rep.strayWaiting)

	end := otherSession(t, db, fmt.Sprintf("SELECT id FROM %s.jobs WHERE id = 1 FOR UPDATE", schema))
	require.Eventually(t, func() bool {
		rep, err = w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep.strayFound > 0
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, int64(1), rep.strayReset, "row 2 reset; row 1 skipped, locked")
	assert.Equal(t, 1, rep.strayLocked, "row 1 reported locked")
	w.peers.rlog.swept(rep, nil)
	assert.Contains(t, logs.String(), `"rows_locked":1,"rows_refused":0,"rows_gone":0,"rows_changed":0`)
	rep, err = w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.strayLocked, "still locked: tried again at the next look")

	end()
	rep, err = w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[int64]string{1: "pending", 2: "pending", 3: "pending", 4: "pending"}, jobStates(t, db, schema),
		"the locked row is reset at the first look after the lock ended")
}

// Item 2's identity was database, schema and table, not the server: two
// applications on two PostgreSQL servers whose database, schema and table
// are named alike (staging and production sharing one Redis; two services
// that both took the defaults: database postgres, schema public, table
// batchrows) passed the check, and each recovered the other's dead
// workers into its own table. The record now names the server too (its
// system_identifier), and Start refuses the second server.
//
// The record is first written as the release before the server field
// writes it (serves only): A's Start accepts it and fills the server (the
// rolling upgrade), and B is refused all the same.
//
// Before the fix (the server neither recorded nor compared): B started;
// A's scan reset 5 of 5 rows of its own live worker, in A's table, for B's
// dead worker.
func TestTwoServersWithTheSameNamesAreTwoFleets(t *testing.T) {
	testutil.PostgresURL(t) // skips under -short, or without PostgreSQL
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows := `INSERT INTO batchrows (rowid, batchid) SELECT g, 1 FROM generate_series(1, 10) g;`
	dbA, dbB := privatePostgres(ctx, t, rows), privatePostgres(ctx, t, rows)
	rdb := testutil.Redis(t)
	shared := testutil.Name("R20s")
	rA, err := pgxreset.New(dbA)
	require.NoError(t, err)
	rB, err := pgxreset.New(dbB)
	require.NoError(t, err)
	infoA, err := rA.Check(ctx, false)
	require.NoError(t, err)
	infoB, err := rB.Check(ctx, false)
	require.NoError(t, err)
	servesA, servesB := infoA.Serves, infoB.Serves
	require.Equal(t, servesA, servesB, "the two servers' names are alike")
	serverA, serverB := infoA.Server, infoB.Server
	require.NotEqual(t, serverA, serverB)

	key := store.FleetKey(shared)
	require.NoError(t, rdb.HSet(ctx, key, "serves", servesA).Err()) // the release before the server field
	a, _ := startWorker(t, rdb, rA, "liveA", WithKeyPrefix(shared))
	assert.Equal(t, serverA, rdb.HGet(ctx, key, "server").Val(), "A's Start accepted the old record and filled the server")
	take(t, dbA, "liveA", 1, 2, 3, 4, 5)
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4, 5))

	b, _ := newWorker(t, rdb, rB, "deadB", WithKeyPrefix(shared))
	err = b.Start(ctx)
	if assert.ErrorIs(t, err, ErrFleetMismatch, "another server's table under the prefix is refused") {
		assert.Contains(t, err.Error(), serverA)
		assert.Contains(t, err.Error(), serverB)
		assert.False(t, registered(t, rdb, shared, "deadB"), "the refused worker wrote nothing")
		return
	}
	secondFleetCost(t, rdb, dbA, dbB, a, b, "a second server's fleet")
}

// privatePostgres starts a PostgreSQL server of the test's own and returns
// a pool on it (as superuser) holding testutil.BatchSchema, batch 1 and
// then sql.
func privatePostgres(ctx context.Context, t *testing.T, sql string) *pgxpool.Pool {
	t.Helper()
	srv, err := servers.StartPostgres(ctx)
	if err != nil {
		testutil.Unavailable(t, "start a PostgreSQL server: %v", err)
	}
	t.Cleanup(srv.Stop)
	db, err := pgxpool.New(ctx, srv.URL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, testutil.BatchSchema+"\nINSERT INTO batches (batchid) VALUES (1);\n"+sql)
	require.NoError(t, err)
	return db
}

// A heartbeat that finds the record naming another server (a worker of
// another server recorded it first, after Redis restarted empty) says so
// at Error, once, naming both servers.
func TestHeartbeatLogsAnotherServerOnThePrefix(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 5, "F2v")
	r, err := pgxreset.New(db)
	require.NoError(t, err)
	w, logs := startWorker(t, rdb, r, "w", WithKeyPrefix(prefix))
	_, server := w.fleet.mem.served()
	require.NotEmpty(t, server)
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "server", "system_identifier=1").Err())
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("the key prefix serves another fleet") == 1 })
	assert.Contains(t, logs.String(), `"recorded_server":"system_identifier=1"`)
	assert.Contains(t, logs.String(), `"server":"`+server+`"`)
}

// RecoverNow before Start (recoveryctl recover, an operator's tool) never
// heartbeats, so it never learnt the fleet's timings: after a restart from
// an RDB file it held verdicts for its own TTL only, although the record
// it loaded names a member with a longer one. Here the fleet runs at TTL
// 8 s; the tool at 1 s finds the long worker's heartbeat gone (expired
// since the snapshot) two seconds after the restart, before that worker's
// next heartbeat.
//
// Before the fix: 5 of 5 rows of the live worker reset. Now RecoverNow
// before Start reads the record's announcements and holds for the longest.
func TestRecoverNowBeforeStartHoldsForTheFleetsLongestTTLAfterARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, db, prefix, long, beats := longTTLWorld(t, "R20n")

	c := restartFromASnapshotRightAfterABeat(t, srv, beats)
	require.NoError(t, c.Del(ctx, long.ownKeys().Heartbeat).Err()) // expired since the snapshot
	waitUptime(t, c, 2*time.Second)

	tool, _ := newWorker(t, c, fencedResetter(t, db), "tool", WithKeyPrefix(prefix),
		WithTimings(Timings{HeartbeatTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond}))
	require.Zero(t, c.Exists(ctx, long.ownKeys().Heartbeat).Val(), "the long worker has not beaten since the restart")
	rep, err := tool.recoverNow(ctx)
	require.NoError(t, err)
	reset := longRowsReset(t, db)
	assert.Zero(t, reset, "rows of the live long-TTL worker reset by RecoverNow before Start (found dead: %v), of 5", rep.Dead)
}

// A worker that starts after Redis restarted from a snapshot older than
// three of a member's TTLs finds that member's announcement lapsed: its
// first heartbeat's recount drops it, and its memory held only its own
// TTL. Start now learns the record's announcements, lapsed ones too,
// before its first heartbeat. (The snapshot's age is played by moving the
// announcement's expiry and the longest's due time into the past.)
//
// Before the fix: 5 of 5 rows of the live long-TTL worker reset.
func TestAWorkerStartedAfterARestartFromAnOldSnapshotHoldsForTheLapsedLongTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, db, prefix, long, beats := longTTLWorld(t, "R20o")

	c := restartFromASnapshotRightAfterABeat(t, srv, beats)
	key := store.FleetKey(prefix)
	past := time.Now().Add(-time.Minute).UnixMilli()
	v := c.HGet(ctx, key, "m:long").Val()
	parts := strings.Fields(v)
	require.Len(t, parts, 5, v)
	parts[4] = strconv.FormatInt(past, 10)
	require.NoError(t, c.HSet(ctx, key, "m:long", strings.Join(parts, " "),
		"longest", fmt.Sprintf("8000 1 1 %d", past)).Err())
	require.NoError(t, c.Del(ctx, long.ownKeys().Heartbeat).Err()) // expired since the snapshot

	short, _ := newWorker(t, c, fencedResetter(t, db), "short", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 300 * time.Millisecond,
			RecoveryInterval:  300 * time.Millisecond,
			ResetTimeout:      time.Second,
		}))
	require.NoError(t, short.Start(ctx))
	<-beats // the long worker's first heartbeat after the restart
	waitScans(t, short, 3)
	reset := longRowsReset(t, db)
	assert.Zero(t, reset, "rows of the live long-TTL worker reset by a worker started after a restart from an old snapshot, of 5")
	assert.NoError(t, long.CheckLease())
}

// longTTLWorld starts a redis-server of the test's own, a batch of 10
// rows, and "long", an owner-mode worker at TTL 8 s (a heartbeat every
// 4 s) under a fresh prefix, holding rows 1..5. beats receives a value at
// each of its heartbeats.
func longTTLWorld(t *testing.T, name string) (srv *testutil.RedisServer, db *pgxpool.Pool, prefix string, long *Worker, beats chan struct{}) {
	t.Helper()
	return longTTLWorldBeating(t, name, 4*time.Second)
}

// longTTLWorldBeating is longTTLWorld with a heartbeat every interval, at
// a TTL of twice that.
func longTTLWorldBeating(t *testing.T, name string, interval time.Duration, extra ...Option) (srv *testutil.RedisServer, db *pgxpool.Pool, prefix string, long *Worker, beats chan struct{}) {
	t.Helper()
	srv = testutil.StartRedis(t)
	db = testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix = testutil.Name(name)
	beats = make(chan struct{}, 16)
	opts := []Option{WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      2 * interval,
			HeartbeatInterval: interval,
			RecoveryInterval:  2 * time.Second,
			RowsTTL:           30 * time.Second,
		}),
		WithObserver(func(e Event) {
			if e.Kind == EventHeartbeat {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}),
	}
	opts = append(opts, extra...)
	long, _ = startWorker(t, srv.Client(t), fencedResetter(t, db), "long", opts...)
	require.True(t, long.Stats().OwnerMode)
	take(t, db, "long", 1, 2, 3, 4, 5)
	require.NoError(t, long.Track(context.Background(), 1, 2, 3, 4, 5))
	// Its first sweep (at Start) has ended: one still under way when the
	// test restarts Redis would take the sweep turn on the restarted
	// server and hold it for 2.2 recovery intervals.
	signals(long).sweep.WaitOrTimeout(t)
	return srv, db, prefix, long, beats
}

// restartFromASnapshotRightAfterABeat waits for a heartbeat of the long
// worker (its next is 4 s away), SAVEs, restarts srv from the snapshot
// and returns a client of it.
func restartFromASnapshotRightAfterABeat(t *testing.T, srv *testutil.RedisServer, beats chan struct{}) *redis.Client {
	t.Helper()
	drain(beats)
	<-beats
	require.NoError(t, srv.Client(t).Save(context.Background()).Err())
	srv.RestartKeepingData()
	return srv.Client(t)
}

// longRowsReset counts the rows of 1..5 no longer in progress by "long".
func longRowsReset(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	reset := 0
	for id := int64(1); id <= 5; id++ {
		if s, o := rowState(t, db, id); s != "inprog" || o == nil || *o != "long" {
			reset++
		}
	}
	return reset
}

// The other half of the empty restart (docs/safety.md §13, A2): the fleet
// record is gone with everything else, so a worker of a second
// application that starts before any heartbeat of ours recorded the
// record again records its own table and starts. Documented, not covered:
// our running workers then log at Error once, and ours that start
// afterwards are refused until the operator deletes the record.
func TestASecondFleetStartedRightAfterAnEmptyRestartIsAcceptedAndOursAreRefused(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartRedis(t)
	_, dbB, rA, rB := twoTables(t, 5)
	prefix := testutil.Name("R20e")
	a1, logs := startWorker(t, srv.Client(t), rA, "a1", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      8 * time.Second,
			HeartbeatInterval: 4 * time.Second,
			RecoveryInterval:  2 * time.Second,
			RowsTTL:           30 * time.Second,
		}))

	srv.Restart()
	c := srv.Client(t)
	_, _ = startWorker(t, c, rB, "b1", WithKeyPrefix(prefix)) // accepted: the record was empty
	recorded := c.HGet(ctx, store.FleetKey(prefix), "serves").Val()
	assert.Contains(t, recorded, pgtest.CurrentSchema(t, dbB), "the second application recorded its table")

	waitTurns(t, &signals(a1).beat, 10*time.Second, func() bool { return logs.Count("the key prefix serves another fleet") == 1 },
		"our running worker says so at its next heartbeat")
	a2, _ := newWorker(t, c, rA, "a2", WithKeyPrefix(prefix))
	assert.ErrorIs(t, a2.Start(ctx), ErrFleetMismatch, "ours that start afterwards are refused")
}
