package recovery

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Benchmarks against a real redis-server and PostgreSQL, started as the
// tests start them. Each comparison runs the library and its baseline
// alternately in one loop and reports both times and their ratio, so a
// noisy machine slows both alike. Run with `make bench`; the figures are in
// docs/performance.md.

// paired runs lib and base alternately b.N times and reports their mean
// times and lib/base.
func paired(b *testing.B, baseName string, lib, base func()) {
	b.Helper()
	var tl, tb time.Duration
	b.ResetTimer()
	for range b.N {
		s := time.Now()
		lib()
		tl += time.Since(s)
		s = time.Now()
		base()
		tb += time.Since(s)
	}
	b.StopTimer()
	b.ReportMetric(float64(tl.Nanoseconds())/float64(b.N), "lib-ns/op")
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), baseName+"-ns/op")
	b.ReportMetric(float64(tl)/float64(tb), "ratio")
}

// benchWorker is a started Worker with default timings on a fresh prefix.
func benchWorker(b *testing.B, rdb redis.UniversalClient, opts ...Option) *Worker {
	b.Helper()
	w, err := New(rdb, &fakeResetter{}, append([]Option{WithKeyPrefix(testutil.Name("B")),
		WithLogger(discardLogger), WithScanTurn(false)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Shutdown(context.Background()) })
	return w
}

// floorTrack is the physical floor of Track: SADD and PEXPIRE pipelined.
func floorTrack(ctx context.Context, rdb redis.UniversalClient, key string, ids []any) {
	pipe := rdb.Pipeline()
	pipe.SAdd(ctx, key, ids...)
	pipe.PExpire(ctx, key, defaultRowsTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		panic(err)
	}
}

// naiveTrack is the design written by hand: one command per call.
func naiveTrack(ctx context.Context, rdb redis.UniversalClient, key string, ids []any) {
	for _, id := range ids {
		if err := rdb.SAdd(ctx, key, id).Err(); err != nil {
			panic(err)
		}
	}
	if err := rdb.Expire(ctx, key, defaultRowsTTL).Err(); err != nil {
		panic(err)
	}
}

func srem(ctx context.Context, rdb redis.UniversalClient, key string, ids ...any) {
	if err := rdb.SRem(ctx, key, ids...).Err(); err != nil {
		panic(err)
	}
}

// BenchmarkTrackUntrackOneRow: Track + Untrack of one row against the
// floor (pipelined SADD+PEXPIRE, then SREM: two round trips) and against
// the naive version (SADD, EXPIRE, SREM: three).
func BenchmarkTrackUntrackOneRow(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	w := benchWorker(b, rdb)
	key := store.InstanceKeys("BENCH", "floor").Rows
	id := []any{"42"}
	lib := func() {
		if err := w.Track(ctx, 42); err != nil {
			panic(err)
		}
		if err := w.Untrack(42); err != nil {
			panic(err)
		}
	}
	b.Run("library", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			lib()
		}
	})
	b.Run("vs-floor", func(b *testing.B) {
		paired(b, "floor", lib, func() { floorTrack(ctx, rdb, key, id); srem(ctx, rdb, key, id...) })
	})
	b.Run("vs-naive", func(b *testing.B) {
		paired(b, "naive", lib, func() { naiveTrack(ctx, rdb, key, id); srem(ctx, rdb, key, id...) })
	})
}

// BenchmarkTrackBlockOf100: Track of a 100-row block (one round trip; the
// count is asserted in TestTrackAddsRowsAndRefreshesTTLInOneRoundTrip).
func BenchmarkTrackBlockOf100(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	w := benchWorker(b, rdb)
	ids := make([]int64, 100)
	args := make([]any, 100)
	for i := range ids {
		ids[i] = int64(i)
		args[i] = strconv.Itoa(i)
	}
	key := store.InstanceKeys("BENCH", "floor").Rows
	lib := func() {
		if err := w.Track(ctx, ids...); err != nil {
			panic(err)
		}
	}
	b.Run("library", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			lib()
		}
	})
	b.Run("vs-floor", func(b *testing.B) { paired(b, "floor", lib, func() { floorTrack(ctx, rdb, key, args) }) })
	b.Run("vs-naive", func(b *testing.B) { paired(b, "naive", lib, func() { naiveTrack(ctx, rdb, key, args) }) })
}

