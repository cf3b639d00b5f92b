package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the Store over a go-redis client: a single server, a failover
// client or a Cluster. It never closes the client.
type Redis struct {
	rdb       redis.UniversalClient
	prefix    string
	registry  string
	opTimeout time.Duration // bounds each page of ReadRows

	slots slotMap // reloads a Cluster client's slot map after a failure (cluster.go)

	nodesMu sync.Mutex
	nodes   map[string]*redis.Client // Cluster masters named by NodeOf or Masters
}

// NewRedis returns the Store of the fleet under prefix in rdb. opTimeout
// bounds each call of a method that sends several in turn (ReadRows).
func NewRedis(rdb redis.UniversalClient, prefix string, opTimeout time.Duration) *Redis {
	s := &Redis{rdb: rdb, prefix: prefix, registry: RegistryKey(prefix), opTimeout: opTimeout,
		nodes: make(map[string]*redis.Client)}
	s.slots.cc, _ = rdb.(*redis.ClusterClient)
	return s
}

// failed hands the error of a method to the slot map (cluster.go): every
// method that sends a command defers it.
func (s *Redis) failed(err *error) { s.slots.after(*err) }

// Keys returns the key names of instance id.
func (s *Redis) Keys(id string) Keys { return InstanceKeys(s.prefix, id) }

// Registry returns the name of the registry key.
func (s *Redis) Registry() string { return s.registry }

// Beat runs beatScript on the instance's slot and the registry SADD in the
// same pipeline (another slot on Cluster). EVAL, not EVALSHA: a pipeline
// cannot fall back on NOSCRIPT, and the server caches the script by its
// hash either way.
func (s *Redis) Beat(ctx context.Context, id string, b Heartbeat) (_ BeatResult, err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	args := make([]any, 0, 6+len(b.Remove)+len(b.Add))
	args = append(args, b.Value, b.TTL.Milliseconds(), b.Incarnation,
		b.IncarnationTTL.Milliseconds(), b.RowsTTL.Milliseconds(), len(b.Remove))
	args = appendIDs(args, b.Remove)
	args = appendIDs(args, b.Add)
	pipe := s.rdb.Pipeline()
	script := beatScript.Eval(ctx, pipe, []string{k.Heartbeat, k.Incarnation, k.Rows, k.Claim, k.RowsSeen}, args...)
	reg := pipe.SAdd(ctx, s.registry, id)
	fleet := s.fleetBeat(ctx, pipe, id, b)
	oldest := pipe.Set(ctx, k.OldestRow, OldestRowValue(b.HoldsRows, b.OldestRowAge, b.TTL), b.TTL)
	cmds, err := pipe.Exec(ctx)
	wrote, scriptErr := script.Int()
	res := BeatResult{RegistryErr: reg.Err()}
	if scriptErr == nil {
		res.Foreign, res.Wrote = wrote == 0, wrote == 1
	}
	res.Fleet, res.FleetErr = fleetView(fleet)
	if res.FleetErr != nil {
		res.FleetErr = fmt.Errorf("fleet record %s: %w", FleetKey(s.prefix), res.FleetErr)
	}
	if err != nil && failedOnlyOn(cmds, reg, fleet, oldest) {
		// A registry key of the wrong type is the fleet's outage; this
		// instance's heartbeat and rows are written.
		err = nil
	}
	if err != nil {
		return res, fmt.Errorf("heartbeat %s: %w", k.Heartbeat, err)
	}
	return res, nil
}

// TrackRows sends SADD and PEXPIRE in one pipeline.
func (s *Redis) TrackRows(ctx context.Context, id string, rows []int64, ttl time.Duration) (err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	pipe := s.rdb.Pipeline()
	pipe.SAdd(ctx, k.Rows, appendIDs(nil, rows)...)
	pipe.PExpire(ctx, k.Rows, ttl)
	_, err = pipe.Exec(ctx)
	return err
}

// UntrackRows sends one SREM.
func (s *Redis) UntrackRows(ctx context.Context, id string, rows []int64) (err error) {
	defer s.failed(&err)
	return s.rdb.SRem(ctx, s.Keys(id).Rows, appendIDs(nil, rows)...).Err()
}

// RetrackRows sends one SADD.
func (s *Redis) RetrackRows(ctx context.Context, id string, rows []int64) (err error) {
	defer s.failed(&err)
	return s.rdb.SAdd(ctx, s.Keys(id).Rows, appendIDs(nil, rows)...).Err()
}

