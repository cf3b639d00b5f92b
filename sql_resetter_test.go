package recovery

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest/impls"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/sqlreset"
)

// The resetter implementations every resetter test runs on (pgx, lib/pq,
// pgx's stdlib) are internal/pgtest's.
type (
	pgResetterAPI = impls.Resetter
	resetterImpl  = impls.Impl
)

var (
	resetterImpls = impls.Impls
	forEachImpl   = impls.ForEachImpl
)

// sqlImpls are the implementations through database/sql.
func sqlImpls() []resetterImpl { return resetterImpls[1:] }

func TestNewSQLResetterRefusesANilHandleAndBadOptions(t *testing.T) {
	var db *sql.DB
	r, err := sqlreset.New(db)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Nil(t, r)
	assert.Contains(t, err.Error(), "database handle is nil")

	r, err = sqlreset.New(&sql.DB{}, postgres.WithMaxRecoveries(3, ""))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Nil(t, r)
	assert.Contains(t, err.Error(), "max recoveries 3 (WithMaxRecoveries) needs a recovery count column (WithRecoveryCountColumn)")
}

func TestSQLResetterWorksWithConnAndInsideACallersTransaction(t *testing.T) {
	for _, impl := range sqlImpls() {
		t.Run(impl.Name, func(t *testing.T) {
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 3)
			ctx := context.Background()
			take(t, db, "dead", 1, 2, 3)
			h := impl.Handle(t, db)

			tx, err := h.BeginTx(ctx, nil)
			require.NoError(t, err)
			r, err := sqlreset.New(tx, postgres.WithOwnerColumn("owner"))
			require.NoError(t, err)
			n, err := resetRows(r, ctx, "dead", []int64{1})
			require.NoError(t, err)
			assert.Equal(t, int64(1), n)
			var inTx string
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT status FROM batchrows WHERE rowid = 1`).Scan(&inTx))
			assert.Equal(t, "queued", inTx, "the reset is visible in the caller's transaction")
			_, err = tx.ExecContext(ctx, "RELEASE SAVEPOINT recovery_reset")
			require.Error(t, err, "the resetter released its savepoint")
			require.NoError(t, tx.Rollback())
			s, _ := rowState(t, db, 1)
			assert.Equal(t, "inprog", s, "the caller's transaction decides")

			// A failed reset inside the caller's transaction rolls back to
			// its savepoint: the transaction stays usable.
			tx, err = h.BeginTx(ctx, nil)
			require.NoError(t, err)
			bad, err := sqlreset.New(tx, postgres.WithTable("no_such_table"), postgres.WithOwnerColumn("owner"))
			require.NoError(t, err)
			_, err = resetRows(bad, ctx, "dead", []int64{1})
			require.Error(t, err)
			assert.Contains(t, err.Error(), `relation "no_such_table" does not exist`)
			_, err = tx.ExecContext(ctx, `UPDATE batchrows SET status = 'done' WHERE rowid = 3`)
			require.NoError(t, err, "not aborted: the resetter rolled back to its savepoint")
			require.NoError(t, tx.Commit())
			s, _ = rowState(t, db, 3)
			assert.Equal(t, "done", s)

			conn, err := h.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			r, err = sqlreset.New(conn, postgres.WithOwnerColumn("owner"))
			require.NoError(t, err)
			n, err = resetRows(r, ctx, "dead", []int64{1, 2, 3})
			require.NoError(t, err)
			assert.Equal(t, int64(2), n, "rows 1 and 2; row 3 is done")
		})
	}
}

// flakySQL fails BeginTx with an error carrying an SQLSTATE a number of
// times, as the driver would report it.
type flakySQL struct {
	*sql.DB
	err   func(code string) error
	code  string
	fails int
	calls int
}

func (f *flakySQL) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	f.calls++
	if f.calls <= f.fails {
		return nil, f.err(f.code)
	}
	return f.DB.BeginTx(ctx, opts)
}

func TestSQLResetterRetriesDeadlocksAndSerializationFailuresOfEitherDriver(t *testing.T) {
	t.Parallel()
	driverErr := map[string]func(code string) error{
		"libpq":  func(code string) error { return &pq.Error{Code: pq.ErrorCode(code), Message: "injected"} },
		"stdlib": func(code string) error { return &pgconn.PgError{Code: code, Message: "injected"} },
	}
	for _, impl := range sqlImpls() {
		t.Run(impl.Name, func(t *testing.T) {
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			h := impl.Handle(t, db)
			for _, code := range []string{"40P01", "40001"} {
				setStatus(t, db, "inprog", 1)
				f := &flakySQL{DB: h, err: driverErr[impl.Name], code: code, fails: 2}
				r, err := sqlreset.New(f, postgres.WithoutResetLedger())
				require.NoError(t, err)
				n, err := resetRows(r, context.Background(), "dead", []int64{1})
				require.NoError(t, err, code)
				assert.Equal(t, int64(1), n, code)
				assert.Equal(t, 3, f.calls, code)
			}
			f := &flakySQL{DB: h, err: driverErr[impl.Name], code: "42P01", fails: 1}
			r, err := sqlreset.New(f)
			require.NoError(t, err)
			_, err = resetRows(r, context.Background(), "dead", []int64{1})
			require.Error(t, err)
			assert.Equal(t, 1, f.calls, "undefined table: not retried")
			assert.Equal(t, "42P01", sqlState(err))
		})
	}
}

func TestSQLResetterReportsAMissingLedgerOfEitherDriverAsErrNoLedger(t *testing.T) {
	for _, impl := range sqlImpls() {
		t.Run(impl.Name, func(t *testing.T) {
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			setStatus(t, db, "inprog", 1)
			r := impl.Must(t, db, postgres.WithResetLedger("no_ledger_here"))
			_, err := r.ResetRows(context.Background(), RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1}})
			require.ErrorIs(t, err, postgres.ErrNoLedger)
			require.NoError(t, r.CreateLedger(context.Background()))
			res, err := r.ResetRows(context.Background(), RowsReset{InstanceID: "dead", Incarnation: "i1", RowIDs: []int64{1}})
			require.NoError(t, err)
			assert.Equal(t, int64(1), res.Changed)
		})
	}
}

// A Worker given an sqlreset.Resetter WithOwnerColumn is in owner mode, and a
// dead peer's rows are reset by owner, through each database/sql driver.
func TestSQLResetterRecoversADeadPeerInOwnerModeEndToEnd(t *testing.T) {
	t.Parallel()
	for _, impl := range sqlImpls() {
		t.Run(impl.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb, db, prefix := onRealServers(t, 20, "SQLO")
			r, err := sqlreset.New(impl.Handle(t, db), postgres.WithOwnerColumn("owner"),
				postgres.WithRecoveryCountColumn("recoveries"), postgres.WithChunkSize(4))
			require.NoError(t, err)

			peer, _ := startWorker(t, rdb, r, "peer", WithKeyPrefix(prefix)) // Start runs the schema check
			require.True(t, peer.Stats().OwnerMode, "an sqlreset.Resetter WithOwnerColumn puts the worker in owner mode")
			ids := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
			take(t, db, "peer", ids...)
			require.NoError(t, peer.Track(ctx, ids...))
			setStatus(t, db, "done", 10) // finished before the peer died
			take(t, db, "live", 11, 12)
			peer.crash()
			require.NoError(t, rdb.Del(ctx, peer.ownKeys().Heartbeat).Err())

			// Start's own recovery of a predecessor left a finish tombstone
			// on peer's claim for 2 × the operation timeout: a scan within
			// it skips peer, the next recovers it.
			rec, logs := newWorker(t, rdb, r, "rec", WithKeyPrefix(prefix))
			var rep report.RecoveryReport
			require.Eventually(t, func() bool {
				rep, err = rec.recoverNow(ctx)
				require.NoError(t, err, logs.String())
				return len(rep.Recovered) == 1
			}, 5*time.Second, 50*time.Millisecond)
			assert.Equal(t, int64(9), rep.Recovered[0].RowsReset, "rows 1-9 in chunks of 4")

			counts := recoveries(t, db)
			for _, id := range ids[:9] {
				s, owner := rowState(t, db, id)
				assert.Equal(t, "queued", s, "row %d", id)
				assert.Nil(t, owner, "row %d", id)
				assert.Equal(t, 1, counts[id], "row %d counted once", id)
			}
			s, _ := rowState(t, db, 10)
			assert.Equal(t, "done", s)
			for _, id := range []int64{11, 12} {
				s, owner := rowState(t, db, id)
				assert.Equal(t, "inprog", s, "a live worker's row %d is left alone", id)
				assert.Equal(t, "live", *owner)
			}
			assert.False(t, registered(t, rdb, prefix, "peer"))
		})
	}
}

// Without an owner column the worker keeps rows sets and the reset is
// recorded in the ledger under the peer's incarnation: a second recovery of
// the same life resets nothing a live worker took since.
func TestSQLResetterRecoversADeadPeerFromItsRowsSetWithTheLedger(t *testing.T) {
	t.Parallel()
	for _, impl := range sqlImpls() {
		t.Run(impl.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb, db, prefix := onRealServers(t, 10, "SQLL")
			r, err := sqlreset.New(impl.Handle(t, db), postgres.WithRecoveryCountColumn("recoveries"))
			require.NoError(t, err)
			require.True(t, r.Info().Ledger)
			v := victim(t, rdb, db, r, "victim", []Option{WithKeyPrefix(prefix)}, 1, 2, 3)
			require.False(t, v.Stats().OwnerMode)
			inc, err := rdb.Get(ctx, v.ownKeys().Incarnation).Result()
			require.NoError(t, err)

			rec, logs := newWorker(t, rdb, r, "rec", WithKeyPrefix(prefix))
			rep, err := rec.recoverNow(ctx)
			require.NoError(t, err, logs.String())
			require.Len(t, rep.Recovered, 1)
			assert.Equal(t, int64(3), rep.RowsReset)
			got := statuses(t, db)
			for id := int64(1); id <= 3; id++ {
				assert.Equal(t, "queued", got[id], "row %d", id)
			}
			var recorded int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger WHERE instance_id = 'victim' AND incarnation = $1`, inc).Scan(&recorded))
			assert.Equal(t, 3, recorded, "the reset is in the ledger under the victim's incarnation")

			setStatus(t, db, "inprog", 1, 2, 3) // a live worker takes them again
			res, err := r.ResetRows(ctx, RowsReset{InstanceID: "victim", Incarnation: inc, RowIDs: []int64{1, 2, 3}})
			require.NoError(t, err)
			assert.Zero(t, res.Changed, "a late retry of the same life resets nothing")
			assert.Empty(t, res.NotReset)
			assert.Equal(t, map[int64]int{1: 1, 2: 1, 3: 1}, pick(recoveries(t, db), 1, 2, 3))
		})
	}
}

