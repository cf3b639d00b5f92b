// Package recoveryotel exports the metrics of recovery Workers through
// OpenTelemetry, and traces each recovery of a dead peer as a span. It
// lives in a module of its own, beside the Prometheus one, so that the
// recovery module never depends on OpenTelemetry.
//
//	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
//	defer mp.Shutdown(ctx) // runs last: its final export has every count
//	o, err := recoveryotel.New(recoveryotel.WithMeterProvider(mp))
//	defer o.Close() // keeps the final counts for that export
//	w, err := recovery.New(rdb, resetter, recovery.WithObserver(o.Observe))
//	o.Watch(w)
//	defer w.Shutdown(ctx)
//
// Without WithMeterProvider and WithTracerProvider the global providers
// are used. Close may run before or after the provider's Shutdown: after
// Close the Observer reports the watched workers' final Stats.
//
// The Observer's Observe method is also the observer (recovery.WithObserver)
// that feeds its two histograms and its spans; a host with an observer of
// its own passes one func that calls both.
//
// # Metrics
//
// Names follow OpenTelemetry's conventions: dotted, lowercase, no unit or
// _total in the name, units in UCUM ("s", "{row}"). The counters are
// asynchronous, read from Worker.Stats at each collection:
//
//	recovery.heartbeats             {heartbeat}  successful heartbeat refreshes
//	recovery.heartbeat.failures     {failure}    failed heartbeat refresh attempts
//	recovery.lease.losses           {loss}       times the heartbeat lease was lost
//	recovery.scans                  {scan}       finished recovery scans
//	recovery.peers.dead             {peer}       dead peers found, once per scan
//	recovery.peers.recovered        {peer}       dead peers whose rows were reset
//	recovery.rows.recovered         {row}        rows of dead peers reset or quarantined
//	recovery.rows.quarantined       {row}        rows set to the terminal status
//	recovery.rows.not_reset         {row}        rows a recovery could neither reset nor show finished
//	recovery.rows.stray_reset       {row}        rows no rows set held for a rows TTL, reset by the sweep
//	recovery.rows.untracked         {row}        rows committed in progress that no worker had tracked
//	recovery.errors                 {error}      failed scans, peer recoveries and sweeps
//	recovery.registry.wrong_type    {reply}      registry commands refused with WRONGTYPE
//	recovery.events.dropped         {event}      events the observer did not receive
//	recovery.history.dropped        {entry}      history entries not appended to <prefix>_HISTORY
//	recovery.rows.tracked           {row}        rows being processed now (up-down counter)
//	recovery.registry.broken        1            1 while the registry key is not a set (gauge)
//	recovery.rows.oldest.age        s            how long the oldest row tracked now has been held, 0 with none (gauge)
//	recovery.scan.duration          s            histogram of scan durations
//	recovery.peer.recovery.duration s            histogram: dead peer found → reset committed
//	recovery.rows.stuck.duration    s            histogram: dead peer's last heartbeat → its rows queued again
//
// recovery.rows.stuck.duration is the time users wait: per recovered peer
// whose rows were reset, from its last heartbeat to the commit of the
// reset (recovery.Event.StuckFor: heartbeat TTL + time from the death
// being noticed to the commit, a lower bound).
//
// Every data point carries recovery.instance.id, the reporting worker,
// unless the Observer is built WithoutInstanceID. Peer IDs are never
// metric attributes; they are span attributes.
//
// # Spans
//
// Each recovery of a dead peer by a watched worker's Observer is one span,
// "recover dead peer", from the moment the peer was found dead to the end
// of the recovery, with the attributes recovery.instance.id,
// recovery.peer.id, recovery.found_by and the row counts, and a span event
// per step: "peer found dead", "claimed" (the worker took the recovery
// claim: recovery.EventPeerClaimed), "rows reset" (the reset committed,
// with the counts: recovery.EventRowsReset) and "finished" (rows set
// deleted, peer deregistered). A failed recovery has the steps it reached,
// then the error, and status Error. A peer found dead whose recovery
// another worker claimed makes no span here: it shows in the claimer's.
package recoveryotel

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/alya/recovery"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/alya/recovery/otel"

