// Command recoveryctl inspects and repairs the Redis state of a fleet of
// workers that use github.com/alya/recovery: who is registered, who is alive,
// which rows each instance is tracking, the fleet's history, a live view,
// and one recovery scan on demand.
//
// Usage:
//
//	recoveryctl [flags] workers
//	recoveryctl [flags] rows <instance>
//	recoveryctl [flags] history [--since 1h] [--last N] [--rows]
//	recoveryctl [flags] watch [--interval 2s] [--last 10] [--count N] [--plain]
//	recoveryctl [flags] recover [--dry-run] [--fleet-down] [--database-url URL] [resetter flags]
//
// Flags may come before or after the command:
//
//	--redis-url URL   Redis to use (default $REDIS_URL, else redis://127.0.0.1:6379)
//	--cluster a,b     Redis Cluster seed addresses; credentials and TLS still
//	                  come from --redis-url / $REDIS_URL when set
//	--prefix ALYA     key prefix of the fleet (recovery.WithKeyPrefix)
//	                  (default $RECOVERY_KEY_PREFIX, else ALYA: ops.EnvKeyPrefix,
//	                  ops.DefaultKeyPrefix)
//	--json            print JSON instead of text
//	--timeout 30s     bound for the whole command (for watch: for each frame)
//	--heartbeat-ttl 60s, --heartbeat-interval 30s
//	                  override the heartbeat TTL each worker announced in
//	                  the fleet record, and the interval (half the TTL,
//	                  the library's default), for LAST BEAT; for a worker
//	                  that announced none, they default to the library's
//
// workers lists every registered instance: its state (alive, late or
// dead, and its recovery claim), LAST BEAT, the time since its last
// heartbeat, its heartbeat key's TTL left, and its rows. Every heartbeat
// sets the key's TTL back to the worker's heartbeat TTL, which it
// announces in the fleet record, so LAST BEAT is that TTL (or
// --heartbeat-ttl) minus the TTL left, to the millisecond (PTTL; OBJECT
// IDLETIME is not used: a read of the key such as GET resets it, it
// counts whole seconds, and Redis refuses it under an LFU maxmemory
// policy). A dead
// instance's last heartbeat was over a TTL ago; one whose key has more TTL
// left than its TTL shows "?": pass the fleet's TTL. An instance is late
// when no heartbeat came for 1.5 heartbeat intervals (past the heartbeat
// loop's ±20% jitter): right after a kill -9 its key lives on until the
// TTL runs out, and late is the first sign.
//
// history prints the fleet's history stream (<prefix>_HISTORY, see
// recovery.WithHistory): which peer died, who recovered it, how many rows
// were reset and quarantined and how long it took, what failed and why,
// who lost its lease. --since keeps the entries Redis appended in that
// last stretch of time, --last the newest N; --rows adds the IDs of the
// rows each entry reset, quarantined or found (the lowest
// ops.HistoryRowIDsMax, and how many more); --json prints every field,
// row IDs included.
//
// watch shows the fleet live: every worker, alive or dead, its heartbeat
// TTL left and the rows it holds, who holds the scan and sweep turns, and
// the last --last entries of the history, read again every --interval
// until interrupted (or --count frames). On a terminal each frame redraws
// the screen in place; piped (or with --plain), frames are plain lines,
// one block per frame.
//
// recover resets rows in PostgreSQL through the library itself: a
// PostgreSQL resetter built from the flags below and one scan of a
// recovery.Worker that is never started (ops.RecoverNow: no heartbeat,
// no registration). It needs --database-url or $DATABASE_URL, and first
// checks the resetter against the catalogue (--no-schema-check skips it). A dead instance whose tracked rows could be
// neither reset nor shown finished keeps its rows set and registry entry,
// and recover exits 1 naming the rows and their statuses.
//
// recover also judges from PostgreSQL, as the backstop sweep does
// (ops.SweepNow). Without an owner column, the rows in progress that no
// rows set holds, seen so at two looks the sweep's gap apart (the fleet's
// rows TTL), are reset with their version in the statement; with one, the
// rows of owners without a heartbeat at two looks a heartbeat TTL apart
// are reset by owner. It waits for the second look when --timeout leaves
// time for it; otherwise, or when rows stay in progress, it exits 1 naming
// them (or their owners), and without an owner column keeps registered
// every dead instance that left no rows set, whose rows they may be.
//
// Before it reads PostgreSQL, recover (and --dry-run) requires the fleet
// record under --prefix, serving what the resetter serves (the check
// Start makes, ErrFleetMismatch), and at least one registered instance:
// under a wrong --prefix or --redis-url every live worker's rows would
// look held by no rows set, and be reset under them. It refuses, exit 1,
// when the record serves something else, and when the record is missing
// or the registry empty unless --fleet-down says the whole fleet is down.
//
// recover --dry-run changes nothing: it finds the dead instances as a scan
// does and asks PostgreSQL which rows a reset would change, by running the
// reset in a transaction that is rolled back (ops.PlanRecovery, a dry
// run of the resetter), and names the rows in progress no rows set holds.
//
// The resetter flags are the options of the fleet's PostgreSQL resetter
// (package postgres), and each defaults to the RECOVERY_* variable
// ops.FromEnv reads, so a host that configures itself with ops.FromEnv and
// recoveryctl share one configuration:
//
//	--schema                 RECOVERY_SCHEMA                 WithSchema
//	--table                  RECOVERY_TABLE                  WithTable
//	--id-column              RECOVERY_ID_COLUMN              WithIDColumn
//	--status-column          RECOVERY_STATUS_COLUMN          WithStatusColumn
//	--inprog-status          RECOVERY_INPROG_STATUS          WithStatuses
//	--queued-status          RECOVERY_QUEUED_STATUS          WithStatuses
//	--done-statuses a,b      RECOVERY_DONE_STATUSES          WithDoneStatuses
//	--owner-column           RECOVERY_OWNER_COLUMN           WithOwnerColumn
//	--recovery-count-column  RECOVERY_RECOVERY_COUNT_COLUMN  WithRecoveryCountColumn
//	--max-recoveries         RECOVERY_MAX_RECOVERIES         WithMaxRecoveries
//	--terminal-status        RECOVERY_TERMINAL_STATUS        WithMaxRecoveries
//	--reset-ledger           RECOVERY_RESET_LEDGER           WithResetLedger
//	--no-reset-ledger        RECOVERY_NO_RESET_LEDGER        WithoutResetLedger
//
// and --prefix defaults to RECOVERY_KEY_PREFIX.
//
// recoveryctl never prints credentials: passwords are masked in every URL and
// error it shows. Exit status: 0 done, 1 failed, 2 bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// defaultRedisURL is used when neither --redis-url nor REDIS_URL is set.
const defaultRedisURL = "redis://127.0.0.1:6379"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the flags of every command.
type options struct {
	redisURL      string
	cluster       string
	prefix        string
	json          bool
	timeout       time.Duration
	dryRun        bool
	databaseURL   string
	noSchemaCheck bool
	// fleetDown: the operator says the whole fleet is down, so recover
	// runs without a fleet record or registered instances under --prefix.
	fleetDown bool
	since     time.Duration // history
	rows      bool          // history
	last      int           // history, watch
	interval  time.Duration // watch
	count     int           // watch
	plain     bool          // watch
	// heartbeatTTL and heartbeatInterval are the fleet's, for the time
	// since each instance's last heartbeat (workers, rows, watch).
	heartbeatTTL, heartbeatInterval time.Duration
	// ttlGiven and intervalGiven say whether the flags gave them: they
	// then override what the fleet record says of each worker.
	ttlGiven, intervalGiven bool
	// pgx is the fleet's resetter configuration: the RECOVERY_*
	// environment variables the host reads too (ops.FromEnv), then the
	// flags. Its Options make the resetter's errors name the RECOVERY_*
	// variable of a setting still as the environment gave it.
	pgx postgres.Config
}