// pick returns m restricted to keys.
func pick[V any](m map[int64]V, keys ...int64) map[int64]V {
	out := make(map[int64]V, len(keys))
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

func TestSQLResetterReadsItsSQLStateFromEitherDriversError(t *testing.T) {
	assert.Equal(t, "40P01", sqlState(errors.Join(errors.New("x"), &pq.Error{Code: "40P01"})))
	assert.Equal(t, "40001", sqlState(&pgconn.PgError{Code: "40001"}))
	assert.Empty(t, sqlState(errors.New("no code")))
}

func TestSQLResetterBackstopSweepGoesByOwnerOrByRowVersion(t *testing.T) {
	plain, err := sqlreset.New(&sql.DB{})
	require.NoError(t, err)
	w, err := New(idleClient(t), plain, WithBackstopSweep(true))
	require.NoError(t, err)
	require.NotNil(t, w.sweeper)
	assert.True(t, w.sweeper.byVersion(), "without an owner column the sweep goes by row version")
	w, err = New(idleClient(t), plain, WithBackstopSweep(false))
	require.NoError(t, err)
	assert.Nil(t, w.sweeper)

	fenced, err := sqlreset.New(&sql.DB{}, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	w, err = New(idleClient(t), fenced, WithBackstopSweep(true))
	require.NoError(t, err)
	assert.True(t, w.Stats().OwnerMode)
}
