// Package recoveryprom exports the metrics of recovery Workers to
// Prometheus. It lives in a module of its own so that the recovery module
// never depends on the Prometheus client.
//
//	c := recoveryprom.NewCollector()
//	w, err := recovery.New(rdb, resetter, recovery.WithObserver(c.Observe))
//	c.Watch(w)
//	prometheus.MustRegister(c)
//
// The Collector's Observe method is also the observer that feeds its three
// histograms (scan durations, recovery latency and how long rows were
// stuck); a host with an observer of its own passes one func that calls
// both to recovery.WithObserver (see ExampleCollector_Observe).
//
// By default every metric carries an instance_id label naming the
// reporting worker. A fleet that keeps the default instance IDs (a new one
// per process start) gets new series at every restart: build the Collector
// with WithoutInstanceID, and let the scrape target's own labels (instance,
// pod) tell processes apart. Peer IDs and row IDs are never labels, so the
// number of series stays bounded however many peers die. The alert rules
// in alerts.yml work either way.
package recoveryprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/alya/recovery"
)

// ScanDurationBuckets are the buckets of recovery_scan_duration_seconds:
// a scan is a few Redis round trips, milliseconds, up to the operation
// timeout when Redis is slow.
var ScanDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// RecoveryLatencyBuckets are the buckets of recovery_latency_seconds, from
// 10 ms (a claim and one UPDATE) to 10 minutes (a reset of many rows
// retried on a slow PostgreSQL).
var RecoveryLatencyBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// RowsStuckBuckets are the buckets of recovery_rows_stuck_seconds, from
// 1 s to 2 hours: the figure is at least the heartbeat TTL (60 s by
// default) and, with the default timings, at most about 174 s when
// recovery works; what lies beyond is an outage.
var RowsStuckBuckets = []float64{1, 5, 10, 30, 60, 90, 120, 180, 240, 300, 600, 1800, 3600, 7200}

// Collector is a prometheus.Collector over the Stats of watched Workers,
// and, through its Observe method passed to recovery.WithObserver, an
// observer that records scan durations and recovery latencies.
type Collector struct {
	mu      sync.Mutex
	workers map[string]*recovery.Worker

	instanceLabel bool

	scanDuration, recoveryLatency *prometheus.HistogramVec
	rowsStuck                     *prometheus.HistogramVec

	heartbeats, heartbeatFailures, leaseLost *prometheus.Desc
	scans, peersDead, peersRecovered         *prometheus.Desc
	rowsRecovered, rowsQuarantined           *prometheus.Desc
	rowsNotReset, errors, trackedRows        *prometheus.Desc
	strayRowsReset, untrackedRows            *prometheus.Desc
	registryBroken, registryWrongType        *prometheus.Desc
	eventsDropped, historyDropped            *prometheus.Desc
	oldestRowAge                             *prometheus.Desc
}

// An Option configures a Collector.
type Option interface{ apply(*Collector) }

type optionFunc func(*Collector)

func (f optionFunc) apply(c *Collector) { f(c) }

// WithoutInstanceID drops the instance_id label: each metric is one series
// per scrape target, the sum over the watched workers (for
// recovery_registry_broken, the maximum), so a restart under a new
// instance ID continues the same series instead of starting new ones.
// Counters stay monotonic: a worker once watched stays watched, its
// counters frozen after its Shutdown. Default: every series carries
// instance_id.
func WithoutInstanceID() Option {
	return optionFunc(func(c *Collector) { c.instanceLabel = false })
}

