//go:build sim || simmutants

package recovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The deterministic simulation's Redis: an in-memory model of the Redis
// semantics the library relies on, on the bubble's fake clock. Keys are
// strings or sets with an absolute expiry (as Redis keeps them, and as an
// RDB file stores them); the six scripts of internal/store/scripts.go are
// mirrored line by line and run atomically under the world's lock; a
// pipeline runs as the Redis implementation sends it (one round trip, its
// commands in order); methods the Redis implementation sends in several
// round trips (Deregister, ReadRows) are several round trips here too.
//
// simStore is one worker's client: every round trip goes through
// simConn.roundTrip, which draws the latency and the faults (a reply lost
// after the command ran, retried as go-redis does; a server that is down)
// and blocks while the worker is paused.

// simKey is one key: a string or a set, with an absolute expiry (zero:
// none).
type simKey struct {
	str    string
	set    map[string]struct{}
	isSet  bool
	hash   map[string]string // the fleet record, the one hash
	expire time.Time
}

func (k *simKey) clone() *simKey {
	c := *k
	if k.isSet {
		c.set = maps.Clone(k.set)
	}
	c.hash = maps.Clone(k.hash)
	return &c
}

// simRedis is the server: its keys and what INFO says about it.
type simRedis struct {
	keys     map[string]*simKey
	runID    string
	replID   string
	started  time.Time // for uptime_in_seconds
	loaded   int       // rdb_last_load_keys_loaded
	shifted  bool      // second_repl_offset set: promoted
	downTill time.Time // refuses connections until then
	runs     int       // restarts and failovers, for run IDs
	// Evictions (maxmemory with volatile-lru under another application's
	// memory pressure): until evictTill, every round trip evicts one key
	// with a TTL, drawn from evictRng; evicted is INFO's evicted_keys.
	evictTill time.Time
	evictRng  *rand.Rand
	evicted   int64
	// When the last eviction struck, and each key evicted last was (the
	// bound check's: a rows set lost to an eviction is the sweep's).
	lastEvict time.Time
	evictedAt map[string]time.Time
	// subConns are the subscriber connections the server holds
	// (sim_witness_test.go).
	subConns map[*simSubConn]bool
}

func newSimRedis(now time.Time) *simRedis {
	return &simRedis{keys: map[string]*simKey{}, runID: "run0", replID: "repl0", started: now, subConns: map[*simSubConn]bool{}}
}

// get returns the live key, expiring it lazily.
func (r *simRedis) get(k string) *simKey {
	e, ok := r.keys[k]
	if !ok {
		return nil
	}
	if !e.expire.IsZero() && !time.Now().Before(e.expire) {
		delete(r.keys, k)
		return nil
	}
	return e
}

func (r *simRedis) getStr(k string) (string, bool) {
	e := r.get(k)
	if e == nil || e.isSet {
		return "", false
	}
	return e.str, true
}

func (r *simRedis) exists(k string) bool { return r.get(k) != nil }

// set is SET k v PX ttl (ttl 0: no expiry).
func (r *simRedis) set(k, v string, ttl time.Duration) {
	e := &simKey{str: v}
	if ttl > 0 {
		e.expire = time.Now().Add(ttl)
	}
	r.keys[k] = e
}

func (r *simRedis) del(ks ...string) {
	for _, k := range ks {
		delete(r.keys, k)
	}
}

func (r *simRedis) pexpire(k string, ttl time.Duration) {
	if e := r.get(k); e != nil {
		e.expire = time.Now().Add(ttl)
	}
}

func (r *simRedis) sadd(k string, ms ...string) {
	if len(ms) == 0 {
		return
	}
	e := r.get(k)
	if e == nil {
		e = &simKey{isSet: true, set: map[string]struct{}{}}
		r.keys[k] = e
	}
	for _, m := range ms {
		e.set[m] = struct{}{}
	}
}

func (r *simRedis) srem(k string, ms ...string) {
	e := r.get(k)
	if e == nil || !e.isSet {
		return
	}
	for _, m := range ms {
		delete(e.set, m)
	}
	if len(e.set) == 0 {
		delete(r.keys, k) // Redis deletes an emptied set
	}
}

