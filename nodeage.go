package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alya/recovery/internal/store"
)

// Node age: no death verdict from a Redis server that may have forgotten
// live heartbeats and has not been up long enough for every live worker to
// write its heartbeat again.
//
// A server restarted from an RDB (or AOF) file written more than a TTL ago
// brings back the registry and rows sets, while the heartbeats in the file
// have already expired; a promoted replica may lack the last heartbeat
// writes its old master acknowledged. Until each live worker's next
// heartbeat (at most one heartbeat interval, < 0.9 × TTL, after it can reach
// the server again) such a server reports live workers dead. So an absent
// heartbeat counts only if the EXISTS that saw it was sent at least one
// heartbeat TTL after the latest moment the answering node may have started
// with old data or been promoted ("since" below).
//
// The node is asked (INFO server, replication, persistence: one round trip)
// only when one of its heartbeat keys was found absent, after that EXISTS,
// so a restart between the two is seen too: never on the Track/Untrack
// path, at most once per scan per node. What the worker saw is remembered
// per node (the only server, or a Cluster master's address), and:
//
//   - a node started with data (keys loaded from disk, AOF on, or data it
//     got as a replica) less than a TTL ago: since = its start, from
//     uptime_in_seconds;
//   - a node whose run_id or master_replid differs from what the worker saw
//     before, or a Cluster master the worker did not know while it knew the
//     others, that was promoted or restarted from a file (second_repl_offset
//     set): since = now, the promotion time being unknown but not later;
//   - a node that answers as a replica: no verdict this time.
//
// A server that started empty cannot hold a stale registry, so on a first
// look it holds nothing back; but a restart the worker saw (the run ID
// changed) holds verdicts for a TTL from the start whatever the server
// loaded: the registry a scan read may come from before the restart. Start records every master, so a failover after Start is a
// change; a Worker that first looks at a node within a TTL after that node
// was promoted can only go by its uptime (docs/safety.md).

// nodeFacts is what one INFO says about a node.
type nodeFacts struct {
	runID, replID string
	master        bool
	uptime        time.Duration // uptime_in_seconds: now − start, both in whole Unix seconds
	// withData: the node may have started with data older than its start:
	// keys loaded from a file, AOF on, or an unknown count (Redis < 7).
	withData bool
	// shifted: second_repl_offset is set: the node was promoted, or
	// restarted from a file, since its start.
	shifted bool
	// evicted is evicted_keys (INFO stats); -1 when not reported.
	evicted int64
}

// parseNodeFacts reads the INFO server, replication and persistence
// sections. run_id, uptime_in_seconds and role are required.
func parseNodeFacts(info string) (nodeFacts, error) {
	var (
		f                         = nodeFacts{evicted: -1}
		haveRun, haveUp, haveRole bool
		loaded                    = "" // rdb_last_load_keys_loaded; absent before Redis 7
		aof                       bool
	)
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "run_id":
			f.runID, haveRun = v, true
		case "uptime_in_seconds":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return f, fmt.Errorf("INFO uptime_in_seconds %q", v)
			}
			f.uptime, haveUp = time.Duration(min(n, 1<<32))*time.Second, true
		case "role":
			f.master, haveRole = v == "master", true
		case "master_replid":
			f.replID = v
		case "second_repl_offset":
			f.shifted = v != "-1"
		case "rdb_last_load_keys_loaded":
			loaded = v
		case "aof_enabled":
			aof = v == "1"
		case "evicted_keys":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				f.evicted = n
			}
		}
	}
	if !haveRun || !haveUp || !haveRole {
		return f, fmt.Errorf("INFO lacks run_id, uptime_in_seconds or role")
	}
	f.withData = loaded != "0" || aof || f.shifted
	return f, nil
}

// nodeSeen is what a worker remembers of one node.
type nodeSeen struct {
	runID, replID string
	since         time.Time // zero: nothing to hold back for
	warned        bool      // the hold was logged
	// What eviction.go remembers: evicted_keys at the last look, the
	// last look that saw it move, and whether this episode was logged.
	evicted                  int64
	evictedAt                time.Time
	evictLooked, evictWarned bool
}

