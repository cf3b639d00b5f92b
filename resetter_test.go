package recovery

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// metered is a host's plain decorator (docs/migrating.md): it embeds
// the Resetter it wraps, so it forwards all nine methods, and overrides
// ResetRows only, to count the resets of rows by ID, with no filter.
type metered struct {
	Resetter
	n atomic.Int64
}

func (m *metered) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	m.n.Add(1)
	return m.Resetter.ResetRows(ctx, req)
}

// A wrapper that overrides ResetRows alone counts the resets of rows by ID
// and nothing else, without looking at what it is given: the backstop
// sweep (by owner with an owner column, by row version without) and the
// plan of a rows-set recovery (PlanRecovery) never reach it; the recovery
// itself does, once.
func TestAWrapperOfResetRowsSeesNoSweepAndNoPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	for _, ownerCol := range []bool{true, false} {
		t.Run(fmt.Sprintf("owner=%v", ownerCol), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb, db, prefix := onRealServers(t, 4, "MW")
			g := guarantee{impl: resetterImpls[0], ownerCol: ownerCol, wrap: func(r pgResetterAPI) Resetter { return r }}
			m := &metered{Resetter: g.resetter(t, db)}

			waitUptime(t, rdb, 2*time.Second)
			take(t, db, "gone", 1, 2)
			sw, _ := newWorker(t, rdb, m, "sweeper", rowsSweepTimings(WithKeyPrefix(prefix))...)
			require.NotNil(t, sw.sweeper, "the backstop sweep runs")
			require.Eventually(t, func() bool {
				_, err := sw.sweeper.runOnce(ctx)
				st := statuses(t, db)
				return err == nil && st[1] == "queued" && st[2] == "queued"
			}, 10*time.Second, 50*time.Millisecond, "the sweep resets rows no one tracks")
			assert.Zero(t, m.n.Load(), "the sweep reached ResetRows")

			opts := []Option{WithKeyPrefix(prefix), WithRowsSets()}
			g.deadVictim(t, rdb, db, opts, 3, 4)
			p, _ := newWorker(t, rdb, m, "planner", opts...)
			plan, err := p.planRecovery(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, plan.RowsToReset, "%+v", plan)
			assert.Zero(t, m.n.Load(), "the plan reached ResetRows")

			rep, err := p.recoverNow(ctx)
			require.NoError(t, err)
			require.Len(t, rep.Recovered, 1)
			assertQueued(t, db, 3, 4)
			assert.Equal(t, int64(1), m.n.Load(), "the recovery's reset by ID went through the wrapper")
		})
	}
}

// A decorated resetter keeps every guarantee of the resetter it wraps:
// what a resetter guarantees travels in Info's value, and the Worker finds
// nothing by type assertion. Each guarantee is checked for pgxreset.Resetter and
// sqlreset.Resetter, with and without an owner column, bare and wrapped in
// metered. Before the contract, a wrapper that forwarded only ResetRows
// lost all of them but the owner fencing done inside the statement, and
// one that forwarded every exported method lost ErrReadOnly and
// ErrFleetMismatch.
func TestDecoratedResetterKeepsEveryGuarantee(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	var resets atomic.Int64
	runGuarantees(t, []decoration{
		{"bare", func(r pgResetterAPI) Resetter { return r }},
		{"metered", func(r pgResetterAPI) Resetter {
			m := &metered{Resetter: r}
			t.Cleanup(func() { resets.Add(m.n.Load()) })
			return m
		}},
	})
	t.Cleanup(func() { assert.NotZero(t, resets.Load(), "the resets went through the decorator") })
}