// registerCommon defines the flags every command accepts, with the current
// values as defaults, so flags given before the command carry over.
func (o *options) registerCommon(fs *flag.FlagSet) {
	fs.StringVar(&o.redisURL, "redis-url", o.redisURL, "Redis URL (default $REDIS_URL, else "+defaultRedisURL+")")
	fs.StringVar(&o.cluster, "cluster", o.cluster, "comma-separated Redis Cluster seed addresses (host:port,...)")
	fs.StringVar(&o.prefix, "prefix", o.prefix, "key prefix of the fleet (recovery.WithKeyPrefix; default $"+ops.EnvKeyPrefix+", else "+ops.DefaultKeyPrefix+")")
	fs.BoolVar(&o.json, "json", o.json, "print JSON")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound for the whole command")
	fs.DurationVar(&o.heartbeatTTL, "heartbeat-ttl", o.heartbeatTTL,
		"the fleet's heartbeat TTL (recovery.Timings.HeartbeatTTL), for LAST BEAT: this TTL minus the TTL left (default: the TTL each worker announced in the fleet record)")
	fs.DurationVar(&o.heartbeatInterval, "heartbeat-interval", o.heartbeatInterval,
		"the fleet's heartbeat interval (recovery.Timings.HeartbeatInterval): an instance without a heartbeat for 1.5 intervals is late (default: half the TTL)")
}