// NewCollector returns a Collector with no worker watched yet.
func NewCollector(opts ...Option) *Collector {
	c := &Collector{workers: make(map[string]*recovery.Worker), instanceLabel: true}
	for _, o := range opts {
		o.apply(c)
	}
	var label []string
	if c.instanceLabel {
		label = []string{"instance_id"}
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, label, nil)
	}
	c.scanDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "recovery_scan_duration_seconds",
		Help:    "Duration of recovery scans for dead peers.",
		Buckets: ScanDurationBuckets,
	}, label)
	c.recoveryLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "recovery_latency_seconds",
		Help: "Time from a dead peer being found (scan, expiry notification or sweep) " +
			"to the commit of its rows' reset, per peer recovered.",
		Buckets: RecoveryLatencyBuckets,
	}, label)
	c.rowsStuck = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "recovery_rows_stuck_seconds",
		Help: "Time a dead peer's rows were stuck in progress, from its last heartbeat (estimated from below " +
			"as the heartbeat TTL before its death was noticed) to the commit of their reset, per peer recovered.",
		Buckets: RowsStuckBuckets,
	}, label)
	c.heartbeats = desc("recovery_heartbeats_total", "Successful heartbeat refreshes.")
	c.heartbeatFailures = desc("recovery_heartbeat_failures_total", "Failed heartbeat refresh attempts.")
	c.leaseLost = desc("recovery_lease_lost_total", "Times the worker's heartbeat lease was lost.")
	c.scans = desc("recovery_scans_total", "Finished recovery scans.")
	c.peersDead = desc("recovery_peers_dead_total", "Dead peers found by recovery scans, once per scan.")
	c.peersRecovered = desc("recovery_peers_recovered_total", "Dead peers whose rows were reset.")
	c.rowsRecovered = desc("recovery_rows_recovered_total", "Rows of dead peers returned to the queue or quarantined.")
	c.rowsQuarantined = desc("recovery_rows_quarantined_total", "Rows set to the terminal status after too many recoveries.")
	c.rowsNotReset = desc("recovery_rows_not_reset_total",
		"Rows of dead peers a recovery found but could neither reset nor show finished, once per attempt.")
	c.strayRowsReset = desc("recovery_stray_rows_reset_total",
		"Rows in progress that no rows set held for a rows TTL, reset by the backstop sweep without an owner column.")
	c.untrackedRows = desc("recovery_untracked_rows_total",
		"Rows the backstop sweep found committed in progress by a worker that had not tracked them (ErrUntrackedRows).")
	c.errors = desc("recovery_errors_total", "Failed recovery scans, peer recoveries and sweeps.")
	c.trackedRows = desc("recovery_tracked_rows", "Rows the worker is processing now.")
	c.registryBroken = desc("recovery_registry_broken",
		"1 while the fleet's registry key holds something other than a set: scans cannot find dead peers until it is deleted.")
	c.registryWrongType = desc("recovery_registry_wrong_type_total", "Registry commands Redis refused with WRONGTYPE.")
	c.eventsDropped = desc("recovery_events_dropped_total",
		"Events the observer did not receive: the histograms miss them.")
	c.historyDropped = desc("recovery_history_dropped_total",
		"Entries of the fleet's history stream the worker could not append (queue full, or Redis did not take them).")
	c.oldestRowAge = desc("recovery_oldest_row_age_seconds",
		"How long the worker has held the oldest row it tracks now (since its last Track, to the second); 0 when it tracks none. "+
			"With WithoutInstanceID, the oldest over the watched workers.")
	return c
}

// Watch adds a Worker whose Stats are exported. Watching the same instance
// ID again replaces the earlier worker.
func (c *Collector) Watch(w *recovery.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers[w.InstanceID()] = w
}

// Observe is the observer to pass to recovery.WithObserver: it records scan durations
// (EventScanFinished), recovery latencies and how long the recovered rows
// were stuck (EventRowsRecovered).
func (c *Collector) Observe(e recovery.Event) {
	switch e.Kind {
	case recovery.EventScanFinished:
		c.scanDuration.WithLabelValues(c.labels(e.InstanceID)...).Observe(e.Duration.Seconds())
	case recovery.EventRowsRecovered:
		c.recoveryLatency.WithLabelValues(c.labels(e.InstanceID)...).Observe(e.Duration.Seconds())
		if e.StuckFor > 0 {
			c.rowsStuck.WithLabelValues(c.labels(e.InstanceID)...).Observe(e.StuckFor.Seconds())
		}
	}
}

