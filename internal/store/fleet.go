package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The fleet record (FleetKey): what the fleet under a prefix serves, and
// the timings its live members announce. Workers before the fourth
// protocol version neither write nor read it; the first worker of this
// version to start or beat records it.

// Fields of the fleet record.
const (
	fleetServesField  = "serves"
	fleetServerField  = "server"
	fleetMemberField  = "m:"
	fleetLongestField = "longest"
)

// Announcement is what one member announces of itself in the fleet
// record with every heartbeat.
type Announcement struct {
	// TTL is the member's heartbeat TTL; Claim its recovery claim's TTL;
	// Wait the longest a dead peer's rows set waits for its scan after
	// the heartbeat expired (recovery interval, jitter and scan turn).
	TTL, Claim, Wait time.Duration
	// Mode is "owner" or "rows-set", for the operator only.
	Mode string
}

// FleetView is what a heartbeat learnt of the fleet record.
type FleetView struct {
	// Serves is the identity recorded ("" when none); Server the
	// PostgreSQL server's ("" when none).
	Serves, Server string
	// Longest is the longest of each timing over the live announcements,
	// the caller's own included.
	Longest Announcement
}

// Member is one member's announcement as ReadFleet found it.
type Member struct {
	ID string
	Announcement
	// Expires is when the announcement lapses unless the member beats
	// again (the server's clock).
	Expires time.Time
}

// Fleet is the whole fleet record.
type Fleet struct {
	// Serves is what the fleet serves (database, schema, table); Server
	// the PostgreSQL server it serves it on (its system identifier), ""
	// when no worker could tell or the record was written by a release
	// before the field.
	Serves, Server string
	Members        []Member
}

// Differs reports whether the record f serves something other than
// serves on server, and then the two as an error names them: the
// recorded identity and serves, each with its server when the servers
// differ. A record without a server (a release before the field), or a
// caller that cannot tell its server, differs by identity only. Start's
// fleet check and recoveryctl recover both judge with it.
func (f Fleet) Differs(serves, server string) (recorded, theirs string, differs bool) {
	if f.Serves != serves {
		return f.Serves, serves, true
	}
	if server != "" && f.Server != "" && f.Server != server {
		return f.Serves + " on " + f.Server, serves + " on " + server, true
	}
	return "", "", false
}

// recordFleetScript records what the fleet serves unless a value is there
// already, and the server it serves it on unless one is there or the
// recorded identity is another's (a record of the release before the
// server field gets it filled), and returns the whole record. A retry
// after a lost reply finds its own values and answers the same.
//
//	KEYS[1] fleet record
//	ARGV[1] what the caller serves, ARGV[2] its server ("" if it cannot tell)
var recordFleetScript = redis.NewScript(`
redis.call('HSETNX', KEYS[1], '` + fleetServesField + `', ARGV[1])
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], '` + fleetServesField + `') == ARGV[1] then
  redis.call('HSETNX', KEYS[1], '` + fleetServerField + `', ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
`)

// fleetBeatScript is the fleet part of a heartbeat: it records what the
// fleet serves if nothing is (after a Redis restart, or a fleet of older
// workers), writes the caller's announcement with its expiry (the
// server's clock + ARGV[4]), and returns the identity and the longest TTL,
// claim TTL and wait over the live announcements.
//
// The longest are kept in one field ("longest", with the time they are
// due to be worked out again), so a heartbeat costs O(1): a longer
// announcement raises them at once; once they are due (the longest TTL
// after they were last worked out), the heartbeat that finds them due
// reads every announcement, drops the lapsed ones and works them out
// afresh, so a member that left or shortened its timings stops counting
// within about four of its TTLs. (Reading every field at each heartbeat
// cost 1.3 ms of server time per heartbeat with 1,000 members.) Writing
// the same announcement again is harmless, so a retry is too.
//
//	KEYS[1] fleet record
//	ARGV[1] what the caller serves ("" if it cannot tell), ARGV[2] member
//	field, ARGV[3] "<ttl ms> <claim ms> <wait ms> <mode>", ARGV[4] ms the
//	announcement lives, ARGV[5] the caller's server ("" if it cannot tell),
//	recorded as recordFleetScript does
//
// It returns {serves, ttl, claim, wait, server}.
var fleetBeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] ~= '' then
  redis.call('HSETNX', KEYS[1], '` + fleetServesField + `', ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ' ' .. (now + tonumber(ARGV[4])))
local got = redis.call('HMGET', KEYS[1], '` + fleetServesField + `', '` + fleetLongestField + `', '` + fleetServerField + `')
local serves = got[1] or ''
local server = got[3] or ''
if ARGV[5] ~= '' and server == '' and serves == ARGV[1] then
  redis.call('HSET', KEYS[1], '` + fleetServerField + `', ARGV[5])
  server = ARGV[5]
end
local ttl, claim, wait, due
if got[2] then
  ttl, claim, wait, due = string.match(got[2], '^(%d+) (%d+) (%d+) (%d+)$')
