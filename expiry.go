package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/keys"
)

// Expiry-driven recovery: instead of waiting for the next scan, a worker
// subscribed to Redis keyspace notifications learns that a peer's heartbeat
// key expired the moment Redis expires it, and recovers that peer at once.
// Detection then takes about the heartbeat TTL instead of TTL + recovery
// interval. Notifications are fire-and-forget (a worker that is
// disconnected when one is sent misses it), so the periodic scan stays as
// the fallback.

// expiredChannel is the keyevent channel of expired keys, in every database.
const expiredChannel = "__keyevent@*__:expired"

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

// notificationsEnabled reports whether a notify-keyspace-events value
// includes keyevent notifications of expired keys.
func notificationsEnabled(flags string) bool {
	return strings.Contains(flags, "E") && (strings.Contains(flags, "x") || strings.Contains(flags, "A"))
}

// forEachMaster runs f on every master of a Cluster (concurrently), or on
// rdb itself.
func (w *Worker) forEachMaster(ctx context.Context, f func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := w.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return f(ctx, c) })
	}
	return f(ctx, w.rdb)
}

// prepareNotifications checks (and with configure, sets) the server's
// notify-keyspace-events on every master. It reports whether notifications
// of expired keys can be relied on; every problem is logged, none is fatal.
func (w *Worker) prepareNotifications(ctx context.Context) bool {
	opCtx, cancel := context.WithTimeout(ctx, 2*w.opts.opTimeout)
	defer cancel()
	err := w.forEachMaster(opCtx, func(ctx context.Context, c redis.UniversalClient) error {
		cfg, err := c.ConfigGet(ctx, "notify-keyspace-events").Result()
		if err != nil {
			return fmt.Errorf("read notify-keyspace-events: %w", err)
		}
		flags := cfg["notify-keyspace-events"]
		if notificationsEnabled(flags) {
			return nil
		}
		if !w.opts.expiryConfigure {
			return fmt.Errorf("notify-keyspace-events is %q, without E and x", flags)
		}
		if err := c.ConfigSet(ctx, "notify-keyspace-events", flags+"Ex").Err(); err != nil {
			return fmt.Errorf("set notify-keyspace-events: %w", err)
		}
		w.log.Warn("enabled keyspace notifications of expired keys on the server (CONFIG SET notify-keyspace-events); set it in the server's configuration to keep it across restarts",
			slog.String("notify_keyspace_events", flags+"Ex"))
		return nil
	})
	if err != nil {
		w.log.Warn("expiry notifications unavailable; dead peers are found by the periodic scan only", slog.Any("error", err))
		return false
	}
	return true
}

// subscribeExpired subscribes to expired-key events on every master.
func (w *Worker) subscribeExpired(ctx context.Context) ([]*redis.PubSub, error) {
	var (
		mu   sync.Mutex // ForEachMaster calls f concurrently
		subs []*redis.PubSub
	)
	opCtx, cancel := context.WithTimeout(ctx, 2*w.opts.opTimeout)
	defer cancel()
	err := w.forEachMaster(opCtx, func(ctx context.Context, c redis.UniversalClient) error {
		ps := c.PSubscribe(context.Background(), expiredChannel)
		if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
			ps.Close()
			return err
		}
		mu.Lock()
		subs = append(subs, ps)
		mu.Unlock()
		return nil
	})
	if err != nil {
		for _, ps := range subs {
			ps.Close()
		}
		return nil, fmt.Errorf("subscribe to %s: %w", expiredChannel, err)
	}
	return subs, nil
}

// watchExpired forwards the IDs of peers whose heartbeat expired, as one
// master reports them, to the recovery loop until ctx is done; then it
// closes the subscription. A peer is forwarded only if deadPeers, asked
// then, finds it dead.
func (w *Worker) watchExpired(ctx context.Context, ps *redis.PubSub) {
	defer ps.Close()
	prefix, suffix := w.opts.keyPrefix+"_{", "}_HEARTBEAT"
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			key := m.Payload
			if !strings.HasPrefix(key, prefix) || !strings.HasSuffix(key, suffix) || len(key) < len(prefix)+len(suffix) {
				continue
			}
			id := key[len(prefix) : len(key)-len(suffix)]
			if id == w.opts.instanceID || keys.ValidateName(id) != nil {
				continue
			}
			// The event is a hint; the verdict is deadPeers', as for a
			// scan: the key may be back, or the server may have restarted
			// too recently for an absent heartbeat to mean death.
			if dead, err := w.deadPeers(ctx, []string{id}); err != nil || len(dead) == 0 {
				continue
			}
			select {
			case w.expired <- id:
			default: // the loop is busy; the periodic scan will find the peer
			}
		}
	}
}
