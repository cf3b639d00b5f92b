package recovery

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/alya/recovery/internal/store"
)

// Expiry-driven recovery: instead of waiting for the next scan, a worker
// subscribed to Redis keyspace notifications learns that a peer's heartbeat
// key expired the moment Redis expires it, and recovers that peer at once.
// Detection then takes about the heartbeat TTL instead of TTL + recovery
// interval. Notifications are fire-and-forget (a worker that is
// disconnected when one is sent misses it), so the periodic scan stays as
// the fallback.

// WithExpiryNotifications turns on expiry-driven recovery: the worker
// subscribes to expired-key events (on every master of a Cluster) and
// recovers a peer as soon as its heartbeat key expires, the periodic scan
// staying as the fallback. The server must have notify-keyspace-events
// with "E" and "x"; if configure is true and it has not, Start adds them
// with CONFIG SET (and logs a warning); otherwise Start logs a warning and
// the worker relies on scans. Default: off.
func WithExpiryNotifications(configure bool) Option {
	return optionFunc(func(o *options) { o.expiry, o.expiryConfigure = true, configure })
}

// expiryWatcher forwards the peers whose heartbeat expired, as the masters
// announce them, to the recoverer.
type expiryWatcher struct {
	w    *Worker
	subs []store.Subscription
}

// subscribe makes sure the servers publish expired-key events and
// subscribes to them on every master. Every problem is logged, none is
// fatal: without a watcher the scan finds dead peers.
func (w *Worker) subscribeExpiry(ctx context.Context) *expiryWatcher {
	opCtx, cancel := context.WithTimeout(ctx, 2*w.opts.opTimeout)
	defer cancel()
	set, err := w.store.EnableExpiredEvents(opCtx, w.opts.expiryConfigure)
	for _, flags := range set {
		w.log.Warn("enabled keyspace notifications of expired keys on the server (CONFIG SET notify-keyspace-events); set it in the server's configuration to keep it across restarts",
			slog.String("notify_keyspace_events", flags))
	}
	if err == nil {
		var subs []store.Subscription
		if subs, err = w.store.SubscribeExpired(opCtx); err == nil {
			return &expiryWatcher{w: w, subs: subs}
		}
	}
	w.log.Warn("expiry notifications unavailable; dead peers are found by the periodic scan only",
		slog.Any("error", fmt.Errorf("expiry notifications: %w", err)))
	return nil
}

// run watches one master's subscription until ctx is done, then closes it.
func (e *expiryWatcher) run(ctx context.Context, sub store.Subscription) {
	defer sub.Close()
	for {
		key, ok := sub.Next(ctx)
		if !ok {
			return
		}
		e.runOnce(ctx, key)
	}
}

// runOnce handles one expired key: a peer's heartbeat is handed to the
// recoverer if deadPeers, asked now, finds it dead. The event is a hint;
// the verdict is deadPeers', as for a scan: the key may be back, or the
// server may have restarted too recently for an absent heartbeat to mean
// death.
func (e *expiryWatcher) runOnce(ctx context.Context, key string) {
	w := e.w
	id, ok := store.InstanceOfHeartbeat(w.opts.keyPrefix, key)
	if !ok || id == w.opts.instanceID {
		return
	}
	if dead, err := w.deadPeers(ctx, []string{id}); err != nil || len(dead) == 0 {
		return
	}
	w.recov.hand(id)
}
