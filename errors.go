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

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/store"
)

// Sentinel errors. Errors returned by this package wrap them, so test with
// errors.Is.
var (
	// ErrShutdown is returned by Start, Track, ops.RecoverNow, CheckLease and
	// Healthy after Shutdown was called (and by Release without owner
	// fencing).
	ErrShutdown = errors.New("recovery: shut down")

	// ErrNotStarted is returned by Track and CheckLease before Start has
	// succeeded: rows tracked by a worker without a heartbeat would never be
	// recovered.
	ErrNotStarted = errors.New("recovery: not started")

	// ErrAlreadyStarted is returned by a second call to Start.
	ErrAlreadyStarted = errors.New("recovery: already started")

	// ErrLeaseLost is returned by Track and CheckLease while the worker has
	// not refreshed its heartbeat for long enough that peers may already
	// consider it dead and recover its rows.
	ErrLeaseLost = errors.New("recovery: heartbeat lease lost")

	// ErrRowsNotReset is wrapped by the error of a recovery that found rows
	// it could neither reset nor show to be settled (see
	// ResetResult.NotReset): usually a status misconfigured. The peer's rows
	// set is kept and recovery tries again at every scan.
	ErrRowsNotReset = errors.New("recovery: rows neither reset nor settled")

	// ErrRowsLocked is wrapped, with ErrRowsNotReset, by the error of a
	// recovery or a reset that left rows in progress because another
	// session held them locked (RowState.Locked): a transaction left open,
	// perhaps on a host that vanished without closing its connection. The
	// reset never waits for such a lock; the rows are kept and retried at
	// every scan until the session ends (idle_in_transaction_session_timeout
	// ends it, see docs/operations.md). A reset whose statement waited out
	// lock_timeout on a table lock, or found another session resetting the
	// same rows set, wraps it too.
	ErrRowsLocked = contract.ErrRowsLocked

	// ErrRowsRefused is wrapped, with ErrRowsNotReset, by the error of a
	// recovery or a reset that left rows in progress because the database
	// would not change them: a BEFORE UPDATE trigger returned NULL
	// (RowState.Refused), or the reset's UPDATE failed on a constraint, a
	// trigger raising an error, or a rule. Unlike a lock, waiting does not
	// end it: the trigger, rule or constraint must change. The rows are
	// kept and retried at every scan.
	ErrRowsRefused = contract.ErrRowsRefused

	// ErrReadOnly is wrapped by the error Start returns when the resetter's
	// database session cannot write: the server is a standby
	// (pg_is_in_recovery), or transactions are read-only
	// (default_transaction_read_only, set for the role, the database or the
	// server: a replica or a read endpoint). A reset refused for the same
	// reason wraps it too.
	ErrReadOnly = contract.ErrReadOnly

	// ErrRowsSetLost is wrapped by the error of a recovery that found a
	// dead peer's rows set gone after an earlier recovery of it had
	// failed, or after a scan of this worker had seen it (it expired or
	// was evicted; the error names how many rows it held): the rows it
	// held may stay in progress. The backstop sweep recovers them (unless
	// WithBackstopSweep(false)).
	ErrRowsSetLost = errors.New("recovery: rows set of a dead peer lost before its rows were reset")

	// ErrUntrackedRows is wrapped by Healthy's error, and by the error
	// logged, for a rows TTL after this worker was found not to Track
	// before its COMMIT (rows-set mode): a backstop sweep (without an
	// owner column) found rows committed in progress in no rows set and
	// then in this worker's (Track after the COMMIT), and told it through
	// the untracked-rows note it reads with its scan turn; or the worker
	// was asked to Untrack rows while no Track had been called since Start
	// (Track forgotten). The sweeping worker logs every such finding with
	// this error, and the rows no set holds (nothing says whose), but its
	// own Healthy fails only for its own rows. The sweep resets such rows
	// after a rows TTL, as if their worker had died, while that host may
	// still process them (docs/safety.md §5b).
	ErrUntrackedRows = errors.New("recovery: rows in progress that no worker tracked")

	// ErrRegistryWrongType is wrapped by the error of a recovery scan that
	// could not read the fleet's registry because its key holds something
	// other than a set (someone wrote it by hand). Until the key is deleted
	// no scan can find a dead peer; expiry notifications and the backstop
	// sweep still do.
	ErrRegistryWrongType = errors.New("recovery: worker registry key is not a set")

	// ErrInstanceIDInUse is wrapped by the error Start returns when another
	// live process heartbeats the same instance ID (two Workers given one
	// WithInstanceID, a pod started while its predecessor still runs): the
	// other process refreshed the heartbeat while Start watched it. A
	// running Worker whose heartbeat finds another process's value (it was
	// paused past its TTL and a process with its ID started meanwhile)
	// reports it too, with ErrLeaseLost, from CheckLease, Healthy and
	// Track, for good: that Worker must be shut down.
	ErrInstanceIDInUse = errors.New("recovery: instance ID in use by another live process")

	// ErrInvalidConfig is wrapped by every error New, pgxreset.New and sqlreset.New
	// return for a bad option or argument.
	ErrInvalidConfig = contract.ErrInvalidConfig

	// ErrSchema is wrapped by every error of a Resetter's Check that found the
	// database different from what the resetter was configured for: a
	// missing table or column, a column of an unusable type, a status that
	// is not a label of the status column's enum, a missing privilege.
	// Start returns it, before writing anything to Redis.
	ErrSchema = contract.ErrSchema

	// ErrRedisAuth is wrapped by the error Start returns when Redis
	// refuses the client before anything is written: a password is
	// required and none was given (NOAUTH), the user or password is wrong
	// (WRONGPASS), or the user may not run the commands recovery needs
	// (NOPERM). The message names the address and Redis's reply, never
	// the password.
	ErrRedisAuth = errors.New("recovery: redis refused this client")

	// ErrFleetMismatch is wrapped by the error Start returns when the key
	// prefix already serves another fleet: the fleet record under it names
	// another database, schema or table than this worker's resetter. Two
	// applications under one prefix would recover each other's dead
	// workers into the wrong table. The error names both; give each
	// application its own prefix (WithKeyPrefix).
	ErrFleetMismatch = errors.New("recovery: key prefix serves another fleet")

	// ErrEvictionPolicy is wrapped by the error Start returns when a Redis
	// master can evict the library's keys (maxmemory with a volatile-* or
	// allkeys-* maxmemory-policy) and WithEvictionAccepted was not given,
	// or when its policy cannot be read (INFO memory refused): an evicted
	// heartbeat would make a live worker look dead. The message names the
	// node, its policy and the fix (maxmemory-policy noeviction).
	ErrEvictionPolicy = errors.New("recovery: redis may evict the recovery keys")

	// ErrMisconfigured is wrapped by Healthy's error once the worker's
	// self-check found that the rows it tracks do not look, to its resetter,
	// like rows in progress by this worker: statuses swapped or misspelt, or an
	// owner column not set to OwnerValue(). A crash would leave such rows
	// stuck.
	ErrMisconfigured = errors.New("recovery: tracked rows do not match the resetter's configuration")
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
