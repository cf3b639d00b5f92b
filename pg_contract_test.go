package recovery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// contractResetter returns impl's resetter over db as the Resetter
// contract.
func contractResetter(t *testing.T, impl resetterImpl, db *pgxpool.Pool, opts ...ResetterOption) Resetter {
	t.Helper()
	r, ok := any(impl.mustResetter(t, db, opts...)).(Resetter)
	require.True(t, ok, "%s implements Resetter", impl.name)
	return r
}

// rowVersions returns rowid -> xmin of every row.
func rowVersions(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	return byRow[string](t, db, `SELECT rowid, xmin::text FROM batchrows`)
}

func TestPgContractInfoSaysWhatTheResetterDoes(t *testing.T) {
	db := testutil.Postgres(t)
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		name := "sqlreset.Resetter"
		if impl.handle == nil {
			name = "pgxreset.Resetter"
		}
		plain := contractResetter(t, impl, db, WithStatuses("running", "waiting"))
		assert.Equal(t, ResetterInfo{Name: name, Ledger: true, DryRun: true, ListsInProgress: true,
			InProgressStatus: "running", QueuedStatus: "waiting"}, plain.Info())
		fenced := contractResetter(t, impl, db, WithOwnerColumn("owner"))
		assert.Equal(t, ResetterInfo{Name: name, OwnerFencing: true, DryRun: true, ListsInProgress: true,
			InProgressStatus: "inprog", QueuedStatus: "queued"}, fenced.Info())
		noLedger := contractResetter(t, impl, db, WithoutResetLedger())
		assert.False(t, noLedger.Info().Ledger)
	})
}

func TestPgContractResetByEachSelector(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 6)

		t.Run("RowIDs", func(t *testing.T) {
			take(t, db, "A", 1, 2)
			r := contractResetter(t, impl, db, WithOwnerColumn("owner"))
			res, err := r.Reset(ctx, ResetRequest{InstanceID: "A", Incarnation: "1", RowIDs: []int64{1, 2, 3}})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			assertRequeued(t, db, 1, 2)
		})
		t.Run("Owner", func(t *testing.T) {
			take(t, db, "B", 3, 4)
			take(t, db, "C", 5)
			r := contractResetter(t, impl, db, WithOwnerColumn("owner"))
			res, err := r.Reset(ctx, ResetRequest{Owner: "B"})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			assertRequeued(t, db, 3, 4)
			assert.Equal(t, "inprog", statuses(t, db)[5], "another owner's row is left alone")
			setStatus(t, db, "queued", 5)
		})
		t.Run("Versions", func(t *testing.T) {
			setStatus(t, db, "inprog", 1, 2, 3)
			r := contractResetter(t, impl, db)
			rows, err := r.InProgressRows(ctx)
			require.NoError(t, err)
			want := rowVersions(t, db)
			require.Len(t, rows, 3)
			for _, s := range rows {
				assert.Equal(t, "inprog", s.Status)
				assert.Equal(t, want[s.ID], s.Version, "row %d: its xmin", s.ID)
			}
			setStatus(t, db, "inprog", 2) // written since: a new version
			res, err := r.Reset(ctx, ResetRequest{Versions: rows})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			st := statuses(t, db)
			assert.Equal(t, "queued", st[1])
			assert.Equal(t, "inprog", st[2], "a row written since its version was read is left alone")
			assert.Equal(t, "queued", st[3])
			again, err := r.Reset(ctx, ResetRequest{Versions: rows})
			require.NoError(t, err)
			assert.Zero(t, again.Changed, "the same versions again change nothing")
			setStatus(t, db, "queued", 2)
		})
		t.Run("more than one selector", func(t *testing.T) {
			r := contractResetter(t, impl, db, WithOwnerColumn("owner"))
			for _, req := range []ResetRequest{
				{InstanceID: "A", RowIDs: []int64{1}, Owner: "A"},
				{Owner: "A", Versions: []RowState{{ID: 1, Version: "1"}}},
				{InstanceID: "A", RowIDs: []int64{1}, Versions: []RowState{{ID: 1, Version: "1"}}},
			} {
				_, err := r.Reset(ctx, req)
				require.ErrorIs(t, err, ErrInvalidConfig, "%+v", req)
			}
		})
	})
}

