package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// Model hole H3 (docs/model.md): a recoverer whose Claim answered "lost"
// (a failed recovery's note, the record gone since) holds "lost:<token>",
// which its Finish takes for its own claim. If the peer comes back, tracks
// rows and dies again meanwhile, that Finish must not delete its new rows
// set: the peer's heartbeat cancels a lost: claim as it cancels a token.
func TestBeatCancelsALostClaim(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	k := s.Keys("w")

	require.NoError(t, rdb.Set(ctx, k.Claim, FailedClaim, time.Minute).Err()) // an earlier recovery failed
	res, err := s.ClaimDead(ctx, "w", "tok", time.Minute, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ClaimTakenLost, res, "no rows set: the record is lost")
	require.Equal(t, "lost:tok", rdb.Get(ctx, k.Claim).Val())

	// w comes back: its heartbeat, then a row tracked; then it dies.
	b, err := s.Beat(ctx, "w", Heartbeat{Value: HeartbeatOf("p"), TTL: time.Minute, Incarnation: "i",
		IncarnationTTL: time.Minute, RowsTTL: time.Minute})
	require.NoError(t, err)
	require.True(t, b.Wrote)
	assert.Zero(t, rdb.Exists(ctx, k.Claim).Val(), "the heartbeat cancelled the lost: claim")
	require.NoError(t, s.TrackRows(ctx, "w", []int64{7}, time.Minute))
	require.NoError(t, rdb.Del(ctx, k.Heartbeat).Err()) // w died; its heartbeat expired

	fin, err := s.FinishRecovery(ctx, "w", "tok", time.Second)
	require.NoError(t, err)
	assert.Equal(t, FinishLost, fin, "the late finish has nothing to finish")
	assert.True(t, rdb.SIsMember(ctx, k.Rows, "7").Val(), "w's new rows set is kept for the next recovery")
}

// Model hole H2 (docs/model.md): between a recoverer's finish and its
// deregistration, the peer may come back, take rows and die again. On a
// single server the deregistration removes it only while it has neither a
// heartbeat nor a rows set, in one step.
func TestDeregisterKeepsAPeerThatCameBackWithRows(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	k := s.Keys("w")
	require.NoError(t, rdb.SAdd(ctx, s.Registry(), "w").Err())

	// Came back, tracked a row, died: no heartbeat, a rows set.
	require.NoError(t, s.TrackRows(ctx, "w", []int64{7}, time.Minute))
	require.NoError(t, s.Deregister(ctx, "w"))
	assert.True(t, rdb.SIsMember(ctx, s.Registry(), "w").Val(), "kept: the next scan recovers its row")

	// Alive again: kept too.
	require.NoError(t, rdb.Del(ctx, k.Rows).Err())
	require.NoError(t, rdb.Set(ctx, k.Heartbeat, HeartbeatOf("p"), time.Minute).Err())
	require.NoError(t, s.Deregister(ctx, "w"))
	assert.True(t, rdb.SIsMember(ctx, s.Registry(), "w").Val(), "alive: kept")

	// Dead with nothing left: removed.
	require.NoError(t, rdb.Del(ctx, k.Heartbeat).Err())
	require.NoError(t, s.Deregister(ctx, "w"))
	assert.False(t, rdb.SIsMember(ctx, s.Registry(), "w").Val())
}

// The finish of a recovery frees the dead peer's rows set with UNLINK, off
// Redis's main thread: a DEL of a set of a million IDs blocked the server
// for about 250 ms (docs/reliability.md), every client of it waiting.
func TestFinishFreesTheRowsSetOffTheMainThread(t *testing.T) {
	srv := testutil.StartRedis(t) // a server of its own: its command counts are this test's
	rdb := srv.Client(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	k := s.Keys("w")
	require.NoError(t, s.TrackRows(ctx, "w", []int64{1, 2, 3}, time.Minute)) // w died with three rows
	res, err := s.ClaimDead(ctx, "w", "tok", time.Minute, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ClaimTaken, res)
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())

	fin, err := s.FinishRecovery(ctx, "w", "tok", time.Second)
	require.NoError(t, err)
	require.Equal(t, FinishDone, fin)
	assert.Zero(t, rdb.Exists(ctx, k.Rows).Val())
	stats := rdb.Info(ctx, "commandstats").Val()
	assert.Contains(t, stats, "cmdstat_unlink:calls=1,", "the rows set went with one UNLINK")
	assert.NotContains(t, stats, "cmdstat_del:", "and no DEL")
}