// A resetter whose Info cannot work, and the backstop sweep asked of a
// resetter that cannot list the rows in progress, are refused by New,
// naming the resetter's type and the field.
func TestNewRefusesWhatTheResetterInfoRulesOut(t *testing.T) {
	_, rdb := newMini(t)
	cases := []struct {
		name string
		info ResetterInfo
		opts []Option
		want string
	}{
		{"no in-progress status", ResetterInfo{QueuedStatus: "queued"}, nil, "resetter *recovery.fakeResetter: Info().InProgressStatus is empty"},
		{"no queued status", ResetterInfo{InProgressStatus: "inprog"}, nil, "resetter *recovery.fakeResetter: Info().QueuedStatus is empty"},
		{"same statuses", ResetterInfo{InProgressStatus: "inprog", QueuedStatus: "inprog"}, nil,
			`resetter *recovery.fakeResetter: Info().QueuedStatus "inprog" equals InProgressStatus`},
		{"sweep without listing", ResetterInfo{InProgressStatus: "inprog", QueuedStatus: "queued"}, []Option{WithBackstopSweep(true)},
			"needs a resetter that lists rows in progress (Info().ListsInProgress); *recovery.fakeResetter does not"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			info := c.info
			_, err := New(rdb, &fakeResetter{info: &info}, c.opts...)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	var nilFake *fakeResetter
	_, err := New(rdb, nilFake)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "row resetter is nil")
}

// decoration wraps a bundled resetter as a host would, or not at all.
type decoration struct {
	name string
	wrap func(r pgResetterAPI) Resetter
}

// guaranteeImpls are the bundled resetters the decorator test runs on:
// pgxreset.Resetter, and sqlreset.Resetter (through pgx's stdlib).
func guaranteeImpls() []resetterImpl {
	var out []resetterImpl
	for _, impl := range resetterImpls {
		if impl.Name == "pgx" || impl.Name == "stdlib" {
			out = append(out, impl)
		}
	}
	return out
}

// runGuarantees runs every guarantee of §2c for each bundled resetter,
// with and without an owner column, bare and through each decoration.
func runGuarantees(t *testing.T, decorations []decoration) {
	for _, impl := range guaranteeImpls() {
		for _, ownerCol := range []bool{true, false} {
			for _, d := range decorations {
				t.Run(fmt.Sprintf("%s/owner=%v/%s", impl.Name, ownerCol, d.name), func(t *testing.T) {
					t.Parallel()
					g := guarantee{impl: impl, ownerCol: ownerCol, wrap: d.wrap}
					t.Run("OwnerMode", g.ownerMode)
					t.Run("Ledger", g.ledger)
					t.Run("StartRefuses", g.startRefuses)
					t.Run("SelfCheck", g.selfCheck)
					t.Run("Report", g.report)
					t.Run("Sweep", g.sweep)
					t.Run("DryRun", g.dryRun)
					t.Run("ReleaseAfterLoss", g.releaseAfterLoss)
				})
			}
		}
	}
}

// guarantee is one resetter configuration under one decoration.
type guarantee struct {
	impl     resetterImpl
	ownerCol bool
	wrap     func(r pgResetterAPI) Resetter
}

// resetter returns the decorated resetter on db's batch table.
func (g guarantee) resetter(t *testing.T, db *pgxpool.Pool, extra ...postgres.Option) Resetter {
	t.Helper()
	var opts []postgres.Option
	if g.ownerCol {
		opts = append(opts, postgres.WithOwnerColumn("owner"))
	}
	return g.wrap(g.impl.Must(t, db, append(opts, postgres.WithRecoveryCountColumn("recoveries"))...))
}

// deadVictim starts a worker, has it take and track ids as a host would
// (the owner column set to its owner value), and kills it.
func (g guarantee) deadVictim(t *testing.T, rdb redis.UniversalClient, db *pgxpool.Pool, opts []Option, ids ...int64) {
	t.Helper()
	v, _ := startWorker(t, rdb, g.resetter(t, db), "victim", opts...)
	take(t, db, v.OwnerValue(), ids...)
	require.NoError(t, v.Track(context.Background(), ids...))
	v.crash()
	// Its heartbeat expired; so did the claim its Start took on its own ID.
	require.NoError(t, rdb.Del(context.Background(), v.ownKeys().Heartbeat, v.ownKeys().Claim).Err())
}

func (g guarantee) ownerMode(t *testing.T) {
	rdb, db, prefix := onRealServers(t, 4, "DG")
	w, _ := newWorker(t, rdb, g.resetter(t, db), "w", WithKeyPrefix(prefix))
	assert.Equal(t, g.ownerCol, w.Stats().OwnerMode, "owner mode whenever the resetter fences by owner")
}

// ledger: a recoverer's reset commits and the recoverer dies before Redis
// hears of it; the rows are taken again by a live worker; the next
// recoverer, of the same incarnation, changes nothing.
func (g guarantee) ledger(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")
	opts := []Option{WithKeyPrefix(prefix), WithRowsSets(), WithTimings(Timings{ResetTimeout: 5 * time.Second})}
	g.deadVictim(t, rdb, db, opts, 1, 2, 3)
	before := dumpKeys(t, rdb, prefix)

	r1, _ := newWorker(t, rdb, g.resetter(t, db), "r1", opts...)
	rep, err := r1.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assertQueued(t, db, 1, 2, 3)

	restoreKeys(t, rdb, prefix, before) // r1's finish never reached Redis
	take(t, db, "live", 1, 2, 3)        // a live worker takes them again

	r2, _ := newWorker(t, rdb, g.resetter(t, db), "r2", opts...)
	rep, err = r2.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1, "r2 recovered the victim again: its reset ran")
	assert.Zero(t, rep.RowsReset, "the second reset of the same incarnation changes nothing")
	for id, s := range statuses(t, db) {
		if id <= 3 {
			assert.Equal(t, "inprog", s, "row %d stays with the live worker", id)
		}
	}
}

