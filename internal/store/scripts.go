// The Lua scripts of the recovery protocol. claimScript, finishScript,
// failScript, beatScript and leaveScript touch the keys of one instance
// only, which share a hash tag; turnScript touches one fleet-wide key. So
// every script runs unchanged on Redis Cluster.
//
// Every script is idempotent for its caller: go-redis retries a command
// whose reply was lost (MaxRetries, 3 by default), and a retry must have
// the effect of one call, never report "held by someone else" for a claim
// the caller itself took, nor "claim lost" for a recovery it finished.
package store

import (
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ClaimResult is what ClaimDead found.
type ClaimResult int

// ClaimDead results (the claim script's replies).
const (
	ClaimTaken         ClaimResult = 1  // the caller now holds the claim; the peer has a rows set
	ClaimTakenNoRecord ClaimResult = 2  // the caller holds the claim; the peer has no rows set (it died without rows)
	ClaimTakenLost     ClaimResult = 3  // as ClaimTakenNoRecord, but an earlier recovery of the peer failed: its rows set was lost
	ClaimAlive         ClaimResult = 0  // the heartbeat exists: the peer is not dead
	ClaimHeld          ClaimResult = -1 // another recoverer holds the claim
)

// Taken reports whether the caller holds the claim.
func (r ClaimResult) Taken() bool { return r > 0 }

// FailedClaim is the value a failed recovery leaves in the claim key (see
// failScript): not a claim, a note for the next recoverer.
const FailedClaim = "failed"

// FinishResult is what FinishRecovery did.
type FinishResult int

// FinishRecovery results (the finish script's replies).
const (
	FinishDone FinishResult = 1 // rows set, incarnation and claim deleted
	FinishBack FinishResult = 2 // claim deleted, rows set kept: the peer's heartbeat is back
	FinishLost FinishResult = 0 // the claim expired or was taken over: nothing deleted
)

// claimScript atomically re-checks that the peer's heartbeat is absent and takes
// the recovery claim. Taking it also renews the TTL of the peer's rows set
// and incarnation: a dead peer's rows must stay known for as long as
// recoverers keep trying (a PostgreSQL outage of hours, recoverers dying
// mid-way), so the TTL only ever removes sets nobody tries to recover. It
// only ever lengthens a TTL: a recoverer with shorter timings than the
// dead peer's (a rolling change of timings) must not cut its set short. (A
// key without one, which no worker writes, gets the claim's.) A
// retry by the same caller (same token) finds its own claim and answers as
// the first call did. The note a failed recovery left (FailedClaim) is
// taken over; if the peer's record is gone despite it, the answer says so.
// A claim key no worker wrote (another type, or a string without a TTL:
// every claim, note and tombstone is written with PX) is a stranger's and
// counts as no claim, so it never blocks the peer's recovery for good.
//
//	KEYS[1] heartbeat, KEYS[2] claim, KEYS[3] rows set, KEYS[4] incarnation
//	ARGV[1] claim token, ARGV[2] claim TTL ms, ARGV[3] rows TTL ms
var claimScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'string' and t ~= 'none' then
  redis.call('DEL', KEYS[2])
end
local held = redis.call('GET', KEYS[2])
if held and redis.call('PTTL', KEYS[2]) < 0 then
  held = false
end
local failed = false
if held == ARGV[1] or held == 'lost:' .. ARGV[1] then
  -- a retry of our own call
elseif held == '` + FailedClaim + `' then
  failed = true
elseif held then
  return -1
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  local ttl = tonumber(ARGV[3])
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  return 1
end
if failed or held == 'lost:' .. ARGV[1] then
  redis.call('SET', KEYS[2], 'lost:' .. ARGV[1], 'PX', ARGV[2])
  return 3
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 2
`)

// finishScript ends a recovery the caller holds the claim for. If the heartbeat is
// still absent it deletes the rows set and the incarnation, as the design's
// step 5 does, with UNLINK: the memory of a set of a million IDs is freed
// off the main thread (a DEL of one blocked the server for about 250 ms).
// It deletes the rows-seen key with them.
// If the peer came back meanwhile (it was only paused) it
// leaves the rows set alone: whatever the peer wrote there since is live
// tracking, and rows the reset handled are fenced by owner or recorded in
// the reset ledger, so a later recovery never resets them again. Either way
// it replaces the claim with a short tombstone that holds the result, so a
// retry of this call after a lost reply answers the same instead of
// FinishLost.
//
//	KEYS[1] heartbeat, KEYS[2] rows set, KEYS[3] claim, KEYS[4] incarnation,
//	KEYS[5] rows seen
//	ARGV[1] claim token, ARGV[2] tombstone TTL ms
var finishScript = redis.NewScript(`
local held = redis.call('GET', KEYS[3])
if held == 'lost:' .. ARGV[1] then
  held = ARGV[1]
end
if held == 'done:1:' .. ARGV[1] then
  return 1
end
if held == 'done:2:' .. ARGV[1] then
  return 2
end
if held ~= ARGV[1] then
  return 0
end
local result = 2
if redis.call('EXISTS', KEYS[1]) == 0 then
  if KEYS[5] then
    redis.call('UNLINK', KEYS[2], KEYS[4], KEYS[5])
  else
    redis.call('UNLINK', KEYS[2], KEYS[4])
  end
  result = 1
end
redis.call('SET', KEYS[3], 'done:' .. result .. ':' .. ARGV[1], 'PX', ARGV[2])
return result
`)

// failScript gives up a claim the caller holds after a failed recovery: it
// replaces the claim with FailedClaim, which the next recoverer's Claim
// takes over at once and which tells it that the peer's rows were not
// reset yet. A retry finds the note and does nothing.
//
//	KEYS[1] claim key
//	ARGV[1] claim token, ARGV[2] TTL of the note in ms
var failScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == 'lost:' .. ARGV[1] then
  redis.call('SET', KEYS[1], '` + FailedClaim + `', 'PX', ARGV[2])
  return 1
end
return 0
`)