func TestPgContractDryRunChangesNothingAndListsTheRows(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 6)
		take(t, db, "A", 4, 2)
		take(t, db, "B", 5)
		before := rowVersions(t, db)
		fenced := contractResetter(t, impl, db, WithOwnerColumn("owner"))

		res, err := fenced.Reset(ctx, ResetRequest{InstanceID: "A", RowIDs: []int64{4, 2, 3}, DryRun: true})
		require.NoError(t, err)
		assert.Equal(t, ResetResult{Changed: 2, ChangedIDs: []int64{2, 4}}, res)

		res, err = fenced.Reset(ctx, ResetRequest{Owner: "B", DryRun: true})
		require.NoError(t, err)
		assert.Equal(t, ResetResult{Changed: 1, ChangedIDs: []int64{5}}, res)

		plain := contractResetter(t, impl, db)
		rows, err := plain.InProgressRows(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		res, err = plain.Reset(ctx, ResetRequest{Versions: rows, DryRun: true})
		require.NoError(t, err)
		assert.Equal(t, ResetResult{Changed: 3, ChangedIDs: []int64{2, 4, 5}}, res)

		assert.Equal(t, before, rowVersions(t, db), "no row written")
		var ledger int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger`).Scan(&ledger))
		assert.Zero(t, ledger, "nothing recorded")
	})
}

func TestPgContractRowStatesReadsALockedRowWithoutWaiting(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 3)
		take(t, db, "A", 1, 2)
		versions := rowVersions(t, db)
		r := contractResetter(t, impl, db, WithOwnerColumn("owner"))

		// Another session writes row 2 and keeps its transaction open.
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, `UPDATE batchrows SET status = 'done', owner = NULL WHERE rowid = 2`)
		require.NoError(t, err)

		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		got, err := r.RowStates(qctx, []int64{3, 2, 1, 99})
		require.NoError(t, err)
		assert.Less(t, time.Since(start), 2*time.Second, "does not wait for the lock")
		assert.Equal(t, []RowState{
			{ID: 1, Status: "inprog", Owner: "A", Version: versions[1]},
			{ID: 2, Status: "inprog", Owner: "A", Version: versions[2], Locked: true}, // its committed state
			{ID: 3, Status: "queued", Version: versions[3]},
		}, got)
	})
}

func TestPgContractCheckReadsTheServerAndRefuses(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 2)
		s := currentSchema(t, db)
		var dbName string
		require.NoError(t, db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName))

		r := contractResetter(t, impl, db, WithOwnerColumn("owner"))
		info, err := r.Check(ctx, true)
		require.NoError(t, err)
		assert.Equal(t, "database="+dbName+" schema="+s+" table=batchrows", info.Serves)
		assert.True(t, strings.HasPrefix(info.Server, "system_identifier="), info.Server)
		assert.Zero(t, info.OwnerWidth, "text")
		assert.Equal(t, r.Info().Name, info.Name)
		assert.True(t, info.OwnerFencing)

		_, err = db.Exec(ctx, `ALTER TABLE batchrows ALTER COLUMN owner TYPE varchar(40)`)
		require.NoError(t, err)
		info, err = r.Check(ctx, true)
		require.NoError(t, err)
		assert.Equal(t, 40, info.OwnerWidth)
		info, err = r.Check(ctx, false)
		require.NoError(t, err)
		assert.Zero(t, info.OwnerWidth, "no session check without schema")
		assert.NotEmpty(t, info.Serves)

		t.Run("wrong status", func(t *testing.T) {
			_, err := db.Exec(ctx, userEnumTable)
			require.NoError(t, err)
			wrong := contractResetter(t, impl, db, userEnumOptions(s)...) // statuses left at inprog/queued
			_, err = wrong.Check(ctx, true)
			require.ErrorIs(t, err, ErrSchema)
			assert.Contains(t, err.Error(), `check schema: `)
			assert.Contains(t, err.Error(), `in-progress status "inprog" (WithStatuses) is not a label of enum job_state`)
			info, err := wrong.Check(ctx, false)
			require.NoError(t, err, "without schema only the identity is read")
			assert.Equal(t, "database="+dbName+" schema="+s+" table=items", info.Serves)
		})
		t.Run("read-only session", func(t *testing.T) {
			ro := poolAsReadOnlyRole(t, db)
			r := contractResetter(t, impl, ro, WithOwnerColumn("owner"))
			_, err := r.Check(ctx, true)
			if impl.name == "libpq" {
				// lib/pq begins every transaction READ WRITE.
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrReadOnly)
			assert.Contains(t, err.Error(), "check database session: ")
			assert.Contains(t, err.Error(), "default_transaction_read_only set by the user")
		})
	})
}