// RotateIncarnation sends SREM and SET in one MULTI.
func (s *Redis) RotateIncarnation(ctx context.Context, id string, gone []int64, next string, ttl time.Duration) (err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	pipe := s.rdb.TxPipeline()
	if len(gone) > 0 {
		pipe.SRem(ctx, k.Rows, appendIDs(nil, gone)...)
	}
	pipe.Set(ctx, k.Incarnation, next, ttl)
	_, err = pipe.Exec(ctx)
	return err
}

// ReadOwn reads the heartbeat, its TTL and whether a rows set or an
// incarnation exists, in one MULTI on the instance's slot.
func (s *Redis) ReadOwn(ctx context.Context, id string) (_ Own, err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	pipe := s.rdb.TxPipeline()
	get := pipe.Get(ctx, k.Heartbeat)
	pttl := pipe.PTTL(ctx, k.Heartbeat)
	rows, inc := pipe.Exists(ctx, k.Rows), pipe.Exists(ctx, k.Incarnation)
	if _, err = pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Own{}, fmt.Errorf("read heartbeat %s: %w", k.Heartbeat, err)
	}
	return Own{Value: get.Val(), PTTL: pttl.Val(), Record: rows.Val() > 0 || inc.Val() > 0, RowsSet: rows.Val() > 0}, nil
}

// Leave sends the clean-up in one pipeline: the heartbeat (while it holds
// d.Value), the oldest-row report, the scan turn (while it names id), and,
// unless d.Stay, the registry entry and the fleet record's member field.
// A registry that is not a set, or a fleet record that is not a hash (a
// stranger's write), lists nobody: their WRONGTYPE fails no departure, as
// it fails no heartbeat.
func (s *Redis) Leave(ctx context.Context, id string, d Departure) (_ LeaveResult, err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	pipe := s.rdb.Pipeline()
	leaveScript.Eval(ctx, pipe, []string{k.Heartbeat}, d.Value)
	pipe.Del(ctx, k.OldestRow) // the report goes with the heartbeat
	// The scan turn, if it still names this instance: left to its TTL, the
	// next taker would find it held by an instance with no heartbeat and
	// no registry entry, which it must take for a stranger's write.
	leaveScript.Eval(ctx, pipe, []string{ScanTurnKey(s.prefix)}, id)
	var reg, fleet redis.Cmder
	if !d.Stay {
		reg = pipe.SRem(ctx, s.registry, id)
		fleet = pipe.HDel(ctx, FleetKey(s.prefix), fleetMemberField+id)
	}
	if len(d.Tracked) > 0 {
		pipe.SAdd(ctx, k.Rows, appendIDs(nil, d.Tracked)...)
		pipe.PExpire(ctx, k.Rows, d.RowsTTL)
	}
	if len(d.Unremoved) > 0 {
		pipe.SRem(ctx, k.Rows, appendIDs(nil, d.Unremoved)...)
	}
	cmds, err := pipe.Exec(ctx)
	var res LeaveResult
	if reg != nil {
		res.Deregistered, res.RegistryErr = true, reg.Err()
		if err != nil && failedOnlyOnWrongType(cmds, reg, fleet) {
			err = nil // a key of another type lists nobody: nothing to remove
		}
	}
	return res, err
}

// RegistryMembers sends SMEMBERS.
func (s *Redis) RegistryMembers(ctx context.Context) (_ []string, err error) {
	defer s.failed(&err)
	all, err := s.rdb.SMembers(ctx, s.registry).Result()
	if err != nil {
		return nil, fmt.Errorf("read registry %s: %w", s.registry, err)
	}
	return all, nil
}

// IsRegistered sends SISMEMBER.
func (s *Redis) IsRegistered(ctx context.Context, id string) (_ bool, err error) {
	defer s.failed(&err)
	ok, err := s.rdb.SIsMember(ctx, s.registry, id).Result()
	if err != nil {
		return false, fmt.Errorf("read registry %s: %w", s.registry, err)
	}
	return ok, nil
}

