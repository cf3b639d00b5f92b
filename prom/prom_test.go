package recoveryprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	recoveryprom "github.com/alya/recovery/prom"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestScrapeAfterARealRecovery kills a worker holding rows on a real Redis
// and PostgreSQL, lets a peer recover them, and scrapes the peer's metrics
// over HTTP from a real registry.
func TestScrapeAfterARealRecovery(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	prefix := testutil.DeadPeer(t, rdb, db, "dead-1", 3)
	ctx := context.Background()

	resetter, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	c := recoveryprom.NewCollector()
	w, err := recovery.New(rdb, resetter, recovery.WithObserver(c.Observe), recovery.WithKeyPrefix(prefix),
		recovery.WithInstanceID("rec-1"), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           4 * time.Second,
		}))
	require.NoError(t, err)
	c.Watch(w)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Track(ctx, 10, 11))
	require.Eventually(t, func() bool { return w.Stats().RowsRecovered == 3 }, 5*time.Second, 10*time.Millisecond)
	shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, w.Untrack(10))
	require.NoError(t, w.Shutdown(shutdownCtx)) // delivers the queued scan events

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	text := string(body)

	for _, line := range []string{
		`recovery_rows_recovered_total{instance_id="rec-1"} 3`,
		`recovery_peers_dead_total{instance_id="rec-1"} 1`,
		`recovery_rows_quarantined_total{instance_id="rec-1"} 0`,
		`recovery_errors_total{instance_id="rec-1"} 0`,
		`recovery_lease_lost_total{instance_id="rec-1"} 0`,
		`recovery_heartbeat_failures_total{instance_id="rec-1"} 0`,
		`recovery_tracked_rows{instance_id="rec-1"} 1`,
		`recovery_peers_recovered_total{instance_id="rec-1"} 1`,
		`recovery_rows_not_reset_total{instance_id="rec-1"} 0`,
		`recovery_events_dropped_total{instance_id="rec-1"} 0`,
		`recovery_history_dropped_total{instance_id="rec-1"} 0`,
		`recovery_latency_seconds_count{instance_id="rec-1"} 1`,
		`recovery_rows_stuck_seconds_count{instance_id="rec-1"} 1`,
		`recovery_rows_stuck_seconds_bucket{instance_id="rec-1",le="1"} 0`, // at least the 2s TTL
	} {
		assert.Contains(t, text, line)
	}
	stuck := regexp.MustCompile(`recovery_rows_stuck_seconds_sum\{instance_id="rec-1"\} (\S+)`).FindStringSubmatch(text)
	require.Len(t, stuck, 2, text)
	secs, err := strconv.ParseFloat(stuck[1], 64)
	require.NoError(t, err)
	assert.Equal(t, w.Stats().LastStuckFor.Seconds(), secs)
	assert.GreaterOrEqual(t, secs, 2.0, "the dead peer's key had expired: at least the TTL")
	assert.Regexp(t, regexp.MustCompile(`recovery_heartbeats_total\{instance_id="rec-1"\} [1-9]`), text)
	assert.Regexp(t, regexp.MustCompile(`recovery_scan_duration_seconds_count\{instance_id="rec-1"\} [1-9]`), text)
	assert.Regexp(t, regexp.MustCompile(`recovery_scans_total\{instance_id="rec-1"\} [1-9]`), text)
	for _, l := range strings.Split(text, "\n") {
		assert.NotContains(t, l, "dead-1", "no peer ID as a label")
	}
}

func TestDescribeListsEveryMetric(t *testing.T) {
	c := recoveryprom.NewCollector()
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	var names []string
	for d := range ch {
		names = append(names, d.String())
	}
	all := strings.Join(names, "\n")
	for _, n := range []string{"recovery_heartbeats_total", "recovery_heartbeat_failures_total",
		"recovery_lease_lost_total", "recovery_peers_dead_total", "recovery_rows_recovered_total",
		"recovery_rows_quarantined_total", "recovery_errors_total", "recovery_tracked_rows",
		"recovery_scan_duration_seconds", "recovery_registry_broken", "recovery_registry_wrong_type_total",
		"recovery_rows_not_reset_total", "recovery_peers_recovered_total", "recovery_scans_total",
		"recovery_events_dropped_total", "recovery_history_dropped_total", "recovery_latency_seconds",
		"recovery_rows_stuck_seconds", "recovery_oldest_row_age_seconds"} {
		assert.Contains(t, all, `"`+n+`"`)
	}
}