// registerRecover defines the flags of recover: one for every postgres
// option, each defaulting to its RECOVERY_* variable (already in o.pgx).
func (o *options) registerRecover(fs *flag.FlagSet) {
	c := &o.pgx
	fs.BoolVar(&o.dryRun, "dry-run", false, "ask PostgreSQL which rows a scan would change, and change nothing")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	fs.BoolVar(&o.noSchemaCheck, "no-schema-check", false, "do not check table, columns and statuses against the catalogue first")
	fs.BoolVar(&o.fleetDown, "fleet-down", false, "the whole fleet is down: run although --prefix has no fleet record or no registered instance (without it, recover refuses, since a wrong --prefix or --redis-url would make every live worker's rows look unheld)")
	str := func(p *string, name, env, def, usage string) {
		fs.StringVar(p, name, *p, fmt.Sprintf("%s (postgres.%s; default $%s, else %s)", usage, optionName(name), env, def))
	}
	str(&c.Schema, "schema", postgres.EnvSchema, "the search_path", "schema of the table")
	str(&c.Table, "table", postgres.EnvTable, postgres.DefaultTable, "table of the rows")
	str(&c.IDColumn, "id-column", postgres.EnvIDColumn, postgres.DefaultIDColumn, "bigint row ID column")
	str(&c.StatusColumn, "status-column", postgres.EnvStatusColumn, postgres.DefaultStatusColumn, "status column, text or enum")
	str(&c.InProgressStatus, "inprog-status", postgres.EnvInProgressStatus, postgres.DefaultInProgressStatus, "status of a row in progress")
	str(&c.QueuedStatus, "queued-status", postgres.EnvQueuedStatus, postgres.DefaultQueuedStatus, "status of a queued row")
	fs.Func("done-statuses", fmt.Sprintf("comma-separated statuses of a finished row (postgres.WithDoneStatuses; default $%s, else %s)",
		postgres.EnvDoneStatuses, postgres.DefaultDoneStatus), func(v string) error {
		c.DoneStatuses = splitAddrs(v)
		return nil
	})
	str(&c.OwnerColumn, "owner-column", postgres.EnvOwnerColumn, "off", "owner column, if the fleet fences by owner")
	str(&c.RecoveryCountColumn, "recovery-count-column", postgres.EnvRecoveryCountColumn, "off", "recovery counter column, if the fleet counts")
	fs.IntVar(&c.MaxRecoveries, "max-recoveries", c.MaxRecoveries, fmt.Sprintf(
		"quarantine a row at this many recoveries (postgres.WithMaxRecoveries; default $%s, else off)", postgres.EnvMaxRecoveries))
	str(&c.TerminalStatus, "terminal-status", postgres.EnvTerminalStatus, postgres.DefaultTerminalStatus, "status of a quarantined row, with --max-recoveries")
	str(&c.ResetLedger, "reset-ledger", postgres.EnvResetLedger, postgres.DefaultLedgerTable, "reset ledger table, used without --owner-column")
	fs.BoolVar(&c.NoResetLedger, "no-reset-ledger", c.NoResetLedger, fmt.Sprintf(
		"reset without the reset ledger (postgres.WithoutResetLedger; default $%s)", postgres.EnvNoResetLedger))
}

// registerHistory defines the flags of history.
func (o *options) registerHistory(fs *flag.FlagSet) {
	fs.DurationVar(&o.since, "since", 0, "only the entries appended in this last stretch of time (default: all kept)")
	fs.IntVar(&o.last, "last", 0, "only the newest N entries (default: all)")
	fs.BoolVar(&o.rows, "rows", false, fmt.Sprintf("add a ROWS column: the IDs of the rows each entry reset, quarantined or found (at most %d each)", ops.HistoryRowIDsMax))
}

