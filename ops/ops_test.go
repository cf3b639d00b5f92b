package ops_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// fleet returns the test Redis and a fresh prefix.
func fleet(t *testing.T) (*redis.Client, string) {
	t.Helper()
	return testutil.Redis(t), testutil.Name("OPS")
}

// TestInspectReadsWhatRedisHolds: the registry as a scan reads it (invalid
// members apart, sorted), each instance's keys, and nothing changed.
func TestInspectReadsWhatRedisHolds(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := fleet(t)
	a, b := store.InstanceKeys(prefix, "a"), store.InstanceKeys(prefix, "b")
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "b", "a", "not valid").Err())
	require.NoError(t, rdb.Set(ctx, a.Heartbeat, "x", time.Minute).Err())
	require.NoError(t, rdb.SAdd(ctx, b.Rows, "3", "1", "two").Err())
	require.NoError(t, rdb.Set(ctx, b.Incarnation, "life-1", 0).Err())
	require.NoError(t, rdb.Set(ctx, b.Claim, store.FailedClaim, time.Minute).Err())

	fs, err := ops.Inspect(ctx, rdb, prefix)
	require.NoError(t, err)
	assert.Equal(t, store.RegistryKey(prefix), fs.Registry)
	assert.Equal(t, []string{"not valid"}, fs.InvalidMembers)
	require.Len(t, fs.Instances, 2)
	ia, ib := fs.Instances[0], fs.Instances[1]
	assert.Equal(t, "a", ia.InstanceID)
	assert.True(t, ia.Registered)
	assert.True(t, ia.Alive())
	assert.InDelta(t, time.Minute, ia.HeartbeatTTL, float64(5*time.Second))
	assert.False(t, ia.RowsPresent)
	assert.Equal(t, ops.ClaimNone, ia.Claim)
	assert.Equal(t, "b", ib.InstanceID)
	assert.False(t, ib.Alive())
	assert.True(t, ib.RowsPresent)
	assert.Equal(t, int64(3), ib.Rows)
	assert.Equal(t, "life-1", ib.Incarnation)
	assert.Equal(t, ops.ClaimFailed, ib.Claim)
	assert.Empty(t, fs.Serves, "no fleet record")

	n, err := rdb.Exists(ctx, a.Heartbeat, b.Rows, b.Incarnation, b.Claim).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(4), n, "inspection changes nothing")
}

// TestInspectInstanceAndReadTrackedRows: one instance, registered or not,
// and its rows set as a recovery reads it.
func TestInspectInstanceAndReadTrackedRows(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := fleet(t)
	k := store.InstanceKeys(prefix, "gone")
	require.NoError(t, rdb.SAdd(ctx, k.Rows, "10", "2", "x", "a").Err())
	require.NoError(t, rdb.Set(ctx, k.Incarnation, "life-2", 0).Err())
	require.NoError(t, rdb.Set(ctx, k.Claim, "done:token", time.Minute).Err())

	st, err := ops.InspectInstance(ctx, rdb, prefix, "gone")
	require.NoError(t, err)
	assert.False(t, st.Registered)
	assert.True(t, st.Known(), "its keys are there")
	assert.Equal(t, ops.ClaimFinished, st.Claim)

	tr, err := ops.ReadTrackedRows(ctx, rdb, prefix, "gone")
	require.NoError(t, err)
	assert.Equal(t, ops.TrackedRows{Incarnation: "life-2", RowIDs: []int64{2, 10}, InvalidMembers: []string{"a", "x"}}, tr)

	none, err := ops.InspectInstance(ctx, rdb, prefix, "nobody")
	require.NoError(t, err)
	assert.False(t, none.Known())
}

