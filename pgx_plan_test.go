package recovery

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

func TestPlanResetNamesTheRowsAResetWouldChangeAndCommitsNothing(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 6)
		_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid IN (1, 2, 3);
			UPDATE batchrows SET status = 'inprog', recoveries = 2 WHERE rowid = 4;
			UPDATE batchrows SET status = 'done' WHERE rowid = 5;
			UPDATE batchrows SET status = 'inporg' WHERE rowid = 6`)
		require.NoError(t, err)
		// No owner column: the reset ledger is in the plan too.
		r, err := impl.newResetter(t, db, WithRecoveryCountColumn("recoveries"), WithMaxRecoveries(3, "failed"))
		require.NoError(t, err)
		state := func() map[int64]string {
			return byRow[string](t, db, `SELECT rowid, status || '/' || recoveries FROM batchrows`)
		}
		before := state()
		req := ResetRequest{InstanceID: "dead-1", Incarnation: "inc-1", RowIDs: []int64{6, 5, 4, 3, 2, 1, 1, 99}}

		plan, err := r.PlanReset(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 2, 3, 4}, plan.Reset, "rows in progress, not the finished row 5 nor the missing 99")
		assert.Equal(t, []int64{4}, plan.Quarantined, "row 4 reaches its third recovery")
		assert.Equal(t, []RowState{{ID: 6, Status: "inporg"}}, plan.NotReset)
		assert.Equal(t, before, state(), "nothing committed")
		var ledger int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger`).Scan(&ledger))
		assert.Zero(t, ledger, "nothing recorded in the ledger")

		// The reset then does what the plan said.
		res, err := r.ResetIncarnation(ctx, req)
		require.NoError(t, err)
		assert.EqualValues(t, len(plan.Reset), res.Changed)
		assert.Equal(t, plan.Quarantined, res.Quarantined)
		assert.Equal(t, plan.NotReset, res.NotReset)

		// Under the same incarnation the ledger makes a second reset a no-op,
		// and the plan says so.
		_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid = 1`) // re-taken by a live worker
		require.NoError(t, err)
		plan, err = r.PlanReset(ctx, req)
		require.NoError(t, err)
		assert.Empty(t, plan.Reset, "row 1 was reset once under this incarnation: it is a live worker's now")
	})
}
