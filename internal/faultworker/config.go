package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/alya/recovery"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres"
)

// Completion guards: how the host's completion UPDATE protects a row.
const (
	// guardOwner is owner fencing (docs/safety.md): the fetch sets owner,
	// the completion requires owner = me AND status = 'inprog', and the
	// resetter only resets rows the dead instance still owns.
	guardOwner = "owner"
	// guardStatus requires only status = 'inprog' at completion; the
	// resetter has no owner column.
	guardStatus = "status"
	// guardNone is the design's host taken literally: the completion sets
	// the row done whatever its state; the resetter has no owner column.
	guardNone = "none"
)

// Host loops (-host): the calls the host makes.
const (
	// hostProtocol calls Track, CheckLease, Untrack and Release itself.
	hostProtocol = "protocol"
	// hostForgetful is hostProtocol abandoning a block on a lost lease
	// without Release (issue 32's report).
	hostForgetful = "forgetful"
	// hostBlock uses the Block handle: Begin, defer Close, Track, Check, Done.
	hostBlock = "block"
)

// config is everything the worker can be told. Connection strings come
// from the environment only (REDIS_URL, REDIS_CLUSTER_ADDRS, or
// REDIS_SENTINEL_ADDRS with REDIS_SENTINEL_MASTER; and DATABASE_URL), so
// they never appear in a process listing, and they are never printed.
type config struct {
	redisURL     string   // REDIS_URL, never printed
	clusterAddrs []string // REDIS_CLUSTER_ADDRS: a Redis Cluster instead
	// sentinelAddrs (REDIS_SENTINEL_ADDRS) and sentinelMaster
	// (REDIS_SENTINEL_MASTER): a master found through Sentinel
	// (redis.NewFailoverClient) instead.
	sentinelAddrs  []string
	sentinelMaster string
	databaseURL    string // DATABASE_URL, never printed
	// resetDatabaseURL (RESET_DATABASE_URL, never printed) is the
	// database of the resetter's own pool, when it must differ from the
	// host's (the suite puts a proxy in front of the resets only); ""
	// shares the host's pool.
	resetDatabaseURL string

	schema     string // search_path of the tables
	table      string // the rows table, quoted as one identifier
	instanceID string
	prefix     string
	guard      string
	block      int
	work       time.Duration // simulated work per row
	poll       time.Duration // wait when nothing is queued
	rowTimeout time.Duration // bound for committing one row, retries included

	heartbeatTTL      time.Duration
	heartbeatInterval time.Duration
	recoveryInterval  time.Duration
	rowsTTL           time.Duration
	opTimeout         time.Duration
	resetTimeout      time.Duration
	shutdownTimeout   time.Duration
	scanLease         bool
	expiry            bool // WithExpiryNotifications(true)

	// Faults of the recoverer (issue 10), all off by default.
	recoverOnly     bool          // take no rows: only heartbeat and recover peers
	rowsSets        bool          // WithRowsSets: rows sets even with owner fencing
	acceptEviction  bool          // WithEvictionAccepted
	dieAfterResetOf string        // SIGKILL this process right after the first reset of this peer's rows that changed rows committed
	delayFinishOf   string        // after the first reset of this peer's rows that changed rows, wait finishDelay before the finish script
	finishDelay     time.Duration // see delayFinishOf
	// stallCompletion holds the first completion transaction open this
	// long once its UPDATE has locked the row (fault L1: the host
	// vanishes mid-completion, its session keeping the lock).
	stallCompletion time.Duration

	// Host mistakes the backstop sweep must survive (issue 21), off by
	// default: track is "before" (the design: Track before the fetch's
	// COMMIT), "after" (after it) or "never"; dieAfterCommit SIGKILLs the
	// process right after its first fetch commits, before a Track that
	// comes after it; resetterInprog is the in-progress status the
	// resetter is told ("" : 'inprog', as the host writes it).
	track          string
	dieAfterCommit bool
	resetterInprog string
	noBackstop     bool // WithBackstopSweep(false): the sweep's "before" figures
	noWitness      bool // WithLivenessWitness(false): detection by the heartbeat TTL alone
	// host is the host loop (hostProtocol, hostForgetful, hostBlock);
	// with hostBlock, fetchers goroutines fetch at once, every panicEvery-th
	// row panics and every failFetchEvery-th fetch fails before its COMMIT.
	host                                 string
	fetchers, panicEvery, failFetchEvery int
	panicCrash                           bool // -panic-every's panic crashes the process

	logLevel slog.Level
}