// registerWatch defines the flags of watch.
func (o *options) registerWatch(fs *flag.FlagSet) {
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "time between frames")
	fs.IntVar(&o.last, "last", 10, "how many of the newest history entries to show")
	fs.IntVar(&o.count, "count", 0, "stop after N frames (default: until interrupted)")
	fs.BoolVar(&o.plain, "plain", false, "plain lines, one block per frame, even on a terminal")
	fs.StringVar(&o.pgx.OwnerColumn, "owner-column", o.pgx.OwnerColumn, fmt.Sprintf(
		"the fleet's owner column (default $%s): with one, watch shows the backstop sweep's turn even when free (without, when held)", postgres.EnvOwnerColumn))
}

// The library's default heartbeat TTL and interval (the zero
// recovery.Timings), for LAST BEAT when the flags do not give the fleet's.
const (
	defaultHeartbeatTTL      = 60 * time.Second
	defaultHeartbeatInterval = 30 * time.Second
)

// optionName names the option of package postgres behind a recover flag.
func optionName(flag string) string {
	switch flag {
	case "schema":
		return "WithSchema"
	case "table":
		return "WithTable"
	case "id-column":
		return "WithIDColumn"
	case "status-column":
		return "WithStatusColumn"
	case "inprog-status", "queued-status":
		return "WithStatuses"
	case "owner-column":
		return "WithOwnerColumn"
	case "recovery-count-column":
		return "WithRecoveryCountColumn"
	case "terminal-status":
		return "WithMaxRecoveries"
	case "reset-ledger":
		return "WithResetLedger"
	}
	return flag
}

const usageText = `recoveryctl inspects and repairs the Redis state of a recovery fleet.

Usage:
  recoveryctl [flags] workers              every registered instance: alive, late or dead, last beat, TTL, rows
  recoveryctl [flags] rows <instance>      the row IDs an instance is tracking
  recoveryctl [flags] history [--since 1h] the fleet's history: deaths, recoveries, failures, lease losses
  recoveryctl [flags] watch                the fleet live: workers, turns, the last recoveries
  recoveryctl [flags] recover [--dry-run]  one recovery scan: reset the rows of dead instances
                                           (--dry-run: ask PostgreSQL what it would change)

Flags (before or after the command):
`

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// run is the program: it returns the exit status. getenv supplies
// REDIS_URL, DATABASE_URL and the RECOVERY_* variables.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd, pos, o, code := parseArgs(args, getenv, stderr)
	if code >= 0 {
		return code
	}
	var err error
	if cmd != "watch" { // a watch lasts until interrupted; --timeout bounds each frame
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	switch cmd {
	case "workers":
		err = cmdWorkers(ctx, o, stdout, stderr)
	case "rows":
		err = cmdRows(ctx, o, pos[0], stdout)
	case "history":
		err = cmdHistory(ctx, o, stdout, stderr)
	case "watch":
		err = cmdWatch(ctx, o, stdout)
	case "recover":
		err = cmdRecover(ctx, o, stdout, stderr)
	}
	if err == nil {
		return exitOK
	}
	// Whatever a library put in the message, no password leaves this program.
	err = redact.Error(err, o.redisURL, o.databaseURL)
	// Nor anything from Redis an error quotes that a terminal acts on.
	lines := strings.Split(err.Error(), "\n")
	for n, l := range lines {
		lines[n] = redact.Shown(l, 4*redact.MaxShown)
	}
	fmt.Fprintf(stderr, "recoveryctl %s: %s\n", cmd, strings.Join(lines, "\n"))
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFail
}