// Deregister runs deregisterScript on a single server: the peer leaves
// the registry only while neither its heartbeat nor its rows set exists.
// On a Cluster, where the registry and the peer's keys live in different
// slots, it sends SREM, then EXISTS of the heartbeat, and SADD again if it
// exists: a peer that was only paused is never left out of the registry
// until its next heartbeat (a peer that came back, took rows and died
// again while the recoverer stalled between the two is found by expiry
// notifications or the backstop sweep; docs/safety.md).
func (s *Redis) Deregister(ctx context.Context, id string) (err error) {
	defer s.failed(&err)
	k := s.Keys(id)
	if _, cluster := s.rdb.(*redis.ClusterClient); !cluster {
		if err := deregisterScript.Run(ctx, s.rdb, []string{s.registry, k.Heartbeat, k.Rows}, id).Err(); err != nil {
			return fmt.Errorf("deregister %s: %w", id, err)
		}
		return nil
	}
	if err := s.rdb.SRem(ctx, s.registry, id).Err(); err != nil {
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	alive, err := s.rdb.Exists(ctx, k.Heartbeat).Result()
	if err != nil {
		return fmt.Errorf("recheck heartbeat of %s: %w", id, err)
	}
	if alive == 1 {
		if err := s.rdb.SAdd(ctx, s.registry, id).Err(); err != nil {
			return fmt.Errorf("re-register %s: %w", id, err)
		}
	}
	return nil
}

// Heartbeats pipelines one EXISTS per peer.
func (s *Redis) Heartbeats(ctx context.Context, ids []string) ([]Liveness, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.Exists(ctx, s.Keys(id).Heartbeat)
	}
	_, err := pipe.Exec(ctx)
	s.slots.after(err) // even when other nodes answered: one may be gone
	out := make([]Liveness, len(ids))
	answered := 0
	for i, c := range cmds {
		switch {
		case c.Err() != nil: // unknown, not dead: on Cluster one node may be down
		case c.Val() == 0:
			out[i], answered = Absent, answered+1
		default:
			out[i], answered = Alive, answered+1
		}
	}
	if answered == 0 && len(ids) > 0 {
		return out, fmt.Errorf("check heartbeats of %d peers: %w", len(ids), err)
	}
	return out, nil
}

// Records pipelines one EXISTS of the rows set, incarnation, claim and
// rows-seen key per peer (keys of one slot), then, for the peers that have
// any, SCARD, PTTL, PTTL, EXISTS, GET, GET: a mass death of registry
// entries alone costs one command each.
func (s *Redis) Records(ctx context.Context, peers []string) (_ []Record, err error) {
	defer s.failed(&err)
	pipe := s.rdb.Pipeline()
	any := make([]*redis.IntCmd, len(peers))
	for i, id := range peers {
		k := s.Keys(id)
		any[i] = pipe.Exists(ctx, k.Rows, k.Incarnation, k.Claim, k.RowsSeen)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read the records of %d peers: %w", len(peers), err)
	}
	out := make([]Record, len(peers))
	type cmds struct {
		i               int
		rows, claim     *redis.IntCmd
		rowsTTL, incTTL *redis.DurationCmd
		seen, inc       *redis.StringCmd
	}
	var cs []cmds
	pipe = s.rdb.Pipeline()
	for i, id := range peers {
		out[i] = Record{RowsTTL: -2, IncarnationTTL: -2}
		if any[i].Val() == 0 {
			continue
		}
		k := s.Keys(id)
		cs = append(cs, cmds{i: i, rows: pipe.SCard(ctx, k.Rows), rowsTTL: pipe.PTTL(ctx, k.Rows),
			incTTL: pipe.PTTL(ctx, k.Incarnation), claim: pipe.Exists(ctx, k.Claim),
			seen: pipe.Get(ctx, k.RowsSeen), inc: pipe.Get(ctx, k.Incarnation)})
	}
	if len(cs) == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the records of %d peers: %w", len(cs), err)
	}
	for _, c := range cs {
		// Exec names the first failed command, and an absent key's GET
		// (redis.Nil) may come before a real failure.
		for _, cmd := range []redis.Cmder{c.rows, c.claim, c.rowsTTL, c.incTTL, c.seen, c.inc} {
			if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("read the records of %d peers: %w", len(cs), err)
			}
		}
		out[c.i] = Record{Rows: c.rows.Val(), RowsTTL: c.rowsTTL.Val(), IncarnationTTL: c.incTTL.Val(),
			Claim: c.claim.Val() == 1, RowsSeen: rowsSeen(c.seen.Val(), c.inc)}
	}
	return out, nil
}

// rowsSeen returns the rows count a rows-seen key's value ("<rows>
// <incarnation>", keepScript) gives, when it names the life whose
// incarnation inc read (or inc found none); 0 otherwise: a later life's
// set is not the one seen.
func rowsSeen(v string, inc *redis.StringCmd) int64 {
	count, life, ok := strings.Cut(v, " ")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	if cur, err := inc.Result(); err == nil && cur != life {
		return 0
	}
	return n
}