// TestInspectRefusesWhatANewWorkerRefuses: a bad prefix or instance ID and
// a nil client wrap recovery.ErrInvalidConfig; a registry that is not a
// set wraps recovery.ErrRegistryWrongType.
func TestInspectRefusesWhatANewWorkerRefuses(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := fleet(t)
	_, err := ops.Inspect(ctx, rdb, "bad prefix")
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.Inspect(ctx, nil, prefix)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	var nilClient *redis.Client
	_, err = ops.Inspect(ctx, nilClient, prefix)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.InspectInstance(ctx, rdb, prefix, "bad id")
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.ReadTrackedRows(ctx, rdb, prefix, "")
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.ReadHistory(ctx, rdb, "bad prefix", ops.HistoryQuery{})
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Last: -1})
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)

	require.NoError(t, rdb.Set(ctx, store.RegistryKey(prefix), "x", 0).Err())
	_, err = ops.Inspect(ctx, rdb, prefix)
	assert.ErrorIs(t, err, recovery.ErrRegistryWrongType)
}

// xadd appends an entry with the given ID ("*": Redis picks it).
func xadd(t *testing.T, rdb *redis.Client, prefix, id string, fields map[string]string) {
	t.Helper()
	values := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		values = append(values, k, v)
	}
	require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: store.HistoryKey(prefix), ID: id, Values: values}).Err())
}

// TestHistoryEntryRoundTrip: what the Worker writes (these maps are the
// ones recovery's TestHistoryEntryRoundTrip pins historyFields to)
// ReadHistory reads; "peer_dead", the stream's name of a claim, reads as
// HistoryPeerClaimed; an entry of an unknown kind or with garbage fields
// reads as far as it can.
func TestHistoryEntryRoundTrip(t *testing.T) {
	rdb, prefix := fleet(t)
	at := time.Date(2026, 11, 23, 3, 12, 7, 123456789, time.UTC)
	xadd(t, rdb, prefix, "1-0", map[string]string{"kind": "rows_recovered", "time": "2026-11-23T03:12:07.123456789Z",
		"instance": "w-1", "uid": "u1", "peer": "w-2", "found_by": "expiry", "rows": "7", "rows_reset": "6",
		"rows_quarantined": "1", "duration_ms": "1.5", "row_ids": "-4,1,2,3,5,8", "row_ids_total": "6"})
	// As a release before row IDs wrote it: no row_ids, no row_ids_total.
	xadd(t, rdb, prefix, "2-0", map[string]string{"kind": "stray_rows_reset", "time": "2026-11-23T03:12:07.123456789Z",
		"instance": "w-1", "uid": "u3", "found_by": "sweep", "rows": "4", "rows_reset": "3", "rows_quarantined": "1"})
	xadd(t, rdb, prefix, "3-0", map[string]string{"kind": "untracked_rows", "time": "2026-11-23T03:12:07.123456789Z",
		"instance": "w-1", "uid": "u4", "rows": "2", "row_ids": "20,x,21", "row_ids_total": "2"})
	xadd(t, rdb, prefix, "4-0", map[string]string{"kind": "peer_dead", "time": "2026-11-23T03:12:07.123456789Z",
		"instance": "w-1", "uid": "u5", "peer": "w-2", "found_by": "registry", "duration_ms": "2"})
	xadd(t, rdb, prefix, "5-0", map[string]string{"kind": "from_the_future", "rows": "many", "extra": "x"})

	h, err := ops.ReadHistory(context.Background(), rdb, prefix, ops.HistoryQuery{})
	require.NoError(t, err)
	ms := func(n int64) time.Time { return time.UnixMilli(n) }
	assert.Equal(t, []ops.HistoryEntry{
		{ID: "1-0", Added: ms(1), Kind: ops.HistoryRowsRecovered, Time: at, InstanceID: "w-1", PeerID: "w-2",
			FoundBy: "expiry", Rows: 7, RowsReset: 6, RowsQuarantined: 1, Duration: 1500 * time.Microsecond,
			RowIDs: []int64{-4, 1, 2, 3, 5, 8}, RowIDsTotal: 6},
		{ID: "2-0", Added: ms(2), Kind: ops.HistoryStrayRowsReset, Time: at, InstanceID: "w-1", FoundBy: "sweep",
			Rows: 4, RowsReset: 3, RowsQuarantined: 1},
		{ID: "3-0", Added: ms(3), Kind: ops.HistoryUntrackedRows, Time: at, InstanceID: "w-1", Rows: 2,
			RowIDs: []int64{20, 21}, RowIDsTotal: 2},
		{ID: "4-0", Added: ms(4), Kind: ops.HistoryPeerClaimed, Time: at, InstanceID: "w-1", PeerID: "w-2",
			FoundBy: "registry", Duration: 2 * time.Millisecond},
		{ID: "5-0", Added: ms(5), Kind: "from_the_future"},
	}, h)
}