// dropScript gives up a claim whose taking the caller could not confirm
// (every send of the claim timed out, or the peer was no longer judged
// dead before a retry), so the next recoverer need not wait out its TTL.
// It deletes the caller's token; a "lost:<token>" (the claim had taken a
// failure note over, with the peer's record gone) goes back to the note,
// so the next recoverer still learns that rows were lost. Anything else is
// left: the claim was never ours, or is another's now. A retry finds
// nothing of the caller's and does nothing.
//
//	KEYS[1] claim key
//	ARGV[1] claim token, ARGV[2] TTL of the note in ms
var dropScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == 'lost:' .. ARGV[1] then
  redis.call('SET', KEYS[1], '` + FailedClaim + `', 'PX', ARGV[2])
  return 1
end
return 0
`)

// keepScript renews the TTL of a held peer's rows set and incarnation to
// ARGV[1] ms, only ever lengthening it: a key without a TTL, or with a
// longer one, is left alone, and an absent key is not created. While the
// peer's heartbeat is absent and its set holds rows, it writes the set's
// size and incarnation into the rows-seen key, living the set's TTL plus
// ARGV[1]: a recoverer that finds the set gone later reports the loss
// from it. A retry writes the same again.
//
//	KEYS[1] rows set, KEYS[2] incarnation, KEYS[3] heartbeat, KEYS[4] rows seen
//	ARGV[1] TTL ms
var keepScript = redis.NewScript(`
local ttl = tonumber(ARGV[1])
for i = 1, 2 do
  local left = redis.call('PTTL', KEYS[i])
  if left >= 0 and left < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  local n = redis.call('SCARD', KEYS[1])
  if n > 0 then
    local left = redis.call('PTTL', KEYS[1])
    if left < ttl then
      left = ttl
    end
    local inc = redis.call('GET', KEYS[2]) or ''
    redis.call('SET', KEYS[4], n .. ' ' .. inc, 'PX', left + ttl)
  end
end
return 0
`)

// turnScript takes a fleet-wide turn (the scan or the sweep turn), or extends it if the caller holds it
// already: the holder keeps the lease for as long as it renews it, and a
// retry after a lost reply finds the caller holding it. Workers before
// takeTurnScript ran it; it stays for the tests that run old and new
// workers' scripts together.
//
//	KEYS[1] lease key
//	ARGV[1] holder token, ARGV[2] TTL in milliseconds
//
// Returns 1 when the caller holds the lease, 0 otherwise.
var turnScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
`)