// DropClaim deletes the caller's claim, puts back the failure note a
// "lost:" claim had taken over, and leaves anything else; a retry does
// nothing.
func TestDropClaimGivesUpOnlyTheCallersClaim(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	k := s.Keys("w")

	require.NoError(t, rdb.Set(ctx, k.Claim, "tok", time.Minute).Err())
	require.NoError(t, s.DropClaim(ctx, "w", "tok", time.Minute))
	assert.Zero(t, rdb.Exists(ctx, k.Claim).Val(), "the caller's claim is gone")
	require.NoError(t, s.DropClaim(ctx, "w", "tok", time.Minute), "a retry")
	assert.Zero(t, rdb.Exists(ctx, k.Claim).Val())

	require.NoError(t, rdb.Set(ctx, k.Claim, "lost:tok", time.Minute).Err())
	require.NoError(t, s.DropClaim(ctx, "w", "tok", 30*time.Second))
	assert.Equal(t, FailedClaim, rdb.Get(ctx, k.Claim).Val(), "the failure note is back: rows were lost")
	assert.InDelta(t, 30*time.Second, rdb.PTTL(ctx, k.Claim).Val(), float64(time.Second))

	for _, other := range []string{"other", "lost:other", FailedClaim, "done:1:tok"} {
		require.NoError(t, rdb.Set(ctx, k.Claim, other, time.Minute).Err())
		require.NoError(t, s.DropClaim(ctx, "w", "tok", time.Minute))
		assert.Equal(t, other, rdb.Get(ctx, k.Claim).Val(), "not the caller's: left alone")
	}
}

// KeepRows only lengthens TTLs: a shorter one is raised, a longer one or
// none is kept, an absent key is not created; on every peer asked.
func TestKeepRowsOnlyLengthensTTLs(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	short, long, forever, gone := s.Keys("short"), s.Keys("long"), s.Keys("forever"), s.Keys("gone")
	require.NoError(t, rdb.SAdd(ctx, short.Rows, 1).Err())
	require.NoError(t, rdb.PExpire(ctx, short.Rows, time.Second).Err())
	require.NoError(t, rdb.Set(ctx, short.Incarnation, "i", time.Second).Err())
	require.NoError(t, rdb.SAdd(ctx, long.Rows, 1).Err())
	require.NoError(t, rdb.PExpire(ctx, long.Rows, time.Hour).Err())
	require.NoError(t, rdb.SAdd(ctx, forever.Rows, 1).Err())

	require.NoError(t, s.KeepRows(ctx, []string{"short", "long", "forever", "gone"}, time.Minute))
	assert.InDelta(t, time.Minute, rdb.PTTL(ctx, short.Rows).Val(), float64(time.Second))
	assert.InDelta(t, time.Minute, rdb.PTTL(ctx, short.Incarnation).Val(), float64(time.Second))
	assert.Greater(t, rdb.PTTL(ctx, long.Rows).Val(), 59*time.Minute, "a longer TTL is kept")
	assert.Equal(t, time.Duration(-1), rdb.PTTL(ctx, forever.Rows).Val(), "no TTL stays none")
	assert.Zero(t, rdb.Exists(ctx, gone.Rows, gone.Incarnation).Val(), "nothing created")
	require.NoError(t, s.KeepRows(ctx, nil, time.Minute))
}

// Issue 20, item 3: a recoverer with a shorter rows TTL than the dead
// peer's (a rolling change of timings) must not cut the peer's set short.
func TestClaimOnlyLengthensTheRowsSetsTTL(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	long, short := s.Keys("long"), s.Keys("short")
	require.NoError(t, rdb.SAdd(ctx, long.Rows, 1).Err())
	require.NoError(t, rdb.PExpire(ctx, long.Rows, time.Hour).Err())
	require.NoError(t, rdb.Set(ctx, long.Incarnation, "i", time.Hour).Err())
	require.NoError(t, rdb.SAdd(ctx, short.Rows, 1).Err())
	require.NoError(t, rdb.PExpire(ctx, short.Rows, time.Second).Err())

	res, err := s.ClaimDead(ctx, "long", "tok", time.Second, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ClaimTaken, res)
	assert.Greater(t, rdb.PTTL(ctx, long.Rows).Val(), 59*time.Minute, "a longer TTL is kept")
	assert.Greater(t, rdb.PTTL(ctx, long.Incarnation).Val(), 59*time.Minute)
	res, err = s.ClaimDead(ctx, "short", "tok", time.Second, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ClaimTaken, res)
	assert.InDelta(t, time.Minute, rdb.PTTL(ctx, short.Rows).Val(), float64(time.Second), "a shorter one is renewed")
}