// DeregisterIdle pipelines deregisterScript (by its hash) per peer on a
// single server; on a Cluster it sends the SREM, then pipelines one EXISTS
// of each peer's heartbeat and rows set (one slot), then the SADD of the
// peers that have either (or did not answer) back: Deregister's sequence,
// which also checks the rows set.
func (s *Redis) DeregisterIdle(ctx context.Context, ids []string) (_ int, err error) {
	defer s.failed(&err)
	if len(ids) == 0 {
		return 0, nil
	}
	if _, cluster := s.rdb.(*redis.ClusterClient); !cluster {
		// Loaded first, so the pipeline sends its hash, not its body, per
		// peer; a server that lost it meanwhile fails the batch (NOSCRIPT),
		// which the next scan sends again.
		if err := deregisterScript.Load(ctx, s.rdb).Err(); err != nil {
			return 0, fmt.Errorf("deregister %d peers: %w", len(ids), err)
		}
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(ids))
		for i, id := range ids {
			k := s.Keys(id)
			cmds[i] = deregisterScript.EvalSha(ctx, pipe, []string{s.registry, k.Heartbeat, k.Rows}, id)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, fmt.Errorf("deregister %d peers: %w", len(ids), err)
		}
		removed := 0
		for _, c := range cmds {
			if n, _ := c.Int(); n == 1 {
				removed++
			}
		}
		return removed, nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	if err := s.rdb.SRem(ctx, s.registry, members...).Err(); err != nil {
		return 0, fmt.Errorf("deregister %d peers: %w", len(ids), err)
	}
	// The heartbeat and the rows set share a slot: one EXISTS each.
	pipe := s.rdb.Pipeline()
	held := make([]*redis.IntCmd, len(ids))
	for i, id := range ids {
		k := s.Keys(id)
		held[i] = pipe.Exists(ctx, k.Heartbeat, k.Rows)
	}
	_, err = pipe.Exec(ctx)
	var back []any
	for i, c := range held {
		if c.Err() != nil || c.Val() > 0 { // unknown, alive or holding rows: back into the registry
			back = append(back, ids[i])
		}
	}
	if len(back) > 0 {
		// Under an operation timeout of its own: the EXISTS pipeline may
		// have used up ctx's, and a peer removed here that is alive or
		// holds rows must be back before anything else.
		addCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opTimeout)
		serr := s.rdb.SAdd(addCtx, s.registry, back...).Err()
		cancel()
		if serr != nil {
			return 0, fmt.Errorf("re-register %d peers: %w", len(back), serr)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("recheck heartbeats: %w", err)
	}
	return len(ids) - len(back), nil
}

// ClaimDead runs claimScript.
func (s *Redis) ClaimDead(ctx context.Context, peer, token string, claimTTL, rowsTTL time.Duration) (_ ClaimResult, err error) {
	defer s.failed(&err)
	k := s.Keys(peer)
	res, err := claimScript.Run(ctx, s.rdb, []string{k.Heartbeat, k.Claim, k.Rows, k.Incarnation},
		token, claimTTL.Milliseconds(), rowsTTL.Milliseconds()).Int()
	if err != nil {
		return ClaimHeld, fmt.Errorf("claim: %w", err)
	}
	return ClaimResult(res), nil
}

// KeepRows runs keepScript for each peer, in one pipeline (one round trip
// per node on Cluster; the script's body goes with each call, as a
// pipeline cannot load it on NOSCRIPT). A retry sets the same TTL again.
func (s *Redis) KeepRows(ctx context.Context, peers []string, rowsTTL time.Duration) (err error) {
	defer s.failed(&err)
	if len(peers) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, p := range peers {
		k := s.Keys(p)
		keepScript.Eval(ctx, pipe, []string{k.Rows, k.Incarnation, k.Heartbeat, k.RowsSeen}, rowsTTL.Milliseconds())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("renew the rows sets of %d peers: %w", len(peers), err)
	}
	return nil
}

// readRowsBatch is how many members one SSCAN asks for. Small sets (up to
// 512 integers) come back whole in one call; a huge one is read in pieces,
// each under the operation timeout, so a dead peer with a million rows is
// still recovered and the server is never blocked for long.
const readRowsBatch = 10000

// ReadRows sends GET of the incarnation, then SSCAN pages (and SCARD when
// there were several).
func (s *Redis) ReadRows(ctx context.Context, peer string) (_ string, _ []string, err error) {
	defer s.failed(&err)
	k := s.Keys(peer)
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout)
	incarnation, err := s.rdb.Get(opCtx, k.Incarnation).Result()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", nil, fmt.Errorf("read incarnation %s: %w", k.Incarnation, err)
	}
	members, err := s.scanSet(ctx, k.Rows, true)
	return incarnation, members, err
}

// LiveRows reads a rows set that may change while it is read.
func (s *Redis) LiveRows(ctx context.Context, id string) (_ []string, err error) {
	defer s.failed(&err)
	return s.scanSet(ctx, s.Keys(id).Rows, false)
}

