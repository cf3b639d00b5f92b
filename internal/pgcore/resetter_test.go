package pgcore_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/pgtest/impls"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	"github.com/alya/recovery/postgres/sqlreset"
)

func TestMain(m *testing.M) { os.Exit(testutil.MainCheckingLeaks(m)) }

// The resetter implementations every test runs on (pgx, lib/pq, pgx's
// stdlib) are internal/pgtest's.
type (
	resetter     = impls.Resetter
	resetterImpl = impls.Impl
)

var (
	resetterImpls = impls.Impls
	forEachImpl   = impls.ForEachImpl
)

// unjoin returns the errors joined in err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// setStatus sets the status of the given rows.
func setStatus(t *testing.T, db *pgxpool.Pool, status string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE batchrows SET status = $1 WHERE rowid = ANY($2)`, status, ids)
	require.NoError(t, err)
}

// statuses returns rowid -> status of every row.
func statuses(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	return pgtest.ByRow[string](t, db, `SELECT rowid, status FROM batchrows`)
}

// take marks rows in progress for owner, as FetchBlockOfRows does.
func take(t *testing.T, db *pgxpool.Pool, owner string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		`UPDATE batchrows SET status = 'inprog', owner = $1 WHERE rowid = ANY($2)`, owner, ids)
	require.NoError(t, err)
}

// assertRequeued asserts that each of ids is queued again with no owner,
// as a reset by an owner-fenced resetter leaves it.
func assertRequeued(t *testing.T, db *pgxpool.Pool, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		var status string
		var owner *string
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT status, owner FROM batchrows WHERE rowid = $1`, id).Scan(&status, &owner))
		assert.Equal(t, "queued", status, "row %d", id)
		assert.Nil(t, owner, "row %d: owner cleared on reset", id)
	}
}

// userEnumTable is the schema of issue 11: a user's own table with an enum
// status and none of the default names.
const userEnumTable = `
CREATE TYPE job_state AS ENUM ('pending', 'running', 'done');
CREATE TABLE items (item_id bigint PRIMARY KEY, state job_state NOT NULL DEFAULT 'pending', worker text, retries int NOT NULL DEFAULT 0);`

// userEnumOptions configures a resetter for userEnumTable in schema s.
func userEnumOptions(s string, extra ...postgres.Option) []postgres.Option {
	return append([]postgres.Option{postgres.WithSchema(s), postgres.WithTable("items"), postgres.WithIDColumn("item_id"),
		postgres.WithStatusColumn("state"), postgres.WithOwnerColumn("worker")}, extra...)
}