// parseArgs reads the command line and the environment. code is -1 when
// the command should run, else the exit status to return at once.
func parseArgs(args []string, getenv func(string) string, stderr io.Writer) (cmd string, pos []string, o *options, code int) {
	env, err := ops.FromEnv(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "recoveryctl: %v\n", err)
		return "", nil, nil, exitUsage
	}
	o = &options{prefix: env.KeyPrefix, timeout: 30 * time.Second,
		heartbeatTTL: defaultHeartbeatTTL, heartbeatInterval: defaultHeartbeatInterval}
	o.pgx = env.Postgres
	global := flag.NewFlagSet("recoveryctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	o.registerCommon(global)
	global.Usage = func() {
		fmt.Fprint(stderr, usageText)
		global.PrintDefaults()
		fmt.Fprint(stderr, "\nrecover flags:\n")
		fs := flag.NewFlagSet("recover", flag.ContinueOnError)
		fs.SetOutput(stderr)
		(&options{pgx: o.pgx}).registerRecover(fs)
		fs.PrintDefaults()
		for _, c := range []struct {
			name     string
			register func(*options, *flag.FlagSet)
		}{{"history", (*options).registerHistory}, {"watch", (*options).registerWatch}} {
			fmt.Fprintf(stderr, "\n%s flags:\n", c.name)
			fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
			fs.SetOutput(stderr)
			c.register(&options{}, fs)
			fs.PrintDefaults()
		}
	}
	if err = global.Parse(args); err != nil {
		return "", nil, nil, helpOrUsage(err)
	}
	if global.NArg() == 0 {
		global.Usage()
		return "", nil, nil, exitUsage
	}
	cmd = global.Arg(0)
	rest := global.Args()[1:]

	fs := flag.NewFlagSet("recoveryctl "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = global.Usage
	o.registerCommon(fs)
	var wantArgs int
	switch cmd {
	case "workers":
	case "rows":
		wantArgs = 1
	case "recover":
		o.registerRecover(fs)
	case "history":
		o.registerHistory(fs)
	case "watch":
		o.registerWatch(fs)
	default:
		fmt.Fprintf(stderr, "recoveryctl: unknown command %q (workers, rows, history, watch, recover)\n", cmd)
		return "", nil, nil, exitUsage
	}
	pos, err = parseInterleaved(fs, rest)
	if err != nil {
		return "", nil, nil, helpOrUsage(err)
	}
	if len(pos) != wantArgs {
		if wantArgs == 1 {
			fmt.Fprintf(stderr, "recoveryctl: usage: recoveryctl rows <instance>\n")
		} else {
			fmt.Fprintf(stderr, "recoveryctl %s: unexpected arguments %q\n", cmd, pos)
		}
		return "", nil, nil, exitUsage
	}
	for _, f := range []*flag.FlagSet{global, fs} {
		f.Visit(func(f *flag.Flag) {
			o.ttlGiven = o.ttlGiven || f.Name == "heartbeat-ttl"
			o.intervalGiven = o.intervalGiven || f.Name == "heartbeat-interval"
		})
	}
	if o.ttlGiven && !o.intervalGiven {
		o.heartbeatInterval = o.heartbeatTTL / 2 // as the library derives it
	}
	if o.redisURL == "" {
		o.redisURL = getenv("REDIS_URL")
	}
	if o.databaseURL == "" {
		o.databaseURL = getenv("DATABASE_URL")
	}
	if o.timeout <= 0 {
		fmt.Fprintf(stderr, "recoveryctl: --timeout %v must be positive\n", o.timeout)
		return "", nil, nil, exitUsage
	}
	if o.heartbeatTTL <= 0 || o.heartbeatInterval <= 0 || o.heartbeatInterval >= o.heartbeatTTL {
		fmt.Fprintf(stderr, "recoveryctl: --heartbeat-interval %v and --heartbeat-ttl %v must be positive, the interval shorter\n",
			o.heartbeatInterval, o.heartbeatTTL)
		return "", nil, nil, exitUsage
	}
	if cmd == "watch" && o.json {
		fmt.Fprintf(stderr, "recoveryctl watch: no --json: a watch is for people; programs read workers --json and history --json\n")
		return "", nil, nil, exitUsage
	}
	if o.since < 0 || o.last < 0 || o.count < 0 || (cmd == "watch" && o.interval <= 0) {
		fmt.Fprintf(stderr, "recoveryctl %s: --since, --last and --count must not be negative, --interval must be positive\n", cmd)
		return "", nil, nil, exitUsage
	}

	return cmd, pos, o, -1
}

func helpOrUsage(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments, and returns the positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		// After "--" everything is positional.
		if len(args) > len(fs.Args()) && args[len(args)-len(fs.Args())-1] == "--" {
			return append(pos, fs.Args()...), nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// splitAddrs splits a comma-separated address list, dropping empty parts.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