// scanSet returns the members of a set, read with SSCAN in pages; whole
// checks, for a set that does not change meanwhile (a dead peer's under
// the claim), that no member was skipped (checkComplete).
func (s *Redis) scanSet(ctx context.Context, key string, whole bool) ([]string, error) {
	var (
		out    []string
		seen   map[string]struct{}
		cursor uint64
	)
	for {
		opCtx, cancel := context.WithTimeout(ctx, s.opTimeout)
		page, next, err := s.rdb.SScan(opCtx, key, cursor, "", readRowsBatch).Result()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read rows set %s: %w", key, err)
		}
		if cursor == 0 && next == 0 {
			return page, nil // the whole set in one call: no repeats
		}
		if seen == nil {
			seen = make(map[string]struct{}, len(page))
		}
		for _, m := range page {
			if _, dup := seen[m]; !dup {
				seen[m] = struct{}{}
				out = append(out, m)
			}
		}
		if next == 0 {
			if !whole {
				return out, nil
			}
			return out, s.checkComplete(ctx, key, len(out))
		}
		cursor = next
	}
}

// checkComplete makes sure a set read in several SSCAN pages was read
// whole. An SSCAN cursor only means something on the node that issued it:
// should the key's slot migrate to another Cluster node between two pages
// (go-redis follows the MOVED or ASK), the cursor walks another hash table
// and may skip members, which the finish would then delete unread. A dead
// peer's set does not change under the claim, so fewer distinct members
// than SCARD means some were skipped: the read fails, and the next scan
// reads it again.
func (s *Redis) checkComplete(ctx context.Context, key string, read int) error {
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	card, err := s.rdb.SCard(opCtx, key).Result()
	if err != nil {
		return fmt.Errorf("count rows set %s: %w", key, err)
	}
	if int64(read) < card {
		return fmt.Errorf("read rows set %s: %d of its %d members read (its slot moved between pages?); read again at the next scan", key, read, card)
	}
	return nil
}

// FinishRecovery runs finishScript.
func (s *Redis) FinishRecovery(ctx context.Context, peer, token string, tombstoneTTL time.Duration) (_ FinishResult, err error) {
	defer s.failed(&err)
	k := s.Keys(peer)
	fin, err := finishScript.Run(ctx, s.rdb, []string{k.Heartbeat, k.Rows, k.Claim, k.Incarnation, k.RowsSeen},
		token, tombstoneTTL.Milliseconds()).Int()
	if err != nil {
		return FinishLost, fmt.Errorf("delete rows set after reset: %w", err)
	}
	return FinishResult(fin), nil
}

// FailRecovery runs failScript.
func (s *Redis) FailRecovery(ctx context.Context, peer, token string, noteTTL time.Duration) (err error) {
	defer s.failed(&err)
	return failScript.Run(ctx, s.rdb, []string{s.Keys(peer).Claim}, token, noteTTL.Milliseconds()).Err()
}

// DropClaim runs dropScript.
func (s *Redis) DropClaim(ctx context.Context, peer, token string, noteTTL time.Duration) (err error) {
	defer s.failed(&err)
	if err := dropScript.Run(ctx, s.rdb, []string{s.Keys(peer).Claim}, token, noteTTL.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("drop claim: %w", err)
	}
	return nil
}

// TakeScanTurn runs takeTurnScript on the scan turn's key, and HGET of
// holder's untracked-rows note beside it, in one pipeline (EVAL: a
// pipeline cannot fall back on NOSCRIPT). A failed note read is only a
// missing note: the turn is what the caller acts on. A holder that is not
// an instance ID with a heartbeat loses the turn to the caller (takeTurn).
func (s *Redis) TakeScanTurn(ctx context.Context, holder string, ttl time.Duration) (_ TurnTake, _ string, err error) {
	defer s.failed(&err)
	key := ScanTurnKey(s.prefix)
	pipe := s.rdb.Pipeline()
	turn := takeTurnScript.Eval(ctx, pipe, []string{key}, holder, ttl.Milliseconds(), "")
	note := pipe.HGet(ctx, UntrackedKey(s.prefix), holder)
	_, _ = pipe.Exec(ctx)
	t, err := s.takeTurn(ctx, key, true, holder, ttl, turn)
	return t, note.Val(), err
}

// NoteUntracked is HSET of notes and PEXPIRE of the untracked-rows hash,
// pipelined.
func (s *Redis) NoteUntracked(ctx context.Context, notes map[string]string, ttl time.Duration) (err error) {
	defer s.failed(&err)
	if len(notes) == 0 {
		return nil
	}
	key := UntrackedKey(s.prefix)
	fields := make([]any, 0, 2*len(notes))
	for id, n := range notes {
		fields = append(fields, id, n)
	}
	pipe := s.rdb.Pipeline()
	pipe.HSet(ctx, key, fields...)
	pipe.PExpire(ctx, key, ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("note untracked rows in %s: %w", key, err)
	}
	return nil
}

