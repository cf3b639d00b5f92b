package recovery

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Rows without an owner: a worker that does not set the owner column (a
// rows-set worker of the release before the column existed) dies, and an
// owner-mode worker recovers it (docs/safety.md §13, A4).

// oldWorker starts a rows-set worker without an owner column, as the fleet
// ran before the column was added: its resetter records resets in the
// ledger, and its fetch leaves the owner NULL.
func oldWorker(t *testing.T, env ownerNullEnv, id string) *Worker {
	t.Helper()
	r, err := pgxreset.New(env.db)
	require.NoError(t, err)
	w, _ := startWorker(t, env.rdb, r, id, WithKeyPrefix(env.prefix))
	require.False(t, w.Stats().OwnerMode)
	return w
}

type ownerNullEnv struct {
	rdb    *redis.Client
	db     *pgxpool.Pool
	prefix string
}

func TestOwnerModeResetsRowsWithoutOwnerOfADeadRowsSetWorker(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 8, "N")
	env := ownerNullEnv{rdb, db, prefix}
	ctx := context.Background()
	old := oldWorker(t, env, "old")
	setStatus(t, db, "inprog", 1, 2, 3, 4, 5) // owner NULL: the old fetch does not set it
	require.NoError(t, old.Track(ctx, 1, 2, 3, 4, 5))
	take(t, db, "other", 6) // a row another worker owns is never touched
	old.crash()

	rec, logs := newWorker(t, rdb, fencedResetter(t, db), "new", WithKeyPrefix(prefix))
	require.True(t, rec.Stats().OwnerMode)
	waitHeartbeatGone(t, rdb, prefix, "old")
	plan, err := rec.planRecovery(ctx)
	require.NoError(t, err)
	require.Len(t, plan.Peers, 1)
	assert.Equal(t, report.PlanReset, plan.Peers[0].Action, "the dry run says what the recovery does")
	assert.Equal(t, []int64{1, 2, 3, 4, 5}, plan.Peers[0].WouldReset)
	rep, err := rec.recoverNow(ctx)

	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	pr := rep.Recovered[0]
	assert.Equal(t, 5, pr.RowsFound)
	assert.Equal(t, int64(5), pr.RowsReset, "rows without an owner in a dead worker's rows set are its rows")
	assertRequeued(t, db, 1, 2, 3, 4, 5)
	s, o := rowState(t, db, 6)
	assert.Equal(t, "inprog", s)
	assert.Equal(t, "other", *o)
	n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, "old").Rows).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	t.Log(logs.String())
}

// rolloutHost is one host process of the rollout test: a batch loop
// (blocks of 5 rows, 5-10 ms a row, the completion recorded in the table
// ledger, as completeRow does) over its Worker, as written before the owner column
// (owner false: the fetch leaves the owner NULL, the completion is guarded
// by status) or after it.
type rolloutHost struct {
	w     *Worker
	owner bool
	// stop ends the loop after its block (a graceful deploy); dead at
	// once (the process is gone: it commits nothing more).
	stop, dead atomic.Bool
	// killNext makes the loop close midBlock after its next fetch and
	// stop there, holding the block, until dead.
	killNext atomic.Bool
	midBlock chan struct{}
	done     chan struct{}
}

func startRolloutHost(t *testing.T, env ownerNullEnv, r Resetter, id string, owner bool) *rolloutHost {
	t.Helper()
	w, _ := startWorker(t, env.rdb, r, id, WithKeyPrefix(env.prefix))
	require.Equal(t, owner, w.Stats().OwnerMode)
	h := &rolloutHost{w: w, owner: owner, midBlock: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.loop(t, env.db)
	}()
	t.Cleanup(func() { h.dead.Store(true); <-h.done })
	return h
}

func (h *rolloutHost) loop(t *testing.T, db *pgxpool.Pool) {
	ctx := context.Background()
	for !h.stop.Load() && !h.dead.Load() {
		ids, err := fetchBlock(ctx, db, h.w, 5, h.owner)
		switch {
		case errors.Is(err, ErrShutdown):
			return
		case err != nil:
			t.Errorf("%s: fetch: %v", h.w.InstanceID(), err)
			return
		case len(ids) == 0:
			time.Sleep(20 * time.Millisecond) // pace: a host's back-off before it asks again
			continue
		}
		if h.killNext.Load() {
			close(h.midBlock)
			return // killed holding the block
		}
		for _, id := range ids {
			if h.dead.Load() {
				return
			}
			time.Sleep(time.Duration(5+rand.N(5)) * time.Millisecond) // pace: the host's work on the row
			if err := completeRow(ctx, db, h.w.InstanceID(), id, h.owner); err != nil {
				t.Errorf("%s: complete row %d: %v", h.w.InstanceID(), id, err)
				return
			}
			_ = h.w.Untrack(id)
		}
	}
}

