package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/store"
)

// What the worker says about its Redis connection: the addresses and the
// cause in the error of a failed first heartbeat, and an adapter for
// go-redis's own log lines.

// redisTarget is how rdb reaches Redis, for messages and a diagnostic dial.
type redisTarget struct {
	network  string
	addrs    []string
	password string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
}

// targetOf reads the addresses rdb dials: the node of a client, the seed
// nodes of a cluster client, the shards of a ring. Other clients have none.
func targetOf(rdb redis.UniversalClient) redisTarget {
	var t redisTarget
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		t = redisTarget{network: o.Network, addrs: []string{o.Addr}, password: o.Password, dial: o.Dialer}
	case *redis.ClusterClient:
		o := c.Options()
		t = redisTarget{addrs: o.Addrs, password: o.Password, dial: o.Dialer}
	case *redis.Ring:
		o := c.Options()
		t.addrs = slices.Sorted(maps.Values(o.Addrs))
		t.password = o.Password
	}
	if t.network == "" {
		t.network = "tcp"
	}
	if t.dial == nil {
		t.dial = (&net.Dialer{}).DialContext
	}
	return t
}

// maxDiagnosed is how many addresses a failed first heartbeat dials to find
// the cause.
const maxDiagnosed = 3

// firstHeartbeatError returns err, the failure of the first heartbeat, with
// the addresses the client dials and, when err only says that time ran out
// (go-redis then reports the deadline, not why it could not connect), the
// result of dialing each address once more under the operation timeout:
// "dial tcp 127.0.0.1:1: connect: connection refused", or that it
// connects and the server did not answer. The client's password never
// appears in the message. errors.Is and errors.As see err.
func (t redisTarget) firstHeartbeatError(ctx context.Context, o *options, err error) error {
	where := "redis"
	if len(t.addrs) > 0 {
		where = "redis at " + strings.Join(t.addrs, ", ")
	}
	var cause string
	var ne net.Error
	if len(t.addrs) > 0 && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout())) {
		cause = " (" + t.diagnose(ctx, o) + ")"
	}
	return t.redact(fmt.Errorf("first heartbeat to %s: %w%s", where, err, cause))
}

// redact masks the client's password in err.
func (t redisTarget) redact(err error) error {
	if t.password == "" {
		return err
	}
	// As a connection string, so every encoding of the password is masked.
	conn := (&url.URL{Scheme: "redis", User: url.UserPassword("u", t.password), Host: "h"}).String()
	return redact.Error(err, conn)
}

// ping is Start's first Redis command, sent alone (store.Ping): a server
// that refuses the client is reported as such, wrapping ErrRedisAuth,
// before the pipelines that follow could leave replies unread; any other
// failure is reported as the first heartbeat's.
func (t redisTarget) ping(ctx context.Context, st store.Store, o *options) error {
	opCtx, cancel := o.opContext(ctx)
	err := st.Ping(opCtx)
	cancel()
	switch {
	case err == nil:
		return nil
	case store.IsAuthError(err):
		where := "redis"
		if len(t.addrs) > 0 {
			where = "redis at " + strings.Join(t.addrs, ", ")
		}
		return t.redact(fmt.Errorf("%w: %s answered PING with %q: give the client the server's user and password "+
			"(redis.Options Username and Password, or redis://user:password@host:port)", ErrRedisAuth, where, err.Error()))
	default:
		return t.firstHeartbeatError(ctx, o, err)
	}
}

// diagnose dials each address (up to maxDiagnosed, at the same time) under
// the operation timeout and says what happened.
func (t redisTarget) diagnose(parent context.Context, o *options) string {
	addrs := t.addrs[:min(len(t.addrs), maxDiagnosed)]
	out := make([]string, len(addrs))
	ctx, cancel := o.opContext(context.WithoutCancel(parent))
	defer cancel()
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			conn, err := t.dial(ctx, t.network, addr)
			if err != nil {
				out[i] = err.Error()
				return
			}
			_ = conn.Close()
			out[i] = addr + " accepts connections but did not answer within the operation timeout " + o.opTimeout.String()
		})
	}
	wg.Wait()
	return strings.Join(out, "; ")
}

// redisSlow returns err, the failure of a Redis call of the background
// work made under the operation timeout opTimeout, saying which of the
// bounds' assumptions failed when the call timed out (isTimeout): Redis
// answering within the operation timeout (docs/safety.md, "What every
// bound assumes"). Any other error is returned as it is.
func redisSlow(opTimeout time.Duration, err error) error {
	if err == nil || !isTimeout(err) {
		return err
	}
	return fmt.Errorf("Redis did not answer within the operation timeout %v: the crash bound assumes it does: %w", opTimeout, err)
}

// RedisLogger returns a go-redis logger that writes each line go-redis
// prints (dial failures, pool problems) to l at Warn, as the attribute
// redis_log of a "go-redis" record, instead of to stderr. Install it with
// redis.SetLogger(recovery.RedisLogger(logger)), or silence go-redis with
// redis.SetLogger(&logging.VoidLogger{}).
//
// go-redis's logger is one for the whole process and cannot be read back,
// so the library never sets it itself: New or Start replacing it would
// silently take over the logs of the host's other Redis clients, and undo a
// logger the host installed. Whether and where go-redis logs is the host's
// choice, made once at start-up; the worker's own errors (the first
// heartbeat's included) name the address and the cause either way.
func RedisLogger(l *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	if l == nil {
		l = slog.Default()
	}
	return redisLogger{l}
}

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, "go-redis", slog.String("redis_log", fmt.Sprintf(format, v...)))
}
