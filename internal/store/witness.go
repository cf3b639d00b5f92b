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

// The liveness witness (the root package's witness.go): each life of a
// worker that runs it holds a subscription to a channel of its own on a
// connection of its own, and a marker key saying so. The server drops the
// subscription the moment the connection closes, and the kernel closes a
// killed process's connections at once, so a peer that sees the channel
// without a subscriber for a grace period knows the life is gone long
// before its heartbeat expires.
//
//	channel <prefix>_{<instanceID>}_LIFE:<life>  subscribed by that life only
//	<prefix>_{<instanceID>}_WITNESS   string "<life> <grace ms> <run_id> <epoch>", PX heartbeat TTL:
//	                                  the life holds the channel on the server run run_id since
//	                                  its connection's epoch-th (re)connection and fences itself
//	                                  within grace; "judged <life>" once a peer
//	                                  judged that life dead (added in this release: earlier
//	                                  workers neither write nor read it, and are never judged
//	                                  by it)
//	<prefix>_WITNESS_TURN             string instance ID of the worker that watches the
//	                                  channels (the witness turn), PX
//	<prefix>_WITNESS_SECOND           string instance ID of the worker that watches the
//	                                  witness turn's holder alone (the second), PX
//
// On a Cluster the channel is a shard channel (SSUBSCRIBE, Redis 7): its
// hash tag {<instanceID>} puts it in the slot, so on the master, of the
// instance's keys and marker. Its subscribers are counted on that master
// (PUBSUB SHARDNUMSUB), and the run a marker names is that master's. A
// slot that moves (a failover, a migration) unsubscribes its shard
// channels' subscribers (a sunsubscribe from the server): the life
// subscribes again on the slot's new master, a new epoch, with a new run.
// Redis before 7 has no shard channels: WitnessAvailable says so. A Ring
// never runs it: its shards are servers that know nothing of each other,
// and a shard its health check drops moves keys and channels to another
// shard, silently, with no reply that says so (no MOVED, no
// sunsubscribe).

// witnessSuffix names the marker key; lifeChannelInfix the channel.
const (
	witnessSuffix    = "_WITNESS"
	lifeChannelInfix = "_LIFE:"
	// WitnessJudged starts the marker of a life a peer judged dead.
	WitnessJudged = "judged "
)

// LifeChannel returns the channel life of instance id subscribes to.
func LifeChannel(prefix, id, life string) string {
	return prefix + "_{" + id + "}" + lifeChannelInfix + life
}

// WitnessKey returns the name of instance id's witness marker (Keys.Witness).
func WitnessKey(prefix, id string) string { return InstanceKeys(prefix, id).Witness }

// WitnessTurnKey returns the name of the witness turn.
func WitnessTurnKey(prefix string) string { return prefix + "_WITNESS_TURN" }

// WitnessSecondKey returns the name of the witness turn's second.
func WitnessSecondKey(prefix string) string { return prefix + "_WITNESS_SECOND" }

// Witness is what a marker says: the life that holds its channel, within
// which grace it fences itself, on which server run and since which
// (re)connection of the life's connection; or that the life was judged
// dead (Judged).
type Witness struct {
	Life   string
	Grace  time.Duration
	RunID  string
	Epoch  int
	Judged bool
}

// String is the marker's value.
func (w Witness) String() string {
	if w.Judged {
		return WitnessJudged + w.Life
	}
	return w.Life + " " + strconv.FormatInt(w.Grace.Milliseconds(), 10) + " " + w.RunID + " " + strconv.Itoa(w.Epoch)
}

// ParseWitness reads a marker's value; ok is false for anything a worker
// does not write.
func ParseWitness(v string) (w Witness, ok bool) {
	if life, found := strings.CutPrefix(v, WitnessJudged); found {
		return Witness{Life: life, Judged: true}, ValidateName(life) == nil
	}
	f := strings.Fields(v)
	if len(f) != 4 || ValidateName(f[0]) != nil || f[2] == "" {
		return Witness{}, false
	}
	ms, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || ms <= 0 || ms > int64(7*24*time.Hour/time.Millisecond) {
		return Witness{}, false
	}
	epoch, err := strconv.Atoi(f[3])
	if err != nil || epoch < 1 {
		return Witness{}, false
	}
	return Witness{Life: f[0], Grace: time.Duration(ms) * time.Millisecond, RunID: f[2], Epoch: epoch}, true
}

// ErrWitnessUnsupported is returned on a Ring client, and on a Cluster
// whose masters have no shard channels (before Redis 7).
var ErrWitnessUnsupported = errors.New("the liveness witness needs a standalone or Sentinel Redis, or a Redis 7 Cluster (shard channels)")