// TestOwnerColumnRolloutCompletesEveryRowOnceWhenAnOldWorkerDies walks the
// rollout docs/integration.md prescribes for adding an owner column, in its
// order: rows-set workers without the column run; the column and its index
// are added while they run; owner-mode workers start; the deploy stops one
// old worker and the other is killed in the middle of a block, so only
// owner-mode workers are left to recover it. Its rows have no owner.
func TestOwnerColumnRolloutCompletesEveryRowOnceWhenAnOldWorkerDies(t *testing.T) {
	const rows = 200
	rdb, db, prefix := onRealServers(t, rows, "RO")
	env := ownerNullEnv{rdb, db, prefix}
	ctx := context.Background()
	_, err := db.Exec(ctx, `ALTER TABLE batchrows DROP COLUMN owner;
		CREATE TABLE ledger (rowid bigint NOT NULL, instance text NOT NULL)`)
	require.NoError(t, err)

	// 1. The fleet before the column: rows sets, the reset ledger.
	plain, err := pgxreset.New(db)
	require.NoError(t, err)
	old1 := startRolloutHost(t, env, plain, "old-1", false)
	old2 := startRolloutHost(t, env, plain, "old-2", false)

	// 2. The migration of docs/integration.md §1, online, while they run.
	_, err = db.Exec(ctx, `ALTER TABLE batchrows ADD COLUMN owner text;
		CREATE INDEX batchrows_inprog_owner ON batchrows (owner, rowid) WHERE status = 'inprog'`)
	require.NoError(t, err)

	// 3. Owner-mode workers start.
	fenced := fencedResetter(t, db)
	new1 := startRolloutHost(t, env, fenced, "new-1", true)
	new2 := startRolloutHost(t, env, fenced, "new-2", true)

	// 4. The deploy stops one old worker; the other dies holding a block,
	// so only owner-mode workers are left to recover it.
	old2.stop.Store(true)
	<-old2.done
	require.NoError(t, old2.w.Shutdown(ctx))
	old1.killNext.Store(true)
	select {
	case <-old1.midBlock:
	case <-old1.done:
		t.Fatal("old-1 stopped before it was killed")
	}
	old1.dead.Store(true)
	old1.w.crash()
	var held int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status = 'inprog' AND owner IS NULL`).Scan(&held))
	require.Equal(t, 5, held, "old-1's block, without an owner")
	require.Len(t, rowsOf(t, rdb, prefix, "old-1"), 5, "in its rows set")

	var left int
	ok := assert.Eventually(t, func() bool {
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status <> 'done'`).Scan(&left))
		return left == 0
	}, 20*time.Second, 50*time.Millisecond, "every row done: none lost")
	if !ok {
		var stuck int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status = 'inprog' AND owner IS NULL`).Scan(&stuck))
		t.Logf("rows not done: %d, of which in progress without an owner: %d (old-1 registered: %v)",
			left, stuck, registered(t, rdb, prefix, "old-1"))
	}
	for _, h := range []*rolloutHost{new1, new2} {
		h.stop.Store(true)
		<-h.done
	}
	var total, distinct int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*), count(DISTINCT rowid) FROM ledger`).Scan(&total, &distinct))
	assert.Equal(t, rows, distinct, "every row completed")
	assert.Equal(t, rows, total, "no row completed twice")
	recovered := new1.w.Stats().RowsRecovered + new2.w.Stats().RowsRecovered
	assert.Equal(t, uint64(5), recovered, "old-1's block, reset by an owner-mode worker")
	t.Logf("rows reset by owner-mode workers: %d", recovered)
}

