package recovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// BenchmarkWitnessIdleFleetCost measures what the liveness witness costs a
// Redis server with a fleet of idle workers at the default timings: the
// fleet runs on a redis-server of its own, once without the witness and
// once with it, and each window of 5 seconds is read from INFO (commands
// of every kind, INFO included but for this benchmark's own readings;
// the server's CPU; its clients), and a third time with the witness while
// every worker processes 100 rows a second (Track, CheckLease, Untrack,
// one row at a time). Reported per worker: the commands a second and the
// connections the witness adds, and the commands processing adds; for
// the server: the CPU the witness adds, in milliseconds a second.
// docs/performance.md quotes it for 1,000 workers:
//
//	go test -run '^$' -bench 'BenchmarkWitnessIdleFleetCost' -benchtime 1x .
func BenchmarkWitnessIdleFleetCost(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			srv := testutil.StartRedis(b)
			rdb := srv.Client(b)
			db := testutil.Postgres(b)
			testutil.CreateBatch(b, db, 1)
			r := fencedResetter(b, db)
			var off, on, busy fleetWindow
			for range b.N {
				off = idleFleetWindow(b, rdb, r, n, false, false)
				on = idleFleetWindow(b, rdb, r, n, true, false)
				busy = idleFleetWindow(b, rdb, r, n, true, true)
			}
			b.ReportMetric((busy.commands-on.commands)/float64(n), "busy-cmds/s/worker")
			b.ReportMetric((on.commands-off.commands)/float64(n), "cmds/s/worker")
			b.ReportMetric(on.commands, "cmds/s")
			b.ReportMetric(off.commands, "cmds/s-without")
			b.ReportMetric(1000*(on.cpu-off.cpu), "redis-cpu-ms/s")
			b.ReportMetric(float64(on.clients-off.clients)/float64(n), "conns/worker")
		})
	}
}

// fleetWindow is what a Redis server did in a second, on average over a
// window, and the clients connected at its end.
type fleetWindow struct {
	commands, cpu float64
	clients       int64
}

// idleFleetWindow starts n workers at the default timings under a prefix
// of their own, lets them settle, reads a window of 5 seconds and shuts
// them down. With busy, each processes 100 rows a second meanwhile.
func idleFleetWindow(b *testing.B, rdb *redis.Client, r Resetter, n int, witness, busy bool) fleetWindow {
	b.Helper()
	ctx := context.Background()
	prefix := testutil.Name("WC")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ws := make([]*Worker, 0, n)
	defer func() {
		for _, w := range ws {
			_ = w.Shutdown(ctx)
		}
	}()
	for i := range n {
		w, err := New(rdb, r, WithInstanceID(fmt.Sprintf("w%d", i)), WithKeyPrefix(prefix),
			WithLogger(log), WithLivenessWitness(witness))
		require.NoError(b, err)
		require.NoError(b, w.Start(ctx))
		ws = append(ws, w)
	}
	stop := make(chan struct{})
	var hosts sync.WaitGroup
	defer hosts.Wait()
	defer close(stop)
	if busy {
		for i, w := range ws {
			hosts.Go(func() { processRows(b, w, int64(i)*1_000_000, stop) })
		}
	}
	time.Sleep(3 * time.Second) // real time: the turns settle
	const window = 5 * time.Second
	before := redisInfoTotals(b, rdb)
	time.Sleep(window) // real time: the window measured
	after := redisInfoTotals(b, rdb)
	secs := window.Seconds()
	per := make([]string, 0, len(after.calls))
	for cmd, c := range after.calls {
		if d := c - before.calls[cmd]; d > 0 {
			per = append(per, fmt.Sprintf("%s %.0f", cmd, float64(d)/secs))
		}
	}
	slices.Sort(per)
	b.Logf("%d workers, witness %v, busy %v: commands a second: %s", n, witness, busy, strings.Join(per, ", "))
	return fleetWindow{
		// one INFO of ours falls inside the window
		commands: float64(after.commands-before.commands-1) / secs,
		cpu:      (after.cpu - before.cpu) / secs,
		clients:  after.clients,
	}
}

// processRows is a host taking, checking and finishing one row every
// 10 ms (IDs from base up; no row is in the table: each is untracked
// long before the self-check would look at it) until stop closes.
func processRows(b *testing.B, w *Worker, base int64, stop <-chan struct{}) {
	t := time.NewTicker(10 * time.Millisecond) // pace: 100 rows a second
	defer t.Stop()
	ctx := context.Background()
	for id := base; ; id++ {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := w.TrackAs(ctx, w.OwnerValue(), id); err != nil {
			b.Errorf("TrackAs: %v", err)
			return
		}
		if err := w.CheckLease(); err != nil {
			b.Errorf("CheckLease: %v", err)
			return
		}
		if err := w.Untrack(id); err != nil {
			b.Errorf("Untrack: %v", err)
			return
		}
	}
}

type infoTotals struct {
	calls             map[string]int64
	commands, clients int64
	cpu               float64
}

// redisInfoTotals reads, in one INFO, the calls of every command, the
// server's CPU seconds (user and system, main thread and children) and
// its connected clients.
func redisInfoTotals(b *testing.B, rdb *redis.Client) infoTotals {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats", "cpu", "clients").Result()
	require.NoError(b, err)
	t := infoTotals{calls: map[string]int64{}}
	for line := range strings.SplitSeq(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "cmdstat_"):
			calls, _, _ := strings.Cut(strings.TrimPrefix(value, "calls="), ",")
			c, err := strconv.ParseInt(calls, 10, 64)
			require.NoError(b, err, line)
			t.commands += c
			t.calls[strings.TrimPrefix(name, "cmdstat_")] = c
		case name == "used_cpu_user" || name == "used_cpu_sys":
			f, err := strconv.ParseFloat(value, 64)
			require.NoError(b, err, line)
			t.cpu += f
		case name == "connected_clients":
			c, err := strconv.ParseInt(value, 10, 64)
			require.NoError(b, err, line)
			t.clients = c
		}
	}
	return t
}
