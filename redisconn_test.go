package recovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

func TestFirstHeartbeatErrorNamesTheAddressAndTheCause(t *testing.T) {
	port := testutil.FreePort(t, false) // nothing listens there
	opt, err := redis.ParseURL(fmt.Sprintf("redis://admin:s3cretR@127.0.0.1:%d/0", port))
	require.NoError(t, err)
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")

	start := time.Now()
	err = w.Start(context.Background())
	require.Error(t, err)
	assert.Less(t, time.Since(start), 3*time.Second, "bounded by the operation timeout and one diagnostic dial")
	msg := err.Error()
	t.Log(msg)
	assert.Contains(t, msg, fmt.Sprintf("start w-1: first heartbeat to redis at 127.0.0.1:%d: ", port))
	assert.Contains(t, msg, fmt.Sprintf("dial tcp 127.0.0.1:%d: connect: connection refused", port))
	assert.NotContains(t, msg, "s3cretR")
}

func TestFirstHeartbeatErrorNamesEveryClusterSeed(t *testing.T) {
	a, b := testutil.FreePort(t, false), testutil.FreePort(t, false)
	for b == a {
		b = testutil.FreePort(t, false)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{fmt.Sprintf("127.0.0.1:%d", a), fmt.Sprintf("127.0.0.1:%d", b)},
		Password:              "s3cretC",
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")

	err := w.Start(context.Background())
	require.Error(t, err)
	msg := err.Error()
	t.Log(msg)
	assert.Contains(t, msg, fmt.Sprintf("first heartbeat to redis at 127.0.0.1:%d, 127.0.0.1:%d: ", a, b))
	assert.Contains(t, msg, "connection refused")
	assert.NotContains(t, msg, "s3cretC")
}

func TestFirstHeartbeatErrorSaysWhenTheServerConnectsButNeverAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() { // accept and say nothing
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")

	err = w.Start(context.Background())
	require.Error(t, err)
	// The original error is kept: the context's deadline, or the network
	// timeout go-redis derives from it (ContextTimeoutEnabled).
	var ne net.Error
	assert.True(t, errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()),
		"the original error is kept: %v", err)
	assert.Contains(t, err.Error(), ln.Addr().String()+" accepts connections but did not answer within the operation timeout 250ms")
}

// TestRedisLoggerSendsGoRedisLinesToTheLogger changes go-redis's
// process-wide logger: it must not run in parallel with other tests.
func TestRedisLoggerSendsGoRedisLinesToTheLogger(t *testing.T) {
	log, buf := testutil.Logger(t)
	redis.SetLogger(RedisLogger(log))
	t.Cleanup(logging.Enable) // go-redis's default, as every other test has it

	port := testutil.FreePort(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")
	require.Error(t, w.Start(context.Background()))

	require.Eventually(t, func() bool {
		return strings.Contains(buf.String(), `"msg":"go-redis"`) && strings.Contains(buf.String(), "connection refused")
	}, 5*time.Second, 10*time.Millisecond, "go-redis's dial failure reaches the logger: %s", buf)
	assert.Contains(t, buf.String(), `"level":"WARN"`)
}
