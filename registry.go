package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The registry is a Redis set of every instance ID in the fleet. Workers add
// themselves with every heartbeat (store.Beat), so a registry lost with a
// Redis restart is whole again within one heartbeat interval, and remove
// themselves at Shutdown (store.Leave); recoverers remove the dead
// (deregister). Recovery reads it instead of SCAN, which does not work
// across Redis Cluster nodes.

// judge is this worker's side of the registry: who is registered, which
// peers are dead (with the node-age and eviction holds of nodes), the
// removal of the dead, and the registry's health (noteRegistry). The scan,
// the backstop sweep, expiry events, the dead-peer path, the heartbeat and
// Shutdown share one, built in New.
type judge struct {
	store  store.Store
	log    *slog.Logger
	opts   *options // read-only after New
	nodes  *nodeWatch
	fleet  *fleetView
	stats  *counters
	events *dispatcher
}

// registeredPeers returns the registry's valid members other than this
// worker, and the members that are not valid instance IDs.
func (j *judge) registeredPeers(ctx context.Context) (peers, invalid []string, err error) {
	opCtx, cancel := j.opts.opContext(ctx)
	defer cancel()
	all, err := j.store.RegistryMembers(opCtx)
	j.noteRegistry(err)
	if store.IsWrongType(err) {
		// One %w: the scan's callers split joined errors (unjoin).
		return nil, nil, fmt.Errorf("%w (%v)", ErrRegistryWrongType, err)
	}
	if err != nil {
		return nil, nil, err
	}
	peers = make([]string, 0, len(all))
	for _, id := range all {
		switch {
		case id == j.opts.instanceID:
		case store.ValidateName(id) != nil:
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
func (j *judge) deadPeers(ctx context.Context, peers []string) ([]string, error) {
	return j.judgeDead(ctx, peers, false)
}

// deadOwners is deadPeers for the backstop sweep, whose candidates come
// from PostgreSQL: no verdict from a node that started less than a TTL ago,
// even empty (youngNodeHolds, strict).
func (j *judge) deadOwners(ctx context.Context, owners []string) ([]string, error) {
	return j.judgeDead(ctx, owners, true)
}

func (j *judge) judgeDead(ctx context.Context, peers []string, strict bool) ([]string, error) {
	if len(peers) == 0 {
		return nil, nil
	}
	opCtx, cancel := j.opts.opContext(ctx)
	defer cancel()
	sent := time.Now()
	live, err := j.store.Heartbeats(opCtx, peers)
	if err != nil {
		return nil, err
	}
	var dead []string
	for i, l := range live {
		if l == store.Absent {
			dead = append(dead, peers[i])
		}
	}
	if len(dead) == 0 || mutantNoNodeAgeHold {
		return dead, nil
	}
	judged := j.nodes.youngNodeHolds(ctx, dead, sent, strict)
	if len(judged) < len(dead) {
		j.keepHeld(ctx, dead, judged)
	}
	return judged, nil
}

// keepHeld renews the rows sets of the peers of dead whose verdict is held
// (those not in judged) as a claim would. Held after a failover, the first
// death is judged about two TTLs after its last heartbeat, plus the scan's
// wait: later than its rows set lives (3 × TTL) with the default recovery
// interval, and without the backstop sweep its rows were lost (simulation
// seed 1359, docs/reliability.md). The TTLs are only ever lengthened
// (store.KeepRows), and renewing a live worker's set is harmless: its own
// heartbeat does the same. A failure is retried by the
// next scan that holds the peer.
func (j *judge) keepHeld(ctx context.Context, dead, judged []string) {
	isJudged := make(map[string]bool, len(judged))
	for _, p := range judged {
		isJudged[p] = true
	}
	held := make([]string, 0, len(dead)-len(judged))
	for _, p := range dead {
		if !isJudged[p] {
			held = append(held, p)
		}
	}
	opCtx, cancel := j.opts.opContext(ctx)
	defer cancel()
	if err := j.store.KeepRows(opCtx, held, j.fleet.rowsTTL()); err != nil {
		j.log.Warn("renewing the rows sets of peers whose death is not judged yet failed; the next scan that holds them retries",
			slog.Int("peers_held", len(held)), slog.Any("error", err))
	}
}

// deregister removes a dead peer from the registry (store.Deregister puts
// it back if its heartbeat came back meanwhile).
func (j *judge) deregister(ctx context.Context, peer string) error {
	opCtx, cancel := j.opts.opContext(ctx)
	defer cancel()
	err := j.store.Deregister(opCtx, peer)
	j.noteRegistry(err)
	if store.IsWrongType(err) {
		return nil // a key that is not a set lists nobody: nothing to remove
	}
	return err
}

// noteRegistry records the outcome of a command on the registry key. A
// WRONGTYPE reply (someone wrote the key as a string, a hash...) starts an
// outage: no scan can find a dead peer and no worker can register until the
// key is deleted. It is counted every time, and logged at Error and emitted
// once per outage; the next success ends it. Other errors (a timeout, a
// node down) say nothing about the key and change nothing.
func (j *judge) noteRegistry(err error) {
	switch {
	case err == nil:
		if j.stats.registryBroken.Swap(false) {
			j.log.Info("worker registry is a set again; scans find dead peers again",
				slog.String("registry_key", j.store.Registry()))
		}
	case store.IsWrongType(err):
		j.stats.registryWrongType.Add(1)
		if !j.stats.registryBroken.Swap(true) {
			j.events.emit(Event{Kind: EventRegistryWrongType, Err: err})
			j.log.Error("worker registry key is not a set: recovery scans cannot find dead peers and workers cannot register; "+
				"expiry notifications and the backstop sweep still recover peers. Delete the key (DEL it): "+
				"every live worker re-registers with its next heartbeat",
				slog.String("registry_key", j.store.Registry()), slog.Any("error", err))
		}
	}
}