// ScanDurationBuckets are the bucket boundaries of recovery.scan.duration,
// in seconds: a scan is a few Redis round trips, milliseconds, up to the
// operation timeout when Redis is slow. The same as the Prometheus
// module's.
var ScanDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// RecoveryDurationBuckets are the bucket boundaries of
// recovery.peer.recovery.duration, in seconds, from 10 ms (a claim and one
// UPDATE) to 10 minutes (a reset of many rows retried on a slow
// PostgreSQL). The same as the Prometheus module's recovery_latency_seconds.
var RecoveryDurationBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// RowsStuckBuckets are the bucket boundaries of
// recovery.rows.stuck.duration, in seconds, from 1 s to 2 hours: the
// figure is at least the heartbeat TTL (60 s by default) and, with the
// default timings, at most about 174 s when recovery works; what lies
// beyond is an outage. The same as the Prometheus module's
// recovery_rows_stuck_seconds.
var RowsStuckBuckets = []float64{1, 5, 10, 30, 60, 90, 120, 180, 240, 300, 600, 1800, 3600, 7200}

// Attribute keys of the data points and spans.
const (
	InstanceIDKey      = attribute.Key("recovery.instance.id")
	PeerIDKey          = attribute.Key("recovery.peer.id")
	FoundByKey         = attribute.Key("recovery.found_by")
	RowsFoundKey       = attribute.Key("recovery.rows.found")
	RowsResetKey       = attribute.Key("recovery.rows.reset")
	RowsQuarantinedKey = attribute.Key("recovery.rows.quarantined")
	RowsNotResetKey    = attribute.Key("recovery.rows.not_reset")
)

// SpanName is the name of the span of one peer's recovery.
const SpanName = "recover dead peer"

// Observer is an observer of recovery events (pass its Observe method to
// recovery.WithObserver) that records scan and recovery durations
// and traces recoveries, and reports the Stats of watched Workers through
// asynchronous instruments.
type Observer struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	instanceAttr   bool

	tracer                         trace.Tracer
	scanDuration, recoveryDuration metric.Float64Histogram
	rowsStuck                      metric.Float64Histogram
	counters                       []statCounter
	tracked, broken                metric.Int64Observable
	oldestAge                      metric.Float64Observable

	mu      sync.Mutex
	workers map[string]*recovery.Worker
	final   []recovery.Stats     // the watched workers' last Stats, taken by Close; nil before
	dead    map[peerKey]deadPeer // peers found dead whose recovery has not ended
}

// statCounter is an asynchronous counter read from one Stats field.
type statCounter struct {
	inst  metric.Int64ObservableCounter
	value func(recovery.Stats) uint64
}

type peerKey struct{ instance, peer string }

// deadPeer is what the Observer knows of a recovery still under way.
type deadPeer struct {
	at           time.Time
	foundBy      string
	rowsNotReset int
	claimed      time.Time      // zero until this worker claimed it
	reset        time.Time      // zero until its reset committed
	counts       recovery.Event // the EventRowsReset, for its counts
}

// An Option configures an Observer.
type Option interface{ apply(*Observer) }

type optionFunc func(*Observer)

func (f optionFunc) apply(o *Observer) { f(o) }

// WithMeterProvider sets where the instruments are created. Default: the
// global otel.GetMeterProvider().
func WithMeterProvider(p metric.MeterProvider) Option {
	return optionFunc(func(o *Observer) { o.meterProvider = p })
}

// WithTracerProvider sets where the recovery spans go. Default: the global
// otel.GetTracerProvider().
func WithTracerProvider(p trace.TracerProvider) Option {
	return optionFunc(func(o *Observer) { o.tracerProvider = p })
}

// WithoutInstanceID drops the recovery.instance.id attribute from the data
// points: each instrument reports the sum over the watched workers (for
// recovery.registry.broken, the maximum), so a restart under a new
// instance ID continues the same series; the resource (service.instance.id)
// tells processes apart. Spans keep the attribute. Default: every data
// point carries it.
func WithoutInstanceID() Option {
	return optionFunc(func(o *Observer) { o.instanceAttr = false })
}

// New returns an Observer with its instruments created and no worker
// watched yet. It fails if the MeterProvider refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	o := &Observer{
		instanceAttr: true,
		workers:      make(map[string]*recovery.Worker),
		dead:         make(map[peerKey]deadPeer),
	}
	for _, opt := range opts {
		opt.apply(o)
	}
	if o.meterProvider == nil {
		o.meterProvider = otel.GetMeterProvider()
	}
	if o.tracerProvider == nil {
		o.tracerProvider = otel.GetTracerProvider()
	}
	o.tracer = o.tracerProvider.Tracer(ScopeName)
	if err := o.instruments(o.meterProvider.Meter(ScopeName)); err != nil {
		return nil, err
	}
	return o, nil
}

