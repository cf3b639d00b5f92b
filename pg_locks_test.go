package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// otherSession is pgtest.OtherSession: sql in a transaction of another
// session, left open until the returned function or the test's end.
func otherSession(t *testing.T, db *pgxpool.Pool, sql string, args ...any) (end func()) {
	t.Helper()
	return pgtest.OtherSession(t, db, sql, args...)
}

// holdRowLock locks the given rows in a transaction of another session,
// as a completion transaction left open on a host that vanished does, and
// returns the function that ends it.
func holdRowLock(t *testing.T, db *pgxpool.Pool, ids ...int64) (release func()) {
	t.Helper()
	return otherSession(t, db, `SELECT rowid FROM batchrows WHERE rowid = ANY($1) FOR UPDATE`, ids)
}

// lockTestTimeout bounds each reset of the lock tests: a reset that
// waited on the row lock would end at lockTimeoutShare of it.
const lockTimeoutForTest = 5 * time.Second

// A reset never waits on a row lock another session holds (issue 20, item
// 5): it resets the rows it can lock, at once, reports the locked one as
// not reset (Locked), and resets it once the lock is gone. Every reset
// path: by owner (owner mode, the sweep), by IDs with owner fencing, and
// by IDs with the reset ledger; through each Go database API.
func TestResetNeverWaitsOnARowLockAnotherSessionHolds(t *testing.T) {
	paths := []struct {
		name  string
		opts  []postgres.Option
		reset func(ctx context.Context, r pgResetterAPI) (ResetResult, error)
	}{
		{"by owner", []postgres.Option{postgres.WithOwnerColumn("owner")}, func(ctx context.Context, r pgResetterAPI) (ResetResult, error) {
			return r.ResetOwner(ctx, OwnerReset{Owner: "dead"})
		}},
		{"by IDs fenced", []postgres.Option{postgres.WithOwnerColumn("owner")}, func(ctx context.Context, r pgResetterAPI) (ResetResult, error) {
			return r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1, 2, 3, 4, 5}})
		}},
		{"by IDs with ledger", nil, func(ctx context.Context, r pgResetterAPI) (ResetResult, error) {
			return r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1, 2, 3, 4, 5}})
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl resetterImpl) {
				db := testutil.Postgres(t)
				testutil.CreateBatch(t, db, 5)
				take(t, db, "dead", 1, 2, 3, 4, 5)
				release := holdRowLock(t, db, 3)
				r := impl.Must(t, db, p.opts...)

				ctx, cancel := context.WithTimeout(context.Background(), lockTimeoutForTest)
				defer cancel()
				start := time.Now()
				res, err := p.reset(ctx, r)
				took := time.Since(start)
				require.NoError(t, err, "after %v", took)
				assert.Less(t, took, time.Second, "the reset did not wait for the lock")
				assert.Equal(t, int64(4), res.Changed)
				require.Len(t, res.NotReset, 1)
				assert.Equal(t, int64(3), res.NotReset[0].ID)
				assert.Equal(t, "inprog", res.NotReset[0].Status)
				assert.True(t, res.NotReset[0].Locked, "reported as locked")
				st := statuses(t, db)
				assert.Equal(t, map[int64]string{1: "queued", 2: "queued", 3: "inprog", 4: "queued", 5: "queued"}, st)

				release()
				res, err = p.reset(ctx, r)
				require.NoError(t, err)
				assert.Equal(t, int64(1), res.Changed, "the locked row, once its lock is gone")
				assert.Empty(t, res.NotReset)
				assert.Equal(t, "queued", statuses(t, db)[3])
			})
		})
	}
}

// A reset that waits for a table lock (an ALTER TABLE or LOCK TABLE left
// in an open transaction) gives up at lock_timeout, before its context
// ends, with an error that names the lock wait (ErrRowsLocked), not a bare
// "context deadline exceeded".
func TestResetWaitingOnATableLockSaysSo(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 2)
		take(t, db, "dead", 1, 2)
		otherSession(t, db, `LOCK TABLE batchrows IN SHARE MODE`)

		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := r.ResetOwner(rctx, OwnerReset{Owner: "dead"})
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrRowsLocked)
		assert.Contains(t, err.Error(), "lock_timeout")
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "the server gave up first: %v", err)
		assert.Equal(t, 1, strings.Count(err.Error(), "reset rows owned by dead"), "one prefix: %v", err)
	})
}