// TestOwnerFencedResetOfARowsSetTreatsRowsWithoutOwnerAsARowsSetRecoveryWould
// checks the guards on rows without an owner, for every implementation:
// reset once per incarnation under the ledger (a second recovery after a
// lost outcome leaves the row an old worker took since alone); reset
// without a ledger for an unknown incarnation, as a rows-set recovery does;
// kept and reported, never counted settled, when the ledger table is
// missing or the rows do not come from a rows set (Release).
func TestOwnerFencedResetOfARowsSetTreatsRowsWithoutOwnerAsARowsSetRecoveryWould(t *testing.T) {
	t.Parallel()
	for _, impl := range resetterImpls {
		t.Run(impl.Name, func(t *testing.T) {
			_, db, _ := onRealServers(t, 6, "N")
			ctx := context.Background()
			r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
			setStatus(t, db, "inprog", 1, 2, 3) // no owner
			take(t, db, "dead", 4)
			take(t, db, "live", 5)
			req := RowsReset{InstanceID: "dead", Incarnation: "inc-1", RowIDs: []int64{1, 2, 3, 4, 5, 6}, FromRowsSet: true}

			// Release (no rows set): rows without an owner are not its to
			// reset, and not settled either.
			rel, err := r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: "inc-1", RowIDs: []int64{1, 4}})
			require.NoError(t, err)
			assert.Equal(t, int64(1), rel.Changed, "row 4 only")
			assert.Equal(t, []RowState{{ID: 1, Status: "inprog"}}, rel.NotReset)
			take(t, db, "dead", 4)

			res, err := r.ResetRows(ctx, req)
			require.NoError(t, err)
			assert.Equal(t, int64(4), res.Changed, "rows 1, 2, 3 (no owner) and 4 (owned by the dead worker)")
			assert.Empty(t, res.NotReset, "row 5 is another worker's, row 6 queued")
			assertRequeued(t, db, 1, 2, 3, 4)
			s, o := rowState(t, db, 5)
			assert.Equal(t, "inprog", s)
			assert.Equal(t, "live", *o)
			var logged int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger WHERE instance_id = 'dead' AND incarnation = 'inc-1'`).Scan(&logged))
			assert.Equal(t, 4, logged, "recorded under the dead worker's incarnation")

			// The recoverer died before it could tell Redis; an old worker
			// took row 1 (owner still NULL); the next recoverer reads the
			// same rows set.
			setStatus(t, db, "inprog", 1)
			res, err = r.ResetRows(ctx, req)
			require.NoError(t, err)
			assert.Zero(t, res.Changed, "the ledger says the dead worker's rows were reset")
			assert.Empty(t, res.NotReset)
			s, _ = rowState(t, db, 1)
			assert.Equal(t, "inprog", s, "the live old worker keeps its row")

			// A worker of the first protocol version: no incarnation, no
			// ledger, as a rows-set recovery of it does.
			setStatus(t, db, "inprog", 2)
			res, err = r.ResetRows(ctx, RowsReset{InstanceID: "v1", RowIDs: []int64{2}, FromRowsSet: true})
			require.NoError(t, err)
			assert.Equal(t, int64(1), res.Changed)

			// Without the ledger table: kept and reported.
			_, err = db.Exec(ctx, `DROP TABLE recovery_ledger`)
			require.NoError(t, err)
			setStatus(t, db, "inprog", 3)
			take(t, db, "dead2", 4)
			res, err = r.ResetRows(ctx, RowsReset{InstanceID: "dead2", Incarnation: "inc-2", RowIDs: []int64{3, 4}, FromRowsSet: true})
			require.NoError(t, err)
			assert.Equal(t, int64(1), res.Changed, "row 4, which the dead worker owns")
			assert.Equal(t, []RowState{{ID: 3, Status: "inprog"}}, res.NotReset)

			// WithoutResetLedger: the host said rows are idempotent.
			noLedger := impl.Must(t, db, postgres.WithOwnerColumn("owner"), postgres.WithoutResetLedger())
			res, err = noLedger.ResetRows(ctx, RowsReset{InstanceID: "dead2", Incarnation: "inc-2", RowIDs: []int64{3}, FromRowsSet: true})
			require.NoError(t, err)
			assert.Equal(t, int64(1), res.Changed)
		})
	}
}

// TestOwnerModeKeepsADeadWorkersRowsWithoutOwnerWhenTheLedgerIsMissing: a
// recovery that cannot reset rows without an owner keeps the rows set and
// the registry entry, fails with ErrRowsNotReset saying why, and resets
// them once the ledger table exists.
func TestOwnerModeKeepsADeadWorkersRowsWithoutOwnerWhenTheLedgerIsMissing(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "N")
	env := ownerNullEnv{rdb, db, prefix}
	ctx := context.Background()
	old := oldWorker(t, env, "old")
	setStatus(t, db, "inprog", 1, 2, 3)
	require.NoError(t, old.Track(ctx, 1, 2, 3))
	old.crash()
	_, err := db.Exec(ctx, `DROP TABLE recovery_ledger`)
	require.NoError(t, err)

	r := fencedResetter(t, db)
	rec, logs := newWorker(t, rdb, r, "new", WithKeyPrefix(prefix))
	waitHeartbeatGone(t, rdb, prefix, "old")
	_, err = rec.recoverNow(ctx)

	require.ErrorIs(t, err, ErrRowsNotReset)
	assert.Contains(t, err.Error(), "3 of 3 rows of old")
	assert.Contains(t, err.Error(), "3 without an owner")
	assert.Equal(t, 1, logs.Count("3 without an owner"), "logged once")
	assert.Equal(t, uint64(3), rec.Stats().RowsNotReset)
	assert.True(t, registered(t, rdb, prefix, "old"), "kept for the next scan")
	assert.Len(t, rowsOf(t, rdb, prefix, "old"), 3)

	require.NoError(t, r.CreateLedger(ctx)) // what docs/operations.md says to do
	// The failed recovery left a note that holds the claim for the next
	// scan of this worker only briefly; retry as the loop would.
	require.Eventually(t, func() bool {
		rep, err := rec.recoverNow(ctx)
		return err == nil && len(rep.Recovered) == 1
	}, 5*time.Second, 50*time.Millisecond)
	assertRequeued(t, db, 1, 2, 3)
	assert.False(t, registered(t, rdb, prefix, "old"))
}
