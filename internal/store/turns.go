package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// turnValueClip bounds what a take of a turn reads back of a value not
// its own: longer than any worker's value (an instance ID is at most
// MaxNameLen bytes, a sweep token 32), so a clipped value is no worker's.
const turnValueClip = MaxNameLen + 1

// Why a turn key held no live worker's value (TurnTake.Stranger,
// Turn.Stranger).
const (
	// StrangerType: the key is not a string (Was names its type).
	StrangerType = "wrong type"
	// StrangerNoTTL: a string without a TTL; every worker writes the turn
	// with one.
	StrangerNoTTL = "no TTL"
	// StrangerNotWorker: a value no live worker writes: for the scan turn,
	// not an instance ID, or one neither registered nor heartbeating (a
	// registered one without a heartbeat is a dead worker's turn, taken
	// over as an expired one); for the sweep turn, not a worker's token.
	StrangerNotWorker = "not a live worker"
)

// TurnTake is what a take of a turn did.
type TurnTake struct {
	// Held reports whether the caller holds the turn.
	Held bool
	// Stranger is why the caller took the turn from a key that held no
	// live worker's value (StrangerType, StrangerNoTTL, StrangerNotWorker),
	// "" for an ordinary take, renewal or miss.
	Stranger string
	// Was is what the stranger left: the key's type for StrangerType, the
	// value (clipped) otherwise.
	Was string
}

// IsSweepToken reports whether v has the shape of the token a worker
// holds the sweep turn under: 32 lowercase hexadecimal digits.
func IsSweepToken(v string) bool {
	if len(v) != 32 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseTake reads takeTurnScript's reply: the take, and the holder when
// the caller does not hold the turn.
func parseTake(key string, reply any, err error) (TurnTake, string, error) {
	if err != nil {
		return TurnTake{}, "", fmt.Errorf("take %s: %w", key, err)
	}
	r, ok := reply.([]any)
	if !ok || len(r) != 3 {
		return TurnTake{}, "", fmt.Errorf("take %s: unexpected reply %v", key, reply)
	}
	held, _ := r[0].(int64)
	why, _ := r[1].(string)
	was, _ := r[2].(string)
	if held != 1 {
		return TurnTake{}, was, nil
	}
	t := TurnTake{Held: true, Was: was}
	switch why {
	case "type":
		t.Stranger = StrangerType
	case "nottl":
		t.Stranger = StrangerNoTTL
	case "stranger":
		t.Stranger = StrangerNotWorker
	}
	return t, "", nil
}

// isWorker reports whether a turn's holder is a live worker's value:
// for the scan turn an instance ID whose heartbeat exists, for the sweep
// turn a worker's token. dead reports a scan turn held by a registered
// instance whose heartbeat is absent: a worker that died, or lost its
// lease, while it held the turn. Its turn is taken over as an expired one
// would be, and is no stranger's.
func (s *Redis) isWorker(ctx context.Context, scan bool, holder string) (live, dead bool, err error) {
	if len(holder) >= turnValueClip {
		return false, false, nil
	}
	if !scan {
		return IsSweepToken(holder), false, nil
	}
	if ValidateName(holder) != nil {
		return false, false, nil
	}
	n, err := s.rdb.Exists(ctx, s.Keys(holder).Heartbeat).Result()
	if err != nil {
		return false, false, fmt.Errorf("read the heartbeat of the scan turn's holder: %w", err)
	}
	if n == 1 {
		return true, false, nil
	}
	registered, err := s.rdb.SIsMember(ctx, s.registry, holder).Result()
	if err != nil {
		return false, false, fmt.Errorf("read the registration of the scan turn's holder: %w", err)
	}
	return false, registered, nil
}

// takeTurn runs takeTurnScript on key; first is its reply when the
// caller already ran it (TakeScanTurn pipelines it). When another value
// holds the turn and it is no live worker's, it runs the script again,
// taking the turn if the key still holds that value.
func (s *Redis) takeTurn(ctx context.Context, key string, scan bool, holder string, ttl time.Duration, first *redis.Cmd) (TurnTake, error) {
	if first == nil {
		first = takeTurnScript.Run(ctx, s.rdb, []string{key}, holder, ttl.Milliseconds(), "")
	}
	t, other, err := parseTake(key, first.Val(), first.Err())
	if err != nil || t.Held || other == "" {
		return t, err
	}
	live, dead, err := s.isWorker(ctx, scan, other)
	if err != nil || live {
		return TurnTake{}, err
	}
	again := takeTurnScript.Run(ctx, s.rdb, []string{key}, holder, ttl.Milliseconds(), other)
	t, _, err = parseTake(key, again.Val(), again.Err())
	if dead && t.Stranger == StrangerNotWorker {
		t.Stranger, t.Was = "", "" // a dead worker's turn, taken over
	}
	return t, err
}

// Turn is who holds one of the fleet's turns, and for how long more.
type Turn struct {
	// Holder is the key's value: the scanning instance's ID for the scan
	// turn, a random token for the sweep turn; "" when nobody holds it,
	// the key's type when it is not a string.
	Holder string
	TTL    time.Duration
	// Stranger is why the holder is no live worker (StrangerType,
	// StrangerNoTTL, StrangerNotWorker); "" for a worker or no holder.
	// The next take of the turn by a worker takes it over.
	Stranger string
}

// Turns reads the scan turn and the sweep turn, and judges their holders
// as a take would.
func (s *Redis) Turns(ctx context.Context) (scan, sweep Turn, err error) {
	keys := []string{ScanTurnKey(s.prefix), SweepTurnKey(s.prefix)}
	var turns [2]Turn
	for i, key := range keys {
		pipe := s.rdb.Pipeline()
		typ, ttl := pipe.Type(ctx, key), pipe.PTTL(ctx, key)
		get := pipe.GetRange(ctx, key, 0, turnValueClip-1)
		_, _ = pipe.Exec(ctx)
		if err := errors.Join(typ.Err(), ttl.Err()); err != nil {
			return Turn{}, Turn{}, fmt.Errorf("read the scan and sweep turns: %w", err)
		}
		t := Turn{TTL: ttl.Val()}
		switch typ.Val() {
		case "none":
		case "string":
			if get.Err() != nil {
				return Turn{}, Turn{}, fmt.Errorf("read the scan and sweep turns: %w", get.Err())
			}
			t.Holder = get.Val()
			live, dead, err := s.isWorker(ctx, i == 0, t.Holder)
			switch {
			case err != nil:
				return Turn{}, Turn{}, fmt.Errorf("read the scan and sweep turns: %w", err)
			case t.TTL < 0:
				t.Stranger = StrangerNoTTL
			case !live && !dead:
				t.Stranger = StrangerNotWorker
			}
		default:
			t.Holder, t.Stranger = typ.Val(), StrangerType
		}
		turns[i] = t
	}
	return turns[0], turns[1], nil
}
