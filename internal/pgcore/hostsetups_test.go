package pgcore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// The setups of a host's table and session that an outside review tried
// against a real server (issue 33) and that held, kept as regression
// checks: a partitioned rows table, a session lock_timeout of 1 ms, and
// serializable as the session's default isolation. Each runs every way a
// dead worker's rows are reset, through each Go database API.

// deadWorkerReset is one way recovery resets a dead worker's rows, all
// counting recoveries in the recoveries column, so that a test can tell a
// row reset once from a row reset twice.
type deadWorkerReset struct {
	name  string
	opts  []postgres.Option
	reset func(ctx context.Context, r resetter, ids []int64) (contract.ResetResult, error)
}

// deadWorkerResets are owner mode's reset by owner, and the reset of the
// IDs read from a dead worker's rows set, fenced by the owner column or,
// without one, by the reset ledger; both commit chunk by chunk.
var deadWorkerResets = []deadWorkerReset{
	{"by owner", []postgres.Option{postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries")},
		func(ctx context.Context, r resetter, _ []int64) (contract.ResetResult, error) {
			return r.ResetOwner(ctx, contract.OwnerReset{Owner: "dead"})
		}},
	{"by IDs fenced", []postgres.Option{postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries")},
		func(ctx context.Context, r resetter, ids []int64) (contract.ResetResult, error) {
			return r.ResetRows(ctx, contract.RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: ids, FromRowsSet: true})
		}},
	{"by IDs with the ledger", []postgres.Option{postgres.WithRecoveryCountColumn("recoveries")},
		func(ctx context.Context, r resetter, ids []int64) (contract.ResetResult, error) {
			return r.ResetRows(ctx, contract.RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: ids, FromRowsSet: true})
		}},
}

// forEachDeadWorkerReset runs test once per way of resetting a dead
// worker's rows and per implementation.
func forEachDeadWorkerReset(t *testing.T, test func(t *testing.T, impl resetterImpl, p deadWorkerReset)) {
	for _, p := range deadWorkerResets {
		t.Run(p.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl resetterImpl) { test(t, impl, p) })
		})
	}
}

// idRange returns from..to.
func idRange(from, to int64) []int64 {
	var ids []int64
	for id := from; id <= to; id++ {
		ids = append(ids, id)
	}
	return ids
}

// recoveries returns rowid -> recoveries of every row.
func recoveries(t *testing.T, db *pgxpool.Pool) map[int64]int {
	t.Helper()
	return pgtest.ByRow[int](t, db, `SELECT rowid, recoveries FROM batchrows`)
}

// assertResetOnce asserts that the rows of ids are queued with one
// recovery counted, and every other row of 1..n has none.
func assertResetOnce(t *testing.T, db *pgxpool.Pool, n int64, ids []int64) {
	t.Helper()
	want := map[int64]int{}
	for id := int64(1); id <= n; id++ {
		want[id] = 0
	}
	for _, id := range ids {
		want[id] = 1
	}
	assert.Equal(t, want, recoveries(t, db), "rows reset once, the others never")
	st := statuses(t, db)
	for _, id := range ids {
		assert.Equal(t, "queued", st[id], "row %d", id)
	}
}