func (r *simRedis) smembers(k string) []string {
	e := r.get(k)
	if e == nil || !e.isSet {
		return nil
	}
	return slices.Sorted(maps.Keys(e.set))
}

func (r *simRedis) sismember(k, m string) bool {
	e := r.get(k)
	if e == nil || !e.isSet {
		return false
	}
	_, ok := e.set[m]
	return ok
}

// pttl is PTTL as go-redis returns it: -2ns absent, -1ns no expiry.
func (r *simRedis) pttl(k string) time.Duration {
	e := r.get(k)
	switch {
	case e == nil:
		return -2
	case e.expire.IsZero():
		return -1
	}
	return e.expire.Sub(time.Now()).Truncate(time.Millisecond)
}

// snapshot copies every live key with its absolute expiry, as an RDB file
// would.
func (r *simRedis) snapshot() map[string]*simKey {
	out := make(map[string]*simKey, len(r.keys))
	for k := range r.keys {
		if e := r.get(k); e != nil {
			out[k] = e.clone()
		}
	}
	return out
}

// restart starts the server again with keys (nil: empty) after down: a
// new run ID; with keys, rdb_last_load_keys_loaded counts those still
// live.
func (r *simRedis) restart(keys map[string]*simKey, down time.Duration) {
	r.runs++
	now := time.Now()
	r.dropSubs() // a new process: no connection, no subscription
	r.keys = map[string]*simKey{}
	for k, e := range keys {
		r.keys[k] = e.clone()
	}
	r.loaded = 0
	for k := range r.keys {
		if r.get(k) != nil {
			r.loaded++
		}
	}
	r.runID = fmt.Sprintf("run%d", r.runs)
	r.replID = fmt.Sprintf("repl%d", r.runs)
	r.started = now.Add(down)
	r.shifted = false
	r.evicted = 0 // a new process: its stats start at zero
	r.downTill = now.Add(down)
}

// flush is FLUSHALL: every key gone, the server up all along (same run
// ID): what node age cannot see.
func (r *simRedis) flush() { r.keys = map[string]*simKey{} }

// failover promotes a replica that has keys (the master's state some
// moments ago): it was up all along, its run ID and replication ID are
// new and second_repl_offset is set.
func (r *simRedis) failover(keys map[string]*simKey, down time.Duration, replicaStarted time.Time) {
	r.restart(keys, down)
	r.started = replicaStarted
	r.loaded = 0
	r.shifted = true
}

// info is INFO server, replication and persistence, as registry.go reads
// them.
// evict evicts one key with a TTL while an eviction fault lasts, as a
// server over maxmemory does before it runs a command.
func (r *simRedis) evict() {
	if !time.Now().Before(r.evictTill) {
		return
	}
	var volatile []string
	for k, e := range r.keys {
		if !e.expire.IsZero() && r.get(k) != nil {
			volatile = append(volatile, k)
		}
	}
	if len(volatile) == 0 {
		return
	}
	slices.Sort(volatile)
	k := volatile[r.evictRng.IntN(len(volatile))]
	delete(r.keys, k)
	r.evicted++
	if r.evictedAt == nil {
		r.evictedAt = map[string]time.Time{}
	}
	r.lastEvict = time.Now()
	r.evictedAt[k] = r.lastEvict
}

func (r *simRedis) info() string {
	now := time.Now()
	off := "-1"
	if r.shifted {
		off = "1"
	}
	return fmt.Sprintf("run_id:%s\nuptime_in_seconds:%d\nrole:master\nmaster_replid:%s\nsecond_repl_offset:%s\nrdb_last_load_keys_loaded:%d\naof_enabled:0\nevicted_keys:%d\n",
		r.runID, now.Unix()-r.started.Unix(), r.replID, off, r.loaded, r.evicted)
}

// errSimConn is a connection refused, a reset or a read timeout: what a
// round trip to a server that is down, or whose reply was lost, returns.
var errSimConn = errors.New("sim: connection lost")