func TestCheckSchemaNamesEachMistake(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		ddl    string
		opts   func(s string) []postgres.Option
		want   []string // in the message, with {s} for the test's schema
		ledger bool     // check the reset ledger too (off elsewhere: one finding per case)
	}{
		{
			name:   "missing reset ledger without an owner column",
			ddl:    `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts:   func(string) []postgres.Option { return nil },
			want:   []string{`reset ledger table "recovery_ledger" (WithResetLedger) does not exist`},
			ledger: true,
		},
		{
			name: "missing table on the search_path",
			opts: func(string) []postgres.Option { return nil },
			want: []string{"table batchrows (WithTable) does not exist in any schema of the search_path ({s})"},
		},
		{
			name: "missing schema",
			ddl:  testutil.BatchSchema,
			opts: func(string) []postgres.Option { return []postgres.Option{postgres.WithSchema("no_such_schema")} },
			want: []string{"schema no_such_schema (WithSchema) does not exist"},
		},
		{
			name: "missing table in the schema",
			opts: func(s string) []postgres.Option {
				return []postgres.Option{postgres.WithSchema(s), postgres.WithTable("items")}
			},
			want: []string{"table {s}.items (WithTable) does not exist"},
		},
		{
			name: "missing ID column",
			ddl:  `CREATE TABLE batchrows (id bigint, status text)`,
			opts: func(string) []postgres.Option { return nil },
			want: []string{"ID column {s}.batchrows.rowid (WithIDColumn) does not exist"},
		},
		{
			name: "missing status column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, state text)`,
			opts: func(string) []postgres.Option { return nil },
			want: []string{"status column {s}.batchrows.status (WithStatusColumn) does not exist"},
		},
		{
			name: "missing owner column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts: func(string) []postgres.Option { return []postgres.Option{postgres.WithOwnerColumn("owner")} },
			want: []string{"owner column {s}.batchrows.owner (WithOwnerColumn) does not exist"},
		},
		{
			name: "missing recovery count column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts: func(string) []postgres.Option {
				return []postgres.Option{postgres.WithRecoveryCountColumn("recoveries")}
			},
			want: []string{"recovery count column {s}.batchrows.recoveries (WithRecoveryCountColumn) does not exist"},
		},
		{
			name: "ID column of a wrong type",
			ddl:  `CREATE TABLE batchrows (rowid uuid, status text)`,
			opts: func(string) []postgres.Option { return nil },
			want: []string{"ID column {s}.batchrows.rowid (WithIDColumn) is uuid; it must be bigint, integer or smallint"},
		},
		{
			name: "status column of a wrong type",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status integer)`,
			opts: func(string) []postgres.Option { return nil },
			want: []string{"status column {s}.batchrows.status (WithStatusColumn) is integer; it must be text, varchar, char or an enum"},
		},
		{
			name: "owner and count columns of wrong types, both reported",
			ddl:  `CREATE TABLE batchrows (rowid int, status varchar(20), owner bigint, recoveries text)`,
			opts: func(string) []postgres.Option {
				return []postgres.Option{postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries")}
			},
			want: []string{
				"owner column {s}.batchrows.owner (WithOwnerColumn) is bigint; it must be text, varchar or char",
				"recovery count column {s}.batchrows.recoveries (WithRecoveryCountColumn) is text; it must be bigint, integer or smallint",
			},
		},
		{
			name: "enum without the configured statuses",
			ddl:  userEnumTable,
			opts: func(s string) []postgres.Option { return userEnumOptions(s) },
			want: []string{
				`in-progress status "inprog" (WithStatuses) is not a label of enum job_state of status column {s}.items.state; its labels: pending, running, done`,
				`queued status "queued" (WithStatuses) is not a label of enum job_state`,
			},
		},
		{
			name: "enum without the terminal status",
			ddl:  userEnumTable,
			opts: func(s string) []postgres.Option {
				return userEnumOptions(s, postgres.WithStatuses("running", "pending"),
					postgres.WithRecoveryCountColumn("retries"), postgres.WithMaxRecoveries(3, "failed"))
			},
			want: []string{`terminal status "failed" (WithMaxRecoveries) is not a label of enum job_state`},
		},
	}
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				db := testutil.Postgres(t)
				s := pgtest.CurrentSchema(t, db)
				if c.ddl != "" {
					_, err := db.Exec(context.Background(), c.ddl)
					require.NoError(t, err)
				}
				opts := c.opts(s)
				if !c.ledger {
					opts = append(opts, postgres.WithoutResetLedger())
				}
				r, err := impl.New(t, db, opts...)
				require.NoError(t, err)
				_, err = r.Check(context.Background(), true)
				require.Error(t, err)
				assert.ErrorIs(t, err, contract.ErrSchema)
				for _, w := range c.want {
					assert.Contains(t, err.Error(), strings.ReplaceAll(w, "{s}", s))
				}
				assert.Len(t, unjoin(errors.Unwrap(err)), len(c.want), "one finding per mistake: %v", err)
			})
		}
	})
}

func TestCheckSchemaPassesACorrectTable(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		t.Run("enum status, user's names, every option", func(t *testing.T) {
			db := testutil.Postgres(t)
			_, err := db.Exec(context.Background(), userEnumTable)
			require.NoError(t, err)
			r, err := impl.New(t, db, userEnumOptions(pgtest.CurrentSchema(t, db), postgres.WithStatuses("running", "pending"),
				postgres.WithRecoveryCountColumn("retries"), postgres.WithMaxRecoveries(3, "done"))...)
			require.NoError(t, err)
			_, err = r.Check(context.Background(), true)
			require.NoError(t, err)
		})
		t.Run("text status, the documented schema, on the search_path", func(t *testing.T) {
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			r, err := impl.New(t, db, postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries"))
			require.NoError(t, err)
			_, err = r.Check(context.Background(), true)
			require.NoError(t, err)
		})
	})
}

func TestCheckSchemaNeedsUpdatePrivilege(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		s := pgtest.CurrentSchema(t, db)
		testutil.CreateBatch(t, db, 1)
		ctx := context.Background()
		const secret = "pw-s3cretRole"
		asRole, role := pgtest.PoolAsNewRole(t, db, secret, `GRANT USAGE ON SCHEMA %[2]s TO %[1]s; GRANT SELECT ON batchrows TO %[1]s`)

		r, err := impl.New(t, asRole, postgres.WithOwnerColumn("owner"))
		require.NoError(t, err)
		_, err = r.Check(ctx, true)
		require.Error(t, err)
		assert.ErrorIs(t, err, contract.ErrSchema)
		assert.Contains(t, err.Error(), "role "+role+" may not UPDATE "+s+".batchrows.status, "+s+".batchrows.owner")
		assert.NotContains(t, err.Error(), secret)
		assert.NotContains(t, err.Error(), "SELECT "+s, "SELECT was granted")

		// A grant on the columns the reset writes is enough.
		_, err = db.Exec(ctx, `GRANT UPDATE (status, owner) ON batchrows TO `+role)
		require.NoError(t, err)
		_, err = r.Check(ctx, true)
		require.NoError(t, err)
	})
}

func TestCheckSchemaReportsAnUnreachableDatabaseAsSuch(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		r, err := impl.New(t, db)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = r.Check(ctx, true)
		require.Error(t, err)
		assert.False(t, errors.Is(err, contract.ErrSchema), "not a finding about the table: %v", err)
	})
}

func TestResetterRowStatesReadsStatusAndOwner(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 4)
		take(t, db, "A", 1)
		take(t, db, "B", 4)
		setStatus(t, db, "done", 2)
		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))

		got, err := r.RowStates(ctx, []int64{3, 1, 2, 4, 99})
		require.NoError(t, err)
		for i := range got {
			assert.NotEmpty(t, got[i].Version, "row %d: its xmin", got[i].ID)
			got[i].Version = ""
		}
		assert.Equal(t, []contract.RowState{{ID: 1, Status: "inprog", Owner: "A"}, {ID: 2, Status: "done"}, {ID: 3, Status: "queued"}, {ID: 4, Status: "inprog", Owner: "B"}}, got)
		owners, err := r.InProgressOwners(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"A", "B"}, owners)
	})
}

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
		r, err := impl.New(t, db, postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, "failed"))
		require.NoError(t, err)
		state := func() map[int64]string {
			return pgtest.ByRow[string](t, db, `SELECT rowid, status || '/' || recoveries FROM batchrows`)
		}
		before := state()
		req := contract.RowsReset{InstanceID: "dead-1", Incarnation: "inc-1", RowIDs: []int64{6, 5, 4, 3, 2, 1, 1, 99}}

		dry := contract.PlanRequest{Rows: &req}
		plan, err := r.PlanReset(ctx, dry)
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 2, 3, 4}, plan.ChangedIDs, "rows in progress, not the finished row 5 nor the missing 99")
		assert.Equal(t, []int64{4}, plan.Quarantined, "row 4 reaches its third recovery")
		assert.Equal(t, []contract.RowState{{ID: 6, Status: "inporg"}}, plan.NotReset)
		assert.Equal(t, before, state(), "nothing committed")
		var ledger int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger`).Scan(&ledger))
		assert.Zero(t, ledger, "nothing recorded in the ledger")

		// The reset then does what the plan said.
		res, err := r.ResetRows(ctx, req)
		require.NoError(t, err)
		assert.EqualValues(t, len(plan.ChangedIDs), res.Changed)
		assert.Equal(t, plan.Changed, res.Changed)
		assert.Equal(t, plan.ChangedIDs, res.ChangedIDs, "the reset lists the rows it changed")
		assert.Equal(t, plan.Quarantined, res.Quarantined)
		assert.Equal(t, plan.NotReset, res.NotReset)

		// Under the same incarnation the ledger makes a second reset a no-op,
		// and the plan says so.
		_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid = 1`) // re-taken by a live worker
		require.NoError(t, err)
		plan, err = r.PlanReset(ctx, dry)
		require.NoError(t, err)
		assert.Empty(t, plan.ChangedIDs, "row 1 was reset once under this incarnation: it is a live worker's now")
	})
}

// rowVersions returns rowid -> xmin of every row.
func rowVersions(t *testing.T, db *pgxpool.Pool) map[int64]string {
	t.Helper()
	return pgtest.ByRow[string](t, db, `SELECT rowid, xmin::text FROM batchrows`)
}

func TestPgContractInfoSaysWhatTheResetterDoes(t *testing.T) {
	db := testutil.Postgres(t)
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		name := "sqlreset.Resetter"
		if impl.Handle == nil {
			name = "pgxreset.Resetter"
		}
		plain := impl.Must(t, db, postgres.WithStatuses("running", "waiting"))
		assert.Equal(t, contract.ResetterInfo{Name: name, Ledger: true, DryRun: true, ListsInProgress: true,
			InProgressStatus: "running", QueuedStatus: "waiting"}, plain.Info())
		fenced := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
		assert.Equal(t, contract.ResetterInfo{Name: name, OwnerFencing: true, DryRun: true, ListsInProgress: true,
			InProgressStatus: "inprog", QueuedStatus: "queued"}, fenced.Info())
		noLedger := impl.Must(t, db, postgres.WithoutResetLedger())
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
			r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
			res, err := r.ResetRows(ctx, contract.RowsReset{InstanceID: "A", Incarnation: "1", RowIDs: []int64{1, 2, 3}})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			assertRequeued(t, db, 1, 2)
		})
		t.Run("Owner", func(t *testing.T) {
			take(t, db, "B", 3, 4)
			take(t, db, "C", 5)
			r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
			res, err := r.ResetOwner(ctx, contract.OwnerReset{Owner: "B"})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			assertRequeued(t, db, 3, 4)
			assert.Equal(t, "inprog", statuses(t, db)[5], "another owner's row is left alone")
			setStatus(t, db, "queued", 5)
		})
		t.Run("Versions", func(t *testing.T) {
			setStatus(t, db, "inprog", 1, 2, 3)
			r := impl.Must(t, db)
			rows, err := r.InProgressRows(ctx)
			require.NoError(t, err)
			want := rowVersions(t, db)
			require.Len(t, rows, 3)
			for _, s := range rows {
				assert.Equal(t, "inprog", s.Status)
				assert.Equal(t, want[s.ID], s.Version, "row %d: its xmin", s.ID)
			}
			setStatus(t, db, "inprog", 2) // written since: a new version
			res, err := r.ResetVersions(ctx, contract.VersionsReset{Versions: rows})
			require.NoError(t, err)
			assert.Equal(t, int64(2), res.Changed)
			st := statuses(t, db)
			assert.Equal(t, "queued", st[1])
			assert.Equal(t, "inprog", st[2], "a row written since its version was read is left alone")
			assert.Equal(t, "queued", st[3])
			again, err := r.ResetVersions(ctx, contract.VersionsReset{Versions: rows})
			require.NoError(t, err)
			assert.Zero(t, again.Changed, "the same versions again change nothing")
			setStatus(t, db, "queued", 2)
		})
		t.Run("a plan of none or several resets, a reset by no owner", func(t *testing.T) {
			r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
			rows := &contract.RowsReset{InstanceID: "A", RowIDs: []int64{1}}
			owner := &contract.OwnerReset{Owner: "A"}
			versions := &contract.VersionsReset{Versions: []contract.RowState{{ID: 1, Version: "1"}}}
			before := statuses(t, db)
			for _, plan := range []contract.PlanRequest{
				{},
				{Rows: rows, Owner: owner},
				{Owner: owner, Versions: versions},
				{Rows: rows, Versions: versions},
				{Rows: rows, Owner: owner, Versions: versions},
			} {
				_, err := r.PlanReset(ctx, plan)
				require.ErrorIs(t, err, contract.ErrInvalidConfig, "%+v", plan)
			}
			_, err := r.PlanReset(ctx, contract.PlanRequest{Owner: &contract.OwnerReset{}})
			require.ErrorIs(t, err, contract.ErrInvalidConfig, "a plan by no owner")
			_, err = r.ResetOwner(ctx, contract.OwnerReset{})
			require.ErrorIs(t, err, contract.ErrInvalidConfig, "a reset by no owner")
			assert.Equal(t, before, statuses(t, db), "nothing changed")
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
		fenced := impl.Must(t, db, postgres.WithOwnerColumn("owner"))

		res, err := fenced.PlanReset(ctx, contract.PlanRequest{Rows: &contract.RowsReset{InstanceID: "A", RowIDs: []int64{4, 2, 3}}})
		require.NoError(t, err)
		assert.Equal(t, contract.ResetResult{Changed: 2, ChangedIDs: []int64{2, 4}}, res)

		res, err = fenced.PlanReset(ctx, contract.PlanRequest{Owner: &contract.OwnerReset{Owner: "B"}})
		require.NoError(t, err)
		assert.Equal(t, contract.ResetResult{Changed: 1, ChangedIDs: []int64{5}}, res)

		plain := impl.Must(t, db)
		rows, err := plain.InProgressRows(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		res, err = plain.PlanReset(ctx, contract.PlanRequest{Versions: &contract.VersionsReset{Versions: rows}})
		require.NoError(t, err)
		assert.Equal(t, contract.ResetResult{Changed: 3, ChangedIDs: []int64{2, 4, 5}}, res)

		assert.Equal(t, before, rowVersions(t, db), "no row written")
		var ledger int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger`).Scan(&ledger))
		assert.Zero(t, ledger, "nothing recorded")
	})
}

