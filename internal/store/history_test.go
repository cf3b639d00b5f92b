package store

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestHistoryIsCappedAndReadInOrder: on a real redis-server, each append
// trims the stream to about maxLen entries (MAXLEN ~ never leaves fewer),
// and ReadHistory returns the oldest or the newest, oldest first, from a
// time on.
func TestHistoryIsCappedAndReadInOrder(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("ST"), time.Second)
	before := time.Now().Add(-time.Second)
	for i := range 1000 {
		require.NoError(t, s.AppendHistory(ctx, []string{"kind", "test", "n", fmt.Sprint(i)}, 100))
	}
	n, err := rdb.XLen(ctx, HistoryKey(s.prefix)).Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(100))
	assert.Less(t, n, int64(300), "trimmed to about 100 (whole nodes of 100 entries)")

	all, err := s.ReadHistory(ctx, HistoryQuery{})
	require.NoError(t, err)
	require.Len(t, all, int(n))
	assert.Equal(t, "999", all[len(all)-1].Fields["n"])
	assert.Equal(t, fmt.Sprint(1000-n), all[0].Fields["n"])
	assert.WithinDuration(t, time.Now(), all[0].Added, 5*time.Second)

	newest, err := s.ReadHistory(ctx, HistoryQuery{Count: 3, Newest: true})
	require.NoError(t, err)
	require.Len(t, newest, 3)
	assert.Equal(t, []string{"997", "998", "999"}, []string{newest[0].Fields["n"], newest[1].Fields["n"], newest[2].Fields["n"]})
	oldest, err := s.ReadHistory(ctx, HistoryQuery{Count: 2, Since: before})
	require.NoError(t, err)
	assert.Equal(t, all[:2], oldest)
	later, err := s.ReadHistory(ctx, HistoryQuery{Since: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	assert.Empty(t, later)

	empty, err := NewRedis(rdb, testutil.Name("NONE"), time.Second).ReadHistory(ctx, HistoryQuery{Count: 5, Newest: true})
	require.NoError(t, err)
	assert.Empty(t, empty, "no stream: no entries, no error")
}

// TestTurnsNamesTheirHolders reads the scan and sweep turns as taken.
func TestTurnsNamesTheirHolders(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	s := NewRedis(rdb, testutil.Name("ST"), time.Second)
	scan, sweep, err := s.Turns(ctx)
	require.NoError(t, err)
	assert.Equal(t, Turn{Holder: "", TTL: -2 * time.Nanosecond}, Turn{Holder: scan.Holder, TTL: scan.TTL})
	assert.Empty(t, sweep.Holder)

	took, _, err := s.TakeScanTurn(ctx, "w-1", time.Minute)
	require.NoError(t, err)
	require.True(t, took.Held)
	scan, sweep, err = s.Turns(ctx)
	require.NoError(t, err)
	assert.Equal(t, "w-1", scan.Holder)
	assert.InDelta(t, time.Minute, scan.TTL, float64(5*time.Second))
	assert.Empty(t, sweep.Holder)
}
