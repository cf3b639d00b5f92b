package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartWritesHeartbeatAndRegistersBeforeReturning(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	require.False(t, mr.Exists(keysOf("w1").Heartbeat))

	require.NoError(t, w.Start(context.Background()))

	v, err := mr.Get(keysOf("w1").Heartbeat)
	require.NoError(t, err)
	assert.Regexp(t, "^alive:[0-9a-f]{32}$", v, "alive:<this Worker's token>")
	assert.Equal(t, w.beatValue, v)
	assert.Equal(t, 2*time.Second, mr.TTL(keysOf("w1").Heartbeat))
	ok, err := mr.SIsMember(registryKey, "w1")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Zero(t, mr.TTL(registryKey), "the registry has no TTL")
	assert.NoError(t, w.CheckLease())
}

func TestStartFailsWhenRedisIsUnreachable(t *testing.T) {
	mr, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w1")
	mr.Close()

	err := w.Start(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "start w1: first heartbeat")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrNotStarted, "a failed Start starts nothing")

	mr2, rdb2 := newMini(t) // Start may be tried again once Redis is back
	w2, _ := newWorker(t, rdb2, &fakeResetter{}, "w1")
	require.NoError(t, w2.Start(context.Background()))
	assert.True(t, mr2.Exists(keysOf("w1").Heartbeat))
}

func TestStartTwiceIsRefused(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1")
	assert.ErrorIs(t, w.Start(context.Background()), ErrAlreadyStarted)
}
