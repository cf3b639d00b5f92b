package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alya/recovery/internal/store"
)

// Eviction: a Redis server with maxmemory and an evicting policy deletes
// keys under memory pressure. A volatile-* policy (volatile-lru is a
// common managed default) picks among keys with a TTL: the heartbeats, the
// rows sets, the claims. An evicted heartbeat makes a live worker look
// dead, and its rows would be reset under it; an allkeys-* policy can also
// evict the registry, which hides a dead worker from the scan.
//
// So Start reads the policy of every master (INFO memory: managed servers
// often rename CONFIG away) and refuses one that can evict, with
// ErrEvictionPolicy, unless WithEvictionAccepted. maxmemory 0 means no
// limit: such a server never evicts, whatever its policy, and passes. A
// server that does not answer INFO memory is refused too, accepted or not:
// the hold below reads INFO, and nothing else tells a live worker's
// evicted heartbeat from a death.
//
// The hold: every time a verdict finds heartbeats absent, the worker
// already asks their node's INFO (nodeage.go); that round trip carries
// INFO stats too, whose evicted_keys counts the keys the server evicted
// since it started. A count that moved since the worker's last look (or a
// first look at a node that has evicted anything) starts an episode: no
// absent heartbeat seen by an EXISTS sent less than one heartbeat TTL (the
// fleet's longest, fleetView.ttl) after that look counts as a death. The eviction happened before that
// look, and a live worker writes its heartbeat again within one
// heartbeat interval (< TTL) of losing it, so by then it is back. While
// the server keeps evicting, verdicts stay held and the held peers' rows
// sets are renewed (keepHeld); once it stops, the dead are judged one TTL
// later. The hold applies whether or not evictions were accepted: a
// policy or maxmemory changed after Start is caught the same way. With
// WithEvictionAccepted, a node whose INFO cannot be read at a verdict, or
// lacks evicted_keys, holds its verdicts too (it may be evicting).
//
// Every death verdict goes through it: the scan, expiry events and the
// backstop sweep (judgeDead), the sweep by row version without an owner
// column, whose verdict is "no rows set holds this row" (mastersTrusted: a
// live worker's rows set has a TTL too), and Start's recovery of a
// predecessor under its instance ID (predecessorHeld).

// memoryFacts is what INFO memory says of a node's eviction.
type memoryFacts struct {
	policy    string
	maxmemory int64
}

// evicts reports whether the node can evict keys: a limit and a policy
// other than noeviction (any other, including one newer than this code).
func (m memoryFacts) evicts() bool { return m.maxmemory > 0 && m.policy != "noeviction" }

// parseMemoryFacts reads maxmemory and maxmemory_policy from INFO memory.
func parseMemoryFacts(info string) (memoryFacts, error) {
	var (
		m                 memoryFacts
		havePol, haveSize bool
	)
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory_policy":
			m.policy, havePol = v, true
		case "maxmemory":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return m, fmt.Errorf("INFO maxmemory %q", v)
			}
			m.maxmemory, haveSize = n, true
		}
	}
	if !havePol || !haveSize {
		return m, fmt.Errorf("INFO memory lacks maxmemory or maxmemory_policy")
	}
	return m, nil
}

// checkEviction is Start's check of every master's eviction policy, before
// anything is written or judged. A server that cannot be reached is left
// to the first heartbeat's error, which explains it.
func (n *nodeWatch) checkEviction(ctx context.Context) error {
	opCtx, cancel := context.WithTimeout(ctx, 2*n.opts.opTimeout)
	defer cancel()
	infos, err := n.store.MemoryInfos(opCtx)
	if err != nil && !store.IsReply(err) {
		return &readError{err}
	}
	if err != nil {
		const why = "the worker's Redis user needs INFO (ACL +info): without it the worker cannot tell an evicted heartbeat from a dead worker"
		if store.IsAuthError(err) {
			// A missing permission is the ACL's refusal as much as a
			// policy the worker cannot trust: errors.Is finds either.
			return fmt.Errorf("%w: %w: %w; %s", ErrEvictionPolicy, ErrRedisAuth, err, why)
		}
		return fmt.Errorf("%w: %w; %s", ErrEvictionPolicy, err, why)
	}
	for _, node := range slices.Sorted(maps.Keys(infos)) {
		name := nodeLabel(node)
		m, err := parseMemoryFacts(infos[node])
		if err != nil {
			return fmt.Errorf("%w: read the eviction policy of %s: %w", ErrEvictionPolicy, name, err)
		}
		if !m.evicts() {
			continue
		}
		if !n.opts.evictionAccepted {
			return fmt.Errorf("%w: %s has maxmemory-policy %s with maxmemory %d: it can evict a live worker's heartbeat, and its rows would be reset under it; set maxmemory-policy noeviction (or maxmemory 0), or accept evictions with WithEvictionAccepted",
				ErrEvictionPolicy, name, m.policy, m.maxmemory)
		}
		n.log.Warn("redis may evict keys under memory pressure; accepted (WithEvictionAccepted): death verdicts are held while it evicts",
			slog.String("redis_node", name), slog.String("maxmemory_policy", m.policy), slog.Int64("maxmemory", m.maxmemory))
	}
	return nil
}