// WitnessSupported reports whether the witness can run on this store's
// client: a standalone, Sentinel or Cluster client, not a Ring. A
// Cluster's masters must run Redis 7 as well (WitnessAvailable).
func (s *Redis) WitnessSupported() bool {
	_, ok := s.rdb.(interface {
		Subscribe(context.Context, ...string) *redis.PubSub
	})
	_, ring := s.rdb.(*redis.Ring)
	return ok && !ring
}

// WitnessAvailable returns nil if the witness can run on the server: on a
// Cluster, every master must have shard channels (Redis 7, INFO server's
// redis_version); an error wrapping ErrWitnessUnsupported names the first
// that does not. Elsewhere it sends nothing.
func (s *Redis) WitnessAvailable(ctx context.Context) (err error) {
	defer s.failed(&err)
	if s.slots.cc == nil {
		return nil
	}
	var (
		mu  sync.Mutex
		old []string
	)
	err = s.forEachMaster(ctx, func(ctx context.Context, node string, c redis.UniversalClient) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return fmt.Errorf("read the version of %s: %w", node, err)
		}
		if v := infoField(info, "redis_version"); !ShardChannels(v) {
			mu.Lock()
			old = append(old, node+" runs "+v)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the Cluster's versions: %w", err)
	}
	if len(old) > 0 {
		slices.Sort(old)
		return fmt.Errorf("%w: %s", ErrWitnessUnsupported, strings.Join(old, ", "))
	}
	return nil
}

// ShardChannels reports whether a server of version (INFO's redis_version)
// has shard channels: SSUBSCRIBE and PUBSUB SHARDNUMSUB came in 7.0.
func ShardChannels(version string) bool {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 7
}

// LifeSubscription is what a life does with its subscription (LifeSub;
// the simulator's in-memory one).
type LifeSubscription interface {
	Receive(ctx context.Context, timeout time.Duration) (kind int, payload string, err error)
	Ping(ctx context.Context, payload string) error
	Move(ctx context.Context, old, channel string) error
	Close() error
}

// LifeSub is a life's subscription, on a connection of its own: a shard
// channel's on a Cluster (SSUBSCRIBE, on the master of its slot).
type LifeSub struct {
	ps      *redis.PubSub
	sharded bool
	slots   *slotMap // a broken connection may mean a moved slot: reload the map
}

// SubscribeLife subscribes to channel on a new connection. It does not
// wait for the confirmation: it comes through Receive, as after every
// reconnection.
func (s *Redis) SubscribeLife(ctx context.Context, channel string) (_ LifeSubscription, err error) {
	defer s.failed(&err)
	if cc := s.slots.cc; cc != nil {
		ps := cc.SSubscribe(ctx)
		if err := ps.SSubscribe(ctx, channel); err != nil {
			ps.Close()
			return nil, fmt.Errorf("subscribe to shard channel %s: %w", channel, err)
		}
		return &LifeSub{ps: ps, sharded: true, slots: &s.slots}, nil
	}
	c, ok := s.rdb.(interface {
		Subscribe(context.Context, ...string) *redis.PubSub
	})
	if !ok || !s.WitnessSupported() {
		return nil, ErrWitnessUnsupported
	}
	ps := c.Subscribe(ctx)
	if err := ps.Subscribe(ctx, channel); err != nil {
		ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	return &LifeSub{ps: ps, slots: &s.slots}, nil
}

// Kinds of what LifeSub.Receive returns.
const (
	LifeNothing      = iota // the timeout passed
	LifePong                // a PING's answer: Payload is its payload
	LifeSubscribed          // a subscription confirmed: Payload is the channel
	LifeUnsubscribed        // an unsubscription confirmed
	LifeOther               // a message published to the channel (ignored)
)

// Receive waits up to timeout for what the server sends. An error other
// than the timeout means the connection broke; the next call reconnects
// and subscribes again (go-redis does, on a Cluster on the master its slot
// map names), and the confirmation comes as LifeSubscribed. On a Cluster a
// LifeUnsubscribed of the channel held may come from the server: its slot
// moved to another master.
func (l *LifeSub) Receive(ctx context.Context, timeout time.Duration) (kind int, payload string, err error) {
	m, err := l.ps.ReceiveTimeout(ctx, timeout)
	if err != nil {
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			return LifeNothing, "", nil
		}
		l.slots.after(err)
		return LifeNothing, "", err
	}
	switch m := m.(type) {
	case *redis.Pong:
		return LifePong, m.Payload, nil
	case *redis.Subscription:
		switch m.Kind {
		case "subscribe", "ssubscribe":
			return LifeSubscribed, m.Channel, nil
		case "sunsubscribe":
			l.slots.reload() // the slot may have moved: the next SSUBSCRIBE goes to its new master
		}
		return LifeUnsubscribed, m.Channel, nil
	}
	return LifeOther, "", nil
}