// simStore is one worker's view of the simulated Redis: the store.Store
// its Worker talks through.
type simStore struct {
	c      *simConn
	prefix string
}

var _ store.Store = (*simStore)(nil)

func (s *simStore) r() *simRedis { return s.c.world.redis }

func (s *simStore) Keys(id string) store.Keys { return store.InstanceKeys(s.prefix, id) }
func (s *simStore) Registry() string          { return store.RegistryKey(s.prefix) }

func idStrings(ids []int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}

// Beat is beatScript and the registry SADD in one pipeline.
func (s *simStore) Beat(ctx context.Context, id string, b store.Heartbeat) (store.BeatResult, error) {
	k := s.Keys(id)
	m := s.c.world.mut
	var res store.BeatResult
	err := s.c.roundTrip(ctx, "beat", func(r *simRedis) {
		res = store.BeatResult{}
		if v, ok := r.getStr(k.Heartbeat); ok && v != b.Value {
			res.Foreign = true
		} else {
			if c, ok := r.getStr(k.Claim); ok && !m.f8 && c != store.FailedClaim &&
				!strings.HasPrefix(c, "done:") && !strings.HasPrefix(c, "lost:") {
				r.del(k.Claim)
			}
			r.set(k.Heartbeat, b.Value, b.TTL)
			r.set(k.Incarnation, b.Incarnation, b.IncarnationTTL)
			r.srem(k.Rows, idStrings(b.Remove)...)
			if !m.noRewrite {
				r.sadd(k.Rows, idStrings(b.Add)...)
			}
			r.pexpire(k.Rows, b.RowsTTL)
			res.Wrote = true
		}
		r.sadd(s.Registry(), id)
		res.Fleet = r.fleetBeat(store.FleetKey(s.prefix), id, b)
	})
	if err != nil {
		s.c.trace("heartbeat failed: %v", err)
		return store.BeatResult{RegistryErr: err}, fmt.Errorf("heartbeat %s: %w", k.Heartbeat, err)
	}
	s.c.trace("heartbeat: wrote %v, foreign %v, tracked %d", res.Wrote, res.Foreign, len(b.Add))
	return res, nil
}

func (s *simStore) TrackRows(ctx context.Context, id string, rows []int64, ttl time.Duration) error {
	k := s.Keys(id)
	return s.c.roundTrip(ctx, "track", func(r *simRedis) {
		r.sadd(k.Rows, idStrings(rows)...)
		r.pexpire(k.Rows, ttl)
	})
}

func (s *simStore) UntrackRows(ctx context.Context, id string, rows []int64) error {
	k := s.Keys(id)
	return s.c.roundTrip(ctx, "untrack", func(r *simRedis) { r.srem(k.Rows, idStrings(rows)...) })
}

func (s *simStore) RetrackRows(ctx context.Context, id string, rows []int64) error {
	k := s.Keys(id)
	return s.c.roundTrip(ctx, "retrack", func(r *simRedis) { r.sadd(k.Rows, idStrings(rows)...) })
}

func (s *simStore) RotateIncarnation(ctx context.Context, id string, gone []int64, next string, ttl time.Duration) error {
	k := s.Keys(id)
	return s.c.roundTrip(ctx, "rotate", func(r *simRedis) {
		r.srem(k.Rows, idStrings(gone)...)
		r.set(k.Incarnation, next, ttl)
	})
}

func (s *simStore) ReadOwn(ctx context.Context, id string) (store.Own, error) {
	k := s.Keys(id)
	var own store.Own
	err := s.c.roundTrip(ctx, "readown", func(r *simRedis) {
		v, _ := r.getStr(k.Heartbeat)
		own = store.Own{Value: v, PTTL: r.pttl(k.Heartbeat), Record: r.exists(k.Rows) || r.exists(k.Incarnation),
			RowsSet: r.exists(k.Rows)}
	})
	if err != nil {
		return store.Own{}, fmt.Errorf("read heartbeat %s: %w", k.Heartbeat, err)
	}
	return own, nil
}

