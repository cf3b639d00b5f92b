package recovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
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

// TestStartWithoutThePasswordSaysSoAndGoRedisPrintsNothing: a client
// without the password of a Redis that requires one gets a clear error
// from Start, before anything is pipelined, and go-redis has nothing to
// complain about (it logged "Conn has unread data" when the first command
// was a MULTI/EXEC pipeline the server refused). With the password the
// same worker starts. Changes go-redis's process-wide logger: not parallel.
func TestStartWithoutThePasswordSaysSoAndGoRedisPrintsNothing(t *testing.T) {
	log, buf := testutil.Logger(t)
	redis.SetLogger(RedisLogger(log))
	t.Cleanup(logging.Enable)
	srv := testutil.StartRedis(t, "--requirepass", "s3cretP")

	for _, opt := range []*redis.Options{
		{Addr: srv.Addr, ContextTimeoutEnabled: true},
		{Addr: srv.Addr, Password: "wrong-s3cret", ContextTimeoutEnabled: true},
	} {
		rdb := redis.NewClient(opt)
		w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")
		err := w.Start(context.Background())
		require.Error(t, err)
		t.Log(err)
		assert.ErrorIs(t, err, ErrRedisAuth)
		assert.Contains(t, err.Error(), "start w-1: recovery: redis refused this client: redis at "+srv.Addr+" answered PING with ")
		assert.NotContains(t, err.Error(), "s3cret")
		require.NoError(t, rdb.Close())
	}
	// Other tests' clients may still be dialing in the background: only
	// this server's lines count.
	ours := func() (lines []string) {
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, `"msg":"go-redis"`) && (strings.Contains(l, srv.Addr) || strings.Contains(l, "unread data")) {
				lines = append(lines, l)
			}
		}
		return lines
	}
	assert.Empty(t, ours(), "go-redis printed nothing about this server")

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "s3cretP"})
	t.Cleanup(func() { rdb.Close() })
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w-1")
	require.NoError(t, w.Start(context.Background()))
	require.NoError(t, w.Shutdown(context.Background()))
	assert.Empty(t, ours())
}

// A heartbeat and a recovery scan that Redis did not answer within the
// operation timeout say which assumption of the crash bound failed, not
// only "context deadline exceeded" (a real redis-server behind a proxy
// that stops carrying bytes, as a Redis that answers too late looks to
// the worker).
func TestARedisThatDoesNotAnswerInTimeIsNamedAsTheFailedAssumptionOfTheBound(t *testing.T) {
	_, proxy, rdb := behindProxy(t)
	w, logs := startWorker(t, rdb, &fakeResetter{}, "slow")
	proxy.Cut()
	signals(w).beat.WaitFor(t, func(err error) bool { return err != nil })
	waitTurns(t, &signals(w).scan, 10*time.Second, func() bool { return logs.Count("recovery scan failed; will retry") > 0 },
		"a scan that Redis did not answer")

	const want = "Redis did not answer within the operation timeout 250ms: the crash bound assumes it does"
	assert.Regexp(t, `"heartbeat failed; retrying"[^\n]*`+regexp.QuoteMeta(want), logs.String())
	assert.Regexp(t, `"recovery scan failed; will retry"[^\n]*`+regexp.QuoteMeta(want), logs.String())
}

// An error that is not a timeout is left as it is.
func TestRedisSlowNamesOnlyTimeouts(t *testing.T) {
	wrongType := errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")
	assert.Same(t, wrongType, redisSlow(250*time.Millisecond, wrongType))
	assert.NoError(t, redisSlow(250*time.Millisecond, nil))
	err := redisSlow(250*time.Millisecond, fmt.Errorf("claim: %w", context.DeadlineExceeded))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "Redis did not answer within the operation timeout 250ms: the crash bound assumes it does: claim: context deadline exceeded", err.Error())
	var ne net.Error = &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}
	assert.Contains(t, redisSlow(time.Second, ne).Error(), "within the operation timeout 1s")
}

// timeoutErr is a network error that timed out.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// A claim that Redis did not answer within the operation timeout, at
// every try, fails the recovery with an error, and a Warn, that name the
// assumption (a real redis-server; the worker's client holds back the
// claim script, as a Redis that answers too late).
func TestAClaimThatRedisDidNotAnswerInTimeNamesTheFailedAssumption(t *testing.T) {
	ctx := context.Background()
	direct := testutil.Redis(t)
	prefix := testutil.Name("SLOWCLAIM")
	plantDeadPeer(t, direct, prefix, "dead", "1", "2")
	rdb := redis.NewClient(&redis.Options{Addr: direct.Options().Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(&withholder{key: store.InstanceKeys(prefix, "dead").Claim})
	w, logs := newWorker(t, rdb, &fakeResetter{}, "recoverer", WithKeyPrefix(prefix))

	_, err := w.recoverNow(ctx)

	const want = "Redis did not answer within the operation timeout 250ms: the crash bound assumes it does: claim: "
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), want)
	assert.Regexp(t, `"recovery of dead peer failed; will retry"[^\n]*`+regexp.QuoteMeta(want), logs.String())
}

// withholder is a go-redis hook that never sends a script touching key:
// the call ends with its context, as one Redis did not answer in time.
type withholder struct{ key string }

func (h *withholder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *withholder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && slices.Contains(cmd.Args(), any(h.key)) {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

func (h *withholder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