// labels returns the label values of a worker's series.
func (c *Collector) labels(id string) []string {
	if c.instanceLabel {
		return []string{id}
	}
	return nil
}

func (c *Collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.heartbeats, c.heartbeatFailures, c.leaseLost, c.scans,
		c.peersDead, c.peersRecovered, c.rowsRecovered, c.rowsQuarantined, c.rowsNotReset,
		c.strayRowsReset, c.untrackedRows,
		c.errors, c.trackedRows, c.registryBroken, c.registryWrongType, c.eventsDropped, c.historyDropped,
		c.oldestRowAge}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
	c.scanDuration.Describe(ch)
	c.recoveryLatency.Describe(ch)
	c.rowsStuck.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats := make([]recovery.Stats, 0, len(c.workers))
	for _, w := range c.workers {
		stats = append(stats, w.Stats())
	}
	c.mu.Unlock()
	if c.instanceLabel {
		for _, s := range stats {
			c.collect(ch, s, []string{s.InstanceID})
		}
	} else if len(stats) > 0 {
		c.collect(ch, sum(stats), nil)
	}
	c.scanDuration.Collect(ch)
	c.recoveryLatency.Collect(ch)
	c.rowsStuck.Collect(ch)
}

// collect sends the metrics of one Stats.
func (c *Collector) collect(ch chan<- prometheus.Metric, s recovery.Stats, labels []string) {
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(c.heartbeats, s.Heartbeats)
	counter(c.heartbeatFailures, s.HeartbeatFailures)
	counter(c.leaseLost, s.LeaseLosses)
	counter(c.scans, s.Scans)
	counter(c.peersDead, s.PeersDead)
	counter(c.peersRecovered, s.PeersRecovered)
	counter(c.rowsRecovered, s.RowsRecovered)
	counter(c.rowsQuarantined, s.RowsQuarantined)
	counter(c.rowsNotReset, s.RowsNotReset)
	counter(c.strayRowsReset, s.StrayRowsReset)
	counter(c.untrackedRows, s.UntrackedRows)
	counter(c.errors, s.Errors)
	counter(c.registryWrongType, s.RegistryWrongType)
	counter(c.eventsDropped, s.EventsDropped)
	counter(c.historyDropped, s.HistoryDropped)
	ch <- prometheus.MustNewConstMetric(c.trackedRows, prometheus.GaugeValue, float64(s.TrackedRows), labels...)
	broken := 0.0
	if s.RegistryBroken {
		broken = 1
	}
	ch <- prometheus.MustNewConstMetric(c.registryBroken, prometheus.GaugeValue, broken, labels...)
	ch <- prometheus.MustNewConstMetric(c.oldestRowAge, prometheus.GaugeValue, s.OldestRowAge.Seconds(), labels...)
}

// sum adds the counters and tracked rows of several workers; the registry
// is broken if it is broken for any of them, and the oldest row is the
// oldest of any.
func sum(stats []recovery.Stats) recovery.Stats {
	var t recovery.Stats
	for _, s := range stats {
		t.Heartbeats += s.Heartbeats
		t.HeartbeatFailures += s.HeartbeatFailures
		t.LeaseLosses += s.LeaseLosses
		t.Scans += s.Scans
		t.PeersDead += s.PeersDead
		t.PeersRecovered += s.PeersRecovered
		t.RowsRecovered += s.RowsRecovered
		t.RowsQuarantined += s.RowsQuarantined
		t.RowsNotReset += s.RowsNotReset
		t.StrayRowsReset += s.StrayRowsReset
		t.UntrackedRows += s.UntrackedRows
		t.Errors += s.Errors
		t.RegistryWrongType += s.RegistryWrongType
		t.EventsDropped += s.EventsDropped
		t.HistoryDropped += s.HistoryDropped
		t.TrackedRows += s.TrackedRows
		t.RegistryBroken = t.RegistryBroken || s.RegistryBroken
		t.OldestRowAge = max(t.OldestRowAge, s.OldestRowAge)
	}
	return t
}
