package recoveryotel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	recoveryotel "github.com/alya/recovery/otel"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestMain(m *testing.M) { os.Exit(testutil.MainCheckingLeaks(m)) }

// sdk is an Observer on an in-memory metric reader and span recorder.
type sdk struct {
	obs    *recoveryotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func newSDK(t *testing.T, opts ...recoveryotel.Option) *sdk {
	t.Helper()
	s := &sdk{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	t.Cleanup(func() {
		require.NoError(t, mp.Shutdown(context.Background()))
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	obs, err := recoveryotel.New(append(opts, recoveryotel.WithMeterProvider(mp), recoveryotel.WithTracerProvider(tp))...)
	require.NoError(t, err)
	s.obs = obs
	return s
}

// collect reads every metric, by name.
func (s *sdk) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, s.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, recoveryotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// point returns the value of an Int64 sum or gauge's one data point with
// the given attributes, failing the test if there is not exactly one.
func point(t *testing.T, m metricdata.Metrics, attrs attribute.Set) int64 {
	t.Helper()
	var pts []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		pts = d.DataPoints
	case metricdata.Gauge[int64]:
		pts = d.DataPoints
	default:
		t.Fatalf("%s is a %T", m.Name, m.Data)
	}
	var found []int64
	for _, p := range pts {
		if p.Attributes.Equals(&attrs) {
			found = append(found, p.Value)
		}
	}
	require.Len(t, found, 1, "data points of %s with %v", m.Name, attrs.ToSlice())
	return found[0]
}

// histogram returns a Float64 histogram's one data point.
func histogram(t *testing.T, m metricdata.Metrics) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", m.Name, m.Data)
	require.Len(t, h.DataPoints, 1)
	return h.DataPoints[0]
}

// TestMetricsAndSpanAfterARealRecovery kills (in effect) a worker holding
// rows on a real Redis and PostgreSQL, lets a peer recover them, and reads
// the peer's metrics from an in-memory reader and the recovery's span from
// a span recorder.
func TestMetricsAndSpanAfterARealRecovery(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	prefix := testutil.DeadPeer(t, rdb, db, "dead-1", 3)
	ctx := context.Background()

	s := newSDK(t)
	resetter, err := pgxreset.New(db, postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	w, err := recovery.New(rdb, resetter, recovery.WithObserver(s.obs.Observe), recovery.WithKeyPrefix(prefix),
		recovery.WithInstanceID("rec-1"), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      2 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond,
			RecoveryInterval:  time.Second,
			RowsTTL:           4 * time.Second,
		}))
	require.NoError(t, err)
	s.obs.Watch(w)
	began := time.Now()
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Track(ctx, 10, 11))
	require.Eventually(t, func() bool { return w.Stats().RowsRecovered == 3 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, w.Untrack(10))
	shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(shutdownCtx)) // delivers the queued events
	var status string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(DISTINCT status, ',') FROM batchrows WHERE rowid IN (1, 2, 3)`).Scan(&status))
	require.Equal(t, "queued", status, "the rows were really reset")

	metrics := s.collect(t)
	rec1 := attribute.NewSet(recoveryotel.InstanceIDKey.String("rec-1"))
	for name, want := range map[string]int64{
		"recovery.rows.recovered":      3,
		"recovery.peers.dead":          1,
		"recovery.peers.recovered":     1,
		"recovery.rows.quarantined":    0,
		"recovery.rows.not_reset":      0,
		"recovery.errors":              0,
		"recovery.lease.losses":        0,
		"recovery.heartbeat.failures":  0,
		"recovery.registry.wrong_type": 0,
		"recovery.events.dropped":      0,
		"recovery.history.dropped":     0,
		"recovery.rows.tracked":        1,
		"recovery.registry.broken":     0,
	} {
		m, ok := metrics[name]
		require.True(t, ok, "no metric %s", name)
		assert.Equal(t, want, point(t, m, rec1), name)
	}
	assert.Positive(t, point(t, metrics["recovery.heartbeats"], rec1))
	assert.Positive(t, point(t, metrics["recovery.scans"], rec1))
	for name, unit := range map[string]string{"recovery.rows.recovered": "{row}", "recovery.heartbeats": "{heartbeat}",
		"recovery.scan.duration": "s", "recovery.peer.recovery.duration": "s", "recovery.registry.broken": "1"} {
		assert.Equal(t, unit, metrics[name].Unit, name)
	}
	counter, ok := metrics["recovery.rows.recovered"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	assert.True(t, counter.IsMonotonic)
	tracked, ok := metrics["recovery.rows.tracked"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	assert.False(t, tracked.IsMonotonic, "tracked rows go up and down")

	latency := histogram(t, metrics["recovery.peer.recovery.duration"])
	assert.Equal(t, uint64(1), latency.Count)
	assert.Equal(t, recoveryotel.RecoveryDurationBuckets, latency.Bounds)
	assert.Greater(t, latency.Sum, 0.0)
	assert.Less(t, latency.Sum, time.Since(began).Seconds())
	assert.Positive(t, histogram(t, metrics["recovery.scan.duration"]).Count)
	stuck := histogram(t, metrics["recovery.rows.stuck.duration"])
	assert.Equal(t, uint64(1), stuck.Count)
	assert.Equal(t, recoveryotel.RowsStuckBuckets, stuck.Bounds)
	assert.Equal(t, w.Stats().LastStuckFor.Seconds(), stuck.Sum)
	assert.GreaterOrEqual(t, stuck.Sum, 2.0, "the dead peer's key had expired: stuck at least the 2s TTL")
	assert.Equal(t, "s", metrics["recovery.rows.stuck.duration"].Unit)

	spans := s.spans.Ended()
	require.Len(t, spans, 1, "one span: the one recovery")
	span := spans[0]
	assert.Equal(t, recoveryotel.SpanName, span.Name())
	assert.Equal(t, codes.Unset, span.Status().Code)
	assert.False(t, span.Parent().IsValid(), "a trace of its own")
	attrs := attribute.NewSet(span.Attributes()...)
	for k, want := range map[attribute.Key]attribute.Value{
		recoveryotel.InstanceIDKey:      attribute.StringValue("rec-1"),
		recoveryotel.PeerIDKey:          attribute.StringValue("dead-1"),
		recoveryotel.FoundByKey:         attribute.StringValue("registry"),
		recoveryotel.RowsFoundKey:       attribute.IntValue(3),
		recoveryotel.RowsResetKey:       attribute.Int64Value(3),
		recoveryotel.RowsQuarantinedKey: attribute.IntValue(0),
	} {
		v, ok := attrs.Value(k)
		assert.True(t, ok, "span attribute %s", k)
		assert.Equal(t, want, v, "span attribute %s", k)
	}
	var names []string
	for _, ev := range span.Events() {
		names = append(names, ev.Name)
	}
	require.Equal(t, []string{"peer found dead", "claimed", "rows reset", "finished"}, names)
	assert.True(t, span.StartTime().After(began), "starts when the peer was found dead")
	ev := span.Events()
	assert.Equal(t, span.StartTime(), ev[0].Time)
	assert.True(t, ev[1].Time.After(ev[0].Time), "claimed after found")
	assert.True(t, ev[2].Time.After(ev[1].Time), "reset after claimed")
	assert.False(t, ev[3].Time.Before(ev[2].Time), "finished after the reset")
	assert.Equal(t, span.EndTime(), ev[3].Time)
	resetAttrs := attribute.NewSet(ev[2].Attributes...)
	v, _ := resetAttrs.Value(recoveryotel.RowsResetKey)
	assert.Equal(t, int64(3), v.AsInt64(), "the reset event carries its counts")
	assert.InDelta(t, latency.Sum, span.EndTime().Sub(span.StartTime()).Seconds(), 1e-6,
		"the span lasts as long as the recovery the histogram recorded")
}

// TestFailedRecoveryIsAnErrorSpanFromTheDeath: a recovery that fails ends
// its span with the error, starting when the peer was found dead; a scan
// failure (no peer) and a peer found dead but claimed elsewhere make no
// span.
func TestFailedRecoveryIsAnErrorSpanFromTheDeath(t *testing.T) {
	s := newSDK(t)
	t0 := time.Now()
	cause := errors.New("reset rows of dead-2: connection refused")
	for _, e := range []recovery.Event{
		{Kind: recovery.EventRecoveryFailed, InstanceID: "w-1", Time: t0, Err: errors.New("read registry: i/o timeout")},
		{Kind: recovery.EventPeerDead, InstanceID: "w-1", PeerID: "dead-2", Time: t0.Add(time.Second)},
		{Kind: recovery.EventPeerDead, InstanceID: "w-1", PeerID: "other", Time: t0.Add(time.Second)},
		{Kind: recovery.EventPeerClaimed, InstanceID: "w-1", PeerID: "dead-2", Time: t0.Add(2 * time.Second)},
		{Kind: recovery.EventRowsNotReset, InstanceID: "w-1", PeerID: "dead-2", RowsNotReset: 2, Time: t0.Add(3 * time.Second)},
		{Kind: recovery.EventRecoveryFailed, InstanceID: "w-1", PeerID: "dead-2", Time: t0.Add(3 * time.Second), Err: cause},
		// "slow", found by expiry before the scan below began, is this
		// worker's own recovery (claimed): the scan's end keeps it.
		{Kind: recovery.EventPeerDead, InstanceID: "w-1", PeerID: "slow", FoundBy: "expiry", Time: t0.Add(200 * time.Millisecond)},
		{Kind: recovery.EventPeerClaimed, InstanceID: "w-1", PeerID: "slow", FoundBy: "expiry", Time: t0.Add(300 * time.Millisecond)},
		{Kind: recovery.EventScanFinished, InstanceID: "w-1", Time: t0.Add(4 * time.Second), Duration: 3500 * time.Millisecond},
		{Kind: recovery.EventRecoveryFailed, InstanceID: "w-1", PeerID: "slow", FoundBy: "expiry", Time: t0.Add(5 * time.Second), Err: cause},
		// "other" was claimed by another worker: forgotten at the scan's end,
		// so a failure of a later expiry recovery starts its span afresh.
		{Kind: recovery.EventRecoveryFailed, InstanceID: "w-1", PeerID: "other", FoundBy: "expiry", Time: t0.Add(9 * time.Second), Err: cause},
	} {
		s.obs.Observe(e)
	}
	spans := s.spans.Ended()
	require.Len(t, spans, 3)
	failed := spans[0]
	assert.Equal(t, codes.Error, failed.Status().Code)
	assert.Equal(t, cause.Error(), failed.Status().Description)
	assert.Equal(t, t0.Add(time.Second), failed.StartTime())
	assert.Equal(t, t0.Add(3*time.Second), failed.EndTime())
	attrs := attribute.NewSet(failed.Attributes()...)
	v, _ := attrs.Value(recoveryotel.RowsNotResetKey)
	assert.Equal(t, int64(2), v.AsInt64())
	v, _ = attrs.Value(recoveryotel.PeerIDKey)
	assert.Equal(t, "dead-2", v.AsString())
	var names []string
	for _, ev := range failed.Events() {
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{"peer found dead", "claimed", "exception"}, names)
	assert.Equal(t, t0.Add(2*time.Second), failed.Events()[1].Time)

	slow := spans[1]
	assert.Equal(t, t0.Add(200*time.Millisecond), slow.StartTime(), "a claimed recovery outlives a scan's end")
	names = nil
	for _, ev := range slow.Events() {
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{"peer found dead", "claimed", "exception"}, names)

	later := spans[2]
	assert.Equal(t, t0.Add(9*time.Second), later.StartTime(), "the stale death was forgotten")
	laterAttrs := attribute.NewSet(later.Attributes()...)
	v, _ = laterAttrs.Value(recoveryotel.FoundByKey)
	assert.Equal(t, "expiry", v.AsString())

	scan := histogram(t, s.collect(t)["recovery.scan.duration"])
	assert.Equal(t, uint64(1), scan.Count)
	assert.Equal(t, 3.5, scan.Sum)
}

// TestWithoutInstanceIDSumsTheWatchedWorkers: two workers watched without
// the attribute report one data point per instrument, their sum.
func TestWithoutInstanceIDSumsTheWatchedWorkers(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	prefix := testutil.Name("P")
	s := newSDK(t, recoveryotel.WithoutInstanceID())
	for i, rows := range [][]int64{{1, 2}, {3, 4, 5}} {
		w, err := recovery.New(rdb, noReset{}, recovery.WithObserver(s.obs.Observe), recovery.WithKeyPrefix(prefix),
			recovery.WithInstanceID(fmt.Sprintf("w-%d", i)), recovery.WithTimings(recovery.Timings{
				HeartbeatTTL:      2 * time.Second,
				HeartbeatInterval: 100 * time.Millisecond,
				RecoveryInterval:  time.Second,
				RowsTTL:           4 * time.Second,
			}))
		require.NoError(t, err)
		s.obs.Watch(w)
		require.NoError(t, w.Start(ctx))
		require.NoError(t, w.Track(ctx, rows...))
		t.Cleanup(func() {
			require.NoError(t, w.Untrack(rows...))
			shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.NoError(t, w.Shutdown(shutdownCtx))
		})
	}
	metrics := s.collect(t)
	none := attribute.NewSet()
	assert.Equal(t, int64(5), point(t, metrics["recovery.rows.tracked"], none))
	assert.GreaterOrEqual(t, point(t, metrics["recovery.heartbeats"], none), int64(2), "one first heartbeat each at least")
	assert.Equal(t, int64(0), point(t, metrics["recovery.registry.broken"], none))

	// After Close the final counts stay: the workers are no longer read.
	require.NoError(t, s.obs.Close())
	require.NoError(t, s.obs.Close(), "twice")
	after := s.collect(t)
	assert.Equal(t, int64(5), point(t, after["recovery.rows.tracked"], none))
}

// TestOldestRowAgeIsAGaugePerWorker: recovery.rows.oldest.age is how
// long each watched worker has held the oldest row it tracks now, in
// seconds, 0 when it tracks none.
func TestOldestRowAgeIsAGaugePerWorker(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := newSDK(t)
	w, err := recovery.New(rdb, noReset{}, recovery.WithKeyPrefix(testutil.Name("P")), recovery.WithInstanceID("w-1"),
		recovery.WithTimings(recovery.Timings{HeartbeatTTL: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}))
	require.NoError(t, err)
	s.obs.Watch(w)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Shutdown(context.Background())) })
	age := func() float64 {
		t.Helper()
		g, ok := s.collect(t)["recovery.rows.oldest.age"].Data.(metricdata.Gauge[float64])
		require.True(t, ok)
		require.Len(t, g.DataPoints, 1)
		id, _ := g.DataPoints[0].Attributes.Value(recoveryotel.InstanceIDKey)
		assert.Equal(t, "w-1", id.AsString())
		return g.DataPoints[0].Value
	}
	assert.Zero(t, age(), "no row held")
	tracked := time.Now()
	require.NoError(t, w.Track(ctx, 1))
	time.Sleep(1200 * time.Millisecond) // real time: the age is clock time
	require.NoError(t, w.Track(ctx, 2))
	a := age()
	assert.GreaterOrEqual(t, a, 1.2, "row 1's age, not row 2's")
	assert.LessOrEqual(t, a, time.Since(tracked).Seconds()+1, "to the second")
	require.NoError(t, w.Untrack(1, 2))
	assert.Zero(t, age())
}

// memExporter keeps the Int64 sums of the last export, by name.
type memExporter struct {
	mu      sync.Mutex
	exports int
	last    map[string]int64
}

func (e *memExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (e *memExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (e *memExporter) Export(_ context.Context, rm *metricdata.ResourceMetrics) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.exports++
	e.last = map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range sum.DataPoints {
					e.last[m.Name] += p.Value
				}
			}
		}
	}
	return nil
}

func (e *memExporter) ForceFlush(context.Context) error { return nil }
func (e *memExporter) Shutdown(context.Context) error   { return nil }

// TestTheDocumentedDeferOrderExportsTheFinalCounts runs the package
// example's order, defer mp.Shutdown then defer o.Close, with a periodic
// reader that exports only at the provider's shutdown: Close runs first,
// and the final export still carries the worker's final counts.
func TestTheDocumentedDeferOrderExportsTheFinalCounts(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	exp := &memExporter{}
	var final recovery.Stats
	func() {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(time.Hour))))
		defer func() { require.NoError(t, mp.Shutdown(ctx)) }()
		o, err := recoveryotel.New(recoveryotel.WithMeterProvider(mp))
		require.NoError(t, err)
		defer func() { require.NoError(t, o.Close()) }()
		w, err := recovery.New(rdb, noReset{}, recovery.WithObserver(o.Observe), recovery.WithKeyPrefix(testutil.Name("P")),
			recovery.WithTimings(recovery.Timings{
				HeartbeatTTL:      2 * time.Second,
				HeartbeatInterval: 50 * time.Millisecond,
				RecoveryInterval:  time.Second,
				RowsTTL:           4 * time.Second,
			}))
		require.NoError(t, err)
		o.Watch(w)
		require.NoError(t, w.Start(ctx))
		require.Eventually(t, func() bool { return w.Stats().Heartbeats >= 3 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, w.Shutdown(ctx))
		final = w.Stats()
	}()
	exp.mu.Lock()
	defer exp.mu.Unlock()
	require.Equal(t, 1, exp.exports, "one export, at the provider's shutdown")
	assert.Equal(t, int64(final.Heartbeats), exp.last["recovery.heartbeats"], "the final heartbeat count")
	assert.Equal(t, int64(final.Scans), exp.last["recovery.scans"], "the final scan count")
}

// noReset is a Resetter that never recovers anything.
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
