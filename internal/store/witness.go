package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// Only standalone and Sentinel deployments run it: on Cluster a channel's
// subscribers are counted per node (PUBSUB NUMSUB), which this release
// does not follow.

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

// ErrWitnessUnsupported is returned on a Cluster client: the witness
// runs on standalone and Sentinel deployments only.
var ErrWitnessUnsupported = errors.New("the liveness witness needs a standalone or Sentinel Redis (on Cluster, subscribers are counted per node)")

// WitnessSupported reports whether the witness can run on this store's
// client: a standalone or Sentinel client, not a Cluster or a Ring.
func (s *Redis) WitnessSupported() bool {
	_, ok := s.rdb.(interface {
		Subscribe(context.Context, ...string) *redis.PubSub
	})
	_, ring := s.rdb.(*redis.Ring)
	return ok && s.slots.cc == nil && !ring
}

// LifeSubscription is what a life does with its subscription (LifeSub;
// the simulator's in-memory one).
type LifeSubscription interface {
	Receive(ctx context.Context, timeout time.Duration) (kind int, payload string, err error)
	Ping(ctx context.Context, payload string) error
	Move(ctx context.Context, old, channel string) error
	Close() error
}

// LifeSub is a life's subscription, on a connection of its own.
type LifeSub struct{ ps *redis.PubSub }

// SubscribeLife subscribes to channel on a new connection. It does not
// wait for the confirmation: it comes through Receive, as after every
// reconnection.
func (s *Redis) SubscribeLife(ctx context.Context, channel string) (LifeSubscription, error) {
	if s.slots.cc != nil {
		return nil, ErrWitnessUnsupported
	}
	c, ok := s.rdb.(interface {
		Subscribe(context.Context, ...string) *redis.PubSub
	})
	if !ok {
		return nil, ErrWitnessUnsupported
	}
	ps := c.Subscribe(ctx)
	if err := ps.Subscribe(ctx, channel); err != nil {
		ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	return &LifeSub{ps: ps}, nil
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
// and subscribes again (go-redis does), and the confirmation comes as
// LifeSubscribed.
func (l *LifeSub) Receive(ctx context.Context, timeout time.Duration) (kind int, payload string, err error) {
	m, err := l.ps.ReceiveTimeout(ctx, timeout)
	if err != nil {
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			return LifeNothing, "", nil
		}
		return LifeNothing, "", err
	}
	switch m := m.(type) {
	case *redis.Pong:
		return LifePong, m.Payload, nil
	case *redis.Subscription:
		if m.Kind == "subscribe" {
			return LifeSubscribed, m.Channel, nil
		}
		return LifeUnsubscribed, m.Channel, nil
	}
	return LifeOther, "", nil
}

// Ping sends PING payload on the subscription's connection (reconnecting
// first if it broke).
func (l *LifeSub) Ping(ctx context.Context, payload string) error { return l.ps.Ping(ctx, payload) }

// Move subscribes to channel and unsubscribes from old, on the same
// connection: a new life's channel is held before the old one is let go.
func (l *LifeSub) Move(ctx context.Context, old, channel string) error {
	if err := l.ps.Subscribe(ctx, channel); err != nil {
		return fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	if err := l.ps.Unsubscribe(ctx, old); err != nil {
		return fmt.Errorf("unsubscribe from %s: %w", old, err)
	}
	return nil
}

// Close closes the connection: the server drops the subscription.
func (l *LifeSub) Close() error { return l.ps.Close() }

// LifeHeld reports whether channel has a subscriber on the server, and the
// server's run ID, in one round trip.
func (s *Redis) LifeHeld(ctx context.Context, channel string) (held bool, runID string, err error) {
	defer s.failed(&err)
	counts, runID, err := s.CountLives(ctx, []string{channel})
	if err != nil {
		return false, "", err
	}
	return counts[0] > 0, runID, nil
}

// CountLives returns the number of subscribers of each channel and the
// server's run ID, in one round trip (PUBSUB NUMSUB and INFO server).
func (s *Redis) CountLives(ctx context.Context, channels []string) (_ []int64, runID string, err error) {
	defer s.failed(&err)
	if s.slots.cc != nil {
		return nil, "", ErrWitnessUnsupported
	}
	pipe := s.rdb.Pipeline()
	info := pipe.Info(ctx, "server")
	num := pipe.PubSubNumSub(ctx, channels...)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, "", fmt.Errorf("count the subscribers of %d life channels: %w", len(channels), err)
	}
	runID = infoField(info.Val(), "run_id")
	if runID == "" {
		return nil, "", errors.New("count the subscribers of life channels: INFO server has no run_id")
	}
	counts := make([]int64, len(channels))
	for i, ch := range channels {
		counts[i] = num.Val()[ch]
	}
	return counts, runID, nil
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
// are held (one EXISTS): a worker holding neither tries to take them only
// when one is free.
func (s *Redis) WitnessTurnsTaken(ctx context.Context) (_ int64, err error) {
	defer s.failed(&err)
	n, err := s.rdb.Exists(ctx, WitnessTurnKey(s.prefix), WitnessSecondKey(s.prefix)).Result()
	if err != nil {
		return 0, fmt.Errorf("read the witness turns: %w", err)
	}
	return n, nil
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