// instruments creates the instruments and registers the callback of the
// asynchronous ones.
func (o *Observer) instruments(m metric.Meter) error {
	var err error
	if o.scanDuration, err = m.Float64Histogram("recovery.scan.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of recovery scans for dead peers."),
		metric.WithExplicitBucketBoundaries(ScanDurationBuckets...)); err != nil {
		return err
	}
	if o.recoveryDuration, err = m.Float64Histogram("recovery.peer.recovery.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a dead peer being found (scan, expiry notification or sweep) "+
			"to the commit of its rows' reset, per peer recovered."),
		metric.WithExplicitBucketBoundaries(RecoveryDurationBuckets...)); err != nil {
		return err
	}
	if o.rowsStuck, err = m.Float64Histogram("recovery.rows.stuck.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a dead peer's rows were stuck in progress, from its last heartbeat "+
			"(estimated from below as the heartbeat TTL before its death was noticed) to the commit of their reset, per peer recovered."),
		metric.WithExplicitBucketBoundaries(RowsStuckBuckets...)); err != nil {
		return err
	}
	for _, c := range []struct {
		name, unit, desc string
		value            func(recovery.Stats) uint64
	}{
		{"recovery.heartbeats", "{heartbeat}", "Successful heartbeat refreshes.",
			func(s recovery.Stats) uint64 { return s.Heartbeats }},
		{"recovery.heartbeat.failures", "{failure}", "Failed heartbeat refresh attempts.",
			func(s recovery.Stats) uint64 { return s.HeartbeatFailures }},
		{"recovery.lease.losses", "{loss}", "Times the worker's heartbeat lease was lost.",
			func(s recovery.Stats) uint64 { return s.LeaseLosses }},
		{"recovery.scans", "{scan}", "Finished recovery scans.",
			func(s recovery.Stats) uint64 { return s.Scans }},
		{"recovery.peers.dead", "{peer}", "Dead peers found by recovery scans, once per scan.",
			func(s recovery.Stats) uint64 { return s.PeersDead }},
		{"recovery.peers.recovered", "{peer}", "Dead peers whose rows were reset.",
			func(s recovery.Stats) uint64 { return s.PeersRecovered }},
		{"recovery.rows.recovered", "{row}", "Rows of dead peers returned to the queue or quarantined.",
			func(s recovery.Stats) uint64 { return s.RowsRecovered }},
		{"recovery.rows.quarantined", "{row}", "Rows set to the terminal status after too many recoveries.",
			func(s recovery.Stats) uint64 { return s.RowsQuarantined }},
		{"recovery.rows.not_reset", "{row}",
			"Rows of dead peers a recovery found but could neither reset nor show finished, once per attempt.",
			func(s recovery.Stats) uint64 { return s.RowsNotReset }},
		{"recovery.rows.stray_reset", "{row}",
			"Rows in progress that no rows set held for a rows TTL, reset by the backstop sweep without an owner column.",
			func(s recovery.Stats) uint64 { return s.StrayRowsReset }},
		{"recovery.rows.untracked", "{row}",
			"Rows the backstop sweep found committed in progress by a worker that had not tracked them.",
			func(s recovery.Stats) uint64 { return s.UntrackedRows }},
		{"recovery.errors", "{error}", "Failed recovery scans, peer recoveries and sweeps.",
			func(s recovery.Stats) uint64 { return s.Errors }},
		{"recovery.registry.wrong_type", "{reply}", "Registry commands Redis refused with WRONGTYPE.",
			func(s recovery.Stats) uint64 { return s.RegistryWrongType }},
		{"recovery.events.dropped", "{event}", "Events the observer did not receive: histograms and spans miss them.",
			func(s recovery.Stats) uint64 { return s.EventsDropped }},
		{"recovery.history.dropped", "{entry}",
			"Entries of the fleet's history stream the worker could not append (queue full, or Redis did not take them).",
			func(s recovery.Stats) uint64 { return s.HistoryDropped }},
	} {
		inst, err := m.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
		if err != nil {
			return err
		}
		o.counters = append(o.counters, statCounter{inst: inst, value: c.value})
	}
	if o.tracked, err = m.Int64ObservableUpDownCounter("recovery.rows.tracked", metric.WithUnit("{row}"),
		metric.WithDescription("Rows the worker is processing now.")); err != nil {
		return err
	}
	if o.broken, err = m.Int64ObservableGauge("recovery.registry.broken", metric.WithUnit("1"),
		metric.WithDescription("1 while the fleet's registry key holds something other than a set: "+
			"scans cannot find dead peers until it is deleted.")); err != nil {
		return err
	}
	if o.oldestAge, err = m.Float64ObservableGauge("recovery.rows.oldest.age", metric.WithUnit("s"),
		metric.WithDescription("How long the worker has held the oldest row it tracks now (since its last Track, "+
			"to the second); 0 when it tracks none.")); err != nil {
		return err
	}
	observables := []metric.Observable{o.tracked, o.broken, o.oldestAge}
	for _, c := range o.counters {
		observables = append(observables, c.inst)
	}
	// The callback stays registered for the provider's life: after Close
	// it reports the final Stats (see Close).
	_, err = m.RegisterCallback(o.observeStats, observables...)
	return err
}