func (g guarantee) startRefuses(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")

	// A status the table does not know (an enum status column).
	schema, ropts := jobsTable(t, db, true, 2)
	if g.ownerCol {
		_, err := db.Exec(ctx, "ALTER TABLE "+schema+".jobs ADD owner text")
		require.NoError(t, err)
		ropts = append(ropts, postgres.WithOwnerColumn("owner"))
	}
	bad := g.wrap(g.impl.Must(t, db, append(ropts, postgres.WithStatuses("running", "pendng"))...))
	w, _ := newWorker(t, rdb, bad, "bad-status", WithKeyPrefix(testutil.Name("DG")), WithRowsSets())
	assert.ErrorIs(t, w.Start(ctx), ErrSchema, "a misspelt status")

	// A session that cannot write.
	ro := g.resetter(t, pgtest.PoolAsReadOnlyRole(t, db))
	w, _ = newWorker(t, rdb, ro, "read-only", WithKeyPrefix(testutil.Name("DG")), WithRowsSets())
	assert.ErrorIs(t, w.Start(ctx), ErrReadOnly, "a read-only session")

	// Another fleet's record under the prefix.
	startWorker(t, rdb, g.resetter(t, db), "a", WithKeyPrefix(prefix))
	other := testutil.Postgres(t)
	testutil.CreateBatch(t, other, 4)
	w, _ = newWorker(t, rdb, g.resetter(t, other), "b", WithKeyPrefix(prefix))
	assert.ErrorIs(t, w.Start(ctx), ErrFleetMismatch, "another table under the prefix")
}

// selfCheck: rows tracked with a status the resetter does not take for
// in progress raise the alarm.
func (g guarantee) selfCheck(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")
	w, _ := startWorker(t, rdb, g.resetter(t, db), "w", WithKeyPrefix(prefix), WithTimings(Timings{SelfCheckWindow: 100 * time.Millisecond}))
	take(t, db, w.OwnerValue(), 1, 2)
	setStatus(t, db, "in_progress", 1, 2) // the host's status, misspelt
	require.NoError(t, w.Track(ctx, 1, 2))
	waitTurns(t, &signals(w).look, 10*time.Second, func() bool { return errors.Is(w.Healthy(), ErrMisconfigured) },
		"the self-check raises the alarm")
}