// BenchmarkHostLoop: a host batch loop (block of 10 rows, 1 ms of work a
// row) with the library (Track the block, Untrack each row) against the
// same loop without it, with synchronous Untrack (the default) and with
// WithDeferredUntrack. The ratio is lib time / plain time; throughput is
// its inverse.
func BenchmarkHostLoop(b *testing.B) {
	rdb := testutil.Redis(b)
	for _, mode := range []struct {
		name string
		opts []Option
	}{
		{"untrack=sync", nil},
		{"untrack=deferred", []Option{WithDeferredUntrack(20 * time.Millisecond)}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			pairedHostLoop(b, benchWorker(b, rdb, mode.opts...))
		})
	}
}

// pairedHostLoop runs the host loop (blocks of 10, 1 ms a row; Track the
// block, Untrack each row) with w against the same loop without it.
func pairedHostLoop(b *testing.B, w *Worker) {
	ctx := context.Background()
	block := make([]int64, 10)
	next := int64(0)
	work := func() { time.Sleep(time.Millisecond) } // pace: 1 ms of the host's work on a row
	withLib := func() {
		for i := range block {
			next++
			block[i] = next
		}
		if err := w.Track(ctx, block...); err != nil {
			panic(err)
		}
		for _, id := range block {
			work()
			if err := w.Untrack(id); err != nil {
				panic(err)
			}
		}
	}
	plain := func() {
		for range block {
			work()
		}
	}
	paired(b, "plain", withLib, plain)
}

// naiveScan is the design's scan written by hand: SMEMBERS, then one
// EXISTS per peer in sequence.
func naiveScan(ctx context.Context, rdb redis.UniversalClient, prefix string) int {
	peers, err := rdb.SMembers(ctx, store.RegistryKey(prefix)).Result()
	if err != nil {
		panic(err)
	}
	dead := 0
	for _, p := range peers {
		n, err := rdb.Exists(ctx, store.InstanceKeys(prefix, p).Heartbeat).Result()
		if err != nil {
			panic(err)
		}
		if n == 0 {
			dead++
		}
	}
	return dead
}

// BenchmarkScan10000LivePeers: one recovery scan over a registry of 10,000
// live peers (two round trips, asserted in
// TestScanOfTenThousandLivePeersTakesTwoRoundTrips) against the naive scan.
func BenchmarkScan10000LivePeers(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	w := benchWorker(b, rdb)
	plantLivePeers(b, rdb, w.opts.keyPrefix, 10000)
	lib := func() {
		if _, err := w.recoverNow(ctx); err != nil {
			panic(err)
		}
	}
	b.Run("library", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			lib()
		}
	})
	b.Run("vs-naive", func(b *testing.B) { paired(b, "naive", lib, func() { naiveScan(ctx, rdb, w.opts.keyPrefix) }) })
}