// The fleet part of a heartbeat records what the fleet serves once,
// announces the member's timings, drops lapsed announcements and returns
// the longest of the live ones; a retry answers the same.
func TestFleetBeatAnnouncesTimingsAndReturnsTheLongest(t *testing.T) {
	rdb := testutil.Redis(t)
	prefix := testutil.Name("SCF")
	s := NewRedis(rdb, prefix, time.Second)
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, FleetKey(prefix), "m:gone", "99000 99000 99000 owner 1", "m:junk", "x").Err())
	b := Heartbeat{Value: HeartbeatOf("t"), TTL: time.Second, IncarnationTTL: time.Second, RowsTTL: time.Second,
		Serves: "database=a schema=b table=c", Announce: Announcement{TTL: 20 * time.Second, Claim: 35 * time.Second, Wait: 19 * time.Second, Mode: "owner"}}
	for range 2 {
		res, err := s.Beat(ctx, "w1", b)
		require.NoError(t, err)
		require.NoError(t, res.FleetErr)
		assert.Equal(t, "database=a schema=b table=c", res.Fleet.Serves)
		assert.Equal(t, b.Announce.TTL, res.Fleet.Longest.TTL, "the lapsed announcement is not counted")
		assert.Equal(t, b.Announce.Claim, res.Fleet.Longest.Claim)
		assert.Equal(t, b.Announce.Wait, res.Fleet.Longest.Wait)
	}
	b.Serves, b.Announce = "database=x schema=y table=z", Announcement{TTL: time.Second, Claim: time.Second, Wait: time.Second, Mode: "rows-set"}
	res, err := s.Beat(ctx, "w2", b)
	require.NoError(t, err)
	assert.Equal(t, "database=a schema=b table=c", res.Fleet.Serves, "recorded once")
	assert.Equal(t, 20*time.Second, res.Fleet.Longest.TTL, "w1's is the longest")
	f, err := s.ReadFleet(ctx)
	require.NoError(t, err)
	require.Len(t, f.Members, 2, "lapsed and unreadable announcements dropped")
	assert.Equal(t, "rows-set", f.Members[1].Mode)
	got, err := s.RecordFleet(ctx, "database=x schema=y table=z", "system_identifier=2")
	require.NoError(t, err)
	assert.Equal(t, "database=a schema=b table=c", got.Serves, "RecordFleet returns what is recorded")
	assert.Empty(t, got.Server, "a server is not filled into another fleet's record")
	assert.Len(t, got.Members, 2, "RecordFleet returns the members' announcements too")
	_, err = s.Leave(ctx, "w1", Departure{Value: HeartbeatOf("t")})
	require.NoError(t, err)
	f, _ = s.ReadFleet(ctx)
	assert.Len(t, f.Members, 1, "Leave withdraws the announcement")
}

// The server field: a record without it (written by the release before
// it) is filled by the first worker that serves what the record says,
// through Start's RecordFleet or a heartbeat after a Redis restart, and
// never by a worker that serves something else; once recorded it is kept.
func TestFleetRecordFillsTheServerOfARecordWithoutIt(t *testing.T) {
	rdb := testutil.Redis(t)
	prefix := testutil.Name("SCS")
	s := NewRedis(rdb, prefix, time.Second)
	ctx := context.Background()
	key := FleetKey(prefix)
	require.NoError(t, rdb.HSet(ctx, key, "serves", "database=a schema=b table=c").Err()) // the release before
	got, err := s.RecordFleet(ctx, "database=a schema=b table=c", "system_identifier=1")
	require.NoError(t, err)
	assert.Equal(t, "system_identifier=1", got.Server, "filled")
	got, err = s.RecordFleet(ctx, "database=a schema=b table=c", "system_identifier=2")
	require.NoError(t, err)
	assert.Equal(t, "system_identifier=1", got.Server, "kept: the caller sees another server")

	require.NoError(t, rdb.HDel(ctx, key, "server").Err())
	b := Heartbeat{Value: HeartbeatOf("t"), TTL: time.Second, IncarnationTTL: time.Second, RowsTTL: time.Second,
		Serves: "database=x schema=y table=z", Server: "system_identifier=3",
		Announce: Announcement{TTL: time.Second, Claim: time.Second, Wait: time.Second, Mode: "owner"}}
	res, err := s.Beat(ctx, "w1", b)
	require.NoError(t, err)
	require.NoError(t, res.FleetErr)
	assert.Empty(t, res.Fleet.Server, "another fleet's heartbeat fills nothing")
	b.Serves = "database=a schema=b table=c"
	res, err = s.Beat(ctx, "w1", b)
	require.NoError(t, err)
	assert.Equal(t, "system_identifier=3", res.Fleet.Server, "a heartbeat fills it (after a Redis restart)")
	assert.Equal(t, "system_identifier=3", rdb.HGet(ctx, key, "server").Val())
}

