package recovery

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// currentSchema returns the schema testutil.Postgres made for the test.
func currentSchema(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s))
	return s
}

// userEnumTable is the schema of issue 11: a user's own table with an enum
// status and none of the default names.
const userEnumTable = `
CREATE TYPE job_state AS ENUM ('pending', 'running', 'done');
CREATE TABLE items (item_id bigint PRIMARY KEY, state job_state NOT NULL DEFAULT 'pending', worker text, retries int NOT NULL DEFAULT 0);`

// userEnumOptions configures a resetter for userEnumTable in schema s.
func userEnumOptions(s string, extra ...ResetterOption) []ResetterOption {
	return append([]ResetterOption{WithSchema(s), WithTable("items"), WithIDColumn("item_id"),
		WithStatusColumn("state"), WithOwnerColumn("worker")}, extra...)
}

func TestCheckSchemaNamesEachMistake(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		ddl    string
		opts   func(s string) []ResetterOption
		want   []string // in the message, with {s} for the test's schema
		ledger bool     // check the reset ledger too (off elsewhere: one finding per case)
	}{
		{
			name:   "missing reset ledger without an owner column",
			ddl:    `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts:   func(string) []ResetterOption { return nil },
			want:   []string{`reset ledger table "recovery_ledger" (WithResetLedger) does not exist`},
			ledger: true,
		},
		{
			name: "missing table on the search_path",
			opts: func(string) []ResetterOption { return nil },
			want: []string{"table batchrows (WithTable) does not exist in any schema of the search_path ({s})"},
		},
		{
			name: "missing schema",
			ddl:  testutil.BatchSchema,
			opts: func(string) []ResetterOption { return []ResetterOption{WithSchema("no_such_schema")} },
			want: []string{"schema no_such_schema (WithSchema) does not exist"},
		},
		{
			name: "missing table in the schema",
			opts: func(s string) []ResetterOption { return []ResetterOption{WithSchema(s), WithTable("items")} },
			want: []string{"table {s}.items (WithTable) does not exist"},
		},
		{
			name: "missing ID column",
			ddl:  `CREATE TABLE batchrows (id bigint, status text)`,
			opts: func(string) []ResetterOption { return nil },
			want: []string{"ID column {s}.batchrows.rowid (WithIDColumn) does not exist"},
		},
		{
			name: "missing status column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, state text)`,
			opts: func(string) []ResetterOption { return nil },
			want: []string{"status column {s}.batchrows.status (WithStatusColumn) does not exist"},
		},
		{
			name: "missing owner column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts: func(string) []ResetterOption { return []ResetterOption{WithOwnerColumn("owner")} },
			want: []string{"owner column {s}.batchrows.owner (WithOwnerColumn) does not exist"},
		},
		{
			name: "missing recovery count column",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status text)`,
			opts: func(string) []ResetterOption { return []ResetterOption{WithRecoveryCountColumn("recoveries")} },
			want: []string{"recovery count column {s}.batchrows.recoveries (WithRecoveryCountColumn) does not exist"},
		},
		{
			name: "ID column of a wrong type",
			ddl:  `CREATE TABLE batchrows (rowid uuid, status text)`,
			opts: func(string) []ResetterOption { return nil },
			want: []string{"ID column {s}.batchrows.rowid (WithIDColumn) is uuid; it must be bigint, integer or smallint"},
		},
		{
			name: "status column of a wrong type",
			ddl:  `CREATE TABLE batchrows (rowid bigint, status integer)`,
			opts: func(string) []ResetterOption { return nil },
			want: []string{"status column {s}.batchrows.status (WithStatusColumn) is integer; it must be text, varchar, char or an enum"},
		},
		{
			name: "owner and count columns of wrong types, both reported",
			ddl:  `CREATE TABLE batchrows (rowid int, status varchar(20), owner bigint, recoveries text)`,
			opts: func(string) []ResetterOption {
				return []ResetterOption{WithOwnerColumn("owner"), WithRecoveryCountColumn("recoveries")}
			},
			want: []string{
				"owner column {s}.batchrows.owner (WithOwnerColumn) is bigint; it must be text, varchar or char",
				"recovery count column {s}.batchrows.recoveries (WithRecoveryCountColumn) is text; it must be bigint, integer or smallint",
			},
		},
		{
			name: "enum without the configured statuses",
			ddl:  userEnumTable,
			opts: func(s string) []ResetterOption { return userEnumOptions(s) },
			want: []string{
				`in-progress status "inprog" (WithStatuses) is not a label of enum job_state of status column {s}.items.state; its labels: pending, running, done`,
				`queued status "queued" (WithStatuses) is not a label of enum job_state`,
			},
		},
		{
			name: "enum without the terminal status",
			ddl:  userEnumTable,
			opts: func(s string) []ResetterOption {
				return userEnumOptions(s, WithStatuses("running", "pending"),
					WithRecoveryCountColumn("retries"), WithMaxRecoveries(3, "failed"))
			},
			want: []string{`terminal status "failed" (WithMaxRecoveries) is not a label of enum job_state`},
		},
	}
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				db := testutil.Postgres(t)
				s := currentSchema(t, db)
				if c.ddl != "" {
					_, err := db.Exec(context.Background(), c.ddl)
					require.NoError(t, err)
				}
				opts := c.opts(s)
				if !c.ledger {
					opts = append(opts, WithoutResetLedger())
				}
				r, err := impl.newResetter(t, db, opts...)
				require.NoError(t, err)
				err = r.CheckSchema(context.Background())
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrSchema)
				for _, w := range c.want {
					assert.Contains(t, err.Error(), strings.ReplaceAll(w, "{s}", s))
				}
				assert.Len(t, unjoin(err), len(c.want), "one finding per mistake: %v", err)
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
			r, err := impl.newResetter(t, db, userEnumOptions(currentSchema(t, db), WithStatuses("running", "pending"),
				WithRecoveryCountColumn("retries"), WithMaxRecoveries(3, "done"))...)
			require.NoError(t, err)
			require.NoError(t, r.CheckSchema(context.Background()))
		})
		t.Run("text status, the documented schema, on the search_path", func(t *testing.T) {
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			r, err := impl.newResetter(t, db, WithOwnerColumn("owner"), WithRecoveryCountColumn("recoveries"))
			require.NoError(t, err)
			require.NoError(t, r.CheckSchema(context.Background()))
		})
	})
}

func TestCheckSchemaNeedsUpdatePrivilege(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		s := currentSchema(t, db)
		testutil.CreateBatch(t, db, 1)
		ctx := context.Background()
		const secret = "pw-s3cretRole"
		asRole, role := poolAsNewRole(t, db, secret, `GRANT USAGE ON SCHEMA %[2]s TO %[1]s; GRANT SELECT ON batchrows TO %[1]s`)

		r, err := impl.newResetter(t, asRole, WithOwnerColumn("owner"))
		require.NoError(t, err)
		err = r.CheckSchema(ctx)
		require.Error(t, err)
		assert.ErrorIs(t, err, ErrSchema)
		assert.Contains(t, err.Error(), "role "+role+" may not UPDATE "+s+".batchrows.status, "+s+".batchrows.owner")
		assert.NotContains(t, err.Error(), secret)
		assert.NotContains(t, err.Error(), "SELECT "+s, "SELECT was granted")

		// A grant on the columns the reset writes is enough.
		_, err = db.Exec(ctx, `GRANT UPDATE (status, owner) ON batchrows TO `+role)
		require.NoError(t, err)
		require.NoError(t, r.CheckSchema(ctx))
	})
}

func TestCheckSchemaReportsAnUnreachableDatabaseAsSuch(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		r, err := impl.newResetter(t, db)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err = r.CheckSchema(ctx)
		require.Error(t, err)
		assert.False(t, errors.Is(err, ErrSchema), "not a finding about the table: %v", err)
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
		r := impl.mustResetter(t, db, WithOwnerColumn("owner"))

		got, err := r.RowStates(ctx, []int64{3, 1, 2, 4, 99})
		require.NoError(t, err)
		for i := range got {
			assert.NotEmpty(t, got[i].Version, "row %d: its xmin", got[i].ID)
			got[i].Version = ""
		}
		assert.Equal(t, []RowState{{ID: 1, Status: "inprog", Owner: "A"}, {ID: 2, Status: "done"}, {ID: 3, Status: "queued"}, {ID: 4, Status: "inprog", Owner: "B"}}, got)
		assert.True(t, r.InProgress(got[0], "A"))
		assert.False(t, r.InProgress(got[0], "B"), "fenced: another owner's row")
		owners, err := r.InProgressOwners(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"A", "B"}, owners)
	})
}
