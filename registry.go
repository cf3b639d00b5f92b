package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	deps  // the settings, the store, the log and the shared parts (worker.go)
	nodes *nodeWatch
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
// heartbeat is absent, it then asks that key's node its age (registry.go),
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
	// What registry.go remembers: evicted_keys at the last look, the
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
// Start's check of the eviction policy (registry.go). The judge, the row
// sweep, expiry events and Start share one, built in New.
type nodeWatch struct {
	deps // the settings, the store, the log and the shared parts (worker.go)
	ages nodeAges
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
// that evicted keys less than a TTL before (registry.go). If a node's INFO
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
	ttl := n.fleet.ttl() // the longest any live member uses (registry.go)
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
// already asks their node's INFO (registry.go); that round trip carries
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

// The fleet record (store.FleetKey): one key prefix serves one fleet.
//
// What the fleet serves (database, schema, table) is recorded under the
// prefix by the first worker that can tell (Start, or any heartbeat after
// a Redis restart or a rolling upgrade from workers that do not record
// it), and Start refuses a worker whose resetter serves something else
// (ErrFleetMismatch): two applications under one prefix would each take
// the other's dead workers for their own and reset the wrong table's rows.
// The mode (owner or rows set) is not part of it: a rolling owner-column
// rollout runs both modes in one fleet on purpose.
//
// Every heartbeat also announces the worker's timings there (heartbeat TTL,
// claim TTL, the longest wait for a scan after a death) and learns the
// longest of the fleet's live announcements. Those hold verdicts a worker
// takes on behalf of the whole fleet: after a Redis restart or failover,
// no death is judged until the longest TTL any live member uses has passed
// (registry.go), not the judge's own; a lease that comes back holds for the
// longest claim TTL; rows sets live long enough for the slowest scanner.
// The worker remembers what it learnt in its own memory (fleetMemory), so
// a Redis restarted empty, which has forgotten every announcement, does
// not shorten them. Workers of older versions announce nothing: a fleet
// mixing them gets their timings only from workers that share them.

// fleetView is this worker's side of the fleet record: what it announces,
// what it learnt of the others (mem), and the timings derived from both.
// The heartbeat, the scan, the sweep, the dead-peer path and Start share
// one.
type fleetView struct {
	mem   fleetMemory
	store store.Store
	log   *slog.Logger
	opts  *options
	mode  string // what the heartbeats announce: "owner" or "rows-set"
}

// check finds what this worker serves, and on which server, and
// records both under the prefix, or returns an error wrapping
// ErrFleetMismatch when the prefix serves something else, or the same
// names on another server. A record of the release before the server
// field is filled, not refused (a rolling upgrade). What it serves and
// where are what the resetter's Check read (checked: ResetterInfo's Serves
// and Server); a resetter that cannot tell (Serves empty) is not checked;
// nor, with WithoutSchemaCheck (which lets a worker start while
// PostgreSQL is down), is a worker whose resetter could not ask the
// database (checkSchema logged it). Start calls it before it writes
// anything else. It reports whether it read the fleet record (f): Start
// learns the members' timings from it.
func (v *fleetView) check(ctx context.Context, checked ResetterInfo) (f store.Fleet, read bool, err error) {
	serves, server := checked.Serves, checked.Server
	if serves == "" || mutantNoFleetCheck {
		return f, false, nil // the resetter cannot tell
	}
	opCtx, cancel := v.opts.opContext(ctx)
	defer cancel()
	f, err = v.store.RecordFleet(opCtx, serves, server)
	if err != nil {
		return f, false, err
	}
	if recorded, theirs, differs := f.Differs(serves, server); differs {
		return f, true, v.mismatch(recorded, theirs)
	}
	v.mem.setServes(serves, server)
	return f, true, nil
}

func (v *fleetView) mismatch(recorded, serves string) error {
	return fmt.Errorf("%w: %q serves %s, this worker serves %s; give each application its own key prefix (WithKeyPrefix), and once no worker of the recorded fleet runs under this prefix any more, delete the key %s",
		ErrFleetMismatch, v.opts.keyPrefix, recorded, serves, store.FleetKey(v.opts.keyPrefix))
}

// announcement is what this worker's heartbeats announce.
func (v *fleetView) announcement() store.Announcement {
	return store.Announcement{
		TTL: v.opts.heartbeatTTL, Claim: v.opts.claimTTL(),
		Wait: v.opts.detectionWindow() - v.opts.heartbeatTTL, Mode: v.mode,
	}
}

// note takes in what a heartbeat learnt of the fleet record.
func (v *fleetView) note(read store.FleetView, err error) {
	if err != nil {
		// The memory keeps what it had; the next heartbeat tries again. A
		// reply (a key of the wrong type) is logged once per outage; a
		// timeout is the heartbeat's to report.
		if store.IsReply(err) && v.mem.brokenOnce(true) {
			v.log.Warn("cannot write the fleet record: this worker's timings are not announced to its peers; delete the key if it is not a hash",
				slog.Any("error", err))
		}
		return
	}
	v.mem.brokenOnce(false)
	v.mem.learn(read.Longest, time.Now())
	serves, server := v.mem.served()
	if serves == "" || read.Serves == "" {
		return
	}
	if read.Serves == serves && (server == "" || read.Server == "" || read.Server == server) {
		return
	}
	if v.mem.warnOnce() {
		v.log.Error("the key prefix serves another fleet: its workers would recover this fleet's dead workers in their table, and ours in ours; give each application its own prefix (WithKeyPrefix)",
			slog.String("key_prefix", v.opts.keyPrefix), slog.String("recorded", read.Serves), slog.String("recorded_server", read.Server),
			slog.String("serves", serves), slog.String("server", server))
	}
}

// learnRecord reads the fleet record and learns every announcement in
// it, lapsed ones too (a record loaded from an old snapshot still lists
// the members it had then): a Worker that does not heartbeat (ops.RecoverNow
// before Start) learns the fleet's timings no other way, and Start learns
// them before its first heartbeat's recount drops the lapsed ones. A record that
// cannot be read leaves the memory as it was; the scan reports Redis
// failures itself.
func (v *fleetView) learnRecord(ctx context.Context) {
	opCtx, cancel := v.opts.opContext(ctx)
	f, err := v.store.ReadFleet(opCtx)
	cancel()
	if err != nil {
		return
	}
	v.learnMembers(f)
}

// learnMembers learns every announcement of the fleet record f.
func (v *fleetView) learnMembers(f store.Fleet) {
	now := time.Now()
	for _, m := range f.Members {
		v.mem.learn(m.Announcement, now)
	}
}

// fleetMemory is what a worker remembers of the fleet's announcements:
// the longest of each timing, kept until no announcement has repeated it
// for three of it (a member that announced it is dead or changed by then).
type fleetMemory struct {
	mu            sync.Mutex
	serves        string
	server        string
	warned        bool
	broken        bool // the record's last update got an error reply
	ttl, claim, w remembered
}

// remembered is one remembered timing and when it was last announced.
type remembered struct {
	d    time.Duration
	seen time.Time
}

// learn takes in a timing announced at now: a longer one replaces the
// memory at once, a shorter one only once the memory is three of itself
// old.
func (r *remembered) learn(d time.Duration, now time.Time) {
	d = min(d, maxAnnounced)
	if d >= r.d || now.Sub(r.seen) > satMul(r.d, 3) {
		r.d, r.seen = d, now
	}
}

// maxAnnounced caps an announced timing: a garbage value in Redis must not
// hold verdicts back for years. The longest a valid worker announces is a
// claim TTL, at most 4 × maxDuration.
const maxAnnounced = 4 * maxDuration

func (m *fleetMemory) learn(a store.Announcement, now time.Time) {
	if mutantOwnTimingsOnly {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ttl.learn(a.TTL, now)
	m.claim.learn(a.Claim, now)
	m.w.learn(a.Wait, now)
}

func (m *fleetMemory) longest() (ttl, claim, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ttl.d, m.claim.d, m.w.d
}

func (m *fleetMemory) setServes(serves, server string) {
	m.mu.Lock()
	m.serves, m.server = serves, server
	m.mu.Unlock()
}

// served is what this worker serves and its server, as Start recorded
// them ("" when not).
func (m *fleetMemory) served() (serves, server string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.serves, m.server
}

// brokenOnce records whether the record's update failed, and reports a
// failure that starts an outage.
func (m *fleetMemory) brokenOnce(failed bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := failed && !m.broken
	m.broken = failed
	return first
}

func (m *fleetMemory) warnOnce() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := !m.warned
	m.warned = true
	return first
}

// ttl is the longest heartbeat TTL of the fleet: this worker's, or a
// longer one a member announced. Verdicts held after a restart or a
// failover wait it out.
func (v *fleetView) ttl() time.Duration {
	ttl, _, _ := v.mem.longest()
	return max(v.opts.heartbeatTTL, ttl)
}

// claimTTL is the longest recovery claim TTL of the fleet: a lease
// that comes back is held for it, so that a recovery any member claimed
// meanwhile has ended.
func (v *fleetView) claimTTL() time.Duration {
	_, claim, _ := v.mem.longest()
	return max(v.opts.claimTTL(), claim)
}

// rowsTTL is how long this worker's rows set lives after a write: the
// option, lengthened by as much as a member's wait for a scan after a
// death (its recovery interval and scan turn) exceeds ours, so the set
// outlives the slowest scanner's first look by the margin the option
// keeps over our own.
func (v *fleetView) rowsTTL() time.Duration {
	_, _, wait := v.mem.longest()
	own := v.opts.detectionWindow() - v.opts.heartbeatTTL
	if wait <= own {
		return v.opts.rowsTTL
	}
	return min(satAdd(v.opts.rowsTTL, wait-own), maxAnnounced)
}

// incarnationTTL outlives the rows set by a heartbeat interval: the
// heartbeat writes both, Track renews only the set.
func (v *fleetView) incarnationTTL() time.Duration {
	return satAdd(v.rowsTTL(), v.opts.heartbeatInterval)
}

// failureNoteTTL is how long a failed recovery's note lives: as long as a
// rows set renewed now, and an interval more.
func (v *fleetView) failureNoteTTL() time.Duration {
	return satAdd(v.rowsTTL(), v.opts.recoveryInterval)
}
