package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// TestTurnsAreTakenFromStrangers: on a real redis-server, a take of the
// scan or the sweep turn takes it from a key no live worker holds (a hash,
// a string without a TTL, a value no worker writes), says why, and Turns
// names the same stranger before the take.
func TestTurnsAreTakenFromStrangers(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("STR"), time.Second)
	const me = "w-me"
	token := strings.Repeat("ab", 16)
	take := func(scan bool) (TurnTake, error) {
		if scan {
			t, _, err := s.TakeScanTurn(ctx, me, time.Minute)
			return t, err
		}
		return s.TakeSweepTurn(ctx, token, time.Minute)
	}
	for _, scan := range []bool{true, false} {
		key := SweepTurnKey(s.prefix)
		if scan {
			key = ScanTurnKey(s.prefix)
		}
		for _, c := range []struct {
			name  string
			write func() error
			why   string
			was   string
		}{
			{"hash", func() error { return rdb.HSet(ctx, key, "f", "v").Err() }, StrangerType, "hash"},
			{"no TTL", func() error { return rdb.Set(ctx, key, "junk", 0).Err() }, StrangerNoTTL, "junk"},
			{"unknown holder", func() error { return rdb.Set(ctx, key, "ghost", time.Hour).Err() }, StrangerNotWorker, "ghost"},
			{"huge value", func() error { return rdb.Set(ctx, key, strings.Repeat("x", 1<<20), time.Hour).Err() },
				StrangerNotWorker, strings.Repeat("x", turnValueClip)},
		} {
			t.Run(map[bool]string{true: "scan", false: "sweep"}[scan]+"/"+c.name, func(t *testing.T) {
				require.NoError(t, rdb.Del(ctx, key).Err())
				require.NoError(t, c.write())
				scanTurn, sweepTurn, err := s.Turns(ctx)
				require.NoError(t, err)
				seen := sweepTurn
				if scan {
					seen = scanTurn
				}
				assert.Equal(t, c.why, seen.Stranger, "Turns before the take")

				got, err := take(scan)
				require.NoError(t, err)
				assert.Equal(t, TurnTake{Held: true, Stranger: c.why, Was: c.was}, got)
				v, err := rdb.Get(ctx, key).Result()
				require.NoError(t, err)
				assert.Contains(t, []string{me, token}, v)
				assert.Greater(t, rdb.PTTL(ctx, key).Val(), time.Duration(0))

				again, err := take(scan)
				require.NoError(t, err)
				assert.Equal(t, TurnTake{Held: true}, again, "the renewal of its own turn is no stranger's")
			})
		}
	}
}

// TestTurnsOfLiveWorkersAreNotTaken: a scan turn held by an instance
// whose heartbeat exists, or a sweep turn held by a worker's token, is not
// taken over; once the scan turn's holder has no heartbeat, it is: as a
// stranger's when the holder is not registered either, silently when it
// is (a dead worker's).
func TestTurnsOfLiveWorkersAreNotTaken(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("LIVE"), time.Second)
	require.NoError(t, rdb.Set(ctx, s.Keys("w-live").Heartbeat, HeartbeatOf("t"), time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, ScanTurnKey(s.prefix), "w-live", time.Minute).Err())
	require.NoError(t, rdb.Set(ctx, SweepTurnKey(s.prefix), strings.Repeat("0f", 16), time.Minute).Err())

	scanTurn, sweepTurn, err := s.Turns(ctx)
	require.NoError(t, err)
	assert.Empty(t, scanTurn.Stranger)
	assert.Empty(t, sweepTurn.Stranger)
	got, _, err := s.TakeScanTurn(ctx, "w-me", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, TurnTake{}, got)
	sw, err := s.TakeSweepTurn(ctx, strings.Repeat("ab", 16), time.Minute)
	require.NoError(t, err)
	assert.Equal(t, TurnTake{}, sw)
	assert.Equal(t, "w-live", rdb.Get(ctx, ScanTurnKey(s.prefix)).Val())

	require.NoError(t, rdb.Del(ctx, s.Keys("w-live").Heartbeat).Err())
	got, _, err = s.TakeScanTurn(ctx, "w-me", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, TurnTake{Held: true, Stranger: StrangerNotWorker, Was: "w-live"}, got, "neither heartbeating nor registered: a stranger")

	// A registered worker whose heartbeat is gone (killed, or its lease
	// lost, while it held the turn) is a dead worker, not a stranger: its
	// turn is taken over without an alarm.
	require.NoError(t, rdb.SAdd(ctx, s.Registry(), "w-dead").Err())
	require.NoError(t, rdb.Set(ctx, ScanTurnKey(s.prefix), "w-dead", time.Minute).Err())
	scanTurn, _, err = s.Turns(ctx)
	require.NoError(t, err)
	assert.Equal(t, "w-dead", scanTurn.Holder)
	assert.Empty(t, scanTurn.Stranger, "a dead worker's turn")
	got, _, err = s.TakeScanTurn(ctx, "w-me", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, TurnTake{Held: true}, got, "taken over from a dead worker, no stranger")
	assert.Equal(t, "w-me", rdb.Get(ctx, ScanTurnKey(s.prefix)).Val())
}

