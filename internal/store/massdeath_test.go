package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// A scan's bulk removal of dead registry entries keeps every peer that is
// alive or has a rows set, as one deregistration does, and Records tells
// the peers with nothing in Redis from the others: single server (one
// script per peer, by hash) and Cluster (SREM, EXISTS, SADD back).
func TestDeregisterIdleRemovesOnlyPeersWithNeitherHeartbeatNorRowsSet(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		rdb := testutil.Redis(t)
		testDeregisterIdle(t, NewRedis(rdb, testutil.Name("MD"), time.Second), rdb)
	})
	t.Run("cluster", func(t *testing.T) {
		s, cc := clusterStore(t, testutil.StartCluster(t, 3))
		testDeregisterIdle(t, s, cc)
	})
}

func testDeregisterIdle(t *testing.T, s *Redis, rdb redis.UniversalClient) {
	ctx := context.Background()
	var ids []string
	for i := range 300 { // spread over every master on Cluster
		id := fmt.Sprintf("dead-%d", i)
		ids = append(ids, id)
		require.NoError(t, rdb.SAdd(ctx, s.Registry(), id).Err())
	}
	require.NoError(t, rdb.Set(ctx, s.Keys("dead-1").Heartbeat, HeartbeatOf("p"), time.Minute).Err()) // alive again
	require.NoError(t, s.TrackRows(ctx, "dead-2", []int64{7}, time.Minute))                           // came back, took a row, died
	require.NoError(t, rdb.Set(ctx, s.Keys("dead-3").Incarnation, "life", time.Minute).Err())

	recs, err := s.Records(ctx, ids[:4])
	require.NoError(t, err)
	assert.True(t, recs[0].Empty())
	assert.True(t, recs[1].Empty(), "a heartbeat is no record")
	assert.Equal(t, int64(1), recs[2].Rows)
	assert.Greater(t, recs[2].RowsTTL, 50*time.Second)
	assert.False(t, recs[2].Empty())
	assert.Greater(t, recs[3].IncarnationTTL, 50*time.Second)
	assert.False(t, recs[3].Empty())

	n, err := s.DeregisterIdle(ctx, ids)
	require.NoError(t, err)
	assert.Equal(t, 298, n)
	left, err := rdb.SMembers(ctx, s.Registry()).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"dead-1", "dead-2"}, left, "the live peer and the one with a rows set stay")
}