// takeTurnScript is turnScript that also takes the turn from a stranger:
// a key of another type than a string, a string without a TTL (every
// worker, old or new, writes the turn with PX), or the value ARGV[3] the
// caller found to be no live worker's (TakeScanTurn and TakeSweepTurn
// judge it between two runs; the value must be unchanged since). A live
// worker's value always has a TTL and is never ARGV[3], so the script
// never takes the turn from one: two live workers never both hold it, and
// workers that run turnScript keep their turns.
//
//	KEYS[1] lease key
//	ARGV[1] holder token, ARGV[2] TTL in milliseconds, ARGV[3] the value
//	found to be no worker's ("" for none)
//
// Returns {1, why, was} when the caller holds the lease, {0, "", holder}
// otherwise; why is "" for an ordinary take or renewal, else "type" (was:
// the key's type), "nottl" or "stranger" (was: the value, clipped to
// turnValueClip bytes). The holder is clipped the same way.
var takeTurnScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 'type', t}
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, '', ''}
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, '', ''}
end
local was = string.sub(v, 1, ` + strconv.Itoa(turnValueClip) + `)
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 'nottl', was}
end
if ARGV[3] ~= '' and was == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 'stranger', was}
end
return {0, '', was}
`)

// beatScript writes one heartbeat of an instance on the instance's own slot: if
// the heartbeat key is absent or holds the caller's value, it sets it with
// its TTL, sets the incarnation, removes the rows whose Untrack could not
// reach Redis, adds every tracked row and refreshes the rows set's TTL.
// If the key holds any other value (another process heartbeats the same
// instance ID, or an old worker's "alive"), it writes nothing: the caller
// has lost the ID. A retry after a lost reply finds the caller's own value
// and writes the same again.
//
// A heartbeat also cancels a recovery claim on the instance (a recoverer's
// token, or its "lost:<token>" after a failed recovery whose record was
// gone; not a failure note or a finished tombstone): the instance is
// alive, and a recoverer that claimed it while it was paused must not
// delete its rows set when it finishes, even if the instance has died
// again and its heartbeat expired by then (its finish finds the claim gone
// and leaves everything; the owner guard or the ledger covers the rows it
// reset). It deletes the rows-seen key too (keepScript): what a scan saw
// of its rows set while it was dead is no loss once it is alive.
//
//	KEYS[1] heartbeat, KEYS[2] incarnation, KEYS[3] rows set, KEYS[4] claim,
//	KEYS[5] rows seen
//	ARGV[1] heartbeat value, ARGV[2] heartbeat TTL ms, ARGV[3] incarnation,
//	ARGV[4] incarnation TTL ms, ARGV[5] rows TTL ms, ARGV[6] n,
//	ARGV[7 .. 6+n] rows to remove, ARGV[7+n ..] rows to add
var beatScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then
  return 0
end
local c = redis.call('GET', KEYS[4])
if c and c ~= '` + FailedClaim + `' and string.sub(c, 1, 5) ~= 'done:' then
  redis.call('DEL', KEYS[4])
end
if KEYS[5] then
  redis.call('DEL', KEYS[5])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
local n = tonumber(ARGV[6])
local function each(cmd, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call(cmd, KEYS[3], unpack(ARGV, i, j))
    i = j + 1
  end
end
each('SREM', 7, 6 + n)
each('SADD', 7 + n, #ARGV)
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
`)

// leaveScript deletes the caller's heartbeat at Shutdown, and only if it still
// holds the caller's value: a process that took the instance ID over
// keeps its heartbeat. A retry finds the key gone and does nothing.
//
//	KEYS[1] heartbeat
//	ARGV[1] the caller's heartbeat value
var leaveScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// deregisterScript removes an instance from the registry only while
// neither its heartbeat nor its rows set exists, in one step: a worker that
// came back, took rows and died again between a recoverer's finish and its
// deregistration stays registered, so the next scan finds it (model hole
// H2, docs/model.md). The registry lives in another slot than the
// instance's keys, so this runs on a single server only; Cluster uses the
// SREM-then-recheck sequence (Redis.Deregister).
//
//	KEYS[1] registry, KEYS[2] heartbeat, KEYS[3] rows set
//	ARGV[1] instance ID
var deregisterScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  return redis.call('SREM', KEYS[1], ARGV[1])
end
return 0
`)

// Script returns a protocol script by name ("claim", "finish", "fail",
// "drop", "keep", "turn", "take-turn", "beat", "leave", "deregister", "fleet" or
// "record-fleet"; nil for another), for tests that must
// recognise one on the wire by its hash.
func Script(name string) *redis.Script {
	return map[string]*redis.Script{
		"claim": claimScript, "finish": finishScript, "fail": failScript, "drop": dropScript, "keep": keepScript,
		"turn": turnScript, "take-turn": takeTurnScript, "beat": beatScript, "leave": leaveScript, "deregister": deregisterScript,
		"fleet": fleetBeatScript, "record-fleet": recordFleetScript,
	}[name]
}