// nodeAges is the worker's memory of the nodes it asked.
type nodeAges struct {
	mu          sync.Mutex
	nodes       map[string]*nodeSeen
	infoFailing bool // INFO could not be read; logged once per outage
}

// observe records what an INFO answered at recv says about the node at
// addr and returns the moment verdicts from it may count again (zero: now).
// first reports a hold not logged yet. initial is set for the look at
// Start, when no master is new to the worker for having changed.
func (a *nodeAges) observe(addr string, f nodeFacts, recv time.Time, ttl time.Duration, initial bool) (until time.Time, first bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !f.master {
		return recv.Add(ttl), false // a replica, or a stale route: ask again next time
	}
	if a.nodes == nil {
		a.nodes = make(map[string]*nodeSeen)
	}
	s, known := a.nodes[addr]
	if !known || s.runID != f.runID || s.replID != f.replID {
		changed := known || (!initial && len(a.nodes) > 0)
		ns := &nodeSeen{runID: f.runID, replID: f.replID}
		// uptime_in_seconds is the difference of two whole Unix seconds:
		// it overstates the time since the start by up to a second. A
		// restart this worker saw holds verdicts back even if the server
		// started empty: a scan may have read the registry before the
		// restart and the heartbeats after it, or a live worker's Track
		// may have written its rows set again before its next heartbeat
		// (found by the simulation, seed 1365).
		restarted := known && s.runID != f.runID
		if up := max(f.uptime-time.Second, 0); (f.withData || restarted) && up < ttl {
			ns.since = recv.Add(-up)
		}
		if changed && f.shifted {
			ns.since = recv
		}
		a.nodes[addr] = ns
		s = ns
	}
	s.sawEvictions(f.evicted, recv)
	if s.since.IsZero() || !recv.Before(s.since.Add(ttl)) {
		return time.Time{}, false
	}
	first = !s.warned
	s.warned = true
	return s.since.Add(ttl), first
}

// nodeWatch is this worker's watch on the Redis nodes: their ages and what
// they evicted (ages), the holds on death verdicts both call for, and
// Start's check of the eviction policy (eviction.go). The judge, the row
// sweep, expiry events and Start share one, built in New.
type nodeWatch struct {
	ages  nodeAges
	store store.Store
	log   *slog.Logger
	opts  *options // read-only after New
	fleet *fleetView
}

// nodeInfo asks one node (as the store names it) for the facts of its age
// in one round trip.
func (n *nodeWatch) nodeInfo(ctx context.Context, node string) (nodeFacts, error) {
	opCtx, cancel := n.opts.opContext(ctx)
	defer cancel()
	info, err := n.store.NodeInfo(opCtx, node)
	if err != nil {
		return nodeFacts{}, err
	}
	return parseNodeFacts(info)
}

// observeNodes records every master as it is now, so that a restart or a
// failover after this is seen as a change. Start calls it; a failure only
// leaves the memory empty.
func (n *nodeWatch) observeNodes(ctx context.Context) {
	now := time.Now()
	opCtx, cancel := context.WithTimeout(ctx, 2*n.opts.opTimeout)
	defer cancel()
	infos, _ := n.store.MasterInfos(opCtx)
	for node, info := range infos {
		if f, err := parseNodeFacts(info); err == nil {
			n.ages.observe(node, f, now, n.fleet.ttl(), true)
		}
	}
}

