package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
	w.noteRegistry(err)
	if isWrongType(err) {
		// One %w: the scan's callers split joined errors (unjoin).
		return nil, nil, fmt.Errorf("read registry %s: %w (%v)", w.registry, ErrRegistryWrongType, err)
	}
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
	err := w.rdb.SRem(opCtx, w.registry, peer).Err()
	w.noteRegistry(err)
	if isWrongType(err) {
		return nil // a key that is not a set lists nobody: nothing to remove
	}
	if err != nil {
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

// failedOnlyOnWrongTypeRegistry reports whether reg, the registry command
// of a pipeline, was refused with WRONGTYPE and every other command of it
// succeeded: everything else the pipeline had to do was done. (A pipeline
// that failed as a whole, a timeout say, may leave every command's error
// unset: that is not this case.)
func failedOnlyOnWrongTypeRegistry(cmds []redis.Cmder, reg redis.Cmder) bool {
	if !isWrongType(reg.Err()) {
		return false
	}
	for _, c := range cmds {
		if c != reg && c.Err() != nil {
			return false
		}
	}
	return true
}

// isWrongType reports whether err is Redis's WRONGTYPE reply: the key holds
// another type than the command needs.
func isWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

// noteRegistry records the outcome of a command on the registry key. A
// WRONGTYPE reply (someone wrote the key as a string, a hash...) starts an
// outage: no scan can find a dead peer and no worker can register until the
// key is deleted. It is counted every time, and logged at Error and emitted
// once per outage; the next success ends it. Other errors (a timeout, a
// node down) say nothing about the key and change nothing.
func (w *Worker) noteRegistry(err error) {
	switch {
	case err == nil:
		if w.stats.registryBroken.Swap(false) {
			w.log.Info("worker registry is a set again; scans find dead peers again",
				slog.String("registry_key", w.registry))
		}
	case isWrongType(err):
		w.stats.registryWrongType.Add(1)
		if !w.stats.registryBroken.Swap(true) {
			w.emit(Event{Kind: EventRegistryWrongType, Err: err})
			w.log.Error("worker registry key is not a set: recovery scans cannot find dead peers and workers cannot register; "+
				"expiry notifications and the backstop sweep still recover peers. Delete the key (DEL it): "+
				"every live worker re-registers with its next heartbeat",
				slog.String("registry_key", w.registry), slog.Any("error", err))
		}
	}
}