// UntrackedNote is HGET of id's field of the untracked-rows hash.
func (s *Redis) UntrackedNote(ctx context.Context, id string) (_ string, err error) {
	defer s.failed(&err)
	key := UntrackedKey(s.prefix)
	v, err := s.rdb.HGet(ctx, key, id).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	return v, nil
}

// TakeSweepTurn runs takeTurnScript on the sweep turn's key. A holder
// that is not a worker's token loses the turn to the caller (takeTurn).
func (s *Redis) TakeSweepTurn(ctx context.Context, holder string, ttl time.Duration) (_ TurnTake, err error) {
	defer s.failed(&err)
	return s.takeTurn(ctx, SweepTurnKey(s.prefix), false, holder, ttl, nil)
}

// NodeOf asks a Cluster client which master holds id's slot, and remembers
// that master's client for NodeInfo.
func (s *Redis) NodeOf(ctx context.Context, id string) (_ string, err error) {
	defer s.failed(&err)
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return "", nil
	}
	key := s.Keys(id).Heartbeat
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", fmt.Errorf("find the node of %s: %w", key, err)
	}
	addr := c.Options().Addr
	s.nodesMu.Lock()
	s.nodes[addr] = c
	s.nodesMu.Unlock()
	return addr, nil
}

// NodeInfo reads the INFO sections of one node in one round trip.
func (s *Redis) NodeInfo(ctx context.Context, node string) (_ string, err error) {
	defer s.failed(&err)
	c, err := s.client(node)
	if err != nil {
		return "", fmt.Errorf("read INFO: %w", err)
	}
	return nodeInfo(ctx, c)
}

func nodeInfo(ctx context.Context, c redis.UniversalClient) (string, error) {
	pipe := c.Pipeline()
	cmds := []*redis.StringCmd{
		pipe.Info(ctx, "server"), pipe.Info(ctx, "replication"), pipe.Info(ctx, "persistence"),
		pipe.Info(ctx, "stats"), // evicted_keys: the eviction hold (registry.go in the root package)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("read INFO: %w", err)
	}
	var b strings.Builder
	for _, c := range cmds {
		b.WriteString(c.Val())
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// MasterInfos reads INFO of every master, concurrently on a Cluster.
func (s *Redis) MasterInfos(ctx context.Context) (_ map[string]string, err error) {
	defer s.failed(&err)
	var mu sync.Mutex
	out := make(map[string]string)
	err = s.forEachMaster(ctx, func(ctx context.Context, node string, c redis.UniversalClient) error {
		info, err := nodeInfo(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		out[node] = info
		mu.Unlock()
		return nil
	})
	return out, err
}

// forEachMaster runs f on every master of a Cluster (concurrently), named
// by address, or on the client itself, named "".
func (s *Redis) forEachMaster(ctx context.Context, f func(context.Context, string, redis.UniversalClient) error) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			addr := c.Options().Addr
			s.nodesMu.Lock()
			s.nodes[addr] = c
			s.nodesMu.Unlock()
			return f(ctx, addr, c)
		})
	}
	return f(ctx, "", s.rdb)
}

// expiredChannel is the keyevent channel of expired keys, in every database.
const expiredChannel = "__keyevent@*__:expired"

// ExpiredEventsEnabled reports whether a notify-keyspace-events value
// includes keyevent notifications of expired keys.
func ExpiredEventsEnabled(flags string) bool {
	return strings.Contains(flags, "E") && (strings.Contains(flags, "x") || strings.Contains(flags, "A"))
}

// Masters lists the masters: on a Cluster, read afresh (CLUSTER SLOTS to
// one node, which also renews the client's slot map; the map the client
// has if no node answers); otherwise "", the client itself, without a
// command.
func (s *Redis) Masters(ctx context.Context) (_ []string, err error) {
	defer s.failed(&err)
	var (
		mu    sync.Mutex // forEachMaster calls f concurrently
		nodes []string
	)
	err = s.forEachMaster(ctx, func(_ context.Context, node string, _ redis.UniversalClient) error {
		mu.Lock()
		nodes = append(nodes, node)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the masters: %w", err)
	}
	slices.Sort(nodes)
	return nodes, nil
}

// client returns the client of a node that NodeOf, Masters or
// MasterInfos named; "" is the client itself.
func (s *Redis) client(node string) (redis.UniversalClient, error) {
	if node == "" {
		return s.rdb, nil
	}
	s.nodesMu.Lock()
	c, ok := s.nodes[node]
	s.nodesMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("unknown node %s", node)
	}
	return c, nil
}

