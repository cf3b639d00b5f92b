package pgcore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// A reset by IDs names the IDs no row has any more (Gone), and only
// those, whatever the table's columns are called: a column named like
// the statement's own names does not shadow them.
func TestResetNamesTheGoneRowsWhateverTheTablesColumnsAreCalled(t *testing.T) {
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	_, err := db.Exec(ctx, `ALTER TABLE batchrows ADD COLUMN x bigint NOT NULL DEFAULT 0, ADD COLUMN u bigint`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog'`)
	require.NoError(t, err)
	r, err := pgxreset.New(db, postgres.WithoutResetLedger())
	require.NoError(t, err)

	res, err := r.ResetRows(ctx, contract.RowsReset{InstanceID: "A", RowIDs: []int64{1, 2, 3, 99}})
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 2, 3}, res.ChangedIDs)
	assert.Equal(t, []int64{99}, res.Gone, "only row 99 is gone")
}
