package recoveryprom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	recoveryprom "github.com/alya/recovery/prom"
)

// seriesMinutes is how many one-minute samples each input series of the
// promtool tests holds, and alertsEvalTime when the alerts are checked:
// long enough for every rule's range and `for` (at most 10m + 15m).
const (
	seriesMinutes  = 40
	alertsEvalTime = 35 * time.Minute
)

// TestAlertRulesFireOnFailingRecoveriesAndStaySilentOnAHealthyFleet runs
// three fleets on a real Redis and PostgreSQL: one whose recoverer has a
// misspelt in-progress status (the dead worker's rows are never reset),
// one whose recoverer's table does not exist (every reset fails), and a
// healthy one where workers die and are recovered. It scrapes each fleet's
// collector over HTTP three times, turns the samples into promtool input
// series (the real samples, then the observed growth repeated minute after
// minute), and runs `promtool test rules` against alerts.yml: the failing
// fleets fire RecoveryDeadWorkerNotRecovered and RecoveryErrorsRising
// (plus RecoveryRowsNotReset for the misspelt status), the healthy fleet
// fires nothing.
func TestAlertRulesFireOnFailingRecoveriesAndStaySilentOnAHealthyFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testutil.Unavailable(t, "promtool not on PATH (Debian package prometheus; scripts/install-deps.sh installs it)")
	}
	rules, err := filepath.Abs("alerts.yml")
	require.NoError(t, err)
	ruleList := readAlertRules(t, rules)
	rdb := testutil.Redis(t)

	misspelt := scrapeFailingFleet(t, rdb, "misspelt",
		[]postgres.Option{postgres.WithStatuses("in_progress", "queued")})
	require.Greater(t, last(misspelt, "recovery_rows_not_reset_total"), 0.0, "the misspelt status left rows not reset")
	// Rows-set mode: in owner mode a fixed instance ID's Start resets the
	// rows a predecessor left, which a missing table makes fail at Start.
	missing := scrapeFailingFleet(t, rdb, "missing",
		[]postgres.Option{postgres.WithTable("batchrows_gone")}, recovery.WithoutSchemaCheck(), recovery.WithRowsSets())
	require.Zero(t, last(missing, "recovery_rows_not_reset_total"), "a failed reset is an error, not rows not reset")
	healthy := scrapeHealthyFleet(t, rdb)

	always := []string{"RecoveryDeadWorkerNotRecovered", "RecoveryErrorsRising"}
	file := promtoolFile{
		RuleFiles:          []string{rules},
		EvaluationInterval: "1m",
		Tests: []promtoolTest{
			fleetTest("misspelt in-progress status", misspelt, ruleList,
				append([]string{"RecoveryRowsNotReset"}, always...)),
			fleetTest("table missing", missing, ruleList, always),
			fleetTest("healthy fleet", healthy, ruleList, nil),
		},
	}
	// RecoveryDeadWorkerNotRecovered waits 10 minutes: not yet at 5m.
	file.Tests[0].AlertRuleTests = append(file.Tests[0].AlertRuleTests,
		alertTest{EvalTime: "5m", Alertname: "RecoveryDeadWorkerNotRecovered", ExpAlerts: []expAlert{}})

	out, err := yaml.Marshal(file)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "alerts_test.yml")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	res, err := exec.Command(promtool, "test", "rules", path).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s\ntest file:\n%s", res, out)
	t.Logf("promtool test rules: %s", strings.TrimSpace(string(res)))
}

// alertRule is one rule of alerts.yml, as far as the tests need it.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// readAlertRules returns the alerting rules of a rules file.
func readAlertRules(t *testing.T, path string) []alertRule {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	var rules []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				rules = append(rules, r)
			}
		}
	}
	require.NotEmpty(t, rules)
	return rules
}

// The promtool unit-test file format.
type promtoolFile struct {
	RuleFiles          []string       `yaml:"rule_files"`
	EvaluationInterval string         `yaml:"evaluation_interval"`
	Tests              []promtoolTest `yaml:"tests"`
}

type promtoolTest struct {
	Name           string        `yaml:"name"`
	Interval       string        `yaml:"interval"`
	InputSeries    []inputSeries `yaml:"input_series"`
	AlertRuleTests []alertTest   `yaml:"alert_rule_test"`
}

type inputSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type alertTest struct {
	EvalTime  string     `yaml:"eval_time"`
	Alertname string     `yaml:"alertname"`
	ExpAlerts []expAlert `yaml:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels"`
	ExpAnnotations map[string]string `yaml:"exp_annotations"`
}