// TestOldAndNewTurnScriptsShareATurn: in a rolling upgrade, a worker
// running turnScript (the earlier version) and one running takeTurnScript
// never both hold a turn: neither takes the other's, each renews its own,
// and a stranger's TTL-less value, which the old script never takes, is
// taken by the new one, after which the old one sees an ordinary holder.
func TestOldAndNewTurnScriptsShareATurn(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("OLDNEW"), time.Second)
	key := ScanTurnKey(s.prefix)
	for _, id := range []string{"w-old", "w-new"} {
		require.NoError(t, rdb.Set(ctx, s.Keys(id).Heartbeat, HeartbeatValue, time.Minute).Err())
	}
	old := func() int64 {
		n, err := turnScript.Run(ctx, rdb, []string{key}, "w-old", time.Minute.Milliseconds()).Int64()
		require.NoError(t, err)
		return n
	}
	newTake := func() TurnTake {
		got, _, err := s.TakeScanTurn(ctx, "w-new", time.Minute)
		require.NoError(t, err)
		return got
	}

	require.Equal(t, int64(1), old())
	assert.Equal(t, TurnTake{}, newTake(), "the old worker's turn is a live worker's")
	assert.Equal(t, int64(1), old(), "the old worker renews")
	require.NoError(t, rdb.Del(ctx, key).Err())
	assert.Equal(t, TurnTake{Held: true}, newTake())
	assert.Equal(t, int64(0), old(), "the old worker does not take the new one's turn")

	require.NoError(t, rdb.Set(ctx, key, "junk", 0).Err())
	assert.Equal(t, int64(0), old(), "the old script never takes a stranger's key")
	assert.Equal(t, TurnTake{Held: true, Stranger: StrangerNoTTL, Was: "junk"}, newTake())
	assert.Equal(t, int64(0), old())
	assert.Equal(t, "w-new", rdb.Get(ctx, key).Val())

	require.NoError(t, rdb.Del(ctx, key).Err())
	require.NoError(t, rdb.HSet(ctx, key, "f", "v").Err())
	require.Error(t, turnScript.Run(ctx, rdb, []string{key}, "w-old", 1000).Err(), "the old script fails on a wrong type")
	assert.Equal(t, TurnTake{Held: true, Stranger: StrangerType, Was: "hash"}, newTake())
	assert.Equal(t, int64(0), old(), "and works again once the new one replaced it")
}

// TestLeaveIsNotFailedByAStrangersRegistryOrFleetRecord: a registry that
// is not a set and a fleet record that is not a hash (strings a stranger
// wrote) fail no departure: the heartbeat goes, and Leave returns no
// error, so a worker's Shutdown succeeds (fault scenario T5 found it
// failing on the fleet record).
func TestLeaveIsNotFailedByAStrangersRegistryOrFleetRecord(t *testing.T) {
	for _, c := range []struct {
		name string
		keys func(s *Redis) []string
	}{
		{"fleet record", func(s *Redis) []string { return []string{FleetKey(s.prefix)} }},
		{"registry", func(s *Redis) []string { return []string{s.registry} }},
		{"both", func(s *Redis) []string { return []string{FleetKey(s.prefix), s.registry} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			ctx := context.Background()
			s := NewRedis(rdb, testutil.Name("LEAVE"), time.Second)
			k := s.Keys("w-me")
			require.NoError(t, rdb.Set(ctx, k.Heartbeat, HeartbeatOf("t"), time.Minute).Err())
			for _, key := range c.keys(s) {
				require.NoError(t, rdb.Set(ctx, key, "stray", 0).Err())
			}
			res, err := s.Leave(ctx, "w-me", Departure{Value: HeartbeatOf("t")})
			require.NoError(t, err)
			assert.True(t, res.Deregistered)
			assert.Zero(t, rdb.Exists(ctx, k.Heartbeat).Val(), "the heartbeat is gone")
			for _, key := range c.keys(s) {
				assert.Equal(t, "stray", rdb.Get(ctx, key).Val(), "a stranger's key is left alone")
			}
		})
	}
}

// TestLeaveReleasesTheScanTurnItHolds: a departing worker deletes the scan
// turn while it names it, so the next taker does not find a holder with
// neither heartbeat nor registry entry (a stranger, logged at Error); a
// turn another instance holds is left alone, and a second Leave changes
// nothing.
func TestLeaveReleasesTheScanTurnItHolds(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("LEAVE"), time.Second)
	key := ScanTurnKey(s.prefix)
	require.NoError(t, rdb.Set(ctx, key, "w-other", time.Minute).Err())
	_, err := s.Leave(ctx, "w-me", Departure{Value: HeartbeatOf("t")})
	require.NoError(t, err)
	assert.Equal(t, "w-other", rdb.Get(ctx, key).Val(), "another's turn stays")

	require.NoError(t, rdb.Set(ctx, key, "w-me", time.Minute).Err())
	for range 2 {
		_, err = s.Leave(ctx, "w-me", Departure{Value: HeartbeatOf("t")})
		require.NoError(t, err)
		assert.Zero(t, rdb.Exists(ctx, key).Val(), "its own turn released")
	}
}