// report: a quarantined row and a row not reset are reported.
func (g guarantee) report(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")
	opts := []Option{WithKeyPrefix(prefix), WithRowsSets()}
	g.deadVictim(t, rdb, db, opts, 1, 2, 3)
	_, err := db.Exec(ctx, `UPDATE batchrows SET recoveries = 5 WHERE rowid = 1`)
	require.NoError(t, err)
	setStatus(t, db, "weird", 2)

	var limit []postgres.Option
	if g.ownerCol {
		limit = append(limit, postgres.WithOwnerColumn("owner"))
	}
	limit = append(limit, postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, "failed"))
	r, _ := newWorker(t, rdb, g.wrap(g.impl.Must(t, db, limit...)), "r", opts...)
	rep, err := r.recoverNow(ctx)
	require.ErrorIs(t, err, ErrRowsNotReset, "row 2 is neither reset nor settled")
	require.Len(t, rep.Failed, 1)
	assert.Equal(t, []int64{1}, rep.Failed[0].Quarantined)
	if assert.Len(t, rep.Failed[0].NotReset, 1) {
		assert.Equal(t, int64(2), rep.Failed[0].NotReset[0].ID)
	}
	assert.Len(t, rowsOf(t, rdb, prefix, "victim"), 3, "rows set kept")
}

// sweep: rows in progress that nothing in Redis knows go back to the
// queue: by owner with an owner column, by row version without.
func (g guarantee) sweep(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")
	waitUptime(t, rdb, 2*time.Second)
	take(t, db, "gone", 1, 2)
	w, _ := newWorker(t, rdb, g.resetter(t, db), "sweeper", rowsSweepTimings(WithKeyPrefix(prefix))...)
	require.NotNil(t, w.sweeper, "the backstop sweep runs")
	require.Eventually(t, func() bool {
		_, err := w.sweeper.runOnce(ctx)
		st := statuses(t, db)
		return err == nil && st[1] == "queued" && st[2] == "queued"
	}, 10*time.Second, 50*time.Millisecond, "the sweep resets rows no one tracks")
}

// dryRun: PlanRecovery says what a reset would change.
func (g guarantee) dryRun(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "DG")
	g.deadVictim(t, rdb, db, []Option{WithKeyPrefix(prefix)}, 1, 2, 3)
	w, _ := newWorker(t, rdb, g.resetter(t, db), "planner", WithKeyPrefix(prefix))
	plan, err := w.planRecovery(ctx)
	require.NoError(t, err)
	require.Len(t, plan.Peers, 1)
	assert.NotEqual(t, report.PlanUnknown, plan.Peers[0].Action)
	assert.Equal(t, 3, plan.RowsToReset, "%+v", plan)
	assert.Equal(t, "inprog", statuses(t, db)[1], "nothing changed")
}

// releaseAfterLoss: owner fencing or the ledger make Release safe after
// the lease was lost.
func (g guarantee) releaseAfterLoss(t *testing.T) {
	ctx := context.Background()
	mr, rdb := newMini(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 4)
	w, _ := startWorker(t, rdb, g.resetter(t, db), "w", WithTimings(Timings{
		HeartbeatTTL:      400 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
	}))
	take(t, db, w.OwnerValue(), 1)
	require.NoError(t, w.Track(ctx, 1))
	mr.SetError("ERR down")
	// Each failed heartbeat turn, a retry delay apart, notes the loss once
	// the lease has run out.
	waitTurns(t, &signals(w).beat, 2*time.Second, func() bool { return w.CheckLease() != nil })
	assert.NoError(t, w.Release(ctx, 1), "safe after a lost lease")
	assertQueued(t, db, 1)
	mr.SetError("")
}

// dumpKeys returns a DUMP of every key under prefix.
func dumpKeys(t *testing.T, rdb *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, k := range keys {
		v, err := rdb.Dump(ctx, k).Result()
		require.NoError(t, err)
		out[k] = v
	}
	return out
}

// restoreKeys replaces every key under prefix with the dump.
func restoreKeys(t *testing.T, rdb *redis.Client, prefix string, dump map[string]string) {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	if len(keys) > 0 {
		require.NoError(t, rdb.Del(ctx, keys...).Err())
	}
	for k, v := range dump {
		require.NoError(t, rdb.Restore(ctx, k, 0, v).Err())
	}
}

// assertQueued asserts that each of ids is queued.
func assertQueued(t *testing.T, db *pgxpool.Pool, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d", id)
	}
}