// The claim re-checks the heartbeat in the script that takes it: a peer
// whose heartbeat came back between the scan that found it absent and the
// claim is alive, and no claim is taken (the simulation's mutant "the claim
// does not re-check the heartbeat" needs a scan and a heartbeat to line up
// within a round trip, which no seed of the CI budget does; this test
// catches it).
func TestClaimFindsAHeartbeatThatCameBackAfterTheScan(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("SC"), time.Second)
	ctx := context.Background()
	k := s.Keys("w")
	require.NoError(t, s.TrackRows(ctx, "w", []int64{7}, time.Minute))
	// The scan found no heartbeat; then w beat again.
	require.NoError(t, rdb.Set(ctx, k.Heartbeat, HeartbeatOf("p"), time.Minute).Err())

	res, err := s.ClaimDead(ctx, "w", "tok", time.Minute, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, ClaimAlive, res)
	assert.Zero(t, rdb.Exists(ctx, k.Claim).Val(), "no claim on a live peer")
	assert.True(t, rdb.SIsMember(ctx, k.Rows, "7").Val())
}

// TestBeatReportsTheOldestRowAgedOnTheServersClock: on a real
// redis-server, a heartbeat writes the age of the worker's oldest row
// beside its heartbeat, living a heartbeat TTL; Describe reads it aged by
// the time the key has lived. A worker holding none reads as known and
// holding none; a worker that never wrote it (an earlier release) and a
// key a stranger wrote (another type, or without the TTL) read as unknown,
// and Describe still answers. Leave deletes it.
func TestBeatReportsTheOldestRowAgedOnTheServersClock(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("OR"), time.Second)
	ctx := context.Background()
	beat := func(id string, holds bool, age time.Duration) {
		t.Helper()
		_, err := s.Beat(ctx, id, Heartbeat{Value: HeartbeatOf("p"), TTL: time.Minute, Incarnation: "i",
			IncarnationTTL: time.Minute, RowsTTL: time.Minute, HoldsRows: holds, OldestRowAge: age})
		require.NoError(t, err)
	}
	beat("holder", true, 2*time.Hour)
	beat("idle", false, 0)
	require.NoError(t, rdb.Set(ctx, s.Keys("old").Heartbeat, HeartbeatValue, time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, s.Keys("odd").Heartbeat, HeartbeatValue, time.Minute).Err())
	require.NoError(t, rdb.HSet(ctx, s.Keys("odd").OldestRow, "a", "b").Err())
	require.NoError(t, rdb.Set(ctx, s.Keys("nottl").OldestRow, "5 60000", 0).Err())

	assert.Equal(t, "7200000 60000", rdb.Get(ctx, s.Keys("holder").OldestRow).Val())
	assert.InDelta(t, time.Minute, rdb.PTTL(ctx, s.Keys("holder").OldestRow).Val(), float64(5*time.Second), "it lives a heartbeat TTL")
	// The key has lived 1.5 s: 60 s set, 58.5 s left.
	require.NoError(t, rdb.PExpire(ctx, s.Keys("holder").OldestRow, 58500*time.Millisecond).Err())

	got, err := s.Describe(ctx, []string{"holder", "idle", "old", "odd", "nottl"})
	require.NoError(t, err, "a stranger's key of another type fails nothing")
	h := got[0]
	assert.True(t, h.OldestRowKnown)
	assert.True(t, h.HoldsRows)
	assert.InDelta(t, 2*time.Hour+1500*time.Millisecond, h.OldestRow, float64(100*time.Millisecond))
	assert.Equal(t, []bool{true, false}, []bool{got[1].OldestRowKnown, got[1].HoldsRows}, "idle: known, none held")
	for _, i := range got[2:] {
		assert.False(t, i.OldestRowKnown, i.ID)
		assert.Zero(t, i.OldestRow, i.ID)
	}

	_, err = s.Leave(ctx, "holder", Departure{Value: HeartbeatOf("p")})
	require.NoError(t, err)
	assert.Zero(t, rdb.Exists(ctx, s.Keys("holder").OldestRow).Val(), "Shutdown takes the report with the heartbeat")
}

// TestParseOldestRowTakesOnlyWhatAHeartbeatWrites: malformed values read
// as unknown, never as an age.
func TestParseOldestRowTakesOnlyWhatAHeartbeatWrites(t *testing.T) {
	for _, v := range []string{"", "5", "x 1000", "-5 1000", "5 0", "5 -1", "5 x", "- x"} {
		_, _, known := ParseOldestRow(v, time.Second)
		assert.False(t, known, "%q", v)
	}
	_, _, known := ParseOldestRow("5 1000", -1)
	assert.False(t, known, "no expiry: not a heartbeat's")
	age, holds, known := ParseOldestRow("5 1000", 400*time.Millisecond)
	assert.Equal(t, []any{605 * time.Millisecond, true, true}, []any{age, holds, known})
	age, holds, known = ParseOldestRow("- 1000", 400*time.Millisecond)
	assert.Equal(t, []any{time.Duration(0), false, true}, []any{age, holds, known})
	assert.Equal(t, "- 60000", OldestRowValue(false, time.Hour, time.Minute))
	assert.Equal(t, "0 60000", OldestRowValue(true, -time.Second, time.Minute), "never negative")
}
