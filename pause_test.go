package recovery

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 21: a worker without an owner column, paused past its TTL, could
// not go on. Release refused (ErrLeaseLost), its rows stayed tracked, and
// the self-check took the rows a recoverer had reset meanwhile for
// swapped statuses, for good. With the reset ledger (the default without
// an owner column) Release is now a recovery of the worker by itself,
// under its incarnation: the rows a peer already recovered are left alone,
// whoever holds them now. The test runs the whole story on real servers:
//
//  1. w takes rows 1-4 and finishes row 1; then it is paused (its Redis
//     calls hang) past its TTL.
//  2. Peer p recovers w: rows 2-4 go back to the queue.
//  3. w resumes. Its lease stays lost (sticky: rows 2-4 were held at the
//     loss), and its self-check, which had not verified the configuration
//     yet, does not judge rows 2-4 (tracked and queued).
//  4. p takes rows 2 and 3; w's host, told by CheckLease, releases the
//     rest of its block (2-4): nothing is reset, rows 2 and 3 stay p's.
//  5. w's next fetch gets rows 4 and 5 (not 2 or 3), its self-check
//     verifies the configuration, and every row is processed once.
func TestPausedWorkerWithoutOwnerColumnReleasesItsBlockAndGoesOn(t *testing.T) {
	t.Parallel()
	for _, impl := range resetterImpls {
		t.Run(impl.Name, func(t *testing.T) {
			t.Parallel()
			rdb, db, prefix := onRealServers(t, 10, "PZ")
			ctx := context.Background()
			// No owner column: rows sets and the reset ledger. The self-check
			// reads nothing until w has resumed: its first block is not
			// verified yet when it is paused.
			r := &blindResetter{pgResetterAPI: impl.Must(t, db)}
			r.blind.Store(true)
			require.True(t, r.Info().Ledger)
			wc := redis.NewClient(rdb.Options())
			t.Cleanup(func() { _ = wc.Close() })
			fr := &freezer{}
			wc.AddHook(fr)
			timing := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
				HeartbeatTTL:      time.Second,
				HeartbeatInterval: 250 * time.Millisecond,
				RecoveryInterval:  time.Hour,
				RowsTTL:           2 * time.Hour,
				ResetTimeout:      500 * time.Millisecond,
			}), // the hold after the regain: a claim TTL, 875ms
				WithTimings(Timings{SelfCheckWindow: 200 * time.Millisecond})}
			w, logs := startWorker(t, wc, r, "w", timing...)
			p, _ := startWorker(t, rdb, r, "p", timing...)
			processed := map[int64][]string{}
			finish := func(by *Worker, ids ...int64) {
				setStatus(t, db, "done", ids...)
				require.NoError(t, by.Untrack(ids...))
				for _, id := range ids {
					processed[id] = append(processed[id], by.InstanceID())
				}
			}

			setStatus(t, db, "inprog", 1, 2, 3, 4)
			require.NoError(t, w.Track(ctx, 1, 2, 3, 4))
			finish(w, 1)

			fr.freeze() // paused
			require.Eventually(t, func() bool {
				n, err := rdb.Exists(ctx, w.ownKeys().Heartbeat).Result()
				return err == nil && n == 0
			}, 5*time.Second, 10*time.Millisecond, "w's heartbeat expires")
			require.ErrorIs(t, w.CheckLease(), ErrLeaseLost)
			_, err := p.recoverNow(ctx)
			require.NoError(t, err)
			require.Equal(t, map[int64]string{1: "done", 2: "queued", 3: "queued", 4: "queued"}, statusesOf(t, db, 1, 2, 3, 4))

			fr.thaw() // resumed
			waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
			// Rows 2-4 were held at the loss: the lease stays lost, and
			// names them, until the host releases or untracks them, or the
			// worker gives them back itself when the hold after the regain
			// (875 ms) ends (heartbeat.go).
			err = w.CheckLease()
			require.ErrorIs(t, err, ErrLeaseLost, "rows 2-4 may have been recovered meanwhile")
			assert.Contains(t, err.Error(), "rows 2, 3, 4")
			r.blind.Store(false)
			beats := w.Stats().Heartbeats
			waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().Heartbeats >= beats+4 },
				"a second, five self-check windows, with rows 2-4 tracked and queued")
			assert.False(t, w.Stats().Misconfigured, "rows a recoverer reset are not a misconfiguration")
			// p's recovery finished w's rows set, so w's first heartbeat after
			// the loss found it gone: rows 2-4 are left to the backstop sweep
			// (not written back; Release only forgets them, docs/safety.md §3).
			assert.Equal(t, 1, logs.Count("rows held when the lease was lost are left to the backstop sweep"),
				"rows 2-4, held at the loss, are left to the sweep")

			setStatus(t, db, "inprog", 2, 3) // p's fetch
			require.NoError(t, p.Track(ctx, 2, 3))
			require.NoError(t, w.Release(ctx, 2, 3, 4), "the documented way on")
			assert.Equal(t, map[int64]string{2: "inprog", 3: "inprog", 4: "queued"}, statusesOf(t, db, 2, 3, 4),
				"p's rows 2 and 3 are left alone")
			assert.Equal(t, map[int64]int{2: 1, 3: 1, 4: 1}, pgtest.ByRow[int](t, db, `SELECT row_id, count(*) FROM recovery_ledger WHERE instance_id = 'w' GROUP BY row_id`), "each row of w reset once, by p's recovery")
			assert.Zero(t, w.Stats().TrackedRows)

			waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil },
				"every row held at the loss given back, and the hold after the regain over")
			next := queuedAmong(t, db, 2, 3, 4, 5)
			require.Equal(t, []int64{4, 5}, next, "w's next fetch")
			setStatus(t, db, "inprog", next...)
			require.NoError(t, w.Track(ctx, next...))
			waitTurns(t, &signals(w).look, 5*time.Second, func() bool { return w.checker.verdict.Load() == 1 },
				"the self-check judges the new block, and verifies the configuration")
			finish(w, next...)
			finish(p, 2, 3)

			for id := int64(1); id <= 5; id++ {
				assert.Len(t, processed[id], 1, "row %d processed once: %v", id, processed[id])
			}
			require.NoError(t, w.Healthy())
			assert.False(t, w.Stats().Misconfigured)
		})
	}
}

// blindResetter is a resetter whose RowStates fail while blind.
type blindResetter struct {
	pgResetterAPI
	blind atomic.Bool
}

func (b *blindResetter) RowStates(ctx context.Context, ids []int64) ([]RowState, error) {
	if b.blind.Load() {
		return nil, errors.New("blind")
	}
	return b.pgResetterAPI.RowStates(ctx, ids)
}

// statusesOf returns rowid -> status of ids.
func statusesOf(t *testing.T, db *pgxpool.Pool, ids ...int64) map[int64]string {
	t.Helper()
	all := statuses(t, db)
	out := make(map[int64]string, len(ids))
	for _, id := range ids {
		out[id] = all[id]
	}
	return out
}

// queuedAmong returns, in order, the rows of ids that are queued.
func queuedAmong(t *testing.T, db *pgxpool.Pool, ids ...int64) []int64 {
	t.Helper()
	all := statuses(t, db)
	var out []int64
	for _, id := range ids {
		if all[id] == "queued" {
			out = append(out, id)
		}
	}
	return out
}
