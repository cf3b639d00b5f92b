package recovery

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/keys"
)

// The registry is a Redis set of every instance ID in the fleet. Workers add
// themselves on every heartbeat, so a registry lost with a Redis restart is
// whole again within one heartbeat interval. Recovery reads it instead of
// SCAN, which does not work across Redis Cluster nodes.

// registeredPeers returns the registry's valid members other than this
// worker, and the members that are not valid instance IDs.
func (w *Worker) registeredPeers(ctx context.Context) (peers, invalid []string, err error) {
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	all, err := w.rdb.SMembers(opCtx, w.registry).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read registry %s: %w", w.registry, err)
	}
	peers = make([]string, 0, len(all))
	for _, id := range all {
		switch {
		case id == w.opts.instanceID:
		case keys.ValidateName(id) != nil:
			invalid = append(invalid, id)
		default:
			peers = append(peers, id)
		}
	}
	return peers, invalid, nil
}

// deadPeers returns the peers whose heartbeat key is absent on a node that
// has been up long enough for the absence to mean death. It asks about all
// of them in one pipelined round trip (one per node on Cluster); only if a
// heartbeat is absent, it then asks that key's node its age (nodeage.go),
// once per node: a server restarted from an old snapshot or a promoted
// replica may lack the heartbeats of live workers for up to one heartbeat
// interval. The scan, the backstop sweep and expiry events all get their
// verdicts here.
func (w *Worker) deadPeers(ctx context.Context, peers []string) ([]string, error) {
	if len(peers) == 0 {
		return nil, nil
	}
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(peers))
	for i, id := range peers {
		cmds[i] = pipe.Exists(opCtx, keys.For(w.opts.keyPrefix, id).Heartbeat)
	}
	sent := time.Now()
	_, err := pipe.Exec(opCtx)
	var dead, deadKeys []string
	failed := 0
	for i, c := range cmds {
		switch {
		case c.Err() != nil:
			failed++ // unknown, not dead: on Cluster one node may be down
		case c.Val() == 0:
			dead = append(dead, peers[i])
			deadKeys = append(deadKeys, keys.For(w.opts.keyPrefix, peers[i]).Heartbeat)
		}
	}
	if failed == len(cmds) {
		return nil, fmt.Errorf("check heartbeats of %d peers: %w", len(peers), err)
	}
	if len(dead) == 0 {
		return nil, nil
	}
	return w.youngNodeHolds(ctx, dead, deadKeys, sent), nil
}

// deregister removes a dead peer from the registry. If the peer's heartbeat
// came back meanwhile (it was only paused), it is put back, so a live
// worker is never left out of the registry until its next heartbeat.
func (w *Worker) deregister(ctx context.Context, peer string) error {
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	if err := w.rdb.SRem(opCtx, w.registry, peer).Err(); err != nil {
		return fmt.Errorf("deregister %s: %w", peer, err)
	}
	alive, err := w.rdb.Exists(opCtx, keys.For(w.opts.keyPrefix, peer).Heartbeat).Result()
	if err != nil {
		return fmt.Errorf("recheck heartbeat of %s: %w", peer, err)
	}
	if alive == 1 {
		if err := w.rdb.SAdd(opCtx, w.registry, peer).Err(); err != nil {
			return fmt.Errorf("re-register %s: %w", peer, err)
		}
	}
	return nil
}
