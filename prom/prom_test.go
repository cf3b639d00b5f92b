package recoveryprom_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	recoveryprom "github.com/alya/recovery/prom"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestScrapeAfterARealRecovery kills a worker holding rows on a real Redis
// and PostgreSQL, lets a peer recover them, and scrapes the peer's metrics
// over HTTP from a real registry.
func TestScrapeAfterARealRecovery(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	ctx := context.Background()
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = 'dead-1' WHERE rowid IN (1, 2, 3)`)
	require.NoError(t, err)
	prefix := testutil.Name("P")
	require.NoError(t, rdb.SAdd(ctx, prefix+"_WORKER_REGISTRY", "dead-1").Err())
	require.NoError(t, rdb.SAdd(ctx, prefix+"_{dead-1}_ROWS", 1, 2, 3).Err())

	resetter, err := recovery.NewPgxResetter(db, recovery.WithOwnerColumn("owner"))
	require.NoError(t, err)
	c := recoveryprom.NewCollector()
	w, err := recovery.New(rdb, resetter, recovery.WithObserver(c), recovery.WithKeyPrefix(prefix),
		recovery.WithInstanceID("rec-1"), recovery.WithHeartbeatTTL(2*time.Second),
		recovery.WithHeartbeatInterval(500*time.Millisecond), recovery.WithRecoveryInterval(time.Second),
		recovery.WithRowsTTL(4*time.Second))
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
	} {
		assert.Contains(t, text, line)
	}
	assert.Regexp(t, regexp.MustCompile(`recovery_heartbeats_total\{instance_id="rec-1"\} [1-9]`), text)
	assert.Regexp(t, regexp.MustCompile(`recovery_scan_duration_seconds_count\{instance_id="rec-1"\} [1-9]`), text)
	for _, l := range strings.Split(text, "\n") {
		assert.NotContains(t, l, "dead-1", "no peer ID as a label")
	}
}

func TestDescribeListsEveryMetric(t *testing.T) {
	c := recoveryprom.NewCollector()
	ch := make(chan *prometheus.Desc, 32)
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
		"recovery_scan_duration_seconds", "recovery_registry_broken", "recovery_registry_wrong_type_total"} {
		assert.Contains(t, all, `"`+n+`"`)
	}
}

// noReset is a RowResetter for tests that never recover anything.
type noReset struct{}

func (noReset) ResetRows(context.Context, string, []int64) (int64, error) { return 0, nil }

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
	w, err := recovery.New(rdb, noReset{}, recovery.WithObserver(c), recovery.WithKeyPrefix(prefix),
		recovery.WithInstanceID("reg-1"), recovery.WithHeartbeatTTL(2*time.Second),
		recovery.WithHeartbeatInterval(100*time.Millisecond), recovery.WithRecoveryInterval(time.Second),
		recovery.WithRowsTTL(4*time.Second))
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
