package store

import (
	"context"
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
