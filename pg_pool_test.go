package recovery

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	"github.com/alya/recovery/postgres/sqlreset"
)

// poolTimings are fast's timings with a reset timeout of 1 s: how long a
// starved reset waits for a connection.
func poolTimings() Option {
	return WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RecoveryInterval:  time.Second,
		RowsTTL:           4 * time.Second,
		ResetTimeout:      time.Second,
	})
}

// starvedPool is a pool of one connection on the test's database, as a
// host configures the pool it shares with the resetter, and hold, which
// takes that connection into a transaction of the host's until the
// returned function (or the test's end) ends it.
type starvedPool struct {
	resetter Resetter
	hold     func(t *testing.T) (end func())
}

// pgxStarvedPool is a *pgxpool.Pool of MaxConns 1.
func pgxStarvedPool(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) starvedPool {
	cfg := db.Config().Copy()
	cfg.MaxConns = 1
	small, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(small.Close)
	r, err := pgxreset.New(small, opts...)
	require.NoError(t, err)
	return starvedPool{resetter: r, hold: func(t *testing.T) func() {
		tx, err := small.Begin(context.Background())
		require.NoError(t, err)
		end := func() { _ = tx.Rollback(context.Background()) }
		t.Cleanup(end)
		return end
	}}
}

// sqlStarvedPool is a *sql.DB (pgx's stdlib) of SetMaxOpenConns(1).
func sqlStarvedPool(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) starvedPool {
	h := pgtest.StdlibDB(t, db)
	h.SetMaxOpenConns(1)
	r, err := sqlreset.New(h, opts...)
	require.NoError(t, err)
	return starvedPool{resetter: r, hold: func(t *testing.T) func() {
		tx, err := h.BeginTx(context.Background(), &sql.TxOptions{})
		require.NoError(t, err)
		end := func() { _ = tx.Rollback() }
		t.Cleanup(end)
		return end
	}}
}

// A resetter that shares a pool too small for it is told at Start (a
// Warn naming the pool's size and use), and a recovery kept waiting for a
// connection by the host's transaction says so, instead of "begin:
// context deadline exceeded": the wait, the connections in use, and
// what to do (postgres.ErrPoolExhausted). Once the host's transaction ends, the
// next recovery resets the rows. Both modes, both Go database APIs.
func TestAResetterStarvedOfItsPoolSaysSoAtStartAndWhileItWaits(t *testing.T) {
	cases := []struct {
		name      string
		ownerMode bool
		pool      func(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) starvedPool
	}{
		{"pgx rows-set mode", false, pgxStarvedPool},
		{"pgx owner mode", true, pgxStarvedPool},
		{"database/sql rows-set mode", false, sqlStarvedPool},
		{"database/sql owner mode", true, sqlStarvedPool},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			rdb, db, prefix := onRealServers(t, 5, "STARVE")
			var opts []postgres.Option
			if c.ownerMode {
				opts = append(opts, postgres.WithOwnerColumn("owner"))
			}
			p := c.pool(t, db, opts...)
			rec := &recorder{}
			w, logs := startWorker(t, rdb, p.resetter, "starved", WithKeyPrefix(prefix), poolTimings(), WithObserver(rec.Observe))
			assert.Regexp(t, `"the resetter's connection pool had fewer connections free at Start than recovery uses at once \(2\)[^\n]*"pool_max_conns":1,"pool_in_use":0,"pool_free":1`, logs.String(),
				"Start warns about a pool too small to share")

			end := p.hold(t) // the host's long transaction takes the only connection
			own, err := pgxreset.New(db, opts...)
			require.NoError(t, err)
			v, _ := startWorker(t, rdb, own, "victim", WithKeyPrefix(prefix))
			if c.ownerMode {
				take(t, db, v.OwnerValue(), 1, 2, 3)
			} else {
				setStatus(t, db, "inprog", 1, 2, 3)
			}
			require.NoError(t, v.Track(ctx, 1, 2, 3))
			v.crash()
			require.NoError(t, rdb.Del(ctx, v.ownKeys().Heartbeat).Err())

			const warn = "recovery of dead peer found no free connection in the resetter's pool"
			waitTurns(t, &signals(w).scan, 10*time.Second, func() bool {
				return len(rec.of(EventRecoveryFailed)) > 0 && logs.Count(warn) > 0
			}, "a recovery that waited for a connection, and its Warn")
			failed := rec.of(EventRecoveryFailed)[0]
			assert.Equal(t, "victim", failed.PeerID)
			require.ErrorIs(t, failed.Err, postgres.ErrPoolExhausted)
			assert.Regexp(t, `resetter waited \d+(\.\d+)?m?s for a connection from its pool \(1 of 1 in use\): give the resetter its own pool`, failed.Err.Error())
			assert.NotContains(t, failed.Err.Error(), "begin: context deadline exceeded")
			assert.Equal(t, 1, logs.Count(warn), "once per outage")
			assert.Regexp(t, warn+`[^\n]*"peer_id":"victim"[^\n]*resetter waited [^\n]*\(1 of 1 in use\): give the resetter its own pool`, logs.String(),
				"the Warn carries the wait")

			end()
			waitTurns(t, &signals(w).scan, 10*time.Second, func() bool {
				return len(rec.of(EventRowsRecovered)) > 0
			}, "the recovery once the host's transaction ended")
			got := statuses(t, db)
			for _, id := range []int64{1, 2, 3} {
				assert.Equal(t, "queued", got[id], "row %d", id)
			}
		})
	}
}

// A Start whose resetter finds every connection of its pool taken by the
// host fails, and says why: the schema check waited for a connection
// (postgres.ErrPoolExhausted), not for the database.
func TestStartWithThePoolHeldByTheHostSaysTheResetterWaitedForAConnection(t *testing.T) {
	for _, pool := range []func(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) starvedPool{pgxStarvedPool, sqlStarvedPool} {
		rdb, db, prefix := onRealServers(t, 1, "STARVEST")
		p := pool(t, db)
		p.hold(t)
		w, logs := newWorker(t, rdb, p.resetter, "starved", WithKeyPrefix(prefix), poolTimings())
		err := w.Start(context.Background())
		require.ErrorIs(t, err, postgres.ErrPoolExhausted)
		assert.Contains(t, err.Error(), "for a connection from its pool (1 of 1 in use): give the resetter its own pool")
		assert.Zero(t, logs.Count("connections free at Start"), "the error says it; no second message")
	}
}

// A pool with room for the resetter draws no Warn at Start.
func TestStartDoesNotWarnAboutAPoolWithRoomForTheResetter(t *testing.T) {
	rdb, db, prefix := onRealServers(t, 1, "ROOMY")
	cfg := db.Config().Copy()
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := pgxreset.New(pool)
	require.NoError(t, err)
	_, logs := startWorker(t, rdb, r, "roomy", WithKeyPrefix(prefix))
	assert.Zero(t, logs.Count("connections free at Start"))
}