// EnableExpiredEvents sends CONFIG GET notify-keyspace-events to node, and
// with configure CONFIG SET where the flags are missing.
func (s *Redis) EnableExpiredEvents(ctx context.Context, node string, configure bool) (_ string, err error) {
	defer s.failed(&err)
	c, err := s.client(node)
	if err != nil {
		return "", fmt.Errorf("read notify-keyspace-events: %w", err)
	}
	cfg, err := c.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return "", fmt.Errorf("read notify-keyspace-events: %w", err)
	}
	flags := cfg["notify-keyspace-events"]
	if ExpiredEventsEnabled(flags) {
		return "", nil
	}
	if !configure {
		return "", fmt.Errorf("notify-keyspace-events is %q, without E and x", flags)
	}
	if err := c.ConfigSet(ctx, "notify-keyspace-events", flags+"Ex").Err(); err != nil {
		return "", fmt.Errorf("set notify-keyspace-events: %w", err)
	}
	return flags + "Ex", nil
}

// SubscribeExpired sends PSUBSCRIBE to node and waits for the
// confirmation within ctx.
func (s *Redis) SubscribeExpired(ctx context.Context, node string) (_ Subscription, err error) {
	defer s.failed(&err)
	c, err := s.client(node)
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", expiredChannel, err)
	}
	ps := c.PSubscribe(context.Background(), expiredChannel)
	if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
		ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", expiredChannel, err)
	}
	return &pubsub{ps: ps, ch: ps.Channel()}, nil
}

type pubsub struct {
	ps *redis.PubSub
	ch <-chan *redis.Message
}

func (p *pubsub) Next(ctx context.Context) (string, bool) {
	select {
	case <-ctx.Done():
		return "", false
	case m, ok := <-p.ch:
		if !ok {
			return "", false
		}
		return m.Payload, true
	}
}

func (p *pubsub) Close() error { return p.ps.Close() }

// Ping sends PING. A refused AUTH fails a pipeline or MULTI/EXEC with
// the replies of its queued commands left unread on the connection, which
// go-redis then logs ("Conn has unread data") before dropping it; a lone
// PING gets one reply, the refusal.
func (s *Redis) Ping(ctx context.Context) (err error) {
	defer s.failed(&err)
	return s.rdb.Ping(ctx).Err()
}

// IsAuthError reports whether err is Redis refusing the client: a
// password is required (NOAUTH), the user or password is wrong
// (WRONGPASS), or the user may not run the command (NOPERM).
func IsAuthError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range []string{"NOAUTH", "WRONGPASS", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// MemoryInfos reads INFO memory of every master (one round trip each,
// concurrently on a Cluster), by node name as MasterInfos names them: the
// eviction policy and maxmemory. It needs no CONFIG, which managed servers
// often rename away. (evicted_keys comes with the INFO the verdicts send.)
func (s *Redis) MemoryInfos(ctx context.Context) (_ map[string]string, err error) {
	defer s.failed(&err)
	var mu sync.Mutex
	out := make(map[string]string)
	err = s.forEachMaster(ctx, func(ctx context.Context, node string, c redis.UniversalClient) error {
		pipe := c.Pipeline()
		mem := pipe.Info(ctx, "memory")
		if _, err := pipe.Exec(ctx); err != nil {
			if node != "" {
				return fmt.Errorf("read INFO memory of %s: %w", node, err)
			}
			return fmt.Errorf("read INFO memory: %w", err)
		}
		mu.Lock()
		out[node] = mem.Val()
		mu.Unlock()
		return nil
	})
	return out, err
}

// Describe pipelines PTTL, SCARD, PTTL, GET, GET per instance.
func (s *Redis) Describe(ctx context.Context, ids []string) (_ []Instance, err error) {
	defer s.failed(&err)
	type cmds struct {
		hbTTL, rowsTTL, oldestTTL  *redis.DurationCmd
		rows                       *redis.IntCmd
		claim, incarnation, oldest *redis.StringCmd
	}
	pipe := s.rdb.Pipeline()
	cs := make([]cmds, len(ids))
	for i, id := range ids {
		k := s.Keys(id)
		cs[i] = cmds{
			hbTTL:       pipe.PTTL(ctx, k.Heartbeat),
			rows:        pipe.SCard(ctx, k.Rows),
			rowsTTL:     pipe.PTTL(ctx, k.Rows),
			claim:       pipe.Get(ctx, k.Claim),
			incarnation: pipe.Get(ctx, k.Incarnation),
			oldest:      pipe.Get(ctx, k.OldestRow),
			oldestTTL:   pipe.PTTL(ctx, k.OldestRow),
		}
	}
	ran, _ := pipe.Exec(ctx)
	oldest := make(map[redis.Cmder]bool, len(cs))
	for _, c := range cs {
		oldest[c.oldest] = true
	}
	for _, c := range ran {
		if oldest[c] && IsReply(c.Err()) {
			continue // an oldest-row key a stranger wrote (another type) reads as unknown
		}
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read the keys of %d instances: %w", len(ids), err)
		}
	}
	out := make([]Instance, len(ids))
	for i, id := range ids {
		c := cs[i]
		out[i] = Instance{ID: id, HeartbeatTTL: c.hbTTL.Val(), Rows: c.rows.Val(), RowsTTL: c.rowsTTL.Val(),
			Claim: c.claim.Val(), Incarnation: c.incarnation.Val()}
		out[i].OldestRow, out[i].HoldsRows, out[i].OldestRowKnown = ParseOldestRow(c.oldest.Val(), c.oldestTTL.Val())
	}
	return out, nil
}

