package pgcore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// blockInProgress returns a pool on a fresh schema whose rows 1..n are in
// progress, owned by owner ("" for none), as a fetch leaves them, under
// an audit trigger doing work (pgtest.AuditTrigger) that has recorded
// nothing; with an owner, the table has the migration's index on it.
func blockInProgress(t testing.TB, n, work int, owner string) *pgxpool.Pool {
	t.Helper()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, n)
	pgtest.AuditTrigger(t, db, work)
	var o any
	if owner != "" {
		o = owner
	}
	_, err := db.Exec(context.Background(), `UPDATE batchrows SET status = 'inprog', owner = $1 WHERE rowid <= $2`, o, n)
	require.NoError(t, err)
	_, err = db.Exec(context.Background(), `TRUNCATE batchrows_audit`)
	require.NoError(t, err)
	if owner != "" {
		// The migration's index (docs/integration.md): without it each
		// chunk by owner sorts every row left, whatever its size.
		_, err = db.Exec(context.Background(), `CREATE INDEX ON batchrows (owner, rowid) WHERE status = 'inprog'`)
		require.NoError(t, err)
	}
	return db
}

// queuedCount returns how many rows are queued.
func queuedCount(t testing.TB, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM batchrows WHERE status = 'queued'`).Scan(&n))
	return n
}

// requeuedOnce asserts that each of rows 1..n went from in progress to
// queued exactly once, as the audit trigger saw it, except the rows of
// skip.
func requeuedOnce(t testing.TB, db *pgxpool.Pool, n int, skip ...int64) {
	t.Helper()
	resets := pgtest.ByRow[int64](t, db, `SELECT rowid, count(*) FROM batchrows_audit WHERE old_status = 'inprog' AND new_status = 'queued' GROUP BY rowid`)
	twice := 0
	for id := int64(1); id <= int64(n); id++ {
		if resets[id] != 1 {
			twice++
			assert.LessOrEqual(t, resets[id], int64(1), "row %d reset %d times", id, resets[id])
		}
	}
	assert.Equal(t, len(skip), twice, "rows not reset exactly once (only %v may be left)", skip)
}

// A reset by owner of a block whose one transaction cannot fit the reset
// timeout (5,000 rows, an audit trigger spending 0.1 ms a row or more:
// 0.5 s at least, against 150 ms; the dry run, one transaction, shows it) commits chunk by chunk: every try keeps what
// it reset, the next resumes from what is left, and every row is queued
// exactly once, also when each try first resets an owner without rows.
// In one transaction every try rolled back whole, forever.
func TestResetByOwnerOfABlockLongerThanTheResetTimeoutComesBackChunkByChunk(t *testing.T) {
	const rows, timeout = 5000, 150 * time.Millisecond
	ctx := context.Background()
	db := blockInProgress(t, rows, 600, "A")
	r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)

	// One transaction does not fit: the dry run runs the reset's
	// statements in one.
	planCtx, cancel := context.WithTimeout(ctx, timeout)
	_, err = r.PlanReset(planCtx, contract.PlanRequest{Owner: &contract.OwnerReset{Owner: "A"}})
	cancel()
	require.Error(t, err, "the block fits one transaction: the test proves nothing")

	start, tries, before := time.Now(), 0, 0
	for queued := 0; queued < rows; tries++ {
		require.Less(t, tries, 100, "%d of %d rows back after %d tries", queued, rows, tries)
		resetCtx, cancel := context.WithTimeout(ctx, timeout)
		// As recovery does: first the bare instance ID, which owns no
		// row (a chunk that finds none must not tell a rate), then A.
		_, err := r.ResetOwner(resetCtx, contract.OwnerReset{Owner: "A-bare"})
		var res contract.ResetResult
		if err == nil {
			res, err = r.ResetOwner(resetCtx, contract.OwnerReset{Owner: "A"})
		}
		cancel()
		queued = queuedCount(t, db)
		t.Logf("try %d: %d rows queued, %d reported locked (error: %v)", tries+1, queued, len(res.NotReset), err)
		if queued == before && len(res.NotReset) == 0 {
			// Rows still locked (the cancelled dry run's transaction not
			// yet rolled back on a loaded server) are reported, not reset.
			assert.Error(t, err, "a try that reset nothing failed or reported the rows it could not reset")
		}
		before = queued
	}
	t.Logf("%d rows back in %d tries of %v, %v", rows, tries, timeout, time.Since(start).Round(time.Millisecond))
	assert.Greater(t, tries, 1, "one try could not fit")
	requeuedOnce(t, db, rows)
	assertRequeued(t, db, 1, rows/2, rows)
}

// With statement_timeout = 100 ms on the resetter's session, a 20,000-row
// block whose 5,000-row statements take longer (a trigger spending about
// 50 µs a row or more) comes back in one reset, in both modes: chunks are
// sized to fit half the statement_timeout, and a chunk it cancelled is
// tried again at half the size. Before, each statement of WithChunkSize
// rows was cancelled and the whole reset rolled back, at every try.
func TestResetSizesItsChunksToFitTheStatementTimeout(t *testing.T) {
	const rows = 20000
	for _, mode := range fencedModes(rows) {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			db := blockInProgress(t, rows, 150, mode.owner)
			cfg := db.Config().Copy()
			cfg.ConnConfig.RuntimeParams["statement_timeout"] = "100"
			short, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(short.Close)
			r, err := pgxreset.New(short, mode.opts...)
			require.NoError(t, err)

			info, err := r.Check(ctx, true)
			require.NoError(t, err)
			assert.Equal(t, 100*time.Millisecond, info.StatementTimeout, "Check reads statement_timeout")

			// Tries of 5 s, as recovery tries at each scan: on a loaded
			// machine a statement may outrun 100 ms whatever its size.
			start, tries := time.Now(), 0
			for queued := 0; queued < rows; tries++ {
				require.Less(t, tries, 10, "%d of %d rows back after %d tries", queued, rows, tries)
				resetCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := mode.reset(resetCtx, r)
				cancel()
				queued = queuedCount(t, db)
				t.Logf("try %d: %d rows queued (error: %v)", tries+1, queued, err)
			}
			t.Logf("%d rows back in %d tries, %v", rows, tries, time.Since(start).Round(time.Millisecond))
			requeuedOnce(t, db, rows)
		})
	}
}

// A reset interrupted after some chunks committed (its context ended) is
// finished by the next try, which resets only what is left: a row the
// first try reset and a live worker took since is not reset again, by
// owner (owner mode) or because the ledger holds it (rows-set mode).
func TestAResetInterruptedAfterSomeChunksIsFinishedWithoutRepeatingWork(t *testing.T) {
	const rows = 5000
	for _, mode := range fencedModes(rows) {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			db := blockInProgress(t, rows, 600, mode.owner)
			r, err := pgxreset.New(db, mode.opts...)
			require.NoError(t, err)
			var _ resetter = r

			first, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			_, err = mode.reset(first, r)
			cancel()
			require.Error(t, err, "the first try fits: the test proves nothing")
			done := queuedCount(t, db)
			require.Positive(t, done, "the first try committed no chunk")
			require.Less(t, done, rows)
			t.Logf("first try: %d rows back: %v", done, err)

			// A live worker takes a row the first try reset.
			var taken int64
			require.NoError(t, db.QueryRow(ctx, `SELECT min(rowid) FROM batchrows WHERE status = 'queued'`).Scan(&taken))
			var live any
			if mode.owner != "" {
				live = "B"
			}
			_, err = db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = $2 WHERE rowid = $1`, taken, live)
			require.NoError(t, err)

			changed := resetUntilSettled(t, r, mode.reset)
			assert.Equal(t, int64(rows-done), changed, "the next tries reset only what the first left")
			assert.Equal(t, "inprog", statuses(t, db)[taken], "the row a live worker took is not reset again")
			assert.Equal(t, rows-1, queuedCount(t, db))
			requeuedOnce(t, db, rows)
		})
	}
}