// TestScrapeShowsTheAgeOfTheOldestRowEachWorkerHolds: the gauge is how
// long the worker has held the oldest row it tracks now, 0 with none.
func TestScrapeShowsTheAgeOfTheOldestRowEachWorkerHolds(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	c := recoveryprom.NewCollector(recoveryprom.WithoutInstanceID()) // one series, as value reads it
	w, err := recovery.New(rdb, noReset{}, recovery.WithKeyPrefix(testutil.Name("P")), recovery.WithInstanceID("w-1"),
		recovery.WithTimings(recovery.Timings{HeartbeatTTL: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}))
	require.NoError(t, err)
	c.Watch(w)
	require.NoError(t, w.Start(ctx))
	defer func() { require.NoError(t, w.Shutdown(context.Background())) }()
	assert.Equal(t, 0.0, value(scrape(t, c), "recovery_oldest_row_age_seconds"), "no row held")

	tracked := time.Now()
	require.NoError(t, w.Track(ctx, 1))
	time.Sleep(1200 * time.Millisecond) // real time: the age is clock time
	require.NoError(t, w.Track(ctx, 2))
	age := value(scrape(t, c), "recovery_oldest_row_age_seconds")
	assert.GreaterOrEqual(t, age, 1.2, "row 1's age, not row 2's")
	assert.LessOrEqual(t, age, time.Since(tracked).Seconds()+1, "to the second")
	require.NoError(t, w.Untrack(1, 2))
	assert.Equal(t, 0.0, value(scrape(t, c), "recovery_oldest_row_age_seconds"))
}

// noReset is a Resetter for tests that never recover anything.
type noReset struct{}

func (noReset) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "noReset", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (noReset) Check(context.Context, bool) (recovery.ResetterInfo, error) {
	return recovery.ResetterInfo{Name: "noReset", InProgressStatus: "inprog", QueuedStatus: "queued"}, nil
}

func (noReset) ResetRows(context.Context, recovery.RowsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noReset) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noReset) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noReset) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noReset) InProgressOwners(context.Context) ([]string, error) { return nil, errors.ErrUnsupported }

func (noReset) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (noReset) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

// scrape returns the collector's metrics as the text format.
func scrape(t *testing.T, c *recoveryprom.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// TestScrapeShowsARegistryOfTheWrongType: a registry key that is not a set
// shows as recovery_registry_broken 1 (and WRONGTYPE replies counted) until
// it is deleted.
func TestScrapeShowsARegistryOfTheWrongType(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	prefix := testutil.Name("P")
	require.NoError(t, rdb.Set(ctx, prefix+"_WORKER_REGISTRY", "oops", 0).Err())
	c := recoveryprom.NewCollector()
	w, err := recovery.New(rdb, noReset{}, recovery.WithObserver(c.Observe), recovery.WithKeyPrefix(prefix),
		recovery.WithInstanceID("reg-1"), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           4 * time.Second,
		}))
	require.NoError(t, err)
	c.Watch(w)
	require.NoError(t, w.Start(ctx))
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		assert.NoError(t, w.Shutdown(shutdownCtx))
	}()

	text := scrape(t, c)
	assert.Contains(t, text, `recovery_registry_broken{instance_id="reg-1"} 1`)
	assert.Regexp(t, regexp.MustCompile(`recovery_registry_wrong_type_total\{instance_id="reg-1"\} [1-9]`), text)

	require.NoError(t, rdb.Del(ctx, prefix+"_WORKER_REGISTRY").Err())
	require.Eventually(t, func() bool {
		return strings.Contains(scrape(t, c), `recovery_registry_broken{instance_id="reg-1"} 0`)
	}, 5*time.Second, 20*time.Millisecond)
}