// fleetTest is a promtool test over a fleet's scrapes that expects the
// rules named in firing to fire (with the labels and annotations
// alerts.yml gives them; each expression sums away every series label)
// and every other rule of alerts.yml to stay silent.
func fleetTest(name string, scrapes []scraped, rules []alertRule, firing []string) promtoolTest {
	pt := promtoolTest{Name: name, Interval: "1m", InputSeries: inputSeriesOf(scrapes)}
	for _, r := range rules {
		at := alertTest{EvalTime: alertsEvalTime.String(), Alertname: r.Alert, ExpAlerts: []expAlert{}}
		if slices.Contains(firing, r.Alert) {
			at.ExpAlerts = []expAlert{{ExpLabels: r.Labels, ExpAnnotations: r.Annotations}}
		}
		pt.AlertRuleTests = append(pt.AlertRuleTests, at)
	}
	return pt
}

// scraped is the samples of one scrape, by series ("name{labels}"), and
// which of them are counters.
type scraped struct {
	values  map[string]float64
	counter map[string]bool
}

// last returns the value of an unlabelled-name series summed over its
// labels, in the last scrape.
func last(scrapes []scraped, name string) float64 {
	var v float64
	for s, x := range scrapes[len(scrapes)-1].values {
		if s == name || strings.HasPrefix(s, name+"{") {
			v += x
		}
	}
	return v
}

// inputSeriesOf turns scrapes into promtool input series, one sample a
// minute for seriesMinutes minutes: the scraped samples first, then, for
// counters, the observed growth between successive scrapes repeated in
// turn; for gauges, the observed values in turn. Series absent from a
// scrape (a histogram before its first observation) count as 0 there.
func inputSeriesOf(scrapes []scraped) []inputSeries {
	names := map[string]bool{}
	for _, s := range scrapes {
		for n := range s.values {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var out []inputSeries
	for _, n := range sorted {
		counter := false
		observed := make([]float64, len(scrapes))
		for i, s := range scrapes {
			observed[i] = s.values[n]
			counter = counter || s.counter[n]
		}
		vals := append([]float64(nil), observed...)
		for m := len(observed); m < seriesMinutes; m++ {
			k := (m - len(observed)) % (len(observed) - 1)
			if counter {
				vals = append(vals, vals[m-1]+observed[k+1]-observed[k])
			} else {
				vals = append(vals, observed[k])
			}
		}
		strs := make([]string, len(vals))
		for i, v := range vals {
			strs[i] = strconv.FormatFloat(v, 'g', -1, 64)
		}
		out = append(out, inputSeries{Series: n, Values: strings.Join(strs, " ")})
	}
	return out
}

// scrapeOver fetches a registry's metrics over HTTP and parses them.
func scrapeOver(t *testing.T, url string) scraped {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	s := scraped{values: map[string]float64{}, counter: map[string]bool{}}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := m.GetLabel()
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				s.add(name, labels, nil, m.GetCounter().GetValue(), true)
			case dto.MetricType_GAUGE:
				s.add(name, labels, nil, m.GetGauge().GetValue(), false)
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
					s.add(name+"_bucket", labels, []string{"le", le}, float64(b.GetCumulativeCount()), true)
				}
				s.add(name+"_bucket", labels, []string{"le", "+Inf"}, float64(h.GetSampleCount()), true)
				s.add(name+"_sum", labels, nil, h.GetSampleSum(), true)
				s.add(name+"_count", labels, nil, float64(h.GetSampleCount()), true)
			default:
				t.Fatalf("metric %s of unexpected type %s", name, f.GetType())
			}
		}
	}
	return s
}

func (s scraped) add(name string, labels []*dto.LabelPair, extra []string, v float64, counter bool) {
	parts := make([]string, 0, len(labels)+1)
	for _, l := range labels {
		parts = append(parts, l.GetName()+"="+strconv.Quote(l.GetValue()))
	}
	if extra != nil {
		parts = append(parts, extra[0]+"="+strconv.Quote(extra[1]))
	}
	series := name
	if len(parts) > 0 {
		series += "{" + strings.Join(parts, ",") + "}"
	}
	s.values[series] = v
	s.counter[series] = counter
}

// fleet is one recoverer (and maybe more workers) exported by one
// collector behind a real HTTP endpoint.
type fleet struct {
	prefix  string
	c       *recoveryprom.Collector
	url     string
	workers []*recovery.Worker
}

func newFleet(t *testing.T, name string) *fleet {
	t.Helper()
	f := &fleet{prefix: testutil.Name("AL" + name), c: recoveryprom.NewCollector()}
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, w := range f.workers {
			if err := w.Shutdown(ctx); err != nil {
				t.Errorf("shutdown %s: %v", w.InstanceID(), err)
			}
		}
	})
	return f
}

