package recovery

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestResetterResetsOnlyRowsStillInProgress(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 10)
		setStatus(t, db, "inprog", 1, 2, 3, 4, 5)
		setStatus(t, db, "done", 6)
		r, err := impl.New(t, db)
		require.NoError(t, err)

		n, err := resetRows(r, context.Background(), "dead", []int64{5, 1, 2, 3, 4, 6, 7, 999, 1})

		require.NoError(t, err)
		assert.Equal(t, int64(5), n, "only in-progress rows are counted")
		got := statuses(t, db)
		for id := int64(1); id <= 5; id++ {
			assert.Equal(t, "queued", got[id], "row %d", id)
		}
		assert.Equal(t, "done", got[6], "a finished row is never reset")
		var batch string
		require.NoError(t, db.QueryRow(context.Background(), `SELECT status FROM batches WHERE batchid = 1`).Scan(&batch))
		assert.Equal(t, "inprog", batch, "the parent batch is not touched")

		n, err = resetRows(r, context.Background(), "dead", nil)
		require.NoError(t, err)
		assert.Zero(t, n)
	})
}

func TestResetterChunksLargeSetsInOneTransaction(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 10)
		ctx := context.Background()
		_, err := db.Exec(ctx, `
			CREATE TABLE stmt_count (n int NOT NULL);
			INSERT INTO stmt_count VALUES (0);
			CREATE FUNCTION count_stmt() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN UPDATE stmt_count SET n = n + 1; RETURN NULL; END $$;
			CREATE TRIGGER count_stmt AFTER UPDATE ON batchrows FOR EACH STATEMENT EXECUTE FUNCTION count_stmt();`)
		require.NoError(t, err)
		setStatus(t, db, "inprog", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
		_, err = db.Exec(ctx, `UPDATE stmt_count SET n = 0`)
		require.NoError(t, err)
		r, err := impl.New(t, db, postgres.WithChunkSize(3))
		require.NoError(t, err)

		n, err := resetRows(r, ctx, "dead", []int64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1})

		require.NoError(t, err)
		assert.Equal(t, int64(10), n)
		var stmts int
		require.NoError(t, db.QueryRow(ctx, `SELECT n FROM stmt_count`).Scan(&stmts))
		assert.Equal(t, 4, stmts, "10 IDs in chunks of 3")
	})
}

func TestResetterResetsNothingWhenAChunkFails(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 6)
		ctx := context.Background()
		setStatus(t, db, "inprog", 1, 2, 3, 4, 5, 6)
		_, err := db.Exec(ctx, `
			CREATE FUNCTION refuse_five() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN IF NEW.rowid = 5 THEN RAISE EXCEPTION 'row five refused'; END IF; RETURN NEW; END $$;
			CREATE TRIGGER refuse_five BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION refuse_five();`)
		require.NoError(t, err)
		r, err := impl.New(t, db, postgres.WithChunkSize(2))
		require.NoError(t, err)

		n, err := resetRows(r, ctx, "deadpeer", []int64{1, 2, 3, 4, 5, 6})

		require.Error(t, err)
		assert.Zero(t, n)
		assert.Contains(t, err.Error(), "reset rows of deadpeer")
		assert.Contains(t, err.Error(), "row five refused")
		for id, s := range statuses(t, db) {
			assert.Equal(t, "inprog", s, "row %d: the whole reset is rolled back", id)
		}
	})
}