// Ping sends PING payload on the subscription's connection (reconnecting
// first if it broke).
func (l *LifeSub) Ping(ctx context.Context, payload string) error {
	err := l.ps.Ping(ctx, payload)
	l.slots.after(err)
	return err
}

// Move subscribes to channel and unsubscribes from old, on the same
// connection: a new life's channel is held before the old one is let go.
// (On a Cluster both are in the instance's slot.)
func (l *LifeSub) Move(ctx context.Context, old, channel string) error {
	sub, unsub := l.ps.Subscribe, l.ps.Unsubscribe
	if l.sharded {
		sub, unsub = l.ps.SSubscribe, l.ps.SUnsubscribe
	}
	if err := sub(ctx, channel); err != nil {
		return fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	if err := unsub(ctx, old); err != nil {
		return fmt.Errorf("unsubscribe from %s: %w", old, err)
	}
	return nil
}

// Close closes the connection: the server drops the subscription.
func (l *LifeSub) Close() error { return l.ps.Close() }

// LifeHeld reports whether channel has a subscriber on the server that
// holds it (on a Cluster, the master of its slot), and that server's run
// ID, in one round trip.
func (s *Redis) LifeHeld(ctx context.Context, channel string) (held bool, runID string, err error) {
	defer s.failed(&err)
	counts, runIDs, err := s.CountLives(ctx, []string{channel})
	if err != nil {
		return false, "", err
	}
	if runIDs[0] == "" {
		return false, "", fmt.Errorf("count the subscribers of %s: its node did not answer", channel)
	}
	return counts[0] > 0, runIDs[0], nil
}

// CountLives returns the number of subscribers of each channel and the run
// ID of the server that counted it: on a single server, one round trip
// (PUBSUB NUMSUB and INFO server); on a Cluster, one per master holding
// any of the slots, concurrently (PUBSUB SHARDNUMSUB and INFO server, each
// channel counted on the master of its slot as the client's slot map
// names it). A channel whose master did not answer has run ID "" and
// count 0; the error is returned only when no master answered.
func (s *Redis) CountLives(ctx context.Context, channels []string) (_ []int64, runIDs []string, err error) {
	defer s.failed(&err)
	counts, runIDs := make([]int64, len(channels)), make([]string, len(channels))
	if s.slots.cc == nil {
		runID, err := countOn(ctx, s.rdb, false, channels, counts)
		if err != nil {
			return nil, nil, err
		}
		for i := range runIDs {
			runIDs[i] = runID
		}
		return counts, runIDs, nil
	}
	byNode := make(map[*redis.Client][]int)
	for i, ch := range channels {
		c, err := s.slots.cc.MasterForKey(ctx, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("find the node of %s: %w", ch, err)
		}
		byNode[c] = append(byNode[c], i)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for c, idx := range byNode {
		wg.Go(func() {
			chs := make([]string, len(idx))
			for j, i := range idx {
				chs[j] = channels[i]
			}
			n := make([]int64, len(idx))
			runID, err := countOn(ctx, c, true, chs, n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("on %s: %w", c.Options().Addr, err))
				return
			}
			for j, i := range idx {
				counts[i], runIDs[i] = n[j], runID
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		s.slots.after(errs[0]) // a node may be gone: reload the slot map
		if len(errs) == len(byNode) {
			return nil, nil, errors.Join(errs...)
		}
	}
	return counts, runIDs, nil
}

// countOn counts the subscribers of channels on one server into counts
// (shard channels if sharded) and returns its run ID.
func countOn(ctx context.Context, c redis.UniversalClient, sharded bool, channels []string, counts []int64) (string, error) {
	pipe := c.Pipeline()
	info := pipe.Info(ctx, "server")
	num := pipe.PubSubNumSub
	if sharded {
		num = pipe.PubSubShardNumSub
	}
	n := num(ctx, channels...)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("count the subscribers of %d life channels: %w", len(channels), err)
	}
	runID := infoField(info.Val(), "run_id")
	if runID == "" {
		return "", errors.New("count the subscribers of life channels: INFO server has no run_id")
	}
	for i, ch := range channels {
		counts[i] = n.Val()[ch]
	}
	return runID, nil
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// WriteWitness writes instance id's marker with a TTL, unless it says a
// peer judged the same life dead: a marker that says so stays.
func (s *Redis) WriteWitness(ctx context.Context, id string, w Witness, ttl time.Duration) (judged bool, err error) {
	defer s.failed(&err)
	n, err := writeWitnessScript.Run(ctx, s.rdb, []string{WitnessKey(s.prefix, id)},
		w.String(), WitnessJudged+w.Life, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("write the witness marker: %w", err)
	}
	return n == 0, nil
}

// writeWitnessScript writes ARGV[1] with PX ARGV[3] unless the key holds
// ARGV[2] (the same life, judged). Returns 1 when written.
var writeWitnessScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
`)

// ReadWitness reads instance id's marker ("" when absent).
func (s *Redis) ReadWitness(ctx context.Context, id string) (_ string, err error) {
	defer s.failed(&err)
	v, err := s.rdb.Get(ctx, WitnessKey(s.prefix, id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the witness marker: %w", err)
	}
	return v, nil
}

// ReadWitnesses reads the markers of ids in one round trip ("" for an
// absent one, or a key of another type).
func (s *Redis) ReadWitnesses(ctx context.Context, ids []string) (_ []string, err error) {
	defer s.failed(&err)
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.Get(ctx, WitnessKey(s.prefix, id))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !IsWrongType(err) {
		return nil, fmt.Errorf("read %d witness markers: %w", len(ids), err)
	}
	out := make([]string, len(ids))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// JudgeLife replaces instance id's marker, which the caller read as value
// and parsed as w, with the judged marker of the same life, keeping its
// TTL, only if it still holds value. judged is false when it did not (the
// life reconnected, moved on, left, or was judged by another).
func (s *Redis) JudgeLife(ctx context.Context, id, value string, w Witness) (judged bool, err error) {
	defer s.failed(&err)
	j := Witness{Life: w.Life, Judged: true}
	n, err := judgeLifeScript.Run(ctx, s.rdb, []string{WitnessKey(s.prefix, id)}, value, j.String()).Int()
	if err != nil {
		return false, fmt.Errorf("mark the life judged: %w", err)
	}
	return n == 1, nil
}

// judgeLifeScript sets KEYS[1] to ARGV[2], TTL kept, if it holds ARGV[1];
// it returns 1 too when it holds ARGV[2] already: a retry after a lost
// reply, or another judge, and the reset that follows is idempotent.
var judgeLifeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[2] then return 1 end
if v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
`)

// DropWitness deletes instance id's marker if it holds v (Shutdown, before
// the subscription closes).
func (s *Redis) DropWitness(ctx context.Context, id, v string) (err error) {
	defer s.failed(&err)
	return dropIfScript.Run(ctx, s.rdb, []string{WitnessKey(s.prefix, id)}, v).Err()
}

var dropIfScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
`)

// TakeWitnessTurn takes or renews the witness turn for instance id, as
// TakeScanTurn takes the scan turn (a stranger's value is taken over);
// second takes the second's turn instead.
func (s *Redis) TakeWitnessTurn(ctx context.Context, id string, second bool, ttl time.Duration) (_ TurnTake, err error) {
	defer s.failed(&err)
	key := WitnessTurnKey(s.prefix)
	if second {
		key = WitnessSecondKey(s.prefix)
	}
	return s.takeTurn(ctx, key, true, id, ttl, nil)
}

// WitnessTurnsTaken reports how many of the witness turn and its second
// are held (one EXISTS; one per key on a Cluster, where the two are in
// two slots): a worker holding neither tries to take them only when one
// is free.
func (s *Redis) WitnessTurnsTaken(ctx context.Context) (_ int64, err error) {
	defer s.failed(&err)
	turn, second := WitnessTurnKey(s.prefix), WitnessSecondKey(s.prefix)
	if s.slots.cc == nil {
		n, err := s.rdb.Exists(ctx, turn, second).Result()
		if err != nil {
			return 0, fmt.Errorf("read the witness turns: %w", err)
		}
		return n, nil
	}
	// Two slots on a Cluster: one EXISTS each, pipelined.
	pipe := s.rdb.Pipeline()
	a, b := pipe.Exists(ctx, turn), pipe.Exists(ctx, second)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("read the witness turns: %w", err)
	}
	return a.Val() + b.Val(), nil
}

// WitnessHolder returns the witness turn's holder and its marker ("" for
// none), in two round trips.
func (s *Redis) WitnessHolder(ctx context.Context) (holder, marker string, err error) {
	defer s.failed(&err)
	holder, err = s.rdb.Get(ctx, WitnessTurnKey(s.prefix)).Result()
	if errors.Is(err, redis.Nil) || (err == nil && ValidateName(holder) != nil) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("read the witness turn: %w", err)
	}
	marker, err = s.ReadWitness(ctx, holder)
	return holder, marker, err
}

// DropWitnessTurn deletes the witness turn (second: its second's) if
// holder still holds it: the turn's holder was judged dead, and its second
// takes the turn at its next try; or the second took the turn, and
// another worker may be its second at once.
func (s *Redis) DropWitnessTurn(ctx context.Context, holder string, second bool) (err error) {
	defer s.failed(&err)
	key := WitnessTurnKey(s.prefix)
	if second {
		key = WitnessSecondKey(s.prefix)
	}
	return dropIfScript.Run(ctx, s.rdb, []string{key}, holder).Err()
}
