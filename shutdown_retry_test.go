package recovery

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// unansweredLeave is a go-redis hook that makes the first departure
// pipeline (the one deleting the _OLDEST_ROW report) after arm go
// unanswered until its context ends, as a Redis that answers late would.
type unansweredLeave struct {
	armed, dropped atomic.Bool
}

func (h *unansweredLeave) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *unansweredLeave) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *unansweredLeave) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if args := c.Args(); c.Name() == "del" && len(args) == 2 && strings.HasSuffix(args[1].(string), "_OLDEST_ROW") &&
				h.armed.CompareAndSwap(true, false) {
				<-ctx.Done()
				h.dropped.Store(true)
				return ctx.Err()
			}
		}
		return next(ctx, cmds)
	}
}

// TestShutdownSendsTheDepartureAgainWhenRedisAnswersLate: the departure
// (heartbeat deleted, registry entry removed) is idempotent, so a first
// try Redis did not answer within the operation timeout is sent again
// within the caller's context: Shutdown succeeds and leaves nothing that
// peers would take for a dead worker.
func TestShutdownSendsTheDepartureAgainWhenRedisAnswersLate(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	hook := &unansweredLeave{}
	rdb.AddHook(hook)
	prefix := testutil.Name("SDR")
	w, _ := startWorker(t, rdb, &fakeResetter{}, "leaver", WithKeyPrefix(prefix))
	hook.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(ctx), "the departure is sent again")
	assert.True(t, hook.dropped.Load(), "the first departure went unanswered")
	assert.Zero(t, rdb.Exists(ctx, store.InstanceKeys(prefix, "leaver").Heartbeat).Val(), "heartbeat deleted")
	assert.False(t, rdb.SIsMember(ctx, store.RegistryKey(prefix), "leaver").Val(), "deregistered")
}