// A reset by IDs whose rows are fenced neither by owner nor by the ledger
// (no owner column, no ledger) stays one transaction: a try that runs out
// of time commits nothing, so the next try resetting the same IDs cannot
// reset a row a live worker took since. So does a Release (not
// FromRowsSet) under the ledger: a worker whose Release failed may track a
// row again under the same incarnation, which a committed chunk's ledger
// record would hide from its recovery.
func TestAResetWithoutFencingStaysOneTransaction(t *testing.T) {
	const rows = 5000
	for _, c := range []struct {
		name string
		opts []postgres.Option
	}{
		{"no ledger", []postgres.Option{postgres.WithoutResetLedger()}},
		{"a release under the ledger", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := blockInProgress(t, rows, 600, "")
			r, err := pgxreset.New(db, c.opts...)
			require.NoError(t, err)
			req := contract.RowsReset{InstanceID: "A", Incarnation: "1", RowIDs: seq(rows)}
			short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			_, err = r.ResetRows(short, req)
			cancel()
			require.Error(t, err)
			assert.Zero(t, queuedCount(t, db), "nothing committed")

			assert.Equal(t, int64(rows), resetUntilSettled(t, r, byRows(req)))
			requeuedOnce(t, db, rows)
		})
	}
}

// resetOp is one reset on r: by IDs (byRows) or by owner (byOwner).
type resetOp func(ctx context.Context, r resetter) (contract.ResetResult, error)