// parseConfig reads the flags in args and the connection settings from
// getenv.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("faultworker", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema of the tables (default: the search_path)")
	fs.StringVar(&c.table, "table", postgres.DefaultTable, "the rows table")
	fs.StringVar(&c.instanceID, "instance-id", "", "this worker's ID in Redis (default <hostname>-<pid>-<start>-<random>)")
	fs.StringVar(&c.prefix, "prefix", ops.DefaultKeyPrefix, "Redis key prefix of the fleet")
	fs.StringVar(&c.guard, "guard", guardOwner, "completion guard: owner (fencing), status, or none")
	fs.IntVar(&c.block, "block", 10, "rows per block")
	fs.DurationVar(&c.work, "work", 50*time.Millisecond, "simulated work per row")
	fs.DurationVar(&c.poll, "poll", 50*time.Millisecond, "wait between fetches when no row is queued")
	fs.DurationVar(&c.rowTimeout, "row-timeout", time.Minute, "bound for committing one row, retries included")
	fs.DurationVar(&c.heartbeatTTL, "heartbeat-ttl", 2*time.Second, "heartbeat TTL")
	fs.DurationVar(&c.heartbeatInterval, "heartbeat-interval", 500*time.Millisecond, "heartbeat interval")
	fs.DurationVar(&c.recoveryInterval, "recovery-interval", time.Second, "recovery interval")
	fs.DurationVar(&c.rowsTTL, "rows-ttl", 6*time.Second, "rows set TTL")
	fs.DurationVar(&c.opTimeout, "op-timeout", 0, "timeout of each background Redis call (0: the library's default)")
	fs.DurationVar(&c.resetTimeout, "reset-timeout", 10*time.Second, "timeout of each reset")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 5*time.Second, "deadline for Shutdown after the last block")
	fs.BoolVar(&c.scanLease, "scan-lease", true, "one worker of the fleet scans per recovery interval (false: every worker scans)")
	fs.BoolVar(&c.expiry, "expiry-notifications", false, "recover a peer on its heartbeat's expiry event (WithExpiryNotifications(true)); the scan stays")
	fs.BoolVar(&c.recoverOnly, "recover-only", false, "take no rows: only heartbeat and recover dead peers")
	fs.BoolVar(&c.acceptEviction, "accept-eviction", false, "start on a Redis whose maxmemory-policy can evict keys (WithEvictionAccepted)")
	fs.BoolVar(&c.rowsSets, "rows-sets", false, "keep rows sets in Redis even with owner fencing (WithRowsSets: as releases before owner mode)")
	fs.StringVar(&c.dieAfterResetOf, "die-after-reset-of", "", "SIGKILL this process right after its first reset of this peer's rows that changed rows has committed, before the finish script (fault F2)")
	fs.StringVar(&c.delayFinishOf, "delay-finish-of", "", "after the first reset of this peer's rows that changed rows, wait -finish-delay before the finish script (fault F8)")
	fs.DurationVar(&c.finishDelay, "finish-delay", 0, "see -delay-finish-of")
	fs.DurationVar(&c.stallCompletion, "stall-completion", 0, "hold the first completion transaction open this long after its UPDATE locked the row (fault L1)")
	fs.StringVar(&c.track, "track", "before", "when the host calls Track: before the fetch's COMMIT (the design), after it, or never")
	fs.BoolVar(&c.dieAfterCommit, "die-after-commit", false, "SIGKILL this process right after its first fetch commits, before a Track that comes after it (with -track after)")
	fs.StringVar(&c.resetterInprog, "resetter-inprog", "", "the in-progress status the resetter is told (default 'inprog'; a misspelt one for issue 21)")
	fs.StringVar(&c.host, "host", hostProtocol, "the host loop: protocol (Track, CheckLease, Untrack, Release), forgetful (the same, abandoning a block on a lost lease without Release), or block (the Block handle)")
	fs.IntVar(&c.fetchers, "fetchers", 1, "with -host block: goroutines fetching and processing blocks at once")
	fs.IntVar(&c.panicEvery, "panic-every", 0, "with -host block: every Nth row's processing panics, recovered by the host's own recover (0: never)")
	fs.BoolVar(&c.panicCrash, "panic-crash", false, "with -panic-every: the panic is not recovered and crashes the process, after the block's deferred Close")
	fs.IntVar(&c.failFetchEvery, "fail-fetch-every", 0, "with -host block: every Nth fetch fails between its UPDATE and its COMMIT, and rolls back (0: never)")
	fs.BoolVar(&c.noBackstop, "no-backstop", false, "WithBackstopSweep(false): no sweep without an owner column")
	fs.BoolVar(&c.noWitness, "no-witness", false, "WithLivenessWitness(false): a kill is seen when the heartbeat expires, not at once")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.redisURL = getenv("REDIS_URL")
	if addrs := getenv("REDIS_CLUSTER_ADDRS"); addrs != "" {
		c.clusterAddrs = strings.Split(addrs, ",")
	}
	if addrs := getenv("REDIS_SENTINEL_ADDRS"); addrs != "" {
		c.sentinelAddrs = strings.Split(addrs, ",")
	}
	c.sentinelMaster = getenv("REDIS_SENTINEL_MASTER")
	c.databaseURL = getenv("DATABASE_URL")
	c.resetDatabaseURL = getenv("RESET_DATABASE_URL")

	var problems []string
	switch n := countSet(c.redisURL != "", len(c.clusterAddrs) > 0, len(c.sentinelAddrs) > 0); {
	case n == 0:
		problems = append(problems, "set REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS")
	case n > 1:
		problems = append(problems, "set only one of REDIS_URL, REDIS_CLUSTER_ADDRS and REDIS_SENTINEL_ADDRS")
	}
	if (len(c.sentinelAddrs) > 0) != (c.sentinelMaster != "") {
		problems = append(problems, "REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER go together")
	}
	if c.databaseURL == "" {
		problems = append(problems, "set DATABASE_URL")
	}
	switch c.guard {
	case guardOwner, guardStatus, guardNone:
	default:
		problems = append(problems, fmt.Sprintf("-guard %q must be owner, status or none", c.guard))
	}
	switch c.host {
	case hostProtocol, hostForgetful, hostBlock:
	default:
		problems = append(problems, fmt.Sprintf("-host %q must be protocol, forgetful or block", c.host))
	}
	if c.fetchers < 1 || c.panicEvery < 0 || c.failFetchEvery < 0 {
		problems = append(problems, "-fetchers must be at least 1, -panic-every and -fail-fetch-every at least 0")
	}
	switch c.track {
	case "before", "after", "never":
	default:
		problems = append(problems, fmt.Sprintf("-track %q must be before, after or never", c.track))
	}
	if c.block < 1 {
		problems = append(problems, fmt.Sprintf("-block %d must be at least 1", c.block))
	}
	if c.work < 0 {
		problems = append(problems, fmt.Sprintf("-work %v must not be negative", c.work))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll", c.poll}, {"row-timeout", c.rowTimeout}, {"shutdown-timeout", c.shutdownTimeout}} {
		if d.v <= 0 {
			problems = append(problems, fmt.Sprintf("-%s %v must be positive", d.name, d.v))
		}
	}
	if c.finishDelay < 0 {
		problems = append(problems, fmt.Sprintf("-finish-delay %v must not be negative", c.finishDelay))
	}
	if (c.delayFinishOf != "") != (c.finishDelay > 0) {
		problems = append(problems, "-delay-finish-of and -finish-delay go together")
	}
	if len(problems) > 0 {
		return c, errors.New(strings.Join(problems, "; "))
	}
	return c, nil
}