// TestLatencyHistogramRecordsEachRecoveredPeersDuration: every
// EventRowsRecovered adds its Duration to recovery_latency_seconds, in
// seconds; other events do not.
func TestLatencyHistogramRecordsEachRecoveredPeersDuration(t *testing.T) {
	c := recoveryprom.NewCollector()
	for _, e := range []recovery.Event{
		{Kind: recovery.EventRowsRecovered, InstanceID: "w-1", Duration: 1500 * time.Millisecond, StuckFor: 61500 * time.Millisecond},
		{Kind: recovery.EventRowsRecovered, InstanceID: "w-1", Duration: 40 * time.Second, StuckFor: 100 * time.Second},
		{Kind: recovery.EventRowsRecovered, InstanceID: "w-1", Duration: time.Second}, // no rows reset: nothing stuck
		{Kind: recovery.EventRowsNotReset, InstanceID: "w-1", Duration: time.Hour},
		{Kind: recovery.EventRecoveryFailed, InstanceID: "w-1", Duration: time.Hour},
		{Kind: recovery.EventScanFinished, InstanceID: "w-1", Duration: 2 * time.Millisecond},
	} {
		c.Observe(e)
	}
	text := scrape(t, c)
	for _, line := range []string{
		`recovery_latency_seconds_count{instance_id="w-1"} 3`,
		`recovery_latency_seconds_sum{instance_id="w-1"} 42.5`,
		`recovery_rows_stuck_seconds_count{instance_id="w-1"} 2`,
		`recovery_rows_stuck_seconds_sum{instance_id="w-1"} 161.5`,
		`recovery_rows_stuck_seconds_bucket{instance_id="w-1",le="60"} 0`,
		`recovery_rows_stuck_seconds_bucket{instance_id="w-1",le="90"} 1`,
		`recovery_rows_stuck_seconds_bucket{instance_id="w-1",le="120"} 2`,
		`recovery_latency_seconds_bucket{instance_id="w-1",le="0.5"} 0`,
		`recovery_latency_seconds_bucket{instance_id="w-1",le="2.5"} 2`,
		`recovery_latency_seconds_bucket{instance_id="w-1",le="30"} 2`,
		`recovery_latency_seconds_bucket{instance_id="w-1",le="60"} 3`,
		`recovery_latency_seconds_bucket{instance_id="w-1",le="600"} 3`,
		`recovery_scan_duration_seconds_count{instance_id="w-1"} 1`,
	} {
		assert.Contains(t, text, line)
	}
}

// seriesOf returns the series (name and labels, no value) of a scrape.
func seriesOf(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l[:strings.LastIndexByte(l, ' ')])
	}
	return out
}

// value returns the value of a series in a scrape, or -1.
func value(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimPrefix(l, series+" "), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// TestWithoutInstanceIDKeepsTheSameSeriesAcrossARestart: a worker replaced
// by one with a new default instance ID (a process restart, or a new
// Worker in the same process) continues the same series, summed over the
// watched workers, and no series names an instance.
func TestWithoutInstanceIDKeepsTheSameSeriesAcrossARestart(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	prefix := testutil.Name("P")
	c := recoveryprom.NewCollector(recoveryprom.WithoutInstanceID())
	start := func() *recovery.Worker {
		w, err := recovery.New(rdb, noReset{}, recovery.WithObserver(c.Observe), recovery.WithKeyPrefix(prefix),
			recovery.WithTimings(recovery.Timings{
				HeartbeatTTL:      2 * time.Second,
				HeartbeatInterval: 100 * time.Millisecond,
				RecoveryInterval:  200 * time.Millisecond,
				RowsTTL:           4 * time.Second,
			}))
		require.NoError(t, err)
		c.Watch(w)
		require.NoError(t, w.Start(ctx))
		require.Eventually(t, func() bool { return w.Stats().Scans > 0 }, 5*time.Second, 10*time.Millisecond)
		return w
	}
	stop := func(w *recovery.Worker) {
		shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, w.Shutdown(shutdownCtx))
	}

	first := start()
	require.NoError(t, first.Track(ctx, 1, 2))
	before := scrape(t, c)
	assert.Equal(t, 2.0, value(before, "recovery_tracked_rows"))
	require.NoError(t, first.Untrack(1, 2))
	stop(first)

	second := start()
	defer stop(second)
	require.NotEqual(t, first.InstanceID(), second.InstanceID())
	require.NoError(t, second.Track(ctx, 3, 4, 5))
	after := scrape(t, c)

	assert.NotContains(t, before+after, "instance_id")
	assert.Equal(t, seriesOf(before), seriesOf(after), "the same series after the restart")
	assert.Equal(t, 3.0, value(after, "recovery_tracked_rows"))
	assert.Greater(t, value(after, "recovery_heartbeats_total"), value(before, "recovery_heartbeats_total"),
		"counters continue from the first worker's")
	assert.Greater(t, value(after, "recovery_scans_total"), value(before, "recovery_scans_total"))
	assert.Equal(t, 0.0, value(after, "recovery_registry_broken"))
	require.NoError(t, second.Untrack(3, 4, 5))
}

// ExampleCollector_Observe feeds the collector's histograms and an
// observer of the host's own from one recovery.WithObserver.
func ExampleCollector_Observe() {
	c := recoveryprom.NewCollector()
	var recovered int
	mine := func(e recovery.Event) {
		if e.Kind == recovery.EventRowsRecovered {
			recovered++
		}
	}
	both := func(e recovery.Event) {
		c.Observe(e)
		mine(e)
	}
	// w, err := recovery.New(rdb, resetter, recovery.WithObserver(both))
	// c.Watch(w)
	both(recovery.Event{Kind: recovery.EventRowsRecovered, InstanceID: "w-1", Duration: 3 * time.Second})
	fmt.Println(recovered, promtestutil.CollectAndCount(c, "recovery_latency_seconds"))
	// Output: 1 1
}
