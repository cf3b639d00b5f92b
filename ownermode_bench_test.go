package recovery

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// ownerFake is a fakeResetter that resets by owner, as a pgxreset.Resetter
// WithOwnerColumn does: a Worker given one runs in owner mode.
type ownerFake struct{ fakeResetter }

func (*ownerFake) Info() ResetterInfo {
	return ResetterInfo{Name: "ownerFake", OwnerFencing: true, ListsInProgress: true, InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (f *ownerFake) Check(context.Context, bool) (ResetterInfo, error) { return f.Info(), nil }

func (*ownerFake) InProgressOwners(context.Context) ([]string, error) { return nil, nil }

// ResetOwner resets nothing; by row IDs it is the fakeResetter's.
func (*ownerFake) ResetOwner(context.Context, OwnerReset) (ResetResult, error) {
	return ResetResult{}, nil
}

// BenchmarkHostLoopOwnerMode: the host loop of BenchmarkHostLoop (blocks
// of 10, 1 ms a row, synchronous Untrack) in owner mode, against the same
// loop without the library. Target: ratio ≥ 0.99 of the plain loop's
// throughput, that is lib-ns/op ≤ 1.01 × plain-ns/op.
func BenchmarkHostLoopOwnerMode(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	w, err := New(rdb, &ownerFake{}, WithKeyPrefix(testutil.Name("B")), WithLogger(discardLogger))
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Shutdown(context.Background()) })
	if !w.Stats().OwnerMode {
		b.Fatal("not in owner mode")
	}
	pairedHostLoop(b, w)
}

// commandCalls returns the total calls of every command but INFO from INFO
// commandstats.
func commandCalls(t testing.TB, rdb redis.UniversalClient) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(t, err)
		if name != "cmdstat_info" { // our own reading
			out[strings.TrimPrefix(name, "cmdstat_")] = n
		}
	}
	return out
}

// Owner mode's target: 0 Redis commands per processed row, read from the
// server's own INFO commandstats over 10,000 rows.
func TestOwnerModeSendsNoRedisCommandPerRow(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t) // a server of its own: no other test's commands
	rdb := srv.Client(t)
	ctx := context.Background()
	// The liveness witness's background commands (its pings, a look at
	// the witness turns every grace) are no row's; its cost test,
	// TestWitnessCostPerWorkerIsBounded, counts them. Here it is off.
	w, _ := startWorker(t, rdb, &ownerFake{}, "w", WithLivenessWitness(false), WithTimings(Timings{
		HeartbeatTTL:      time.Hour,
		HeartbeatInterval: time.Hour / 2,
		RowsTTL:           4 * time.Hour,
		RecoveryInterval:  time.Hour,
	}))
	require.True(t, w.Stats().OwnerMode)
	// Let the first scan and sweep (run at Start) finish.
	signals(w).scan.WaitOrTimeout(t)
	signals(w).sweep.WaitOrTimeout(t)
	before := commandCalls(t, rdb)

	for block := range 1000 {
		ids := make([]int64, 10)
		for i := range ids {
			ids[i] = int64(block*10 + i + 1)
		}
		require.NoError(t, w.Track(ctx, ids...))
		for _, id := range ids {
			require.NoError(t, w.Untrack(id))
		}
	}

	after := commandCalls(t, rdb)
	sent := int64(0)
	for cmd, n := range after {
		sent += n - before[cmd]
	}
	assert.Zero(t, sent, "commands sent while 10,000 rows were processed: before %v, after %v", before, after)
	assert.Zero(t, w.Stats().TrackedRows)
}

// BenchmarkRecoverDeadPeer100000: the whole dead-peer path (claim, reset,
// finish, deregister) for a peer that held 100,000 rows, in owner mode
// (reset by owner) against rows-set mode (read the set, reset by ID), on
// real Redis and PostgreSQL, each at the default chunk size, with the
// partial index docs/integration.md's migration creates. Reports both
// times and owner/rows-set.
func BenchmarkRecoverDeadPeer100000(b *testing.B) {
	rdb := testutil.Redis(b)
	db := testutil.Postgres(b)
	testutil.CreateBatch(b, db, 100000)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE INDEX batchrows_inprog_owner ON batchrows (owner, rowid) WHERE status = 'inprog'`); err != nil {
		b.Fatal(err)
	}
	r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	if err != nil {
		b.Fatal(err)
	}
	prefix := testutil.Name("B")
	owner, err := New(rdb, r, WithKeyPrefix(prefix), WithLogger(discardLogger), WithInstanceID("owner-mode"))
	if err != nil {
		b.Fatal(err)
	}
	rows, err := New(rdb, r, WithKeyPrefix(prefix), WithLogger(discardLogger), WithInstanceID("rows-set-mode"), WithRowsSets())
	if err != nil {
		b.Fatal(err)
	}
	members := make([]any, 100000)
	for i := range members {
		members[i] = strconv.Itoa(i + 1)
	}
	die := func(withSet bool) {
		if _, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead'`); err != nil {
			b.Fatal(err)
		}
		k := store.InstanceKeys(prefix, "dead")
		pipe := rdb.Pipeline()
		pipe.Del(ctx, k.Rows, k.Claim, k.Incarnation)
		if withSet {
			pipe.SAdd(ctx, k.Rows, members...)
			pipe.Set(ctx, k.Incarnation, "i", 0)
		}
		pipe.SAdd(ctx, store.RegistryKey(prefix), "dead")
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	recoverWith := func(w *Worker) time.Duration {
		start := time.Now()
		pr, _, err := w.peers.recoverDead(ctx, "dead", foundByScan, start)
		took := time.Since(start)
		if err != nil || pr.RowsReset != 100000 {
			b.Fatalf("%s: reset %d: %v", w.InstanceID(), pr.RowsReset, err)
		}
		return took
	}
	var tOwner, tRows time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		die(false)
		b.StartTimer()
		tOwner += recoverWith(owner)
		b.StopTimer()
		die(true)
		b.StartTimer()
		tRows += recoverWith(rows)
	}
	b.StopTimer()
	b.ReportMetric(float64(tOwner.Nanoseconds())/float64(b.N), "owner-ns/op")
	b.ReportMetric(float64(tRows.Nanoseconds())/float64(b.N), "rowsset-ns/op")
	b.ReportMetric(float64(tOwner)/float64(tRows), "ratio")
}