// Watch adds a Worker whose Stats are reported. Watching the same instance
// ID again replaces the earlier worker.
func (o *Observer) Watch(w *recovery.Worker) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.workers[w.InstanceID()] = w
}

// Close takes the final Stats of the watched workers and stops reading
// them: every later collection reports those final values, so the last
// export of a MeterProvider shut down after Close (a deferred Shutdown
// registered before a deferred Close, as in the package example) still
// carries every count, and none is lost whichever of the two comes first.
// Workers watched after Close are not reported. Close never shuts down
// the providers, which the caller owns; it is safe to call twice.
func (o *Observer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.final == nil {
		o.final = o.readStats()
	}
	return nil
}

// readStats reads the Stats of the watched workers; o.mu is held.
func (o *Observer) readStats() []recovery.Stats {
	stats := make([]recovery.Stats, 0, len(o.workers))
	for _, w := range o.workers {
		stats = append(stats, w.Stats())
	}
	return stats
}

// observeStats reports the watched workers' Stats, or after Close their
// final Stats.
func (o *Observer) observeStats(_ context.Context, obs metric.Observer) error {
	o.mu.Lock()
	stats := o.final
	if stats == nil {
		stats = o.readStats()
	}
	o.mu.Unlock()
	// report reports one data point per instrument for a group of
	// workers: counters and tracked rows summed, the registry broken if
	// it is for any of them, the oldest row the oldest of any.
	report := func(group []recovery.Stats, opts ...metric.ObserveOption) {
		for _, c := range o.counters {
			var v uint64
			for _, s := range group {
				v += c.value(s)
			}
			obs.ObserveInt64(c.inst, int64(v), opts...)
		}
		var tracked, broken int64
		var oldest time.Duration
		for _, s := range group {
			tracked += int64(s.TrackedRows)
			if s.RegistryBroken {
				broken = 1
			}
			oldest = max(oldest, s.OldestRowAge)
		}
		obs.ObserveInt64(o.tracked, tracked, opts...)
		obs.ObserveInt64(o.broken, broken, opts...)
		obs.ObserveFloat64(o.oldestAge, oldest.Seconds(), opts...)
	}
	if o.instanceAttr {
		for _, s := range stats {
			report([]recovery.Stats{s}, metric.WithAttributes(InstanceIDKey.String(s.InstanceID)))
		}
	} else if len(stats) > 0 {
		report(stats)
	}
	return nil
}

// Observe is the observer to pass to recovery.WithObserver: it records scan durations
// (EventScanFinished) and recovery durations (EventRowsRecovered), notes
// the steps of a recovery (EventPeerDead, EventPeerClaimed,
// EventRowsReset, EventRowsNotReset), and ends its span when the recovery
// ends (EventRowsRecovered or EventRecoveryFailed naming a peer).
func (o *Observer) Observe(e recovery.Event) {
	ctx := context.Background()
	var opts []metric.RecordOption
	if o.instanceAttr {
		opts = append(opts, metric.WithAttributes(InstanceIDKey.String(e.InstanceID)))
	}
	key := peerKey{e.InstanceID, e.PeerID}
	switch e.Kind {
	case recovery.EventPeerDead:
		o.mu.Lock()
		o.dead[key] = deadPeer{at: e.Time, foundBy: e.FoundBy}
		o.mu.Unlock()
	case recovery.EventPeerClaimed, recovery.EventRowsReset, recovery.EventRowsNotReset:
		o.mu.Lock()
		d, ok := o.dead[key]
		if !ok { // its EventPeerDead was dropped
			d = deadPeer{at: e.Time.Add(-e.Duration), foundBy: e.FoundBy}
		}
		switch e.Kind {
		case recovery.EventPeerClaimed:
			d.claimed = e.Time
		case recovery.EventRowsReset:
			d.reset, d.counts = e.Time, e
		default:
			d.rowsNotReset = e.RowsNotReset
		}
		o.dead[key] = d
		o.mu.Unlock()
	case recovery.EventRowsRecovered:
		o.recoveryDuration.Record(ctx, e.Duration.Seconds(), opts...)
		if e.StuckFor > 0 {
			o.rowsStuck.Record(ctx, e.StuckFor.Seconds(), opts...)
		}
		o.mu.Lock()
		d := o.dead[key]
		delete(o.dead, key)
		o.mu.Unlock()
		o.recoveredSpan(e, d)
	case recovery.EventRecoveryFailed:
		if e.PeerID == "" {
			return // the scan failed, not a peer's recovery
		}
		o.mu.Lock()
		d, found := o.dead[key]
		delete(o.dead, key)
		o.mu.Unlock()
		o.failedSpan(e, d, found)
	case recovery.EventScanFinished:
		o.scanDuration.Record(ctx, e.Duration.Seconds(), opts...)
		o.forgetClaimedElsewhere(e.InstanceID, e.Time.Add(-e.Duration), e.Time)
	}
}

