package store

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Failover on a Cluster. go-redis's ClusterClient learns a new slot map
// when a node answers MOVED or ASK, or when its map is older than
// ClusterOptions.ClusterStateReloadInterval (60 s by default since
// v9.22.0, 10 s before) and a command is sent. A master that dies answers
// nothing: the client retries the dead address for every command of its
// slots, and keeps doing so until the interval runs out, long after a
// replica was promoted (about cluster-node-timeout + 1 s). A heartbeat
// sent to the dead master fails all that time, so a live worker would
// lose its lease to a failover its Cluster finished in seconds.
//
// So the Store asks the client to reload its slot map (ReloadState, which
// sends CLUSTER SLOTS to one node, in the background) after a command
// fails in a way a changed Cluster explains: a network error or a timeout
// (the master is gone), CLUSTERDOWN (the Cluster has not promoted a
// replica yet), MASTERDOWN, TRYAGAIN, LOADING, READONLY, MOVED or ASK,
// and when the server ends a shard channel's subscription. It does so at
// most once per reloadEvery, so a dead master costs each worker one CLUSTER
// SLOTS a second, and a command sent after the promotion is routed to the
// new master within reloadEvery of the first failure after it.

// reloadEvery is the shortest time between two reloads of the slot map
// that one Store asks of its Cluster client: short beside a heartbeat
// TTL, so a failover costs a worker at most a second more than it costs
// the Cluster, and long beside a round trip, so a dead master does not
// flood the survivors with CLUSTER SLOTS.
const reloadEvery = time.Second

// slotMap reloads a Cluster client's slot map after a failure that may
// mean the Cluster changed masters.
type slotMap struct {
	cc   *redis.ClusterClient // nil: not a Cluster, nothing to reload
	last atomic.Int64         // UnixNano of the last reload asked
}

// after asks for a reload if err calls for one and none was asked in the
// last reloadEvery.
func (m *slotMap) after(err error) {
	if m.cc == nil || !topologyError(err) {
		return
	}
	m.reload()
}

// reload asks for a reload unless one was asked in the last reloadEvery:
// after a failure (after), or when a node said a slot moved (a shard
// channel's subscription ended by the server: LifeSub.Receive).
func (m *slotMap) reload() {
	if m.cc == nil {
		return
	}
	now, last := time.Now().UnixNano(), m.last.Load()
	if now-last < int64(reloadEvery) || !m.last.CompareAndSwap(last, now) {
		return
	}
	m.cc.ReloadState(context.Background())
}

// clusterStateReplies are the error replies of a node that a change of
// the Cluster's masters explains.
// MOVED and ASK reach the store only where go-redis does not follow them:
// a shard channel's SSUBSCRIBE (its reply comes through Receive), or a
// command whose redirections ran out.
var clusterStateReplies = []string{"CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "LOADING", "READONLY", "MOVED", "ASK"}

// topologyError reports whether err may come from a node that is gone or
// no longer serves what it did: every failure but a command's own error
// reply (WRONGTYPE, a script's error, ...), a missing key and a caller's
// cancellation, and those error replies a change of masters explains.
func topologyError(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // no reply: the connection failed or timed out
	}
	for _, p := range clusterStateReplies {
		if strings.HasPrefix(rerr.Error(), p) {
			return true
		}
	}
	return false
}

// IsMoved reports whether err is a Cluster node's redirection (MOVED or
// ASK): a shard channel's SSUBSCRIBE sent to a node that no longer holds
// its slot, since go-redis does not follow redirections on a subscription.
func IsMoved(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	return strings.HasPrefix(re.Error(), "MOVED ") || strings.HasPrefix(re.Error(), "ASK ")
}
