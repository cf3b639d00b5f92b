package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/alya/recovery/internal/store"
)

// Expiry-driven recovery: instead of waiting for the next scan, a worker
// subscribed to Redis keyspace notifications learns that a peer's heartbeat
// key expired the moment Redis expires it, and recovers that peer at once.
// Detection then takes about the heartbeat TTL instead of TTL + recovery
// interval. Notifications are fire-and-forget (a worker that is
// disconnected when one is sent misses it), so the periodic scan stays as
// the fallback.

// expiryWatcher forwards the peers whose heartbeat expired, as the masters
// announce them, to the recoverer.
//
// A subscription is made on a node and stays on it across reconnections,
// whereas a Cluster failover moves the node's slots to a promoted replica
// that nobody listens to. So the watcher's loop checks the masters every
// heartbeat interval (±10%): it subscribes on a master that has no
// subscription (making it publish expired-key events first with configure:
// a replica does not inherit its master's CONFIG SET) and closes the
// subscription of a node that is no longer a master. Events that the
// promoted master sends before the next check are lost, and the scan finds
// those peers. A single server's or a failover client's one subscription
// follows the server, and the check sends nothing.
type expiryWatcher struct {
	store store.Store
	log   *slog.Logger
	opts  *options
	fleet *fleetView
	nodes *nodeWatch // reads a node's INFO and remembers its age (nodeage.go)
	// judge judges peers' heartbeats (registry.go); hand passes a dead peer
	// to the recoverer without waiting (recovery.go).
	judge *judge
	hand  func(peer string)
	// subs holds the subscription of each master, by node; only Start
	// and then the watcher's loop touch it.
	subs map[string]*watch
	wg   sync.WaitGroup // a goroutine per started watch
	// failing holds the masters a subscription failed on, listFailing
	// whether the masters could not be listed: each outage is logged
	// once, not at every check.
	failing     map[string]bool
	listFailing bool
	running     bool // the loop runs: changes are logged
}

// watch is the subscription of one master and the goroutine reading it.
type watch struct {
	sub    store.Subscription
	cancel context.CancelFunc // nil until the loop starts the goroutine
	done   chan struct{}      // closed when the goroutine closed sub
}

// subscribeExpiry makes the masters publish expired-key events (with
// configure) and subscribes e to them, bounded by Start's ctx. Every
// problem is logged, none is fatal: without a watcher the scan finds dead
// peers. It returns e, or nil if no master could be subscribed to.
func subscribeExpiry(ctx context.Context, e *expiryWatcher) *expiryWatcher {
	e.subs, e.failing = make(map[string]*watch), make(map[string]bool)
	err := e.subscribe(ctx)
	switch {
	case len(e.subs) == 0:
		e.log.Warn("expiry notifications unavailable; dead peers are found by the periodic scan only",
			slog.Any("error", fmt.Errorf("expiry notifications: %w", err)))
		return nil
	case err != nil:
		e.log.Warn("expiry notifications unavailable on some masters; peers whose keys they hold are found by the periodic scan only",
			slog.Any("error", fmt.Errorf("expiry notifications: %w", err)))
	}
	return e
}

// run reads the subscriptions and checks the masters every heartbeat
// interval (±10%) until ctx, which only Shutdown cancels, is done; then it
// closes every subscription and waits for the goroutines reading them.
func (e *expiryWatcher) run(ctx context.Context) {
	e.log.Debug("expiry watcher started", slog.Int("masters", len(e.subs)))
	defer e.log.Debug("expiry watcher stopped")
	defer e.wg.Wait()
	defer e.closeAll()
	e.running = true
	e.startWatches(ctx)
	t := time.NewTimer(jitter(e.opts.heartbeatInterval, 0.1))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.runOnce(ctx)
		t.Reset(jitter(e.opts.heartbeatInterval, 0.1))
		e.opts.sig.masters.Signal(struct{}{}) // test signal: a check of the masters ended
	}
}

// runOnce is one check of the masters (subscribe), then the new
// subscriptions' goroutines started.
func (e *expiryWatcher) runOnce(ctx context.Context) {
	_ = e.subscribe(ctx) // logged there, once per outage
	e.startWatches(ctx)
}