end
if ttl and now < tonumber(due) then
  local a, b, c = string.match(ARGV[3], '^(%d+) (%d+) (%d+)')
  local nt, nc, nw = math.max(tonumber(ttl), tonumber(a)), math.max(tonumber(claim), tonumber(b)), math.max(tonumber(wait), tonumber(c))
  if nt ~= tonumber(ttl) or nc ~= tonumber(claim) or nw ~= tonumber(wait) then
    redis.call('HSET', KEYS[1], '` + fleetLongestField + `', nt .. ' ' .. nc .. ' ' .. nw .. ' ' .. due)
  end
  return {serves, nt, nc, nw, server}
end
ttl, claim, wait = 0, 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 2) == '` + fleetMemberField + `' then
    local a, b, c, _, e = string.match(v, '^(%d+) (%d+) (%d+) (%S+) (%d+)$')
    if not a or tonumber(e) < now then
      redis.call('HDEL', KEYS[1], f)
    else
      ttl = math.max(ttl, tonumber(a))
      claim = math.max(claim, tonumber(b))
      wait = math.max(wait, tonumber(c))
    end
  end
end
redis.call('HSET', KEYS[1], '` + fleetLongestField + `', ttl .. ' ' .. claim .. ' ' .. wait .. ' ' .. (now + ttl))
return {serves, ttl, claim, wait, server}
`)

// RecordFleet records serves as what the fleet serves unless another
// value is recorded, and server as its server unless one is recorded (or
// the record serves something else), and returns the record, read in the
// same script.
func (s *Redis) RecordFleet(ctx context.Context, serves, server string) (_ Fleet, err error) {
	defer s.failed(&err)
	key := FleetKey(s.prefix)
	vals, err := recordFleetScript.Run(ctx, s.rdb, []string{key}, serves, server).StringSlice()
	if err != nil {
		return Fleet{}, fmt.Errorf("record fleet %s: %w", key, err)
	}
	fields := make(map[string]string, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		fields[vals[i]] = vals[i+1]
	}
	return ParseFleet(fields), nil
}

// fleetBeat queues fleetBeatScript in pipe for member id.
func (s *Redis) fleetBeat(ctx context.Context, pipe redis.Pipeliner, id string, b Heartbeat) *redis.Cmd {
	a := b.Announce
	val := fmt.Sprintf("%d %d %d %s", a.TTL.Milliseconds(), a.Claim.Milliseconds(), a.Wait.Milliseconds(), modeWord(a.Mode))
	return fleetBeatScript.Eval(ctx, pipe, []string{FleetKey(s.prefix)},
		b.Serves, fleetMemberField+id, val, (3 * a.TTL).Milliseconds(), b.Server)
}

// modeWord keeps a mode one word, as the record's format needs.
func modeWord(m string) string {
	if m == "" || strings.ContainsAny(m, " \t\r\n") {
		return "-"
	}
	return m
}

// fleetView reads fleetBeatScript's reply.
func fleetView(c *redis.Cmd) (FleetView, error) {
	vals, err := c.Slice()
	if err != nil {
		return FleetView{}, err
	}
	if len(vals) != 5 {
		return FleetView{}, fmt.Errorf("fleet record: unexpected reply %v", vals)
	}
	var v FleetView
	v.Serves, _ = vals[0].(string)
	v.Server, _ = vals[4].(string)
	ms := func(x any) time.Duration {
		n, _ := x.(int64)
		return time.Duration(n) * time.Millisecond
	}
	v.Longest = Announcement{TTL: ms(vals[1]), Claim: ms(vals[2]), Wait: ms(vals[3])}
	return v, nil
}

// ReadFleet reads the fleet record with HGETALL. An absent record is an
// empty Fleet.
func (s *Redis) ReadFleet(ctx context.Context) (_ Fleet, err error) {
	defer s.failed(&err)
	key := FleetKey(s.prefix)
	all, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return Fleet{}, fmt.Errorf("read fleet %s: %w", key, err)
	}
	return ParseFleet(all), nil
}

// ParseFleet reads the fields of a fleet record; announcements it cannot
// read are left out.
func ParseFleet(fields map[string]string) Fleet {
	f := Fleet{Serves: fields[fleetServesField], Server: fields[fleetServerField]}
	for k, v := range fields {
		id, ok := strings.CutPrefix(k, fleetMemberField)
		if !ok {
			continue
		}
		p := strings.Fields(v)
		if len(p) != 5 {
			continue
		}
		var n [4]int64
		bad := false
		for i, j := range []int{0, 1, 2, 4} {
			x, err := strconv.ParseInt(p[j], 10, 64)
			bad = bad || err != nil || x < 0
			n[i] = x
		}
		if bad {
			continue
		}
		f.Members = append(f.Members, Member{ID: id, Announcement: Announcement{
			TTL: time.Duration(n[0]) * time.Millisecond, Claim: time.Duration(n[1]) * time.Millisecond,
			Wait: time.Duration(n[2]) * time.Millisecond, Mode: p[3],
		}, Expires: time.UnixMilli(n[3])})
	}
	slices.SortFunc(f.Members, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return f
}