// Leave is leaveScript on the heartbeat and on the scan turn, the
// registry SREM unless Stay, and the rows written back, in one pipeline.
func (s *simStore) Leave(ctx context.Context, id string, d store.Departure) (store.LeaveResult, error) {
	k := s.Keys(id)
	err := s.c.roundTrip(ctx, "leave", func(r *simRedis) {
		if v, ok := r.getStr(k.Heartbeat); ok && v == d.Value {
			r.del(k.Heartbeat)
		}
		if v, ok := r.getStr(store.ScanTurnKey(s.prefix)); ok && v == id {
			r.del(store.ScanTurnKey(s.prefix))
		}
		if !d.Stay {
			r.srem(s.Registry(), id)
			if e := r.get(store.FleetKey(s.prefix)); e != nil {
				delete(e.hash, "m:"+id)
			}
		}
		if len(d.Tracked) > 0 {
			r.sadd(k.Rows, idStrings(d.Tracked)...)
			r.pexpire(k.Rows, d.RowsTTL)
		}
		r.srem(k.Rows, idStrings(d.Unremoved)...)
	})
	return store.LeaveResult{Deregistered: !d.Stay}, err
}

func (s *simStore) RegistryMembers(ctx context.Context) ([]string, error) {
	var out []string
	err := s.c.roundTrip(ctx, "smembers", func(r *simRedis) { out = r.smembers(s.Registry()) })
	if err != nil {
		return nil, fmt.Errorf("read registry: %w", err)
	}
	return out, nil
}

func (s *simStore) IsRegistered(ctx context.Context, id string) (bool, error) {
	var ok bool
	err := s.c.roundTrip(ctx, "sismember", func(r *simRedis) { ok = r.sismember(s.Registry(), id) })
	return ok, err
}