// subscribe lists the masters, closes the subscriptions of other nodes (and
// of any whose reading ended), and subscribes on every master without
// one. It returns the first error; once the loop runs, it logs each
// failure once per outage and each change.
func (e *expiryWatcher) subscribe(ctx context.Context) error {
	opCtx, cancel := context.WithTimeout(ctx, 2*e.opts.opTimeout)
	defer cancel()
	nodes, err := e.store.Masters(opCtx)
	if err != nil {
		if e.running && !e.listFailing {
			e.log.Warn("expiry notifications: cannot list the masters, so a failover is not followed until they can be",
				slog.Any("error", err))
		}
		e.listFailing = true
		return err
	}
	e.listFailing = false
	for node, wt := range e.subs {
		if slices.Contains(nodes, node) && !wt.ended() {
			continue
		}
		wt.stop()
		delete(e.subs, node)
		e.log.Info("expiry notifications: subscription closed, the node is no longer a master", slog.String("node", node))
	}
	var first error
	for _, node := range nodes {
		if _, ok := e.subs[node]; ok {
			continue
		}
		sub, err := e.subscribeNode(opCtx, node)
		if err != nil {
			if e.running && !e.failing[node] {
				e.log.Warn("expiry notifications unavailable on a master; peers whose keys it holds are found by the periodic scan only",
					slog.String("node", node), slog.Any("error", err))
			}
			e.failing[node] = true
			if first == nil {
				first = err
			}
			continue
		}
		delete(e.failing, node)
		e.subs[node] = &watch{sub: sub}
		if e.running {
			e.observe(opCtx, node)
			e.log.Info("expiry notifications: subscribed on a new master", slog.String("node", node))
		}
	}
	return first
}

// subscribeNode makes node publish expired-key events (with configure)
// and subscribes to them.
func (e *expiryWatcher) subscribeNode(ctx context.Context, node string) (store.Subscription, error) {
	set, err := e.store.EnableExpiredEvents(ctx, node, e.opts.expiryConfigure)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	if set != "" {
		e.log.Warn("enabled keyspace notifications of expired keys on the server (CONFIG SET notify-keyspace-events); set it in the server's configuration to keep it across restarts",
			slog.String("node", node), slog.String("notify_keyspace_events", set))
	}
	sub, err := e.store.SubscribeExpired(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	return sub, nil
}

// observe records a master new to the watcher in the worker's memory of
// node ages (nodeage.go), as a scan finding a heartbeat absent on it would
// do. A promoted replica's verdicts are held for a TTL from the moment the
// worker first sees it; without this look that moment would be the first
// event from the node, which the hold would waste, leaving the peer to the
// scan. The node answered as a master, so it was promoted before this look
// and the hold covers the promotion, as the rule asks.
func (e *expiryWatcher) observe(ctx context.Context, node string) {
	f, err := e.nodes.nodeInfo(ctx, node)
	if err != nil {
		return // a scan or an event asks again when it needs a verdict
	}
	e.nodes.ages.observe(node, f, time.Now(), e.fleet.ttl(), false)
}

// startWatches starts a goroutine for each subscription without one.
func (e *expiryWatcher) startWatches(ctx context.Context) {
	for _, wt := range e.subs {
		if wt.cancel != nil {
			continue
		}
		var wctx context.Context
		wctx, wt.cancel = context.WithCancel(ctx)
		wt.done = make(chan struct{})
		e.wg.Go(func() {
			defer close(wt.done)
			e.read(wctx, wt.sub)
		})
	}
}

// closeAll closes every subscription: the ones with a goroutine through
// it, the others at once.
func (e *expiryWatcher) closeAll() {
	for node, wt := range e.subs {
		wt.stop()
		delete(e.subs, node)
	}
}

// stop closes the subscription: its goroutine, if started, does so when
// its context ends.
func (wt *watch) stop() {
	if wt.cancel == nil {
		wt.sub.Close()
		return
	}
	wt.cancel()
}

// ended reports whether the goroutine reading the subscription returned.
func (wt *watch) ended() bool {
	if wt.done == nil {
		return false
	}
	select {
	case <-wt.done:
		return true
	default:
		return false
	}
}

// read hands every expired key of one subscription to handle until ctx is
// done or the subscription ends, then closes it.
func (e *expiryWatcher) read(ctx context.Context, sub store.Subscription) {
	defer sub.Close()
	for {
		key, ok := sub.Next(ctx)
		if !ok {
			return
		}
		e.handle(ctx, key)
	}
}

// handle handles one expired key: a peer's heartbeat is handed to the
// recoverer if deadPeers, asked now, finds it dead. The event is a hint;
// the verdict is deadPeers', as for a scan: the key may be back, or the
// server may have restarted too recently for an absent heartbeat to mean
// death.
func (e *expiryWatcher) handle(ctx context.Context, key string) {
	id, ok := store.InstanceOfHeartbeat(e.opts.keyPrefix, key)
	if !ok || id == e.opts.instanceID {
		return
	}
	if dead, err := e.judge.deadPeers(ctx, []string{id}); err == nil && len(dead) > 0 {
		e.hand(id)
	}
	e.opts.sig.heard.Signal(id) // test signal: an expiry event judged
}