// forgetClaimedElsewhere drops the peers, not claimed by this worker, that
// a scan of instance found dead (FoundBy empty) by the time it ended, and
// those found by an expiry notification or the sweep before it began: a
// recovery this worker ran has ended with an event of its own by then,
// so those were claimed by another worker, or left alone.
func (o *Observer) forgetClaimedElsewhere(instance string, began, ended time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, d := range o.dead {
		if k.instance == instance && d.claimed.IsZero() && (d.foundBy == "" && !d.at.After(ended) || d.at.Before(began)) {
			delete(o.dead, k)
		}
	}
}

// recoveredSpan records the span of a recovery that reset a peer's rows:
// it starts when the peer was found dead (Duration before the event).
func (o *Observer) recoveredSpan(e recovery.Event, d deadPeer) {
	start := e.Time.Add(-e.Duration)
	span := o.startSpan(e, start, e.FoundBy)
	o.steps(span, start, e.FoundBy, d)
	counts := []attribute.KeyValue{RowsFoundKey.Int(e.Rows), RowsResetKey.Int64(e.RowsReset),
		RowsQuarantinedKey.Int(e.RowsQuarantined)}
	span.SetAttributes(counts...)
	span.AddEvent("finished", trace.WithTimestamp(e.Time))
	span.End(trace.WithTimestamp(e.Time))
}

// failedSpan records the span of a recovery that failed: it starts when
// the peer was found dead, if this Observer saw that, else at the failure.
func (o *Observer) failedSpan(e recovery.Event, d deadPeer, found bool) {
	start := e.Time
	if found && d.at.Before(start) {
		start = d.at
	}
	by := e.FoundBy
	if by == "" {
		by = d.foundBy
	}
	span := o.startSpan(e, start, by)
	if found {
		o.steps(span, start, by, d)
	}
	if d.rowsNotReset > 0 {
		span.SetAttributes(RowsNotResetKey.Int(d.rowsNotReset))
	}
	if e.Err != nil {
		span.RecordError(e.Err, trace.WithTimestamp(e.Time))
		span.SetStatus(codes.Error, e.Err.Error())
	} else {
		span.SetStatus(codes.Error, "recovery failed")
	}
	span.End(trace.WithTimestamp(e.Time))
}

// startSpan starts the span of the recovery e ends, at start.
func (o *Observer) startSpan(e recovery.Event, start time.Time, by string) trace.Span {
	_, span := o.tracer.Start(context.Background(), SpanName,
		trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(InstanceIDKey.String(e.InstanceID), PeerIDKey.String(e.PeerID),
			FoundByKey.String(foundBy(by))))
	return span
}

// steps adds the span events of the steps the recovery reached: found
// dead at start, then claimed and rows reset if this Observer saw them.
func (o *Observer) steps(span trace.Span, start time.Time, by string, d deadPeer) {
	span.AddEvent("peer found dead", trace.WithTimestamp(start),
		trace.WithAttributes(FoundByKey.String(foundBy(by))))
	if !d.claimed.IsZero() {
		span.AddEvent("claimed", trace.WithTimestamp(d.claimed))
	}
	if !d.reset.IsZero() {
		c := d.counts
		span.AddEvent("rows reset", trace.WithTimestamp(d.reset), trace.WithAttributes(RowsFoundKey.Int(c.Rows),
			RowsResetKey.Int64(c.RowsReset), RowsQuarantinedKey.Int(c.RowsQuarantined)))
	}
}

// foundBy names the mechanism that found a peer dead: a scan's events
// leave FoundBy empty.
func foundBy(s string) string {
	if s == "" {
		return "registry"
	}
	return s
}
