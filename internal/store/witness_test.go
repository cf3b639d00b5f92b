package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// The witness's names and values are protocol: pinned here.
func TestWitnessKeysAndMarkersMatchTheDesign(t *testing.T) {
	assert.Equal(t, "ALYA_{w-1}_WITNESS", InstanceKeys("ALYA", "w-1").Witness)
	assert.Equal(t, "ALYA_{w-1}_LIFE:abc", LifeChannel("ALYA", "w-1", "abc"))
	assert.Equal(t, "ALYA_WITNESS_TURN", WitnessTurnKey("ALYA"))
	assert.Equal(t, "ALYA_WITNESS_SECOND", WitnessSecondKey("ALYA"))
	assert.Contains(t, FleetKeys("ALYA"), "ALYA_WITNESS_TURN")
	assert.Contains(t, FleetKeys("ALYA"), "ALYA_WITNESS_SECOND")

	w := Witness{Life: "abc", Grace: 500 * time.Millisecond, RunID: "r1", Epoch: 3}
	assert.Equal(t, "abc 500 r1 3", w.String())
	back, ok := ParseWitness(w.String())
	require.True(t, ok)
	assert.Equal(t, w, back)
	j, ok := ParseWitness("judged abc")
	require.True(t, ok)
	assert.Equal(t, Witness{Life: "abc", Judged: true}, j)
	for _, bad := range []string{"", "abc", "abc 500 r1", "abc 0 r1 1", "abc -5 r1 1", "abc 500 r1 0", "a{b 500 r1 1", "abc x r1 1", "judged a}b"} {
		_, ok := ParseWitness(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// On a real redis-server: a marker is judged only if it still holds the
// value the judge read (a reconnection's new epoch defeats it), and once
// judged the life cannot write it back: the worker learns it was judged.
func TestWitnessMarkerIsJudgedByCompareAndSetAndStaysJudged(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("WM"), time.Second)
	w1 := Witness{Life: "l1", Grace: time.Second, RunID: "r", Epoch: 1}
	judged, err := s.WriteWitness(ctx, "w", w1, time.Minute)
	require.NoError(t, err)
	require.False(t, judged)

	w2 := w1
	w2.Epoch = 2 // the worker reconnected after the judge read w1
	_, err = s.WriteWitness(ctx, "w", w2, time.Minute)
	require.NoError(t, err)
	ok, err := s.JudgeLife(ctx, "w", w1.String(), w1)
	require.NoError(t, err)
	assert.False(t, ok, "a reconnection since the read defeats the verdict")

	ok, err = s.JudgeLife(ctx, "w", w2.String(), w2)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.JudgeLife(ctx, "w", w2.String(), w2)
	require.NoError(t, err)
	assert.True(t, ok, "a retry after a lost reply is judged too (the reset is idempotent)")
	ttl, err := rdb.PTTL(ctx, WitnessKey(s.prefix, "w")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 50*time.Second, "the TTL is kept")
	w3 := w2
	w3.Epoch = 3
	judged, err = s.WriteWitness(ctx, "w", w3, time.Minute)
	require.NoError(t, err)
	assert.True(t, judged, "the judged life learns it")
	v, err := s.ReadWitness(ctx, "w")
	require.NoError(t, err)
	assert.Equal(t, "judged l1", v, "and cannot write the marker back")

	next := Witness{Life: "l2", Grace: time.Second, RunID: "r", Epoch: 4}
	judged, err = s.WriteWitness(ctx, "w", next, time.Minute)
	require.NoError(t, err)
	assert.False(t, judged, "a new life writes its own")

	require.NoError(t, s.DropWitness(ctx, "w", w1.String()))
	v, _ = s.ReadWitness(ctx, "w")
	assert.Equal(t, next.String(), v, "dropped only if it holds the value given")
	require.NoError(t, s.DropWitness(ctx, "w", next.String()))
	v, _ = s.ReadWitness(ctx, "w")
	assert.Empty(t, v)
}

// Shard channels came in Redis 7.0: the version decision of
// WitnessAvailable. (The servers here run 7.0, so the 6.2 path is tested
// by this function alone.)
func TestShardChannelsNeedRedis7(t *testing.T) {
	for v, want := range map[string]bool{"7.0.15": true, "7.2.4": true, "8.0.0": true, "10.1": true,
		"6.2.14": false, "6.0.0": false, "5.0.7": false, "": false, "x.y": false} {
		assert.Equal(t, want, ShardChannels(v), "%q", v)
	}
}

// On a real 3-master Cluster: a life's shard channel is held on the
// master of its instance's slot, and counted there with that master's run
// ID, whatever slot it is in; pings are answered on the subscription; the
// witness turns, in two slots, are read in one call; a Cluster of Redis 7
// runs the witness.
func TestWitnessOnClusterCountsEachChannelOnTheMasterOfItsSlot(t *testing.T) {
	c := testutil.StartCluster(t, 3)
	s, cc := clusterStore(t, c)
	ctx := context.Background()
	require.True(t, s.WitnessSupported())
	require.NoError(t, s.WitnessAvailable(ctx))

	// Instances whose keys land on each of the three masters.
	byNode := map[string]string{}
	for i := 0; len(byNode) < 3 && i < 100; i++ {
		id := fmt.Sprintf("w-%d", i)
		m, err := cc.MasterForKey(ctx, s.Keys(id).Heartbeat)
		require.NoError(t, err)
		if _, ok := byNode[m.Options().Addr]; !ok {
			byNode[m.Options().Addr] = id
		}
	}
	require.Len(t, byNode, 3)
	var channels, want []string
	for node, id := range byNode {
		ch := LifeChannel(s.prefix, id, "l1")
		sub, err := s.SubscribeLife(ctx, ch)
		require.NoError(t, err)
		t.Cleanup(func() { sub.Close() })
		kind, payload, err := sub.Receive(ctx, time.Second)
		require.NoError(t, err)
		require.Equal(t, LifeSubscribed, kind)
		require.Equal(t, ch, payload)
		require.NoError(t, sub.Ping(ctx, "p1"))
		kind, payload, err = sub.Receive(ctx, time.Second)
		require.NoError(t, err)
		require.Equal(t, LifePong, kind, "a ping on a shard channel's connection is answered")
		require.Equal(t, "p1", payload)
		info, err := c.Node(node).Client(t).Info(ctx, "server").Result()
		require.NoError(t, err)
		channels, want = append(channels, ch), append(want, infoField(info, "run_id"))
		held, run, err := s.LifeHeld(ctx, ch)
		require.NoError(t, err)
		assert.True(t, held)
		assert.Equal(t, infoField(info, "run_id"), run, "the run of the master that holds the channel")
	}
	counts, runs, err := s.CountLives(ctx, append(channels, LifeChannel(s.prefix, "nobody", "l1")))
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 1, 1, 0}, counts)
	assert.Equal(t, want, runs[:3], "each channel counted on its own master")

	n, err := s.WitnessTurnsTaken(ctx)
	require.NoError(t, err, "the turns are in two slots")
	assert.Zero(t, n)
	for _, second := range []bool{false, true} {
		_, err := s.TakeWitnessTurn(ctx, "w-0", second, time.Minute)
		require.NoError(t, err)
	}
	n, err = s.WitnessTurnsTaken(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
}
