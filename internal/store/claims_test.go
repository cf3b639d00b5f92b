package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// TestClaimsOfStrangersDoNotBlockARecovery: on a real redis-server, a
// dead peer's claim key written by a stranger (a string without a TTL, a
// hash) counts as no claim: the recoverer takes it. A recoverer's claim
// (with its TTL) still holds off another.
func TestClaimsOfStrangersDoNotBlockARecovery(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("CLM"), time.Second)
	for _, c := range []struct {
		name  string
		write func(key string) error
	}{
		{"no TTL", func(key string) error { return rdb.Set(ctx, key, "stray", 0).Err() }},
		{"hash", func(key string) error { return rdb.HSet(ctx, key, "f", "v").Err() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			peer := "dead-" + testutil.Name("P")
			k := s.Keys(peer)
			require.NoError(t, rdb.SAdd(ctx, k.Rows, "1").Err())
			require.NoError(t, c.write(k.Claim))
			got, err := s.ClaimDead(ctx, peer, "tok-1", time.Minute, time.Minute)
			require.NoError(t, err)
			assert.Equal(t, ClaimTaken, got)
			assert.Equal(t, "tok-1", rdb.Get(ctx, k.Claim).Val())

			other, err := s.ClaimDead(ctx, peer, "tok-2", time.Minute, time.Minute)
			require.NoError(t, err)
			assert.Equal(t, ClaimHeld, other, "a recoverer's claim holds")
		})
	}
}