func TestResetterQuotesIdentifiersFromOptions(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 3)
		ctx := context.Background()
		table := `rows"; DROP TABLE batchrows; --`
		_, err := db.Exec(ctx, `CREATE TABLE "rows""; DROP TABLE batchrows; --" ("the id" bigint PRIMARY KEY, "St;atus" text)`)
		require.NoError(t, err)
		_, err = db.Exec(ctx, `INSERT INTO "rows""; DROP TABLE batchrows; --" VALUES (1, 'busy'), (2, 'busy'), (3, 'idle')`)
		require.NoError(t, err)
		r, err := impl.New(t, db, postgres.WithTable(table), postgres.WithIDColumn("the id"), postgres.WithStatusColumn("St;atus"),
			postgres.WithStatuses("busy", "'; DELETE FROM batches; --"))
		require.NoError(t, err)

		n, err := resetRows(r, ctx, "dead", []int64{1, 2, 3})

		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		var count int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows`).Scan(&count))
		assert.Equal(t, 3, count, "batchrows survived")
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batches`).Scan(&count))
		assert.Equal(t, 1, count, "values are parameters")
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM "rows""; DROP TABLE batchrows; --" WHERE "St;atus" = '''; DELETE FROM batches; --'`).Scan(&count))
		assert.Equal(t, 2, count)

		_, err = impl.New(t, db, postgres.WithTable("no_such_table"))
		require.NoError(t, err, "the table is not checked at construction")
		bad, _ := impl.New(t, db, postgres.WithTable("no_such_table"))
		_, err = resetRows(bad, ctx, "dead", []int64{1})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `relation "no_such_table" does not exist`)
	})
}

func TestResetterWithSchemaAndCustomStatuses(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		ctx := context.Background()
		_, err := db.Exec(ctx, `CREATE SCHEMA jobs; CREATE TABLE jobs.items (id bigint PRIMARY KEY, state text);
			INSERT INTO jobs.items VALUES (1, 'RUNNING'), (2, 'PENDING'), (3, 'RUNNING')`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.Exec(context.Background(), `DROP SCHEMA jobs CASCADE`) })
		r, err := impl.New(t, db, postgres.WithSchema("jobs"), postgres.WithTable("items"), postgres.WithIDColumn("id"),
			postgres.WithStatusColumn("state"), postgres.WithStatuses("RUNNING", "PENDING"))
		require.NoError(t, err)
		require.NoError(t, r.CreateLedger(ctx), "the ledger goes into the table's schema")
		n, err := resetRows(r, ctx, "dead", []int64{1, 2, 3})
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
	})
}

func TestPgxResetterWorksWithConnAndInsideACallersTransaction(t *testing.T) {
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	ctx := context.Background()
	setStatus(t, db, "inprog", 1, 2)

	conn, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	r, err := pgxreset.New(tx)
	require.NoError(t, err)
	n, err := resetRows(r, ctx, "dead", []int64{1})
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	require.NoError(t, tx.Rollback(ctx))
	assert.Equal(t, "inprog", statuses(t, db)[1], "the caller's transaction decides")

	r, err = pgxreset.New(conn.Conn())
	require.NoError(t, err)
	n, err = resetRows(r, ctx, "dead", []int64{1, 2})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
}

// flakyBegin fails Begin with a PostgreSQL error a number of times.
type flakyBegin struct {
	pgxreset.Execer
	code  string
	fails int
	calls int
}

func (f *flakyBegin) Begin(ctx context.Context) (pgx.Tx, error) {
	f.calls++
	if f.calls <= f.fails {
		return nil, &pgconn.PgError{Code: f.code, Message: "injected"}
	}
	return f.Execer.Begin(ctx)
}

func TestPgxResetterRetriesDeadlocksAndSerializationFailures(t *testing.T) {
	t.Parallel()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	setStatus(t, db, "inprog", 1)
	for _, code := range []string{"40P01", "40001"} {
		f := &flakyBegin{Execer: db, code: code, fails: 2}
		r, err := pgxreset.New(f)
		require.NoError(t, err)
		_, err = resetRows(r, context.Background(), "dead", []int64{1})
		require.NoError(t, err, code)
		assert.Equal(t, 3, f.calls, code)
	}

	f := &flakyBegin{Execer: db, code: "42P01", fails: 1} // undefined table: not retried
	r, err := pgxreset.New(f)
	require.NoError(t, err)
	_, err = resetRows(r, context.Background(), "dead", []int64{1})
	require.Error(t, err)
	assert.Equal(t, 1, f.calls)

	f = &flakyBegin{Execer: db, code: "40P01", fails: 100}
	r, err = pgxreset.New(f)
	require.NoError(t, err)
	_, err = resetRows(r, context.Background(), "dead", []int64{1})
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, 4, f.calls, "gives up after a bounded number of tries")
}

func TestNewPgxResetterRejectsBadOptions(t *testing.T) {
	var pool *pgxpool.Pool
	cases := []struct {
		name string
		db   pgxreset.Execer
		opts []postgres.Option
		want string
	}{
		{"nil db", nil, nil, "database handle is nil"},
		{"typed nil pool", pool, nil, "database handle is nil"},
		{"nil option", &pgxpool.Pool{}, []postgres.Option{{}}, "nil resetter option"},
		{"empty table", &pgxpool.Pool{}, []postgres.Option{postgres.WithTable("")}, "table name is empty"},
		{"empty id column", &pgxpool.Pool{}, []postgres.Option{postgres.WithIDColumn("")}, "ID column name is empty"},
		{"empty status column", &pgxpool.Pool{}, []postgres.Option{postgres.WithStatusColumn("")}, "status column name is empty"},
		{"long name", &pgxpool.Pool{}, []postgres.Option{postgres.WithTable(strings.Repeat("t", 64))}, "longer than 63 bytes"},
		{"NUL byte", &pgxpool.Pool{}, []postgres.Option{postgres.WithIDColumn("a\x00b")}, "NUL byte"},
		{"same columns", &pgxpool.Pool{}, []postgres.Option{postgres.WithIDColumn("x"), postgres.WithStatusColumn("x")}, `both "x"`},
		{"same statuses", &pgxpool.Pool{}, []postgres.Option{postgres.WithStatuses("a", "a")}, `statuses are both "a"`},
		{"empty status", &pgxpool.Pool{}, []postgres.Option{postgres.WithStatuses("", "queued")}, "statuses must not be empty"},
		{"zero chunk", &pgxpool.Pool{}, []postgres.Option{postgres.WithChunkSize(0)}, "chunk size 0 must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := pgxreset.New(c.db, c.opts...)
			require.Error(t, err)
			assert.Nil(t, r)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestResetterQuarantinesIntoAnEnumStatusColumn(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		ctx := context.Background()
		_, err := db.Exec(ctx, `
			CREATE TYPE row_state AS ENUM ('queued', 'inprog', 'done', 'failed');
			CREATE TABLE jobs (id bigint PRIMARY KEY, state row_state NOT NULL, owner text, recoveries int NOT NULL DEFAULT 0);
			INSERT INTO jobs VALUES (1, 'inprog', 'dead', 2), (2, 'inprog', 'dead', 0);`)
		require.NoError(t, err)
		r, err := impl.New(t, db, postgres.WithTable("jobs"), postgres.WithIDColumn("id"), postgres.WithStatusColumn("state"),
			postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, ""))
		require.NoError(t, err)

		res, err := r.ResetRows(ctx, RowsReset{InstanceID: "dead", RowIDs: []int64{1, 2}})
		require.NoError(t, err)
		assert.Equal(t, int64(2), res.Changed)
		assert.Equal(t, []int64{1}, res.Quarantined)
		_, err = db.Exec(ctx, `UPDATE jobs SET state = 'inprog', owner = 'gone' WHERE id = 2`)
		require.NoError(t, err)
		res, err = r.ResetOwner(ctx, OwnerReset{Owner: "gone"})
		require.NoError(t, err, "the sweep's statement too")
		assert.Equal(t, int64(1), res.Changed)
		var states []string
		require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(state::text ORDER BY id) FROM jobs`).Scan(&states))
		assert.Equal(t, []string{"failed", "queued"}, states)

		// A dead rows-set worker's row without an owner (docs/safety.md
		// §2): the statements that find and reset it take the enum too.
		_, err = db.Exec(ctx, `INSERT INTO jobs VALUES (3, 'inprog', NULL, 0), (4, 'inprog', NULL, 0)`)
		require.NoError(t, err)
		res, err = r.ResetRows(ctx, RowsReset{InstanceID: "dead", RowIDs: []int64{3}, FromRowsSet: true})
		require.NoError(t, err)
		assert.Equal(t, int64(1), res.Changed, "an unknown incarnation: as a rows-set recovery, without the ledger")
		res, err = r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: "i", RowIDs: []int64{4}, FromRowsSet: true})
		require.NoError(t, err)
		assert.Equal(t, []RowState{{ID: 4, Status: "inprog"}}, res.NotReset, "no ledger table: kept")
	})
}

func TestSafetyOwnerFencingNeverResetsARowAnotherWorkerTook(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 6)
		take(t, db, "dead", 1, 2, 3)
		take(t, db, "C", 4, 5) // recovered earlier and fetched again by C
		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"))

		n, err := resetRows(r, context.Background(), "dead", []int64{1, 2, 3, 4, 5, 6})

		require.NoError(t, err)
		assert.Equal(t, int64(3), n)
		assertRequeued(t, db, 1, 2, 3)
		for _, id := range []int64{4, 5} {
			s, o := rowState(t, db, id)
			assert.Equal(t, "inprog", s)
			assert.Equal(t, "C", *o)
		}
	})
}

func TestSafetyPoisonRowIsQuarantinedAfterMaxRecoveries(t *testing.T) {
	t.Parallel()
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		rdb := testutil.Redis(t)
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 3)
		prefix := testutil.Name("S")
		r := impl.Must(t, db, postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, ""))
		rec, logs := newWorker(t, rdb, r, "rec", WithKeyPrefix(prefix))
		ctx := context.Background()

		// Row 1 kills every worker that takes it; rows 2 and 3 die with it once.
		for round := 1; round <= 3; round++ {
			dead := testutil.Name("dead")
			ids := []any{"1"}
			take(t, db, dead, 1)
			if round == 1 {
				take(t, db, dead, 2, 3)
				ids = append(ids, "2", "3")
			}
			plantDeadPeer(t, rdb, prefix, dead, ids...)
			rep, err := rec.recoverNow(ctx)
			require.NoError(t, err)
			require.Len(t, rep.Recovered, 1)
			if round < 3 {
				assert.Empty(t, rep.Recovered[0].Quarantined, "round %d", round)
			} else {
				assert.Equal(t, []int64{1}, rep.Recovered[0].Quarantined)
			}
		}
		s, _ := rowState(t, db, 1)
		assert.Equal(t, "failed", s)
		for _, id := range []int64{2, 3} {
			s, _ := rowState(t, db, id)
			assert.Equal(t, "queued", s, "siblings go back to the queue")
		}
		var count int
		require.NoError(t, db.QueryRow(ctx, `SELECT recoveries FROM batchrows WHERE rowid = 1`).Scan(&count))
		assert.Equal(t, 3, count)
		_ = logs // RecoverNow returns the report; the loop logs it:
		l := recoveryLog{log: rec.log}
		l.recovered(report.PeerRecovery{InstanceID: "x", Quarantined: []int64{1}}, "registry", 0)
		assert.Contains(t, logs.String(), `"row_id":1`)
	})
}

// R5 (fixed). A reset that waited for another transaction's row locks
// reported, as not reset, rows that transaction settled: the "rest" read
// the statement's snapshot, taken before the wait. A false alarm on the
// metric the runbook pages on, each time a claim expired mid-reset or a
// resumed worker completed a row under recovery.
//
// Since issue 20 (item 5) a reset never waits: it skips rows another
// session holds locked and reports them as Locked, which recovery retries
// at the next scan without counting them as not reset. The retry after R1
// commits finds them settled.
func TestResetterWaitingOnAConcurrentResetReportsSettledRowsAsSettled(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl resetterImpl) {
		ctx := context.Background()
		db := testutil.Postgres(t)
		testutil.CreateBatch(t, db, 5)
		take(t, db, "dead", 1, 2, 3)

		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		late, err := pgxreset.New(tx, postgres.WithOwnerColumn("owner"))
		require.NoError(t, err)
		res1, err := late.ResetRows(ctx, RowsReset{InstanceID: "dead", RowIDs: []int64{1, 2, 3}})
		require.NoError(t, err)
		require.Equal(t, int64(3), res1.Changed, "R1's reset, not committed yet")

		r2 := impl.Must(t, db, postgres.WithOwnerColumn("owner"))
		got, err := r2.ResetRows(ctx, RowsReset{InstanceID: "dead", RowIDs: []int64{1, 2, 3}})
		require.NoError(t, err, "R2 does not wait on R1's row locks")
		assert.Zero(t, got.Changed)
		require.Len(t, got.NotReset, 3)
		for _, s := range got.NotReset {
			assert.True(t, s.Locked, "row %d: skipped as locked, no misconfiguration", s.ID)
		}

		require.NoError(t, tx.Commit(ctx))
		got, err = r2.ResetRows(ctx, RowsReset{InstanceID: "dead", RowIDs: []int64{1, 2, 3}})
		require.NoError(t, err)
		assert.Zero(t, got.Changed)
		assert.Empty(t, got.NotReset, "rows 1-3 are queued and ownerless: settled, not 'not reset'")
	})
}
