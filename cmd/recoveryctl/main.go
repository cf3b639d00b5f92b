// Command recoveryctl inspects and repairs the Redis state of a fleet of
// workers that use github.com/alya/recovery: who is registered, who is alive,
// which rows each instance is tracking, and one recovery scan on demand.
//
// Usage:
//
//	recoveryctl [flags] workers
//	recoveryctl [flags] rows <instance>
//	recoveryctl [flags] recover [--dry-run] [--database-url URL]
//
// Flags may come before or after the command:
//
//	--redis-url URL   Redis to use (default $REDIS_URL, else redis://127.0.0.1:6379)
//	--cluster a,b     Redis Cluster seed addresses; credentials and TLS still
//	                  come from --redis-url / $REDIS_URL when set
//	--prefix ALYA     key prefix of the fleet (recovery.WithKeyPrefix)
//	--json            print JSON instead of text
//	--timeout 30s     bound for the whole command
//
// recover without --dry-run resets rows in PostgreSQL through a
// recovery.PgxResetter and needs --database-url or $DATABASE_URL; --table,
// --schema, --id-column, --status-column, --owner-column and
// --recovery-count-column must match the fleet's resetter options (with
// owner fencing, pass --owner-column so a reset only touches rows the dead
// instance still owns).
// It runs exactly one scan (recovery.Worker.RecoverNow) and never starts a
// heartbeat. --dry-run only reads Redis.
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

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
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
	redisURL    string
	cluster     string
	prefix      string
	json        bool
	timeout     time.Duration
	dryRun      bool
	databaseURL string
	table       string
	schema      string
	idColumn    string
	status      string
	ownerColumn string
	countColumn string
}

// registerCommon defines the flags every command accepts, with the current
// values as defaults, so flags given before the command carry over.
func (o *options) registerCommon(fs *flag.FlagSet) {
	fs.StringVar(&o.redisURL, "redis-url", o.redisURL, "Redis URL (default $REDIS_URL, else "+defaultRedisURL+")")
	fs.StringVar(&o.cluster, "cluster", o.cluster, "comma-separated Redis Cluster seed addresses (host:port,...)")
	fs.StringVar(&o.prefix, "prefix", o.prefix, "key prefix of the fleet")
	fs.BoolVar(&o.json, "json", o.json, "print JSON")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound for the whole command")
}

func (o *options) registerRecover(fs *flag.FlagSet) {
	fs.BoolVar(&o.dryRun, "dry-run", false, "print what would be reset; read Redis only")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	fs.StringVar(&o.table, "table", recovery.DefaultTable, "table of the rows")
	fs.StringVar(&o.schema, "schema", "", "schema of the table (default: the search_path)")
	fs.StringVar(&o.idColumn, "id-column", recovery.DefaultIDColumn, "bigint row ID column")
	fs.StringVar(&o.status, "status-column", recovery.DefaultStatusColumn, "status column")
	fs.StringVar(&o.ownerColumn, "owner-column", "", "owner column, if the fleet uses owner fencing (recovery.WithOwnerColumn)")
	fs.StringVar(&o.countColumn, "recovery-count-column", "", "recovery counter column, if the fleet counts (recovery.WithRecoveryCountColumn)")
}

const usageText = `recoveryctl inspects and repairs the Redis state of a recovery fleet.

Usage:
  recoveryctl [flags] workers              every registered instance: alive or dead, heartbeat TTL, rows
  recoveryctl [flags] rows <instance>      the row IDs an instance is tracking
  recoveryctl [flags] recover [--dry-run]  one recovery scan: reset the rows of dead instances

Flags (before or after the command):
`

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// run is the program: it returns the exit status. getenv supplies REDIS_URL
// and DATABASE_URL.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o := &options{prefix: recovery.DefaultKeyPrefix, timeout: 30 * time.Second}
	global := flag.NewFlagSet("recoveryctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	o.registerCommon(global)
	global.Usage = func() {
		fmt.Fprint(stderr, usageText)
		global.PrintDefaults()
		fmt.Fprint(stderr, "\nrecover flags:\n")
		fs := flag.NewFlagSet("recover", flag.ContinueOnError)
		fs.SetOutput(stderr)
		(&options{}).registerRecover(fs)
		fs.PrintDefaults()
	}
	if err := global.Parse(args); err != nil {
		return helpOrUsage(err)
	}
	if global.NArg() == 0 {
		global.Usage()
		return exitUsage
	}
	cmd, rest := global.Arg(0), global.Args()[1:]

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
	default:
		fmt.Fprintf(stderr, "recoveryctl: unknown command %q (workers, rows, recover)\n", cmd)
		return exitUsage
	}
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		return helpOrUsage(err)
	}
	if len(pos) != wantArgs {
		if wantArgs == 1 {
			fmt.Fprintf(stderr, "recoveryctl: usage: recoveryctl rows <instance>\n")
		} else {
			fmt.Fprintf(stderr, "recoveryctl %s: unexpected arguments %q\n", cmd, pos)
		}
		return exitUsage
	}
	if o.redisURL == "" {
		o.redisURL = getenv("REDIS_URL")
	}
	if o.databaseURL == "" {
		o.databaseURL = getenv("DATABASE_URL")
	}
	if o.timeout <= 0 {
		fmt.Fprintf(stderr, "recoveryctl: --timeout %v must be positive\n", o.timeout)
		return exitUsage
	}

	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	switch cmd {
	case "workers":
		err = cmdWorkers(ctx, o, stdout, stderr)
	case "rows":
		err = cmdRows(ctx, o, pos[0], stdout)
	case "recover":
		err = cmdRecover(ctx, o, stdout, stderr)
	}
	if err == nil {
		return exitOK
	}
	// Whatever a library put in the message, no password leaves this program.
	err = redact.Error(err, o.redisURL, o.databaseURL)
	fmt.Fprintf(stderr, "recoveryctl %s: %v\n", cmd, err)
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFail
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