// TestHistoryEntryListsAtMostHistoryRowIDsMaxRows: an entry's row IDs are
// read up to the bound, whatever the stream holds (a stranger may write a
// huge field), with the total the writer gave.
func TestHistoryEntryListsAtMostHistoryRowIDsMaxRows(t *testing.T) {
	rdb, prefix := fleet(t)
	ids := make([]string, 3*ops.HistoryRowIDsMax)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	xadd(t, rdb, prefix, "1-0", map[string]string{"kind": "stray_rows_reset", "row_ids": strings.Join(ids, ","), "row_ids_total": "5000"})
	xadd(t, rdb, prefix, "2-0", map[string]string{"kind": "stray_rows_reset", "row_ids": "7,8", "row_ids_total": "-1"})
	h, err := ops.ReadHistory(context.Background(), rdb, prefix, ops.HistoryQuery{})
	require.NoError(t, err)
	require.Len(t, h, 2)
	require.Len(t, h[0].RowIDs, ops.HistoryRowIDsMax)
	assert.Equal(t, int64(ops.HistoryRowIDsMax-1), h[0].RowIDs[ops.HistoryRowIDsMax-1])
	assert.Equal(t, 5000, h[0].RowIDsTotal)
	assert.Equal(t, []int64{7, 8}, h[1].RowIDs)
	assert.Equal(t, 2, h[1].RowIDsTotal, "never fewer than it lists")
}

// TestReadHistoryDropsTheCopyOfARetriedAppend: an XADD retried after a
// lost reply appends the entry twice, with one uid: it reads once, and
// Last counts entries, not their copies. Entries of versions without a
// uid are all kept.
func TestReadHistoryDropsTheCopyOfARetriedAppend(t *testing.T) {
	rdb, prefix := fleet(t)
	ctx := context.Background()
	xadd(t, rdb, prefix, "*", map[string]string{"kind": "lease_lost", "instance": "old"})
	xadd(t, rdb, prefix, "*", map[string]string{"kind": "lease_lost", "instance": "old"})
	xadd(t, rdb, prefix, "*", map[string]string{"kind": "peer_dead", "instance": "w", "peer": "p", "uid": "u1"})
	xadd(t, rdb, prefix, "*", map[string]string{"kind": "peer_dead", "instance": "w", "peer": "p", "uid": "u1"})
	xadd(t, rdb, prefix, "*", map[string]string{"kind": "rows_recovered", "instance": "w", "peer": "p", "uid": "u2"})

	h, err := ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{})
	require.NoError(t, err)
	var kinds []string
	for _, e := range h {
		kinds = append(kinds, e.Kind)
	}
	assert.Equal(t, []string{ops.HistoryLeaseLost, ops.HistoryLeaseLost, ops.HistoryPeerClaimed, ops.HistoryRowsRecovered}, kinds)
	last, err := ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Last: 2})
	require.NoError(t, err)
	assert.Equal(t, h[2:], last, "Last counts entries, not their copies")
}