// A dead worker's rows spread over two partitions of a partitioned rows
// table (by range of ID, by list of batch) are each reset once, by every
// reset: the reset's SELECT ... FOR UPDATE SKIP LOCKED and UPDATE go
// through the parent table. So are they when the table is partitioned by
// status, where the reset moves each row into another partition.
func TestResetOfADeadWorkersRowsOnAPartitionedTableResetsEachRowOnce(t *testing.T) {
	const columns = `rowid bigint NOT NULL, batchid bigint NOT NULL, status text NOT NULL DEFAULT 'queued', owner text, recoveries int NOT NULL DEFAULT 0`
	partitionings := []struct {
		name string
		ddl  string
		// deadIn is how many partitions hold the dead worker's rows.
		deadIn int
	}{
		{"range on rowid", `CREATE TABLE batchrows (` + columns + `, PRIMARY KEY (rowid)) PARTITION BY RANGE (rowid);
			CREATE TABLE batchrows_low PARTITION OF batchrows FOR VALUES FROM (MINVALUE) TO (11);
			CREATE TABLE batchrows_high PARTITION OF batchrows FOR VALUES FROM (11) TO (MAXVALUE)`, 2},
		{"list on batchid", `CREATE TABLE batchrows (` + columns + `, PRIMARY KEY (rowid, batchid)) PARTITION BY LIST (batchid);
			CREATE TABLE batchrows_b1 PARTITION OF batchrows FOR VALUES IN (1);
			CREATE TABLE batchrows_b2 PARTITION OF batchrows FOR VALUES IN (2)`, 2},
		{"list on status, the reset moving each row", `CREATE TABLE batchrows (` + columns + `, PRIMARY KEY (rowid, status)) PARTITION BY LIST (status);
			CREATE TABLE batchrows_inprog PARTITION OF batchrows FOR VALUES IN ('inprog');
			CREATE TABLE batchrows_rest PARTITION OF batchrows DEFAULT`, 1},
	}
	dead := idRange(3, 18)
	for _, part := range partitionings {
		t.Run(part.name, func(t *testing.T) {
			forEachDeadWorkerReset(t, func(t *testing.T, impl resetterImpl, p deadWorkerReset) {
				ctx := context.Background()
				db := testutil.Postgres(t)
				// The batch schema (its batches and ledger tables), with the
				// rows table partitioned: rows 1..20 of batches 1 and 2.
				_, err := db.Exec(ctx, testutil.BatchSchema+`; DROP TABLE batchrows; `+part.ddl)
				require.NoError(t, err)
				_, err = db.Exec(ctx, `INSERT INTO batches (batchid) VALUES (1), (2);
					INSERT INTO batchrows (rowid, batchid) SELECT g, 1 + g % 2 FROM generate_series(1, 20) g`)
				require.NoError(t, err)
				take(t, db, "dead", dead...)
				take(t, db, "live", 1, 20)
				var parts int
				require.NoError(t, db.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM batchrows WHERE owner = 'dead'`).Scan(&parts))
				require.Equal(t, part.deadIn, parts, "partitions holding the dead worker's rows")

				r := impl.Must(t, db, p.opts...)
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				res, err := p.reset(rctx, r, dead)
				require.NoError(t, err)
				assert.EqualValues(t, len(dead), res.Changed)
				assert.Equal(t, dead, res.ChangedIDs, "each row listed once")
				assert.Empty(t, res.NotReset)
				assertResetOnce(t, db, 20, dead)
				st := statuses(t, db)
				assert.Equal(t, "inprog", st[1], "a live worker's row is left alone")
				assert.Equal(t, "inprog", st[20], "a live worker's row is left alone")

				again, err := p.reset(rctx, r, dead)
				require.NoError(t, err)
				assert.Zero(t, again.Changed, "a repeat changes nothing")
				assertResetOnce(t, db, 20, dead)
			})
		})
	}
}

// poolWithRoleSettings returns a pool on db's schema for a new role that
// may reset the batch tables, whose sessions start with settings (ALTER
// ROLE ... SET, so a handle of any Go database API on the role gets them),
// having checked that a session of the pool has each.
func poolWithRoleSettings(t *testing.T, db *pgxpool.Pool, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	grants := `GRANT USAGE ON SCHEMA %[2]s TO %[1]s;
		GRANT SELECT, UPDATE ON batchrows TO %[1]s;
		GRANT SELECT, INSERT, DELETE ON recovery_ledger TO %[1]s`
	for name, value := range settings {
		grants += `; ALTER ROLE %[1]s SET ` + name + ` = '` + value + `'`
	}
	pool, _ := pgtest.PoolAsNewRole(t, db, "", grants)
	for name, value := range settings {
		var got string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting($1)`, name).Scan(&got))
		require.Equal(t, value, got, "the role's sessions start with %s", name)
	}
	return pool
}

// A resetter whose session has lock_timeout = 1 ms (ALTER ROLE), facing a
// row another session holds locked by SELECT ... FOR UPDATE in an open
// transaction: the reset resets the other rows at once, reports that row
// as not reset because locked, and a retry after the lock is released
// resets it; each row once. Without a deadline on the reset the session's
// 1 ms is in force for every statement; with one, the reset sets its own
// lock_timeout for its transaction.
func TestResetUnderASessionLockTimeoutOf1msReportsALockedRowAndRetriesIt(t *testing.T) {
	deadlines := []struct {
		name    string
		context func() (context.Context, context.CancelFunc)
	}{
		{"no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"a deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 5*time.Second)
		}},
	}
	for _, d := range deadlines {
		t.Run(d.name, func(t *testing.T) {
			forEachDeadWorkerReset(t, func(t *testing.T, impl resetterImpl, p deadWorkerReset) {
				db := testutil.Postgres(t)
				testutil.CreateBatch(t, db, 5)
				ids := idRange(1, 5)
				take(t, db, "dead", ids...)
				asRole := poolWithRoleSettings(t, db, map[string]string{"lock_timeout": "1ms"})
				release := pgtest.OtherSession(t, db, `SELECT rowid FROM batchrows WHERE rowid = 3 FOR UPDATE`)
				r := impl.Must(t, asRole, p.opts...)

				ctx, cancel := d.context()
				defer cancel()
				start := time.Now()
				res, err := p.reset(ctx, r, ids)
				require.NoError(t, err)
				assert.Less(t, time.Since(start), time.Second, "the reset did not wait for the lock")
				assert.Equal(t, []int64{1, 2, 4, 5}, res.ChangedIDs, "the rows not locked")
				require.Len(t, res.NotReset, 1)
				assert.Equal(t, int64(3), res.NotReset[0].ID)
				assert.Equal(t, "inprog", res.NotReset[0].Status)
				assert.True(t, res.NotReset[0].Locked, "reported as locked")
				assert.False(t, res.NotReset[0].Refused, "not refused")
				assert.Equal(t, map[int64]string{1: "queued", 2: "queued", 3: "inprog", 4: "queued", 5: "queued"}, statuses(t, db))

				release()
				res, err = p.reset(ctx, r, ids)
				require.NoError(t, err)
				assert.Equal(t, []int64{3}, res.ChangedIDs, "the locked row, once its lock is gone")
				assert.Empty(t, res.NotReset)
				assertResetOnce(t, db, 5, ids)
			})
		})
	}
}

// isolationNote adds to batchrows a trigger that records, for each row a
// reset takes from in progress to queued, the isolation level of the
// transaction that did it, in reset_isolation, which role may write.
func isolationNote(t *testing.T, db *pgxpool.Pool, role *pgxpool.Pool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
CREATE TABLE reset_isolation (rowid bigint NOT NULL, isolation text NOT NULL);
CREATE FUNCTION note_isolation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO reset_isolation VALUES (NEW.rowid, current_setting('transaction_isolation'));
	RETURN NULL;
END $$;
CREATE TRIGGER note_isolation AFTER UPDATE ON batchrows FOR EACH ROW
	WHEN (OLD.status = 'inprog' AND NEW.status = 'queued') EXECUTE FUNCTION note_isolation();
GRANT INSERT ON reset_isolation TO `+role.Config().ConnConfig.User)
	require.NoError(t, err)
}

// assertResetOnceSerializable asserts that each of ids was taken back to
// the queue exactly once, by a serializable transaction.
func assertResetOnceSerializable(t *testing.T, db *pgxpool.Pool, ids []int64) {
	t.Helper()
	want := map[int64]string{}
	for _, id := range ids {
		want[id] = "serializable x1"
	}
	assert.Equal(t, want, pgtest.ByRow[string](t, db,
		`SELECT rowid, string_agg(DISTINCT isolation, ',') || ' x' || count(*) FROM reset_isolation GROUP BY rowid`))
}

// A resetter whose session defaults to serializable transactions
// (default_transaction_isolation, ALTER ROLE) resets a dead worker's rows
// in serializable transactions, each row once; so do two resetters racing
// over the same rows, whose transactions may fail to serialize (retried)
// or find the other holding the rows or the incarnation's advisory lock
// (tried again, as the next scan would).
func TestResetWithSerializableAsTheSessionsDefaultResetsEachRowOnce(t *testing.T) {
	const n = 40
	ids := idRange(1, n)
	setup := func(t *testing.T) (db, asRole *pgxpool.Pool) {
		db = testutil.Postgres(t)
		testutil.CreateBatch(t, db, n+1)
		take(t, db, "dead", ids...)
		take(t, db, "live", n+1)
		asRole = poolWithRoleSettings(t, db, map[string]string{"default_transaction_isolation": "serializable"})
		isolationNote(t, db, asRole)
		return db, asRole
	}
	t.Run("one resetter", func(t *testing.T) {
		forEachDeadWorkerReset(t, func(t *testing.T, impl resetterImpl, p deadWorkerReset) {
			db, asRole := setup(t)
			r := impl.Must(t, asRole, p.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := p.reset(ctx, r, ids)
			require.NoError(t, err)
			assert.Equal(t, ids, res.ChangedIDs)
			assert.Empty(t, res.NotReset)
			again, err := p.reset(ctx, r, ids)
			require.NoError(t, err)
			assert.Zero(t, again.Changed, "a repeat changes nothing")
			assertResetOnce(t, db, n+1, ids)
			assert.Equal(t, "inprog", statuses(t, db)[n+1], "a live worker's row is left alone")
			assertResetOnceSerializable(t, db, ids)
		})
	})
	t.Run("two resetters racing", func(t *testing.T) {
		forEachDeadWorkerReset(t, func(t *testing.T, impl resetterImpl, p deadWorkerReset) {
			db, asRole := setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var (
				wg      sync.WaitGroup
				changed [2][]int64
				errs    [2]error
			)
			rs := [2]resetter{impl.Must(t, asRole, p.opts...), impl.Must(t, asRole, p.opts...)}
			begin := make(chan struct{})
			for i := range rs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-begin
					// Until a reset leaves none of the rows locked by the
					// other, as recovery keeps a peer until then.
					for ctx.Err() == nil {
						res, err := p.reset(ctx, rs[i], ids)
						if errors.Is(err, contract.ErrRowsLocked) {
							continue // the other holds the incarnation's lock
						}
						if err != nil {
							errs[i] = err
							return
						}
						changed[i] = append(changed[i], res.ChangedIDs...)
						if len(res.NotReset) == 0 {
							return
						}
					}
					errs[i] = ctx.Err()
				}()
			}
			close(begin)
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.ElementsMatch(t, ids, append(changed[0], changed[1]...), "between them, each row changed once")
			assertResetOnce(t, db, n+1, ids)
			assert.Equal(t, "inprog", statuses(t, db)[n+1], "a live worker's row is left alone")
			assertResetOnceSerializable(t, db, ids)
		})
	})
}