// Deregister is three round trips, as the Redis implementation sends it.
func (s *simStore) Deregister(ctx context.Context, id string) error {
	s.c.trace("deregister %s", id)
	if err := s.c.roundTrip(ctx, "deregister", func(r *simRedis) { r.srem(s.Registry(), id) }); err != nil {
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	var alive bool
	if err := s.c.roundTrip(ctx, "exists", func(r *simRedis) { alive = r.exists(s.Keys(id).Heartbeat) }); err != nil {
		return fmt.Errorf("recheck heartbeat of %s: %w", id, err)
	}
	if alive {
		return s.c.roundTrip(ctx, "reregister", func(r *simRedis) { r.sadd(s.Registry(), id) })
	}
	return nil
}

// Records is the scan's pipelined read of the dead peers' records.
func (s *simStore) Records(ctx context.Context, peers []string) ([]store.Record, error) {
	out := make([]store.Record, len(peers))
	err := s.c.roundTrip(ctx, "records", func(r *simRedis) {
		for i, p := range peers {
			k := s.Keys(p)
			out[i] = store.Record{Rows: int64(len(r.smembers(k.Rows))), RowsTTL: r.pttl(k.Rows),
				IncarnationTTL: r.pttl(k.Incarnation), Claim: r.exists(k.Claim)}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the records of %d peers: %w", len(peers), err)
	}
	return out, nil
}

// DeregisterIdle is deregisterScript for each of ids, in one round trip.
func (s *simStore) DeregisterIdle(ctx context.Context, ids []string) (int, error) {
	removed := 0
	err := s.c.roundTrip(ctx, "deregister-idle", func(r *simRedis) {
		for _, id := range ids {
			k := s.Keys(id)
			if !r.exists(k.Heartbeat) && !r.exists(k.Rows) && r.sismember(s.Registry(), id) {
				r.srem(s.Registry(), id)
				removed++
			}
		}
	})
	s.c.trace("deregister idle %d: %v", len(ids), err)
	if err != nil {
		return 0, fmt.Errorf("deregister %d peers: %w", len(ids), err)
	}
	return removed, nil
}

func (s *simStore) Heartbeats(ctx context.Context, ids []string) ([]store.Liveness, error) {
	out := make([]store.Liveness, len(ids))
	err := s.c.roundTrip(ctx, "heartbeats", func(r *simRedis) {
		for i, id := range ids {
			out[i] = store.Absent
			if r.exists(s.Keys(id).Heartbeat) {
				out[i] = store.Alive
			}
		}
	})
	if err != nil && len(ids) > 0 {
		return make([]store.Liveness, len(ids)), fmt.Errorf("check heartbeats of %d peers: %w", len(ids), err)
	}
	return out, nil
}

// ClaimDead is claimScript.
func (s *simStore) ClaimDead(ctx context.Context, peer, token string, claimTTL, rowsTTL time.Duration) (store.ClaimResult, error) {
	k := s.Keys(peer)
	m := s.c.world.mut
	var res store.ClaimResult
	err := s.c.roundTrip(ctx, "claim", func(r *simRedis) {
		res = func() store.ClaimResult {
			if !m.claimNoRecheck && r.exists(k.Heartbeat) {
				return store.ClaimAlive
			}
			held, isHeld := r.getStr(k.Claim)
			failed := false
			switch {
			case isHeld && !m.f4 && (held == token || held == "lost:"+token):
			case isHeld && held == store.FailedClaim:
				failed = true
			case isHeld:
				return store.ClaimHeld
			}
			if r.exists(k.Rows) {
				r.set(k.Claim, token, claimTTL)
				s.c.claimAt[peer] = time.Now()
				if !m.f1 {
					for _, key := range []string{k.Rows, k.Incarnation} {
						if e := r.get(key); e != nil && (e.expire.IsZero() || time.Until(e.expire) < rowsTTL) {
							e.expire = time.Now().Add(rowsTTL)
						}
					}
				}
				return store.ClaimTaken
			}
			if failed || (isHeld && held == "lost:"+token) {
				r.set(k.Claim, "lost:"+token, claimTTL)
				s.c.claimAt[peer] = time.Now()
				return store.ClaimTakenLost
			}
			r.set(k.Claim, token, claimTTL)
			s.c.claimAt[peer] = time.Now()
			return store.ClaimTakenNoRecord
		}()
	})
	s.c.trace("claim %s: %d %v", peer, res, err)
	if res == store.ClaimTakenNoRecord || res == store.ClaimTakenLost {
		s.c.world.mu.Lock()
		s.c.world.unrecorded[peer] = true
		s.c.world.mu.Unlock()
	}
	if err != nil {
		return store.ClaimHeld, fmt.Errorf("claim: %w", err)
	}
	return res, nil
}

// KeepRows is keepScript for each peer, in one pipeline.
func (s *simStore) KeepRows(ctx context.Context, peers []string, rowsTTL time.Duration) error {
	if s.c.world.mut.noKeep {
		return nil
	}
	err := s.c.roundTrip(ctx, "keep", func(r *simRedis) {
		for _, p := range peers {
			for _, k := range []string{s.Keys(p).Rows, s.Keys(p).Incarnation} {
				if e := r.get(k); e != nil && !e.expire.IsZero() && time.Until(e.expire) < rowsTTL {
					e.expire = time.Now().Add(rowsTTL)
				}
			}
		}
	})
	s.c.trace("keep %v: %v", peers, err)
	return err
}

// ReadRows is a GET and one SSCAN page (the sets here are far smaller
// than a page): two round trips.
func (s *simStore) ReadRows(ctx context.Context, peer string) (string, []string, error) {
	k := s.Keys(peer)
	var inc string
	opCtx, cancel := context.WithTimeout(ctx, s.c.opTimeout)
	err := s.c.roundTrip(opCtx, "getinc", func(r *simRedis) { inc, _ = r.getStr(k.Incarnation) })
	cancel()
	if err != nil {
		return "", nil, fmt.Errorf("read incarnation %s: %w", k.Incarnation, err)
	}
	var members []string
	opCtx, cancel = context.WithTimeout(ctx, s.c.opTimeout)
	defer cancel()
	err = s.c.roundTrip(opCtx, "sscan", func(r *simRedis) {
		members = r.smembers(k.Rows)
		s.c.readAt[peer] = time.Now()
	})
	s.c.trace("read rows of %s: %s %v %v", peer, short(inc), members, err)
	if err != nil {
		return "", nil, fmt.Errorf("read rows set %s: %w", k.Rows, err)
	}
	return inc, members, nil
}

// LiveRows is SSCAN of a rows set that may change while it is read (the
// backstop sweep's look), without the incarnation.
func (s *simStore) LiveRows(ctx context.Context, id string) ([]string, error) {
	k := s.Keys(id)
	var members []string
	opCtx, cancel := context.WithTimeout(ctx, s.c.opTimeout)
	defer cancel()
	err := s.c.roundTrip(opCtx, "sscan", func(r *simRedis) { members = r.smembers(k.Rows) })
	if err != nil {
		return nil, fmt.Errorf("read rows set %s: %w", k.Rows, err)
	}
	return members, nil
}

// FinishRecovery is finishScript.
func (s *simStore) FinishRecovery(ctx context.Context, peer, token string, tombstoneTTL time.Duration) (store.FinishResult, error) {
	k := s.Keys(peer)
	m := s.c.world.mut
	var res store.FinishResult
	err := s.c.roundTrip(ctx, "finish", func(r *simRedis) {
		res = func() store.FinishResult {
			held, _ := r.getStr(k.Claim)
			if held == "lost:"+token {
				held = token
			}
			switch held {
			case "done:1:" + token:
				return store.FinishDone
			case "done:2:" + token:
				return store.FinishBack
			case token:
			default:
				return store.FinishLost
			}
			result := store.FinishBack
			if !r.exists(k.Heartbeat) || m.f8 {
				r.del(k.Rows, k.Incarnation)
				result = store.FinishDone
			}
			r.set(k.Claim, fmt.Sprintf("done:%d:%s", result, token), tombstoneTTL)
			return result
		}()
	})
	s.c.trace("finish %s: %d %v", peer, res, err)
	if err != nil {
		return store.FinishLost, fmt.Errorf("delete rows set after reset: %w", err)
	}
	return res, nil
}

// FailRecovery is failScript.
func (s *simStore) FailRecovery(ctx context.Context, peer, token string, noteTTL time.Duration) error {
	k := s.Keys(peer)
	err := s.c.roundTrip(ctx, "fail", func(r *simRedis) {
		if held, ok := r.getStr(k.Claim); ok && (held == token || held == "lost:"+token) {
			r.set(k.Claim, store.FailedClaim, noteTTL)
		}
	})
	s.c.trace("fail recovery of %s: %v", peer, err)
	return err
}

// DropClaim is dropScript.
func (s *simStore) DropClaim(ctx context.Context, peer, token string, noteTTL time.Duration) error {
	k := s.Keys(peer)
	err := s.c.roundTrip(ctx, "drop", func(r *simRedis) {
		switch held, _ := r.getStr(k.Claim); held {
		case token:
			r.del(k.Claim)
		case "lost:" + token:
			r.set(k.Claim, store.FailedClaim, noteTTL)
		}
	})
	s.c.trace("drop claim on %s: %v", peer, err)
	return err
}

// NoteUntracked is HSET and PEXPIRE of the untracked-rows hash.
func (s *simStore) NoteUntracked(ctx context.Context, notes map[string]string, ttl time.Duration) error {
	return s.c.roundTrip(ctx, "note-untracked", func(r *simRedis) {
		k := store.UntrackedKey(s.prefix)
		e := r.get(k)
		if e == nil {
			e = &simKey{hash: map[string]string{}}
			r.keys[k] = e
		}
		for id, n := range notes {
			e.hash[id] = n
		}
		r.pexpire(k, ttl)
	})
}

// UntrackedNote is HGET of id's note.
func (s *simStore) UntrackedNote(ctx context.Context, id string) (string, error) {
	var v string
	err := s.c.roundTrip(ctx, "untracked-note", func(r *simRedis) {
		if e := r.get(store.UntrackedKey(s.prefix)); e != nil {
			v = e.hash[id]
		}
	})
	return v, err
}

// TakeScanTurn is turnScript and the HGET of holder's untracked-rows note,
// in one round trip.
func (s *simStore) TakeScanTurn(ctx context.Context, holder string, ttl time.Duration) (store.TurnTake, string, error) {
	var note string
	held, err := s.takeTurnThen(ctx, "scanturn", store.ScanTurnKey(s.prefix), holder, ttl, func(r *simRedis) {
		if e := r.get(store.UntrackedKey(s.prefix)); e != nil {
			note = e.hash[holder]
		}
	})
	return store.TurnTake{Held: held}, note, err
}

func (s *simStore) TakeSweepTurn(ctx context.Context, holder string, ttl time.Duration) (store.TurnTake, error) {
	w := s.c.world
	key := store.SweepTurnKey(s.prefix)
	var held bool
	held, err := s.takeTurnThen(ctx, "sweepturn", key, holder, ttl, func(r *simRedis) {
		// The youngRedis class: the server restarted empty just before
		// the turn script ran (so the holder keeps its turn, and its
		// memory of earlier looks).
		if now := time.Now(); !now.Before(w.youngFrom) && now.Before(w.youngTill) {
			kept, _ := r.getStr(key)
			r.restart(nil, 0)
			if kept != "" {
				r.set(key, kept, ttl)
			}
			w.redisUp = now
			w.tracef("FAULT Redis restarted empty just before %s's sweep turn script", s.c.proc)
		}
	})
	return store.TurnTake{Held: held}, err
}

// takeTurn is turnScript.
// Each turn has a stream of its own: the scan and the sweep loops start at
// one instant.
func (s *simStore) takeTurn(ctx context.Context, op, key, holder string, ttl time.Duration) (bool, error) {
	return s.takeTurnThen(ctx, op, key, holder, ttl, func(*simRedis) {})
}

// takeTurnThen is takeTurn with then run in the same round trip.
func (s *simStore) takeTurnThen(ctx context.Context, op, key, holder string, ttl time.Duration, then func(*simRedis)) (bool, error) {
	var held bool
	err := s.c.roundTrip(ctx, op, func(r *simRedis) {
		defer then(r)
		v, ok := r.getStr(key)
		switch {
		case ok && v == holder:
			r.pexpire(key, ttl)
			held = true
		case !r.exists(key):
			r.set(key, holder, ttl)
			held = true
		default:
			held = false
		}
	})
	if err != nil {
		return false, fmt.Errorf("take %s: %w", key, err)
	}
	return held, nil
}

func (s *simStore) NodeOf(context.Context, string) (string, error) { return "", nil }

func (s *simStore) NodeInfo(ctx context.Context, node string) (string, error) {
	var info string
	err := s.c.roundTrip(ctx, "info", func(r *simRedis) { info = r.info() })
	if err != nil {
		return "", fmt.Errorf("read INFO: %w", err)
	}
	return info, nil
}

func (s *simStore) MasterInfos(ctx context.Context) (map[string]string, error) {
	info, err := s.NodeInfo(ctx, "")
	if err != nil {
		return nil, err
	}
	return map[string]string{"": info}, nil
}

func (s *simStore) Masters(context.Context) ([]string, error) { return []string{""}, nil }

func (s *simStore) EnableExpiredEvents(context.Context, string, bool) (string, error) {
	return "", errors.New("sim: expiry notifications are not modelled")
}

func (s *simStore) SubscribeExpired(context.Context, string) (store.Subscription, error) {
	return nil, errors.New("sim: expiry notifications are not modelled")
}

func (s *simStore) Turns(context.Context) (scan, sweep store.Turn, err error) {
	return scan, sweep, errors.New("sim: Turns is not modelled")
}

func (s *simStore) AppendHistory(context.Context, []string, int64) error {
	return errors.New("sim: the history is not modelled (workers run WithHistory(0))")
}

func (s *simStore) ReadHistory(context.Context, store.HistoryQuery) ([]store.HistoryRecord, error) {
	return nil, errors.New("sim: the history is not modelled")
}

func (s *simStore) MemoryInfos(context.Context) (map[string]string, error) {
	return map[string]string{"": "maxmemory:0\nmaxmemory_policy:noeviction\n"}, nil
}

func (s *simStore) Ping(context.Context) error { return nil }

// Describe models the TTLs the backstop sweep reads (sweep.go); the
// rest of an Instance is not modelled.
func (s *simStore) Describe(ctx context.Context, ids []string) ([]store.Instance, error) {
	var out []store.Instance
	err := s.c.roundTrip(ctx, "describe", func(r *simRedis) {
		out = out[:0]
		for _, id := range ids {
			k := s.Keys(id)
			out = append(out, store.Instance{ID: id, HeartbeatTTL: r.pttl(k.Heartbeat), RowsTTL: r.pttl(k.Rows)})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("describe %d instances: %w", len(ids), err)
	}
	return out, nil
}

// fleetHash returns the fleet record's fields, creating the key.
func (r *simRedis) fleetHash(key string) map[string]string {
	e := r.get(key)
	if e == nil {
		e = &simKey{hash: map[string]string{}}
		r.keys[key] = e
	}
	return e.hash
}

// fleetBeat is fleetBeatScript: the longest timings kept in one field,
// raised by a longer announcement, worked out afresh from the live
// announcements once due.
func (r *simRedis) fleetBeat(key, id string, b store.Heartbeat) store.FleetView {
	h := r.fleetHash(key)
	now := time.Now()
	if _, ok := h["serves"]; !ok && b.Serves != "" {
		h["serves"] = b.Serves
	}
	a := b.Announce
	h["m:"+id] = fmt.Sprintf("%d %d %d %s %d", a.TTL.Milliseconds(), a.Claim.Milliseconds(), a.Wait.Milliseconds(),
		a.Mode, now.Add(3*a.TTL).UnixMilli())
	v := store.FleetView{Serves: h["serves"]}
	var ttl, claim, wait, due int64
	if n, _ := fmt.Sscanf(h["longest"], "%d %d %d %d", &ttl, &claim, &wait, &due); n == 4 && now.UnixMilli() < due {
		ttl, claim, wait = max(ttl, a.TTL.Milliseconds()), max(claim, a.Claim.Milliseconds()), max(wait, a.Wait.Milliseconds())
		h["longest"] = fmt.Sprintf("%d %d %d %d", ttl, claim, wait, due)
	} else {
		ttl, claim, wait = 0, 0, 0
		for _, m := range store.ParseFleet(h).Members {
			if m.Expires.Before(now) {
				delete(h, "m:"+m.ID)
				continue
			}
			ttl, claim, wait = max(ttl, m.TTL.Milliseconds()), max(claim, m.Claim.Milliseconds()), max(wait, m.Wait.Milliseconds())
		}
		h["longest"] = fmt.Sprintf("%d %d %d %d", ttl, claim, wait, now.UnixMilli()+ttl)
	}
	v.Longest = store.Announcement{TTL: time.Duration(ttl) * time.Millisecond,
		Claim: time.Duration(claim) * time.Millisecond, Wait: time.Duration(wait) * time.Millisecond}
	return v
}

// RecordFleet is recordFleetScript (the simulated resetters name no
// server).
func (s *simStore) RecordFleet(ctx context.Context, serves, _ string) (store.Fleet, error) {
	var got store.Fleet
	err := s.c.roundTrip(ctx, "record-fleet", func(r *simRedis) {
		h := r.fleetHash(store.FleetKey(s.prefix))
		if _, ok := h["serves"]; !ok {
			h["serves"] = serves
		}
		got = store.ParseFleet(h)
	})
	if err != nil {
		return store.Fleet{}, fmt.Errorf("record fleet: %w", err)
	}
	return got, nil
}

// ReadFleet is HGETALL of the fleet record.
func (s *simStore) ReadFleet(ctx context.Context) (store.Fleet, error) {
	var f store.Fleet
	err := s.c.roundTrip(ctx, "read-fleet", func(r *simRedis) {
		if e := r.get(store.FleetKey(s.prefix)); e != nil {
			f = store.ParseFleet(e.hash)
		}
	})
	return f, err
}
