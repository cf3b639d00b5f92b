package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/alya/recovery/ops"
)

// config is everything the worker can be told.
type config struct {
	redisURL    string // never printed
	databaseURL string // never printed
	schema      string // search_path, when the tables are not in the default one

	instanceID string // "" = the library's <hostname>-<pid>-<start>-<random>
	prefix     string
	block      int
	poll       time.Duration
	work       time.Duration // simulated work per row (process)
	rowTimeout time.Duration // bound for processing and committing one row

	heartbeatTTL      time.Duration
	heartbeatInterval time.Duration
	recoveryInterval  time.Duration
	shutdownTimeout   time.Duration

	createSchema bool
	seed         int
	exitWhenDone bool
	logLevel     slog.Level
}

// parseConfig reads flags, falling back to REDIS_URL and DATABASE_URL from
// getenv. The URL flags default to "" rather than to the environment, so
// -help never prints a connection string.
func parseConfig(args []string, getenv func(string) string, output io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("batchworker", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.redisURL, "redis-url", "", "Redis URL (default $REDIS_URL)")
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema of the tables (default: the search_path)")
	fs.StringVar(&c.instanceID, "instance-id", "", "this worker's ID in Redis (default <hostname>-<pid>-<start time>-<random>)")
	fs.StringVar(&c.prefix, "prefix", ops.DefaultKeyPrefix, "Redis key prefix of the fleet")
	fs.IntVar(&c.block, "block", 50, "rows per block")
	fs.DurationVar(&c.poll, "poll", time.Second, "wait between fetches when no row is queued")
	fs.DurationVar(&c.work, "work", 20*time.Millisecond, "simulated work per row")
	fs.DurationVar(&c.rowTimeout, "row-timeout", time.Minute, "bound for processing and committing one row")
	fs.DurationVar(&c.heartbeatTTL, "heartbeat-ttl", 60*time.Second, "how long a dead worker goes unnoticed")
	fs.DurationVar(&c.heartbeatInterval, "heartbeat-interval", 30*time.Second, "heartbeat refresh interval (< TTL)")
	fs.DurationVar(&c.recoveryInterval, "recovery-interval", 60*time.Second, "how often to look for dead peers")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "deadline for Shutdown after the last block")
	fs.BoolVar(&c.createSchema, "create-schema", false, "create the tables if they do not exist")
	fs.IntVar(&c.seed, "seed", 0, "insert a batch of this many queued rows at start (for trying it out)")
	fs.BoolVar(&c.exitWhenDone, "exit-when-done", false, "exit once no row is queued or in progress")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.redisURL == "" {
		c.redisURL = getenv("REDIS_URL")
	}
	if c.databaseURL == "" {
		c.databaseURL = getenv("DATABASE_URL")
	}
	var problems []string
	if c.redisURL == "" {
		problems = append(problems, "set REDIS_URL or -redis-url")
	}
	if c.databaseURL == "" {
		problems = append(problems, "set DATABASE_URL or -database-url")
	}
	if c.block < 1 {
		problems = append(problems, fmt.Sprintf("-block %d must be at least 1", c.block))
	}
	if c.seed < 0 {
		problems = append(problems, fmt.Sprintf("-seed %d must not be negative", c.seed))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll", c.poll}, {"row-timeout", c.rowTimeout}, {"shutdown-timeout", c.shutdownTimeout}} {
		if d.v <= 0 {
			problems = append(problems, fmt.Sprintf("-%s %v must be positive", d.name, d.v))
		}
	}
	if c.work < 0 {
		problems = append(problems, fmt.Sprintf("-work %v must not be negative", c.work))
	}
	if len(problems) > 0 {
		return c, errors.New(strings.Join(problems, "; "))
	}
	return c, nil
}

// rowsTTL keeps the rows set alive three heartbeat TTLs (the library's
// default rule), and always longer than the worst wait for the first
// recovery scan, which New requires: heartbeat TTL + 1.1 × recovery
// interval + the scan lease, min(0.8 × recovery interval, TTL).
func (c config) rowsTTL() time.Duration {
	ttl := 3 * c.heartbeatTTL
	window := c.heartbeatTTL + c.recoveryInterval + c.recoveryInterval/10 + min(c.recoveryInterval*8/10, c.heartbeatTTL)
	if ttl <= window {
		ttl = 2 * (c.heartbeatTTL + c.recoveryInterval)
	}
	return ttl
}

// hideSecrets removes the connection strings' passwords (and the strings
// themselves) from an error message, whatever a driver put in it.
func hideSecrets(err error, conns ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, c := range conns {
		if c == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, c, "<connection string>")
		if u, perr := url.Parse(c); perr == nil {
			if p, ok := u.User.Password(); ok && p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}