// youngNodeHolds returns the peers of absent whose death may be judged: it
// drops those whose heartbeat key lives on a node that has not been up for
// a heartbeat TTL (see above) since sent, when their EXISTS was sent, or
// that evicted keys less than a TTL before (eviction.go). If a node's INFO
// cannot be read (a server that forbids INFO) the peers are judged as
// before, and that is logged once, unless evictions are accepted.
//
// With strict (the backstop sweep, whose candidates come from PostgreSQL,
// not from the registry), a node that started empty less than a TTL ago
// holds its verdicts too: it has forgotten the heartbeats of live workers
// whose rows the database still names, and two sightings a TTL apart
// could both fall right after two such restarts.
func (n *nodeWatch) youngNodeHolds(ctx context.Context, absent []string, sent time.Time, strict bool) []string {
	byAddr := map[string][]int{} // node -> indexes of absent
	var order []string
	kept := make([]bool, len(absent))
	for i, peer := range absent {
		addr, err := n.store.NodeOf(ctx, peer)
		if err != nil {
			continue // unknown node: not judged now
		}
		if _, ok := byAddr[addr]; !ok {
			order = append(order, addr)
		}
		byAddr[addr] = append(byAddr[addr], i)
	}
	for _, addr := range order {
		peers := byAddr[addr]
		f, err := n.nodeInfo(ctx, addr)
		recv := time.Now()
		if err != nil {
			if n.holdForEvictions(addr, f, err, sent, recv, len(peers)) {
				continue
			}
			n.infoUnavailable(err)
			for _, i := range peers {
				kept[i] = true
			}
			continue
		}
		n.infoAvailable()
		until, first, youngOnly := n.nodeHold(addr, f, recv, strict)
		if n.holdForEvictions(addr, f, nil, sent, recv, len(peers)) {
			continue
		}
		if until.IsZero() || !sent.Before(until) {
			for _, i := range peers {
				kept[i] = true
			}
			continue
		}
		switch {
		case first && youngOnly:
			n.log.Debug("backstop sweep: owners without a heartbeat not judged yet: the Redis server has been up for less than a heartbeat TTL, so live workers may not have written their heartbeat to it yet",
				slog.String("redis_node", addr), slog.Duration("uptime", f.uptime), slog.Int("peers_held", len(peers)),
				slog.Duration("held_for", until.Sub(recv)))
		case first:
			n.log.Warn("dead peers not judged yet: the Redis server restarted or was promoted less than a heartbeat TTL ago, so live workers may not have written their heartbeat again",
				slog.String("redis_node", addr), slog.String("run_id", f.runID),
				slog.Duration("uptime", f.uptime), slog.Int("peers_held", len(peers)),
				slog.Duration("held_for", until.Sub(recv)))
		}
	}
	out := absent[:0:0]
	for i, p := range absent {
		if kept[i] {
			out = append(out, p)
		}
	}
	return out
}

// nodeHold returns the moment verdicts from the node at addr, whose INFO
// answered f at recv, may count again (zero: now), and whether that hold
// is new. strict holds a node that started empty too (see youngNodeHolds);
// youngOnly says nothing changed on the node but its youth: it only started
// less than a TTL ago (a new deployment, a test's server), which is no
// incident to warn of.
func (n *nodeWatch) nodeHold(addr string, f nodeFacts, recv time.Time, strict bool) (until time.Time, first, youngOnly bool) {
	ttl := n.fleet.ttl() // the longest any live member uses (fleet.go)
	until, first = n.ages.observe(addr, f, recv, ttl, false)
	if up := max(f.uptime-time.Second, 0); strict && up < ttl {
		if u := recv.Add(ttl - up); u.After(until) {
			youngOnly = until.IsZero()
			until, first = u, true
		}
	}
	return until, first, youngOnly
}

func (n *nodeWatch) infoUnavailable(err error) {
	n.ages.mu.Lock()
	first := !n.ages.infoFailing
	n.ages.infoFailing = true
	n.ages.mu.Unlock()
	if first {
		n.log.Warn("cannot read the Redis server's uptime (INFO); dead peers are judged without the restart check",
			slog.Any("error", err))
	}
}

func (n *nodeWatch) infoAvailable() {
	n.ages.mu.Lock()
	n.ages.infoFailing = false
	n.ages.mu.Unlock()
}
