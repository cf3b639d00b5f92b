// Command crashdemo shows crash recovery at work in one command (make demo):
// it starts a few worker processes that share a batch of rows, kills one
// with SIGKILL in the middle of a block, and shows its heartbeat expiring,
// a peer returning its rows to the queue and the survivors finishing the
// batch. It ends with a verdict: every row processed, none twice (checked
// in a ledger written in the same transaction that marks a row done), and
// the time from the kill to the recovery against the promised bound. It
// exits 1 if a promise was broken.
//
// With no configuration it needs nothing running: Redis is a throwaway
// redis-server on a loopback port when one is installed (else an embedded
// miniredis, which cannot tell its uptime: the workers then warn that they
// judge dead peers without the restart check), and PostgreSQL a throwaway
// cluster started from the installed binaries (as the postgres user when
// run as root).
// REDIS_URL and DATABASE_URL, when set, are used instead (under a key
// prefix and a schema of its own, removed at the end). Everything it
// started is stopped when it ends, also on Ctrl-C.
//
// The workers run the real library with short timings (-ttl, -heartbeat,
// -recovery). They are this program again, in a hidden worker role.
//
// Exit status: 0 every promise kept, 1 a promise broken, 2 bad flags or the
// demo could not run, 130 interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
)

// Exit statuses.
const (
	exitPass        = 0
	exitFail        = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	if os.Getenv(roleEnv) == "worker" {
		os.Exit(workerMain(os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runDemo(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is the demo's flags and environment.
type config struct {
	workers   int
	rows      int
	block     int
	work      time.Duration
	ttl       time.Duration
	beat      time.Duration
	recovery  time.Duration
	killBlock int
	timeout   time.Duration
	plain     bool

	redisURL    string // REDIS_URL; empty: a redis-server of its own, else miniredis
	databaseURL string // DATABASE_URL; empty: throwaway PostgreSQL
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("crashdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.workers, "workers", 3, "worker processes (at least 2: one is killed)")
	fs.IntVar(&c.rows, "rows", 120, "rows in the batch")
	fs.IntVar(&c.block, "block", 10, "rows per block")
	fs.DurationVar(&c.work, "work", 100*time.Millisecond, "work per row")
	fs.DurationVar(&c.ttl, "ttl", 2*time.Second, "heartbeat TTL")
	fs.DurationVar(&c.beat, "heartbeat", 500*time.Millisecond, "heartbeat interval")
	fs.DurationVar(&c.recovery, "recovery", time.Second, "recovery interval")
	fs.IntVar(&c.killBlock, "kill-block", 2, "kill the victim half-way through its block number n")
	fs.DurationVar(&c.timeout, "timeout", 90*time.Second, "give up after this long")
	fs.BoolVar(&c.plain, "plain", false, "plain lines even on a terminal")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: crashdemo [flags]\n\nKills one of several worker processes mid-block and shows its rows coming back.\n"+
			"Uses REDIS_URL and DATABASE_URL when set; otherwise starts its own servers.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case c.workers < 2:
		return c, fmt.Errorf("-workers %d: need at least 2, one to kill and one to recover", c.workers)
	case c.workers > 20:
		return c, fmt.Errorf("-workers %d: at most 20", c.workers)
	case c.block < 2:
		return c, fmt.Errorf("-block %d: need at least 2 rows to kill a worker mid-block", c.block)
	case c.rows < c.block*c.workers:
		return c, fmt.Errorf("-rows %d: need at least -block × -workers = %d", c.rows, c.block*c.workers)
	case c.killBlock < 1:
		return c, fmt.Errorf("-kill-block %d must be at least 1", c.killBlock)
	case c.work < 0 || c.timeout <= 0:
		return c, fmt.Errorf("-work must not be negative and -timeout must be positive")
	}
	// The library checks the timings; ask it now rather than in every
	// worker. New does no I/O, so the client is never used.
	idle := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer idle.Close()
	if _, err := recovery.New(idle, noResetter{}, recovery.WithLogger(slog.New(slog.DiscardHandler)),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      c.ttl,
			HeartbeatInterval: c.beat,
			RecoveryInterval:  c.recovery,
			RowsTTL:           rowsTTL(c.ttl, c.recovery),
		})); err != nil {
		return c, err
	}
	c.redisURL, c.databaseURL = getenv("REDIS_URL"), getenv("DATABASE_URL")
	return c, nil
}

// noResetter stands in for a resetter when only validating options.
type noResetter struct{}

func (noResetter) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "noResetter", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (noResetter) Check(context.Context, bool) (recovery.ResetterInfo, error) {
	return recovery.ResetterInfo{Name: "noResetter", InProgressStatus: "inprog", QueuedStatus: "queued"}, nil
}

func (noResetter) ResetRows(context.Context, recovery.RowsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noResetter) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noResetter) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noResetter) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noResetter) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

func (noResetter) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (noResetter) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

// runDemo is the program; it returns the exit status.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitPass
	}
	if err != nil {
		fmt.Fprintln(stderr, "crashdemo:", err)
		return exitUsage
	}
	d := newDemo(cfg, newUI(stdout, cfg.plain, getenv), stderr)
	return d.run(ctx)
}