// TestPgContractResetListsTheRowsItChanged: a committed reset by each
// selector lists the rows it changed in ChangedIDs, ascending, over
// several chunks, quarantined rows included, finished rows not.
func TestPgContractResetListsTheRowsItChanged(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 9)
		take(t, db, "A", 7, 1, 3, 5, 2)
		take(t, db, "B", 8, 6)
		setStatus(t, db, "done", 2)
		_, err := db.Exec(ctx, `UPDATE batchrows SET recoveries = 2 WHERE rowid = 3`)
		require.NoError(t, err)
		fenced := impl.Must(t, db, postgres.WithOwnerColumn("owner"), postgres.WithChunkSize(2),
			postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, "failed"))

		res, err := fenced.ResetRows(ctx, contract.RowsReset{InstanceID: "A", RowIDs: []int64{7, 5, 3, 2, 1}})
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 3, 5, 7}, res.ChangedIDs, "by IDs, in chunks of 2: not the finished row 2")
		assert.Equal(t, []int64{3}, res.Quarantined)
		assert.EqualValues(t, 4, res.Changed)

		res, err = fenced.ResetOwner(ctx, contract.OwnerReset{Owner: "B"})
		require.NoError(t, err)
		assert.Equal(t, []int64{6, 8}, res.ChangedIDs, "by owner")

		take(t, db, "", 9, 4)
		plain := impl.Must(t, db, postgres.WithChunkSize(1))
		rows, err := plain.InProgressRows(ctx)
		require.NoError(t, err)
		res, err = plain.ResetVersions(ctx, contract.VersionsReset{Versions: rows})
		require.NoError(t, err)
		assert.Equal(t, []int64{4, 9}, res.ChangedIDs, "by row version")
	})
}