// OldestRowValue is what a heartbeat writes into the OldestRow key, which
// lives ttl: "<age ms> <ttl ms>", or "- <ttl ms>" when the worker holds no
// row. Beside the age it gives the TTL it was written with, so a reader
// ages it by the time the key has lived (ttl − PTTL), on the server's
// clock: no two hosts' clocks are compared.
func OldestRowValue(holds bool, age, ttl time.Duration) string {
	a := "-"
	if holds {
		a = strconv.FormatInt(max(age.Milliseconds(), 0), 10)
	}
	return a + " " + strconv.FormatInt(ttl.Milliseconds(), 10)
}

// ParseOldestRow reads an OldestRow key's value and its remaining TTL
// (PTTL): the oldest row's age now, whether the worker held rows, and
// whether the value could be read at all (absent, malformed or without
// the TTL its writer sets: unknown).
func ParseOldestRow(v string, pttl time.Duration) (age time.Duration, holds, known bool) {
	a, t, ok := strings.Cut(v, " ")
	ttlMs, err := strconv.ParseInt(t, 10, 64)
	if !ok || err != nil || pttl <= 0 || ttlMs <= 0 {
		return 0, false, false
	}
	if a == "-" {
		return 0, false, true
	}
	ms, err := strconv.ParseInt(a, 10, 64)
	if err != nil || ms < 0 {
		return 0, false, false
	}
	lived := max(time.Duration(ttlMs)*time.Millisecond-pttl, 0)
	return time.Duration(ms)*time.Millisecond + lived, true, true
}

// IsWrongType reports whether err is Redis's WRONGTYPE reply: the key holds
// another type than the command needs.
func IsWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

// IsReply reports whether err is an error reply from Redis: the command
// was answered, so its outcome is known, unlike a timeout or a connection
// lost.
func IsReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// failedOnlyOnWrongType reports whether the commands of a pipeline that
// failed are all among side (the registry's, the fleet record's) and were
// refused with WRONGTYPE, every other command succeeding. (A pipeline that
// failed as a whole, a timeout say, may leave every command's error unset:
// that is not this case.)
func failedOnlyOnWrongType(cmds []redis.Cmder, side ...redis.Cmder) bool {
	failed := false
	for _, c := range cmds {
		if c.Err() == nil {
			continue
		}
		if !slices.Contains(side, c) || !IsWrongType(c.Err()) {
			return false
		}
		failed = true
	}
	return failed
}

// failedOnlyOn reports whether the failures of a heartbeat pipeline are
// only its side commands': the registry SADD (reg) refused with WRONGTYPE,
// the fleet record's script (fleet) answered with an error. The
// instance's own heartbeat is written then, and so it is when only the
// oldest row's age (oldest) was refused. (A pipeline that failed as a
// whole leaves no command's error set: that is not this case.)
func failedOnlyOn(cmds []redis.Cmder, reg, fleet, oldest redis.Cmder) bool {
	side := false
	for _, c := range cmds {
		switch {
		case c.Err() == nil:
		case c == reg && IsWrongType(c.Err()), (c == fleet || c == oldest) && IsReply(c.Err()):
			side = true
		default:
			return false
		}
	}
	return side
}

// appendIDs appends row IDs as decimal strings, the rows set's members.
func appendIDs(dst []any, ids []int64) []any {
	if dst == nil {
		dst = make([]any, 0, len(ids))
	}
	for _, id := range ids {
		dst = append(dst, strconv.FormatInt(id, 10))
	}
	return dst
}

var _ Store = (*Redis)(nil)