// BenchmarkScan10000PeersWith100Dead: 10,000 registered peers of which
// 100 are dead with 100 rows each, reset by a resetter that returns at once
// (the Redis side of recovery; PostgreSQL is BenchmarkResetRows100000).
func BenchmarkScan10000PeersWith100Dead(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	w := benchWorker(b, rdb)
	prefix := w.opts.keyPrefix
	plantLivePeers(b, rdb, prefix, 9900)
	rows := make([]any, 100)
	for i := range rows {
		rows[i] = strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		pipe := rdb.Pipeline()
		for d := range 100 {
			id := "dead-" + strconv.Itoa(d)
			pipe.SAdd(ctx, store.RegistryKey(prefix), id)
			pipe.SAdd(ctx, store.InstanceKeys(prefix, id).Rows, rows...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rep, err := w.recoverNow(ctx)
		if err != nil || len(rep.Recovered) != 100 {
			b.Fatalf("recovered %d peers: %v", len(rep.Recovered), err)
		}
	}
}

// BenchmarkResetRows100000 resets 100,000 rows of one dead peer in
// PostgreSQL, for a range of chunk sizes (the curve behind
// postgres.DefaultChunkSize).
func BenchmarkResetRows100000(b *testing.B) {
	db := testutil.Postgres(b)
	testutil.CreateBatch(b, db, 100000)
	ctx := context.Background()
	ids := make([]int64, 100000)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	for _, chunk := range []int{500, 1000, 2000, 5000, 10000, 20000, 100000} {
		b.Run(fmt.Sprintf("chunk=%d", chunk), func(b *testing.B) {
			r, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"), postgres.WithChunkSize(chunk))
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				b.StopTimer()
				if _, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead'`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				n, err := resetRows(r, ctx, "dead", ids)
				if err != nil || n != 100000 {
					b.Fatalf("reset %d: %v", n, err)
				}
			}
		})
	}
}

// BenchmarkResetRows100000Modes: the same reset at the default chunk size,
// with owner fencing (the baseline), with the reset ledger (no owner
// column: every changed row is also recorded) and without either.
func BenchmarkResetRows100000Modes(b *testing.B) {
	db := testutil.Postgres(b)
	testutil.CreateBatch(b, db, 100000)
	ctx := context.Background()
	ids := make([]int64, 100000)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	modes := []struct {
		name string
		opts []postgres.Option
	}{
		{"owner", []postgres.Option{postgres.WithOwnerColumn("owner")}},
		{"ledger", nil},
		{"none", []postgres.Option{postgres.WithoutResetLedger()}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			r, err := pgxreset.New(db, m.opts...)
			if err != nil {
				b.Fatal(err)
			}
			for i := range b.N {
				b.StopTimer()
				if _, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead'; TRUNCATE recovery_ledger`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				res, err := r.ResetRows(ctx, RowsReset{InstanceID: "dead", Incarnation: fmt.Sprint(i), RowIDs: ids})
				if err != nil || res.Changed != 100000 {
					b.Fatalf("reset %d: %v", res.Changed, err)
				}
			}
		})
	}
}

// BenchmarkResetThroughput: rows reset per second by one reset of a dead
// peer's block under the default reset timeout, as recovery runs it, for
// blocks of 1,000, 10,000 and 100,000 rows, on a plain table and under an
// ordinary audit trigger (AFTER UPDATE, one INSERT a row), in owner mode
// (by owner) and rows-set mode (by IDs read from a rows set, with the
// reset ledger). Each
// reset commits chunk by chunk (a fresh resetter: its first chunk is the
// probe). x_1000_plain is the rate against the same mode's 1,000-row
// plain block in the same run.
func BenchmarkResetThroughput(b *testing.B) {
	const most = 100000
	db := testutil.Postgres(b)
	testutil.CreateBatch(b, db, most)
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		opts []postgres.Option
	}{
		{"owner", []postgres.Option{postgres.WithOwnerColumn("owner")}},
		{"rows_set", nil},
	} {
		var base float64 // rows/s of the 1,000-row plain block
		for _, trigger := range []bool{false, true} {
			if trigger {
				pgtest.AuditTrigger(b, db, 0)
			}
			for _, n := range []int{1000, 10000, most} {
				name := fmt.Sprintf("%s/rows=%d/trigger=%t", mode.name, n, trigger)
				b.Run(name, func(b *testing.B) {
					ids := make([]int64, n)
					for i := range ids {
						ids[i] = int64(i + 1)
					}
					var elapsed time.Duration
					for i := range b.N {
						b.StopTimer()
						r, err := pgxreset.New(db, mode.opts...)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead' WHERE rowid <= $1 AND status <> 'inprog'`, n); err != nil {
							b.Fatal(err)
						}
						if _, err := db.Exec(ctx, `TRUNCATE recovery_ledger`); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						start := time.Now()
						resetCtx, cancel := context.WithTimeout(ctx, defaultResetTimeout)
						var res ResetResult
						if mode.opts == nil {
							res, err = r.ResetRows(resetCtx, RowsReset{InstanceID: "dead", Incarnation: fmt.Sprint(i), RowIDs: ids, FromRowsSet: true})
						} else {
							res, err = r.ResetOwner(resetCtx, OwnerReset{Owner: "dead"})
						}
						cancel()
						elapsed += time.Since(start)
						if err != nil || res.Changed != int64(n) {
							b.Fatalf("reset %d of %d rows: %v", res.Changed, n, err)
						}
					}
					rate := float64(n) * float64(b.N) / elapsed.Seconds()
					if n == 1000 && !trigger {
						base = rate
					}
					b.ReportMetric(rate, "rows/s")
					b.ReportMetric(rate/base, "x_1000_plain")
				})
			}
		}
		if _, err := db.Exec(ctx, `DROP TRIGGER batchrows_audit ON batchrows; DROP TABLE batchrows_audit; DROP FUNCTION batchrows_audit()`); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeatWith100000TrackedRows: one heartbeat of a worker that
