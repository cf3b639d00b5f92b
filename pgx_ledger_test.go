package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// F2, crash: the recoverer's reset commits and the recoverer dies before
// Redis hears of it. The rows are taken again by a live worker; without
// owner fencing the next recoverer used to reset them under it. For each
// resetter: the ledger is written by each implementation's own code.
func TestSafetyAResetCommittedByARecovererKilledBeforeFinishIsNotAppliedAgain(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		rdb, db, prefix := onRealServers(t, 10, "F2")
		pg := impl.Must(t, db, postgres.WithRecoveryCountColumn("recoveries"))
		require.True(t, pg.Info().Ledger)
		timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{ResetTimeout: time.Second})}
		victim(t, rdb, db, pg, "victim", timing, 1, 2, 3, 4, 5)

		// R1's Redis client dies right after the COMMIT: no finish, no
		// release; its claim stays until it expires, as after SIGKILL.
		r1client := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, ContextTimeoutEnabled: true})
		killer := &hookResetter{pgResetterAPI: pg, after: func() { r1client.Close() }}
		r1, _ := newWorker(t, r1client, killer, "r1", timing...)
		_, err := r1.recoverNow(ctx)
		require.Error(t, err, "R1 cannot finish")
		got := statuses(t, db)
		for id := int64(1); id <= 5; id++ {
			require.Equal(t, "queued", got[id], "R1's reset committed")
		}

		setStatus(t, db, "inprog", 1, 2, 3, 4, 5) // a live worker takes them again

		r2, _ := newWorker(t, rdb, pg, "r2", timing...)
		require.Eventually(t, func() bool {
			rep, err := r2.recoverNow(ctx)
			return err == nil && len(rep.Recovered) == 1
		}, 10*time.Second, 100*time.Millisecond, "R2 recovers the victim once R1's claim expired")
		got = statuses(t, db)
		counts := recoveries(t, db)
		for id := int64(1); id <= 5; id++ {
			assert.Equal(t, "inprog", got[id], "row %d stays with the live worker that took it", id)
			assert.Equal(t, 1, counts[id], "row %d counted as recovered once", id)
		}
		assert.False(t, registered(t, rdb, prefix, "victim"))
		assert.Empty(t, rowsOf(t, rdb, prefix, "victim"))
	})
}

// commitMarker is how each implementation's COMMIT looks on the wire:
// pgx (and database/sql over pgx's stdlib) sends "commit", lib/pq
// "COMMIT".
func commitMarker(impl resetterImpl) []byte {
	if impl.Name == "libpq" {
		return []byte("COMMIT")
	}
	return []byte("commit")
}

// F2, lost acknowledgement: the connection drops after the COMMIT reached
// PostgreSQL and before its reply came back; the recoverer sees an error
// and cannot know the reset committed. For each resetter, whose driver
// reports the lost reply in its own way.
func TestSafetyAResetWhoseCommitReplyWasLostIsNotAppliedAgain(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		rdb, db, prefix := onRealServers(t, 10, "F2")
		proxy := pgProxy(t, db)
		direct := impl.Must(t, db, postgres.WithRecoveryCountColumn("recoveries"))
		timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{ResetTimeout: time.Second})}
		victim(t, rdb, db, direct, "victim", timing, 1, 2, 3)

		viaProxy := impl.Must(t, testutil.PoolVia(t, db, proxy.Addr), postgres.WithRecoveryCountColumn("recoveries"))
		r, _ := newWorker(t, rdb, viaProxy, "recoverer", timing...)
		dropped := proxy.DropReplyTo(commitMarker(impl))
		_, err := r.recoverNow(ctx)
		select {
		case <-dropped:
		case <-time.After(5 * time.Second):
			t.Fatalf("the COMMIT's reply was never dropped; recovery said %v", err)
		}
		require.Error(t, err, "the recoverer does not know whether its reset committed")
		for id := int64(1); id <= 3; id++ {
			require.Equal(t, "queued", statuses(t, db)[id], "it did")
		}
		assert.True(t, registered(t, rdb, prefix, "victim"), "kept for the next scan")

		setStatus(t, db, "inprog", 1, 2, 3) // a live worker takes them again
		rep, err := r.recoverNow(ctx)
		require.NoError(t, err)
		require.Len(t, rep.Recovered, 1)
		assert.Zero(t, rep.RowsReset, "nothing reset twice")
		counts := recoveries(t, db)
		for id := int64(1); id <= 3; id++ {
			assert.Equal(t, "inprog", statuses(t, db)[id], "row %d stays with the live worker", id)
			assert.Equal(t, 1, counts[id])
		}
		assert.False(t, registered(t, rdb, prefix, "victim"))
	})
}

// R4 (fixed). The unknown incarnation "" makes the ledger skip a row for every
// later life of the same instance ID, for the ledger's retention (7 days).
//
// A new recoverer of an old worker finds no incarnation and records its
// reset under the incarnation "". So every life of an old-version worker with a fixed ID (a StatefulSet pod during
// a rolling deploy, or a host calling pgxreset.Resetter.ResetRows itself, which
// also records under "") shares one ledger key:
//
//	old-0 (life 1, first version): row 1 in progress; killed
//	R (second version): resets row 1, ledger (old-0, "", 1)
//	old-0 (life 2, same ID, still the first version): takes row 1 again; killed
//	R: row 1 is in the ledger under (old-0, "") -> settled, skipped;
//	   old-0 deregistered as recovered; row 1 in progress for ever
func TestSafetyUnknownIncarnationNeverHidesARowOfTheNextLifeOfTheSameID(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		rdb, db, prefix := onRealServers(t, 10, "RV4")
		pg, err := impl.New(t, db)
		require.NoError(t, err)
		require.True(t, pg.Info().Ledger)
		r, _ := newWorker(t, rdb, pg, "r", WithKeyPrefix(prefix))

		setStatus(t, db, "inprog", 1, 2) // life 1 of old-0 (a first-version worker: no incarnation key)
		plantDeadPeer(t, rdb, prefix, "old-0", "1", "2")
		rep, err := r.recoverNow(ctx)
		require.NoError(t, err)
		require.Len(t, rep.Recovered, 1)
		require.Equal(t, "queued", statuses(t, db)[1])

		setStatus(t, db, "inprog", 1)       // life 2 of old-0 takes row 1 again, and dies
		require.Eventually(t, func() bool { // once the tombstone of the first recovery is gone
			plantDeadPeer(t, rdb, prefix, "old-0", "1")
			rep, err = r.recoverNow(ctx)
			return err == nil && len(rep.Recovered) == 1
		}, 5*time.Second, 100*time.Millisecond)
		assert.Equal(t, "queued", statuses(t, db)[1], "row 1 of old-0's second life must be recovered; the ledger of its first life skips it")
		assert.False(t, registered(t, rdb, prefix, "old-0"), "and old-0 is gone from the registry: nobody will retry")
	})
}