// TestReadHistorySelectsByTheTimeRedisAppended: Since and Last select by
// the entry's ID, the server's clock; the result is oldest first.
func TestReadHistorySelectsByTheTimeRedisAppended(t *testing.T) {
	rdb, prefix := fleet(t)
	ctx := context.Background()
	for i, id := range []string{"1000-0", "2000-0", "3000-0"} {
		xadd(t, rdb, prefix, id, map[string]string{"kind": "lease_lost", "instance": "w", "uid": id, "rows": string(rune('1' + i))})
	}
	ids := func(h []ops.HistoryEntry) []string {
		var out []string
		for _, e := range h {
			out = append(out, e.ID)
		}
		return out
	}
	h, err := ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Since: time.UnixMilli(2000)})
	require.NoError(t, err)
	assert.Equal(t, []string{"2000-0", "3000-0"}, ids(h))
	h, err = ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Last: 2})
	require.NoError(t, err)
	assert.Equal(t, []string{"2000-0", "3000-0"}, ids(h), "the newest two, oldest first")
	h, err = ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Since: time.UnixMilli(1000), Last: 1})
	require.NoError(t, err)
	assert.Equal(t, []string{"3000-0"}, ids(h))
	h, err = ops.ReadHistory(ctx, rdb, prefix, ops.HistoryQuery{Since: time.UnixMilli(4000)})
	require.NoError(t, err)
	assert.Empty(t, h)
	h, err = ops.ReadHistory(ctx, rdb, testutil.Name("NONE"), ops.HistoryQuery{})
	require.NoError(t, err)
	assert.Empty(t, h, "no stream, no entries")
}

// failing is a resetter that resets every row but fails for one peer. It
// cannot do a dry run.
type failing struct{ peer string }

var _ recovery.Resetter = failing{}

func (f failing) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "failing", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (f failing) Check(context.Context, bool) (recovery.ResetterInfo, error) { return f.Info(), nil }

func (f failing) ResetRows(_ context.Context, req recovery.RowsReset) (recovery.ResetResult, error) {
	if req.InstanceID == f.peer {
		return recovery.ResetResult{}, errors.New("connection refused by the test")
	}
	return recovery.ResetResult{Changed: int64(len(req.RowIDs))}, nil
}

func (f failing) ResetOwner(_ context.Context, req recovery.OwnerReset) (recovery.ResetResult, error) {
	if req.Owner == f.peer {
		return recovery.ResetResult{}, errors.New("connection refused by the test")
	}
	return recovery.ResetResult{}, nil
}

func (failing) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (failing) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (failing) InProgressOwners(context.Context) ([]string, error)              { return nil, nil }
func (failing) InProgressRows(context.Context) ([]recovery.RowState, error)     { return nil, nil }
func (failing) RowStates(context.Context, []int64) ([]recovery.RowState, error) { return nil, nil }

// TestRecoverNowAndPlanRecoveryRunTheWorkersScan: through ops, a Worker
// that is never started plans and runs a scan; a failed peer is an
// *ops.PeerError, the very type the Worker returns.
func TestRecoverNowAndPlanRecoveryRunTheWorkersScan(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := fleet(t)
	for peer, rows := range map[string][]any{"dead-1": {"1", "2"}, "dead-2": {"9"}} {
		require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), peer).Err())
		require.NoError(t, rdb.SAdd(ctx, store.InstanceKeys(prefix, peer).Rows, rows...).Err())
	}
	w, err := recovery.New(rdb, failing{peer: "dead-2"}, recovery.WithKeyPrefix(prefix), recovery.WithInstanceID("ctl"),
		recovery.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)

	plan, err := ops.PlanRecovery(ctx, w)
	require.NoError(t, err)
	assert.Equal(t, 2, plan.DeadPeers)
	require.Len(t, plan.Peers, 2)
	assert.Equal(t, "dead-1", plan.Peers[0].InstanceID)
	assert.Equal(t, ops.PlanUnknown, plan.Peers[0].Action, "this resetter cannot do a dry run")
	assert.Equal(t, []int64{1, 2}, plan.Peers[0].Tracked.RowIDs)

	rep, err := ops.RecoverNow(ctx, w)
	require.Error(t, err)
	var pe *ops.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "dead-2", pe.InstanceID)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, ops.PeerRecovery{InstanceID: "dead-1", RowsFound: 2, RowsReset: 2}, rep.Recovered[0])
	require.Len(t, rep.Failed, 1)
	assert.Equal(t, int64(2), rep.RowsReset)

	require.NoError(t, w.Shutdown(ctx))
	_, err = ops.RecoverNow(ctx, w)
	assert.ErrorIs(t, err, recovery.ErrShutdown)
	_, err = ops.PlanRecovery(ctx, w)
	assert.ErrorIs(t, err, recovery.ErrShutdown)
	_, err = ops.RecoverNow(ctx, nil)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.PlanRecovery(ctx, nil)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
}