// tracks 100,000 rows; allocs/op are those of the one command that writes
// them back.
func BenchmarkHeartbeatWith100000TrackedRows(b *testing.B) {
	rdb := testutil.Redis(b)
	w := benchWorker(b, rdb)
	ids := make([]int64, 100000)
	for i := range ids {
		ids[i] = int64(i)
	}
	w.rows.add(ids)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := w.heart.runOnce(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100000, "ns/row")
}

// BenchmarkInflightBytesPerRow measures the worker's memory per tracked row.
func BenchmarkInflightBytesPerRow(b *testing.B) {
	const n = 100000
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i)
	}
	var total float64
	for range b.N {
		var s inflight
		s.init()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s.add(ids)
		runtime.GC()
		runtime.ReadMemStats(&after)
		total += float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(&s)
	}
	b.ReportMetric(total/float64(b.N), "B/row")
}

// BenchmarkFreshDeathAmongDeadEntries: how long a scan takes to reach the
// reset of one fresh death (a rows set of 5 rows) when n dead registry
// entries without a heartbeat (a zone outage) are registered too, for n of
// 1, 1,000, 10,000 and 100,000, with a resetter that returns at once.
// Each sub-benchmark reports fresh-ns/op (scan start to the fresh peer's
// reset), scan-ns/op (the whole scan, bulk removal of the entries
// included) and ratio, fresh-ns/op against the n=1 run before it.
func BenchmarkFreshDeathAmongDeadEntries(b *testing.B) {
	rdb := testutil.Redis(b)
	ctx := context.Background()
	var resetAt time.Time
	r := &fakeResetter{before: func(peer string) {
		if strings.HasPrefix(peer, "fresh-") {
			resetAt = time.Now()
		}
	}}
	var base float64
	for _, n := range []int{1, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("dead=%d", n), func(b *testing.B) {
			// Not started: its own scans would race the measured one.
			prefix := testutil.Name("B")
			w, err := New(rdb, r, WithKeyPrefix(prefix), WithLogger(discardLogger))
			if err != nil {
				b.Fatal(err)
			}
			var tf, ts time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				plantMassDeath(b, rdb, prefix, n, 0)
				id := "fresh-" + strconv.Itoa(i) // a finished recovery leaves a tombstone claim
				fresh := store.InstanceKeys(prefix, id)
				if err := rdb.SAdd(ctx, store.RegistryKey(prefix), id).Err(); err != nil {
					b.Fatal(err)
				}
				if err := rdb.SAdd(ctx, fresh.Rows, 1, 2, 3, 4, 5).Err(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				rep, err := w.recoverNow(ctx)
				ts += time.Since(start)
				tf += resetAt.Sub(start)
				if err != nil || rep.RowsReset != 5 {
					b.Fatalf("reset %d rows: %v", rep.RowsReset, err)
				}
			}
			b.StopTimer()
			fns := float64(tf.Nanoseconds()) / float64(b.N)
			b.ReportMetric(fns, "fresh-ns/op")
			b.ReportMetric(float64(ts.Nanoseconds())/float64(b.N), "scan-ns/op")
			if n == 1 {
				base = fns
			}
			if base > 0 {
				b.ReportMetric(fns/base, "ratio")
			}
		})
	}
}
