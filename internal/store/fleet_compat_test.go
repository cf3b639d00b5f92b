package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// The fleet record's scripts as the release before the "server" field
// runs them (internal/store/fleet.go at that release, the field names
// written out): workers of that release and of this one run together in
// a rolling upgrade.
var (
	previousRecordFleetScript = redis.NewScript(`
redis.call('HSETNX', KEYS[1], 'serves', ARGV[1])
return redis.call('HGET', KEYS[1], 'serves')
`)
	previousFleetBeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] ~= '' then
  redis.call('HSETNX', KEYS[1], 'serves', ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ' ' .. (now + tonumber(ARGV[4])))
local got = redis.call('HMGET', KEYS[1], 'serves', 'longest')
local serves = got[1] or ''
local ttl, claim, wait, due
if got[2] then
  ttl, claim, wait, due = string.match(got[2], '^(%d+) (%d+) (%d+) (%d+)$')
end
if ttl and now < tonumber(due) then
  local a, b, c = string.match(ARGV[3], '^(%d+) (%d+) (%d+)')
  local nt, nc, nw = math.max(tonumber(ttl), tonumber(a)), math.max(tonumber(claim), tonumber(b)), math.max(tonumber(wait), tonumber(c))
  if nt ~= tonumber(ttl) or nc ~= tonumber(claim) or nw ~= tonumber(wait) then
    redis.call('HSET', KEYS[1], 'longest', nt .. ' ' .. nc .. ' ' .. nw .. ' ' .. due)
  end
  return {serves, nt, nc, nw}
end
ttl, claim, wait = 0, 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 2) == 'm:' then
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
redis.call('HSET', KEYS[1], 'longest', ttl .. ' ' .. claim .. ' ' .. wait .. ' ' .. (now + ttl))
return {serves, ttl, claim, wait}
`)
)

// A record this release wrote (with "server") serves workers of the
// release before it as it did: their Start reads the same "serves" (no
// ErrFleetMismatch), their heartbeats, on both of the script's paths (the
// recount and the O(1) one), answer what they expect and leave "server"
// alone; and this release's workers still find the server afterwards.
func TestFleetRecordWithAServerServesWorkersOfThePreviousRelease(t *testing.T) {
	rdb := testutil.Redis(t)
	prefix := testutil.Name("SCP")
	s := NewRedis(rdb, prefix, time.Second)
	ctx := context.Background()
	key := FleetKey(prefix)
	const serves, server = "database=a schema=b table=c", "system_identifier=1"

	f, err := s.RecordFleet(ctx, serves, server)
	require.NoError(t, err)
	require.Equal(t, server, f.Server)

	got, err := previousRecordFleetScript.Run(ctx, rdb, []string{key}, serves).Text()
	require.NoError(t, err)
	assert.Equal(t, serves, got, "an old worker's Start reads what it serves: accepted")
	for i := range 2 { // the recount first (no "longest" yet), then the O(1) path
		vals, err := previousFleetBeatScript.Run(ctx, rdb, []string{key}, serves, "m:old", "8000 9000 7000 rows-set", 24000).Slice()
		require.NoError(t, err, "old heartbeat %d", i)
		require.Len(t, vals, 4)
		assert.Equal(t, serves, vals[0], "old heartbeat %d: no second fleet seen", i)
		assert.Equal(t, int64(8000), vals[1])
		assert.Equal(t, server, rdb.HGet(ctx, key, "server").Val(), "old heartbeat %d leaves the server", i)
	}

	res, err := s.Beat(ctx, "new", Heartbeat{Value: HeartbeatOf("t"), TTL: time.Second, IncarnationTTL: time.Second, RowsTTL: time.Second,
		Serves: serves, Server: server, Announce: Announcement{TTL: time.Second, Claim: time.Second, Wait: time.Second, Mode: "owner"}})
	require.NoError(t, err)
	require.NoError(t, res.FleetErr)
	assert.Equal(t, server, res.Fleet.Server)
	assert.Equal(t, 8*time.Second, res.Fleet.Longest.TTL, "the old worker's announcement counts")
	read, err := s.ReadFleet(ctx)
	require.NoError(t, err)
	assert.Len(t, read.Members, 2)
}