func TestPgContractRowStatesReadsALockedRowWithoutWaiting(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 3)
		take(t, db, "A", 1, 2)
		versions := rowVersions(t, db)
		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))

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
		assert.Equal(t, []contract.RowState{
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
		s := pgtest.CurrentSchema(t, db)
		var dbName string
		require.NoError(t, db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName))

		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
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
			wrong := impl.Must(t, db, userEnumOptions(s)...) // statuses left at inprog/queued
			_, err = wrong.Check(ctx, true)
			require.ErrorIs(t, err, contract.ErrSchema)
			assert.Contains(t, err.Error(), `check schema: `)
			assert.Contains(t, err.Error(), `in-progress status "inprog" (WithStatuses) is not a label of enum job_state`)
			info, err := wrong.Check(ctx, false)
			require.NoError(t, err, "without schema only the identity is read")
			assert.Equal(t, "database="+dbName+" schema="+s+" table=items", info.Serves)
		})
		t.Run("read-only session", func(t *testing.T) {
			ro := pgtest.PoolAsReadOnlyRole(t, db)
			r := impl.Must(t, ro, postgres.WithOwnerColumn("owner"))
			_, err := r.Check(ctx, true)
			if impl.Name == "libpq" {
				// lib/pq begins every transaction READ WRITE.
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, contract.ErrReadOnly)
			assert.Contains(t, err.Error(), "check database session: ")
			assert.Contains(t, err.Error(), "default_transaction_read_only set by the user")
		})
	})
}