// start starts a watched worker with short timings: a recovery scan every
// 200ms.
func (f *fleet) start(t *testing.T, rdb *redis.Client, resetter recovery.Resetter, id string, opts ...recovery.Option) *recovery.Worker {
	t.Helper()
	opts = append([]recovery.Option{recovery.WithObserver(f.c.Observe), recovery.WithKeyPrefix(f.prefix),
		recovery.WithInstanceID(id), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 200 * time.Millisecond,
			RecoveryInterval:  200 * time.Millisecond,
			RowsTTL:           4 * time.Second,
		})}, opts...)
	w, err := recovery.New(rdb, resetter, opts...)
	require.NoError(t, err)
	f.c.Watch(w)
	require.NoError(t, w.Start(context.Background()))
	f.workers = append(f.workers, w)
	return w
}

// plantDeadPeer leaves what a worker killed while holding rows leaves: a
// registry entry, a rows set and its rows in progress, and no heartbeat.
func plantDeadPeer(t *testing.T, rdb *redis.Client, db *pgxpool.Pool, prefix, id string, rows ...int64) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = $1 WHERE rowid = ANY($2)`, id, rows)
	require.NoError(t, err)
	require.NoError(t, rdb.SAdd(ctx, prefix+"_WORKER_REGISTRY", id).Err())
	members := make([]any, len(rows))
	for i, r := range rows {
		members[i] = r
	}
	require.NoError(t, rdb.SAdd(ctx, fmt.Sprintf("%s_{%s}_ROWS", prefix, id), members...).Err())
}

// scrapeFailingFleet runs a recoverer built with the given resetter
// options next to a dead worker holding rows 1..3, and scrapes it three
// times, a second apart, from its first failed recovery on.
func scrapeFailingFleet(t *testing.T, rdb *redis.Client, name string, ropts []postgres.Option, opts ...recovery.Option) []scraped {
	t.Helper()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	f := newFleet(t, name)
	plantDeadPeer(t, rdb, db, f.prefix, "dead-1", 1, 2, 3)
	resetter, err := pgxreset.New(db, append([]postgres.Option{postgres.WithOwnerColumn("owner")}, ropts...)...)
	require.NoError(t, err)
	w := f.start(t, rdb, resetter, name+"-rec", opts...)
	require.Eventually(t, func() bool { return w.Stats().Errors > 0 }, 10*time.Second, 10*time.Millisecond)
	var scrapes []scraped
	for i := 0; i < 3; i++ {
		if i > 0 {
			time.Sleep(time.Second)
		}
		scrapes = append(scrapes, scrapeOver(t, f.url))
	}
	require.Greater(t, last(scrapes, "recovery_errors_total"), scrapes[0].values[`recovery_errors_total{instance_id="`+name+`-rec"}`],
		"recovery kept failing between scrapes")
	require.Zero(t, w.Stats().PeersRecovered)
	return scrapes
}

// scrapeHealthyFleet runs two workers that track and finish rows while a
// worker dies between each pair of scrapes and is recovered, and scrapes
// the fleet three times.
func scrapeHealthyFleet(t *testing.T, rdb *redis.Client) []scraped {
	t.Helper()
	ctx := context.Background()
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 100)
	f := newFleet(t, "healthy")
	resetter, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	a := f.start(t, rdb, resetter, "healthy-a")
	b := f.start(t, rdb, resetter, "healthy-b")
	recovered := func() uint64 { return a.Stats().PeersRecovered + b.Stats().PeersRecovered }
	var scrapes []scraped
	for i := 0; i < 3; i++ {
		if i > 0 {
			before := recovered()
			base := int64(10 * i)
			plantDeadPeer(t, rdb, db, f.prefix, fmt.Sprintf("dead-%d", i), base+1, base+2, base+3)
			require.NoError(t, a.Track(ctx, 50+base))
			require.NoError(t, b.Track(ctx, 51+base))
			require.Eventually(t, func() bool { return recovered() == before+1 }, 10*time.Second, 10*time.Millisecond)
			require.NoError(t, a.Untrack(50+base))
			require.NoError(t, b.Untrack(51+base))
		}
		// The latency histogram is fed through the observer's goroutine.
		require.Eventually(t, func() bool {
			s := scrapeOver(t, f.url)
			return last([]scraped{s}, "recovery_latency_seconds_count") == float64(recovered())
		}, 5*time.Second, 10*time.Millisecond)
		scrapes = append(scrapes, scrapeOver(t, f.url))
	}
	require.Zero(t, last(scrapes, "recovery_errors_total"))
	require.Zero(t, last(scrapes, "recovery_rows_not_reset_total"))
	require.Equal(t, 6.0, last(scrapes, "recovery_rows_recovered_total"))
	require.Greater(t, last(scrapes, "recovery_peers_dead_total"), 0.0)
	return scrapes
}
