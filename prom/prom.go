// Package recoveryprom exports the metrics of recovery Workers to
// Prometheus. It lives in a module of its own so that the recovery module
// never depends on the Prometheus client.
//
//	c := recoveryprom.NewCollector()
//	w, err := recovery.New(rdb, resetter, recovery.WithObserver(c))
//	c.Watch(w)
//	prometheus.MustRegister(c)
//
// Every metric carries an instance_id label naming the reporting worker,
// one value per process; peer IDs and row IDs are never labels, so the
// number of series stays bounded however many peers die.
package recoveryprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/alya/recovery"
)

// Collector is a prometheus.Collector over the Stats of watched Workers,
// and a recovery.Observer that records scan durations.
type Collector struct {
	mu      sync.Mutex
	workers map[string]*recovery.Worker

	scanDuration *prometheus.HistogramVec

	heartbeats, heartbeatFailures, leaseLost  *prometheus.Desc
	peersDead, rowsRecovered, rowsQuarantined *prometheus.Desc
	errors, trackedRows                       *prometheus.Desc
	registryBroken, registryWrongType         *prometheus.Desc
}

// NewCollector returns a Collector with no worker watched yet.
func NewCollector() *Collector {
	label := []string{"instance_id"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, label, nil)
	}
	return &Collector{
		workers: make(map[string]*recovery.Worker),
		scanDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "recovery_scan_duration_seconds",
			Help:    "Duration of recovery scans for dead peers.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, label),
		heartbeats:        desc("recovery_heartbeats_total", "Successful heartbeat refreshes."),
		heartbeatFailures: desc("recovery_heartbeat_failures_total", "Failed heartbeat refresh attempts."),
		leaseLost:         desc("recovery_lease_lost_total", "Times the worker's heartbeat lease was lost."),
		peersDead:         desc("recovery_peers_dead_total", "Dead peers found by recovery scans, once per scan."),
		rowsRecovered:     desc("recovery_rows_recovered_total", "Rows of dead peers returned to the queue or quarantined."),
		rowsQuarantined:   desc("recovery_rows_quarantined_total", "Rows set to the terminal status after too many recoveries."),
		errors:            desc("recovery_errors_total", "Failed recovery scans, peer recoveries and sweeps."),
		trackedRows:       desc("recovery_tracked_rows", "Rows the worker is processing now."),
		registryBroken: desc("recovery_registry_broken",
			"1 while the fleet's registry key holds something other than a set: scans cannot find dead peers until it is deleted."),
		registryWrongType: desc("recovery_registry_wrong_type_total", "Registry commands Redis refused with WRONGTYPE."),
	}
}

// Watch adds a Worker whose Stats are exported. Watching the same instance
// ID again replaces the earlier worker.
func (c *Collector) Watch(w *recovery.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers[w.InstanceID()] = w
}

// Observe implements recovery.Observer: it records scan durations.
func (c *Collector) Observe(e recovery.Event) {
	if e.Kind == recovery.EventScanFinished {
		c.scanDuration.WithLabelValues(e.InstanceID).Observe(e.Duration.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.heartbeats, c.heartbeatFailures, c.leaseLost,
		c.peersDead, c.rowsRecovered, c.rowsQuarantined, c.errors, c.trackedRows,
		c.registryBroken, c.registryWrongType} {
		ch <- d
	}
	c.scanDuration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	workers := make([]*recovery.Worker, 0, len(c.workers))
	for _, w := range c.workers {
		workers = append(workers, w)
	}
	c.mu.Unlock()
	for _, w := range workers {
		s := w.Stats()
		id := s.InstanceID
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), id)
		}
		counter(c.heartbeats, s.Heartbeats)
		counter(c.heartbeatFailures, s.HeartbeatFailures)
		counter(c.leaseLost, s.LeaseLosses)
		counter(c.peersDead, s.PeersDead)
		counter(c.rowsRecovered, s.RowsRecovered)
		counter(c.rowsQuarantined, s.RowsQuarantined)
		counter(c.errors, s.Errors)
		counter(c.registryWrongType, s.RegistryWrongType)
		ch <- prometheus.MustNewConstMetric(c.trackedRows, prometheus.GaugeValue, float64(s.TrackedRows), id)
		broken := 0.0
		if s.RegistryBroken {
			broken = 1
		}
		ch <- prometheus.MustNewConstMetric(c.registryBroken, prometheus.GaugeValue, broken, id)
	}
	c.scanDuration.Collect(ch)
}