// TestFromEnvReadsThePrefixAndTheResetterConfiguration: the prefix from
// RECOVERY_KEY_PREFIX, else the default; the resetter's variables through
// postgres.ConfigFromEnv, whose errors name the variable.
func TestFromEnvReadsThePrefixAndTheResetterConfiguration(t *testing.T) {
	env := map[string]string{ops.EnvKeyPrefix: "JOBS", postgres.EnvTable: "jobs", postgres.EnvMaxRecoveries: "3"}
	e, err := ops.FromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	assert.Equal(t, "JOBS", e.KeyPrefix)
	assert.Equal(t, "jobs", e.Postgres.Table)
	assert.Equal(t, 3, e.Postgres.MaxRecoveries)

	e, err = ops.FromEnv(func(string) string { return "" })
	require.NoError(t, err)
	assert.Equal(t, ops.DefaultKeyPrefix, e.KeyPrefix)
	assert.Equal(t, postgres.Config{}.Table, e.Postgres.Table)

	_, err = ops.FromEnv(func(k string) string {
		if k == postgres.EnvMaxRecoveries {
			return "three"
		}
		return ""
	})
	require.ErrorIs(t, err, recovery.ErrInvalidConfig)
	assert.Contains(t, err.Error(), postgres.EnvMaxRecoveries)
}

// TestRecoverNowKeepingAndSweepNow: RecoverNowKeeping leaves the dead
// peers it is told to keep registered and untouched, and recovers the
// others; SweepNow says why it cannot sweep with a resetter that cannot
// list the rows in progress, and both refuse a shut-down or nil Worker.
func TestRecoverNowKeepingAndSweepNow(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := fleet(t)
	for _, peer := range []string{"dead-1", "dead-2"} {
		require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), peer).Err())
	}
	w, err := recovery.New(rdb, failing{}, recovery.WithKeyPrefix(prefix), recovery.WithInstanceID("ctl"),
		recovery.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)

	rep, err := ops.RecoverNowKeeping(ctx, w, []string{"dead-2"})
	require.NoError(t, err)
	assert.Equal(t, []string{"dead-2"}, rep.Skipped)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, "dead-1", rep.Recovered[0].InstanceID)
	reg, err := rdb.SMembers(ctx, store.RegistryKey(prefix)).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"dead-2"}, reg, "the kept peer stays registered")
	rep, err = ops.RecoverNow(ctx, w)
	require.NoError(t, err)
	assert.Len(t, rep.Recovered, 1, "a later scan keeps nothing")

	sw, err := ops.SweepNow(ctx, w, false)
	require.NoError(t, err)
	assert.False(t, sw.Swept)
	assert.Contains(t, sw.Why, "cannot list the rows in progress")

	require.NoError(t, w.Shutdown(ctx))
	_, err = ops.SweepNow(ctx, w, true)
	assert.ErrorIs(t, err, recovery.ErrShutdown)
	_, err = ops.SweepNow(ctx, nil, true)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
	_, err = ops.RecoverNowKeeping(ctx, nil, nil)
	assert.ErrorIs(t, err, recovery.ErrInvalidConfig)
}