// countSet returns how many of bs are true.
func countSet(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// options are the library options the flags ask for. New validates them.
func (c config) options(log *slog.Logger) []recovery.Option {
	opts := []recovery.Option{
		recovery.WithKeyPrefix(c.prefix),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      c.heartbeatTTL,
			HeartbeatInterval: c.heartbeatInterval,
			RecoveryInterval:  c.recoveryInterval,
			RowsTTL:           c.rowsTTL,
			ResetTimeout:      c.resetTimeout,
		}),
		recovery.WithScanTurn(c.scanLease),
		recovery.WithLogger(log),
	}
	if c.instanceID != "" {
		opts = append(opts, recovery.WithInstanceID(c.instanceID))
	}
	if c.expiry {
		opts = append(opts, recovery.WithExpiryNotifications(), recovery.WithExpiryConfigSet())
	}
	if c.rowsSets {
		opts = append(opts, recovery.WithRowsSets())
	}
	if c.noBackstop {
		opts = append(opts, recovery.WithBackstopSweep(false))
	}
	if c.noWitness {
		opts = append(opts, recovery.WithLivenessWitness(false))
	}
	if c.acceptEviction {
		opts = append(opts, recovery.WithEvictionAccepted())
	}
	if c.opTimeout != 0 {
		opts = append(opts, recovery.WithTimings(recovery.Timings{OperationTimeout: c.opTimeout}))
	}
	return opts
}

// resetterOptions are the pgxreset.Resetter options of the guard: owner fencing
// adds the owner column. Every reset counts in recoveries, which the
// fault suite reads to prove a row was reset once.
func (c config) resetterOptions() []postgres.Option {
	opts := []postgres.Option{
		postgres.WithTable(c.table),
		postgres.WithRecoveryCountColumn("recoveries"),
	}
	if c.guard == guardOwner {
		opts = append(opts, postgres.WithOwnerColumn("owner"))
	}
	if c.resetterInprog != "" {
		opts = append(opts, postgres.WithStatuses(c.resetterInprog, "queued"))
	}
	return opts
}
