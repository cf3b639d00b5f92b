package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// trackBetweenPages adds members to key after the first SSCAN page, as a
// live worker's Track would.
type trackBetweenPages struct {
	rdb   *redis.Client
	key   string
	added atomic.Bool
}

func (h *trackBetweenPages) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *trackBetweenPages) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *trackBetweenPages) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.EqualFold(cmd.Name(), "sscan") && h.added.CompareAndSwap(false, true) {
			ids := make([]any, 5000)
			for i := range ids {
				ids[i] = 100000 + i
			}
			if err := h.rdb.SAdd(ctx, h.key, ids...).Err(); err != nil {
				return fmt.Errorf("track between pages: %w", err)
			}
		}
		return err
	}
}

// TestLiveRowsReadsASetThatGrowsBetweenPages: the backstop sweep reads the
// rows sets of live workers, which Track may grow between two SSCAN pages.
// ReadRows, for a dead peer's set, fails such a read (fewer members read
// than SCARD counts): used by the sweep, a busy worker with more than a
// page of rows made every look fail. LiveRows returns every member present
// throughout.
func TestLiveRowsReadsASetThatGrowsBetweenPages(t *testing.T) {
	rdb := testutil.Redis(t)
	s := NewRedis(rdb, testutil.Name("LR"), 5*time.Second)
	ctx := context.Background()
	k := s.Keys("w")
	ids := make([]any, 3*readRowsBatch)
	for i := range ids {
		ids[i] = i + 1
	}
	require.NoError(t, rdb.SAdd(ctx, k.Rows, ids...).Err())

	hooked := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = hooked.Close() })
	hooked.AddHook(&trackBetweenPages{rdb: rdb, key: k.Rows})
	hs := NewRedis(hooked, s.prefix, 5*time.Second)
	members, err := hs.LiveRows(ctx, "w")
	require.NoError(t, err)
	read := make(map[string]bool, len(members))
	for _, m := range members {
		read[m] = true
	}
	for i := 1; i <= 3*readRowsBatch; i++ {
		require.True(t, read[strconv.Itoa(i)], "member %d, present throughout, is read", i)
	}

	// The same growth fails ReadRows' whole-set check, as a dead peer's set
	// must not change.
	require.NoError(t, rdb.SRem(ctx, k.Rows, func() []any {
		var extra []any
		for i := 0; i < 5000; i++ {
			extra = append(extra, 100000+i)
		}
		return extra
	}()...).Err())
	again := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = again.Close() })
	again.AddHook(&trackBetweenPages{rdb: rdb, key: k.Rows})
	_, _, err = NewRedis(again, s.prefix, 5*time.Second).ReadRows(ctx, "w")
	assert.ErrorContains(t, err, "members read")
}