// byRows is the reset of req's rows by ID.
func byRows(req contract.RowsReset) resetOp {
	return func(ctx context.Context, r resetter) (contract.ResetResult, error) { return r.ResetRows(ctx, req) }
}

// byOwner is the reset of owner's rows.
func byOwner(owner string) resetOp {
	return func(ctx context.Context, r resetter) (contract.ResetResult, error) {
		return r.ResetOwner(ctx, contract.OwnerReset{Owner: owner})
	}
}

// resetUntilSettled runs reset until it leaves no row locked (NotReset)
// and no error wrapping ErrRowsLocked, as recovery tries again at every
// scan: the session of a try that ran out of time may still hold its rows
// (or its incarnation's lock) for a moment after the client gave up on
// it. It returns the rows changed in all.
func resetUntilSettled(t testing.TB, r resetter, reset resetOp) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var changed int64
	for {
		res, err := reset(ctx, r)
		if errors.Is(err, contract.ErrRowsLocked) {
			continue // the incarnation's lock, still held by that session
		}
		require.NoError(t, err)
		changed += res.Changed
		if len(res.NotReset) == 0 {
			return changed
		}
		for _, s := range res.NotReset {
			require.True(t, s.Locked, "row %d left unlocked: %+v", s.ID, s)
		}
	}
}

// resetMode is a reset of rows 1..n of instance A whose rows are each
// fenced on their own, so it commits chunk by chunk.
type resetMode struct {
	name  string
	opts  []postgres.Option
	owner string // the owner column's value of A's rows; "" without one
	reset resetOp
}

// fencedModes are the resets that commit chunk by chunk: by owner, by IDs
// read from a rows set with an owner column, and by IDs with the ledger.
func fencedModes(n int) []resetMode {
	owner := []postgres.Option{postgres.WithOwnerColumn("owner")}
	return []resetMode{
		{"owner", owner, "A", byOwner("A")},
		{"rows set with an owner column", owner, "A", byRows(contract.RowsReset{InstanceID: "A", Incarnation: "1", RowIDs: seq(n), FromRowsSet: true})},
		{"rows set with the ledger", nil, "", byRows(contract.RowsReset{InstanceID: "A", Incarnation: "1", RowIDs: seq(n), FromRowsSet: true})},
	}
}

// seq returns 1..n.
func seq(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

// A Release (by IDs, not from a rows set) with an owner column stays one
// transaction too: the worker takes the rows of a failed Release as still
// its own, so another of its goroutines may take a row a committed chunk
// put back, under the same owner value (the bare instance ID, or the same
// life's), and the host's repeated Release would reset it under that
// goroutine.
func TestAReleaseWithAnOwnerColumnStaysOneTransaction(t *testing.T) {
	const rows = 5000
	for _, c := range []struct {
		name string
		req  contract.RowsReset
	}{
		{"a life's owner value", contract.RowsReset{InstanceID: "A", RowIDs: seq(rows)}},
		{"the bare instance ID", contract.RowsReset{InstanceID: "A", Incarnation: "1", RowIDs: seq(rows)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := blockInProgress(t, rows, 600, "A")
			r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
			require.NoError(t, err)
			short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			_, err = r.ResetRows(short, c.req)
			cancel()
			require.Error(t, err)

			// Another goroutine of the worker fetches what is queued again,
			// under the same owner value.
			var retaken []int64
			q, err := db.Query(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'A' WHERE status = 'queued' RETURNING rowid`)
			require.NoError(t, err)
			for q.Next() {
				var id int64
				require.NoError(t, q.Scan(&id))
				retaken = append(retaken, id)
			}
			require.NoError(t, q.Err())
			assert.Zero(t, len(retaken), "the failed Release committed nothing")

			resetUntilSettled(t, r, byRows(c.req)) // the host repeats its Release
			for _, id := range retaken {
				var status string
				require.NoError(t, db.QueryRow(ctx, `SELECT status FROM batchrows WHERE rowid = $1`, id).Scan(&status))
				assert.Equal(t, "inprog", status, "row %d, taken again by a live goroutine, is reset under it", id)
			}
			if len(retaken) == 0 {
				requeuedOnce(t, db, rows)
			}
		})
	}
}