// An error of New about a value a Config read from the environment names
// its variable; the same value set by its option, or changed since (by a
// flag), names the option.
func TestNewNamesTheVariableOfASettingFromTheEnvironment(t *testing.T) {
	db := struct{ pgxreset.Execer }{}
	env := map[string]string{postgres.EnvMaxRecoveries: "3", postgres.EnvTerminalStatus: "dead"}
	c, err := postgres.ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	_, err = pgxreset.New(db, c.Options()...)
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 3 (RECOVERY_MAX_RECOVERIES) needs a recovery count column (WithRecoveryCountColumn or RECOVERY_RECOVERY_COUNT_COLUMN)")

	_, err = pgxreset.New(db, postgres.Config{MaxRecoveries: 3, TerminalStatus: "dead"}.Options()...)
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 3 (WithMaxRecoveries) needs a recovery count column (WithRecoveryCountColumn)")

	c.MaxRecoveries = 4 // a flag changed it
	_, err = sqlreset.New(&sql.DB{}, c.Options()...)
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 4 (WithMaxRecoveries)")
}

// New refuses a nil handle, a typed nil and the zero Option.
func TestNewRefusesANilHandleAndANilOption(t *testing.T) {
	_, err := pgxreset.New(nil)
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	var pool *pgxpool.Pool
	_, err = pgxreset.New(pool)
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	_, err = sqlreset.New((*sql.DB)(nil))
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	_, err = sqlreset.New(&sql.DB{}, postgres.Option{})
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "nil resetter option")
}