// nodeLabel names a node in a message: "" is the only server, or the
// master a failover client follows.
func nodeLabel(node string) string {
	if node == "" {
		return "the redis server"
	}
	return "redis node " + node
}

// sawEvictions records a look at evicted_keys (evicted < 0: not reported)
// in s, taken at recv.
func (s *nodeSeen) sawEvictions(evicted int64, recv time.Time) {
	switch {
	case evicted < 0:
		return
	case !s.evictLooked:
		// The first look cannot tell when the count moved: any eviction
		// counts as one just now.
		s.evictLooked = true
		if evicted > 0 {
			s.evictedAt = recv
		}
	case evicted != s.evicted:
		s.evictedAt = recv
	}
	s.evicted = evicted
}

// evictionHold returns the moment verdicts from the node at addr may count
// again after its evictions (zero: they count now), given an EXISTS sent
// at sent; first reports an episode not logged yet. unknown is set when
// the node's count could not be read at recv: with evictions accepted that
// holds for a TTL from recv.
func (a *nodeAges) evictionHold(addr string, sent, recv time.Time, ttl time.Duration, unknown, accepted bool) (until time.Time, first bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.nodes[addr]
	if s == nil {
		if a.nodes == nil {
			a.nodes = make(map[string]*nodeSeen)
		}
		s = &nodeSeen{}
		a.nodes[addr] = s
	}
	if unknown && accepted {
		s.evictedAt = recv
	}
	if s.evictedAt.IsZero() || !sent.Before(s.evictedAt.Add(ttl)) || mutantNoEvictionHold {
		s.evictWarned = false // the episode is over
		return time.Time{}, false
	}
	first = !s.evictWarned
	s.evictWarned = true
	return s.evictedAt.Add(ttl), first
}

// holdForEvictions applies the eviction hold to the peers of absent on the
// node at addr (f read at recv; err its INFO's error). It returns whether
// they are held, and logs the episode once.
func (n *nodeWatch) holdForEvictions(addr string, f nodeFacts, infoErr error, sent, recv time.Time, peers int) bool {
	unknown := infoErr != nil || f.evicted < 0
	until, first := n.ages.evictionHold(addr, sent, recv, n.fleet.ttl(), unknown, n.opts.evictionAccepted)
	if until.IsZero() {
		return false
	}
	if first {
		attrs := []any{slog.String("redis_node", nodeLabel(addr)), slog.Int("peers_held", peers),
			slog.Duration("held_for", until.Sub(recv))}
		if unknown {
			attrs = append(attrs, slog.Any("info_error", infoErr))
			n.log.Warn("dead peers not judged: evictions are accepted and the Redis server's evicted_keys cannot be read, so an absent heartbeat may have been evicted", attrs...)
		} else {
			attrs = append(attrs, slog.Int64("evicted_keys", f.evicted))
			n.log.Warn("dead peers not judged: the Redis server evicted keys less than a heartbeat TTL ago, so an absent heartbeat may be a live worker's", attrs...)
		}
	}
	return true
}

// predecessorHeld reports whether Start must not recover a predecessor
// under its own instance ID yet, whose heartbeat an EXISTS sent at sent
// found absent: its node is evicting (see above), so the heartbeat may be
// a live twin's, evicted.
func (n *nodeWatch) predecessorHeld(ctx context.Context, sent time.Time) bool {
	addr, err := n.store.NodeOf(ctx, n.opts.instanceID)
	if err != nil {
		return n.opts.evictionAccepted
	}
	f, err := n.nodeInfo(ctx, addr)
	recv := time.Now()
	if err == nil {
		n.ages.observe(addr, f, recv, n.fleet.ttl(), true)
	}
	return n.holdForEvictions(addr, f, err, sent, recv, 1)
}
