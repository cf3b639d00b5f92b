// Package scripts holds the Lua scripts the recovery loop runs. Each script
// touches the keys of one instance only, which share a hash tag, so it runs
// unchanged on Redis Cluster.
package scripts

import "github.com/redis/go-redis/v9"

// Claim results.
const (
	ClaimTaken = 1  // the caller now holds the claim
	ClaimAlive = 0  // the heartbeat exists: the peer is not dead
	ClaimHeld  = -1 // another recoverer holds the claim
	FinishDone = 1  // rows set and claim deleted
	FinishBack = 2  // claim deleted, rows set kept: the peer's heartbeat is back
	FinishLost = 0  // the claim expired or was taken over: nothing deleted
)

// Claim atomically re-checks that the peer's heartbeat is absent and takes
// the recovery claim.
//
//	KEYS[1] heartbeat key, KEYS[2] claim key
//	ARGV[1] claim token, ARGV[2] claim TTL in milliseconds
var Claim = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return -1
`)

// Finish ends a recovery the caller holds the claim for. If the heartbeat is
// still absent it deletes the rows set, as the design's step 5 does; if the
// peer came back meanwhile it keeps the set (the caller removes only the
// members it reset). Either way it deletes the claim.
//
//	KEYS[1] heartbeat key, KEYS[2] rows key, KEYS[3] claim key
//	ARGV[1] claim token
var Finish = redis.NewScript(`
if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
redis.call('DEL', KEYS[2])
return 1
`)

// Release deletes the claim if the caller still holds it.
//
//	KEYS[1] claim key
//	ARGV[1] claim token
var Release = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// TakeLease takes a fleet-wide lease, or extends it if the caller holds it
// already: the holder keeps the lease for as long as it renews it.
//
//	KEYS[1] lease key
//	ARGV[1] holder token, ARGV[2] TTL in milliseconds
//
// Returns 1 when the caller holds the lease, 0 otherwise.
var TakeLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
`)