// The ledger's advisory lock (one per incarnation) is taken with the try
// variant: a session holding it (a recoverer whose host vanished mid-reset)
// fails the reset at once with ErrRowsLocked instead of blocking it.
func TestResetWithTheLedgerDoesNotWaitForAnotherSessionsIncarnationLock(t *testing.T) {
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	take(t, db, "dead", 1, 2)
	ctx := context.Background()
	end := otherSession(t, db, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, "dead/i1")

	r, err := pgxreset.New(db)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, lockTimeoutForTest)
	defer cancel()
	start := time.Now()
	_, err = r.ResetRows(rctx, RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1, 2}})
	assert.Less(t, time.Since(start), time.Second)
	require.ErrorIs(t, err, ErrRowsLocked)
	assert.Contains(t, err.Error(), "advisory lock")

	end()
	res, err := r.ResetRows(rctx, RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1, 2}})
	require.NoError(t, err)
	assert.Equal(t, int64(2), res.Changed)
}

// A dead peer with a row locked by a transaction still open (its host
// vanished mid-completion): recovery resets its other rows at once, keeps
// the peer (registry entry, rows set) for the next scan, says why at Warn
// (ErrRowsLocked, no misconfiguration: Stats.RowsNotReset stays 0), and
// resets the locked row at the first scan after the lock is gone. In both
// modes.
func TestRecoveryOfAPeerWithALockedRowResetsTheRestAndRetriesIt(t *testing.T) {
	for _, mode := range bothModes {
		t.Run(mode.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			prefix := testutil.DeadPeer(t, rdb, db, "dead", 5)
			release := holdRowLock(t, db, 3)
			r := fencedResetter(t, db)
			w, logs := newWorker(t, rdb, r, "rec", append([]Option{WithKeyPrefix(prefix)}, mode.opts...)...)
			ctx := context.Background()

			start := time.Now()
			rep, err := w.recoverNow(ctx)
			took := time.Since(start)
			require.Error(t, err)
			assert.Less(t, took, 2*time.Second, "no wait on the lock")
			assert.ErrorIs(t, err, ErrRowsLocked)
			assert.ErrorIs(t, err, ErrRowsNotReset)
			require.Len(t, rep.Failed, 1)
			assert.Equal(t, int64(4), rep.Failed[0].RowsReset)
			require.Len(t, rep.Failed[0].NotReset, 1)
			assert.True(t, rep.Failed[0].NotReset[0].Locked)
			assert.Equal(t, map[int64]string{1: "queued", 2: "queued", 3: "inprog", 4: "queued", 5: "queued"}, statuses(t, db))
			assert.True(t, registered(t, rdb, prefix, "dead"), "kept for the next scan")
			assert.Zero(t, w.Stats().RowsNotReset, "a lock is no misconfiguration")
			w.peers.rlog.peerFailed("dead", err)
			assert.Contains(t, logs.String(), `"level":"WARN","msg":"recovery of dead peer left rows another session holds locked`)
			assert.NotContains(t, logs.String(), "check the resetter's statuses")

			_, err = w.recoverNow(ctx)
			require.ErrorIs(t, err, ErrRowsLocked, "still locked: still kept")
			assert.True(t, registered(t, rdb, prefix, "dead"))

			release()
			rep, err = w.recoverNow(ctx)
			require.NoError(t, err)
			require.Len(t, rep.Recovered, 1)
			assert.Equal(t, int64(1), rep.Recovered[0].RowsReset)
			assertRequeued(t, db, 1, 2, 3, 4, 5)
			assert.False(t, registered(t, rdb, prefix, "dead"))
		})
	}
}

// Release skips a row another session holds locked: the others go back to
// the queue and are untracked, the locked one stays tracked, and the error
// wraps ErrRowsLocked.
func TestReleaseKeepsARowAnotherSessionHoldsLockedTracked(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	r := fencedResetter(t, db)
	w, _ := startWorker(t, rdb, r, "rel", WithKeyPrefix(testutil.Name("L")))
	ctx := context.Background()
	take(t, db, "rel", 1, 2, 3)
	require.NoError(t, w.Track(ctx, 1, 2, 3))
	holdRowLock(t, db, 2)

	err := w.Release(ctx, 1, 2, 3)
	require.ErrorIs(t, err, ErrRowsLocked)
	assert.Equal(t, map[int64]string{1: "queued", 2: "inprog", 3: "queued"}, statuses(t, db))
	tracked, _, _ := w.rows.snapshot()
	assert.Equal(t, []int64{2}, tracked, "the locked row stays tracked")
}

// The error of a failed reset names its context once (issue 20: "reset
// rows owned by X: reset rows owned by X: ..."), through the whole
// dead-peer path, in both modes.
func TestRecoveryErrorNamesTheResetOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name, prefix string
		opts         []Option
	}{{"owner mode", "reset rows owned by dead", nil}, {"rows sets", "reset rows of dead", []Option{WithRowsSets()}}} {
		t.Run(mode.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			prefix := testutil.DeadPeer(t, rdb, db, "dead", 2)
			if mode.opts == nil { // an owner-mode peer keeps no rows set
				require.NoError(t, rdb.Del(context.Background(), prefix+"_{dead}_ROWS").Err())
			}
			_, err := db.Exec(context.Background(), `ALTER TABLE batchrows RENAME COLUMN status TO state`)
			require.NoError(t, err)
			w, _ := newWorker(t, rdb, fencedResetter(t, db), "rec", append([]Option{WithKeyPrefix(prefix)}, mode.opts...)...)
			_, err = w.recoverNow(context.Background())
			require.Error(t, err)
			msg := err.Error()
			assert.Equal(t, 1, strings.Count(msg, mode.prefix), "prefix once: %s", msg)
			var pe *report.PeerError
			assert.True(t, errors.As(err, &pe), fmt.Sprint(err))
		})
	}
}

// A pod restarted under its fixed ID after its node vanished: the old
// process's session still holds one of its rows locked. Start must reset
// every row PostgreSQL names this ID the owner of before it heartbeats, so
// it waits (Warn once) within its context for the lock, instead of failing
// or heartbeating over a row it never took; an ended context says why.
func TestStartWaitsForRowsItsPredecessorLeftLocked(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	take(t, db, "pod-0", 1, 2, 3)
	release := holdRowLock(t, db, 2)
	r := fencedResetter(t, db)
	prefix := testutil.Name("O")

	w, _ := newWorker(t, rdb, r, "pod-0", WithKeyPrefix(prefix))
	// 2 s: Start's round trips before the reset (PING, INFO, the fleet
	// record, the claim) used up 600 ms under make test on a loaded
	// machine, before the row lock was reached.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := w.Start(ctx)
	require.ErrorIs(t, err, ErrRowsLocked, "the context ended first")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	w2, logs := newWorker(t, rdb, r, "pod-0", WithKeyPrefix(prefix))
	// Cleanups run last first: a test that fails before release ends the
	// lock before w2's Shutdown, which waits for its Start, which waits
	// for the lock.
	t.Cleanup(release)
	started := make(chan error, 1)
	go func() { started <- w2.Start(context.Background()) }()
	const waiting = "Start waits for rows a previous process left under this instance ID"
	waitTurns(t, &signals(w2).locked, 10*time.Second, func() bool { return logs.Count(waiting) > 0 })
	select {
	case err := <-started:
		t.Fatalf("Start returned while row 2 was locked: %v", err)
	default:
	}
	release()
	require.NoError(t, <-started)
	assertRequeued(t, db, 1, 2, 3)
	assert.Equal(t, 1, logs.Count(waiting), "said once")
}
