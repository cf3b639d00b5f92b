// Command batchworker is a complete batch worker that uses
// github.com/alya/recovery for crash recovery. Copy it as the starting
// point of your own: replace process (worker.go) with your work and the
// schema (schema.go) with yours.
//
// What it does, in order:
//
//   - FetchBlockOfRows (fetchBlock): takes up to -block queued rows with
//     SELECT ... FOR UPDATE SKIP LOCKED, marks them inprog with owner = this
//     worker's instance ID, and tracks them in Redis before the commit.
//   - Processes every row of the block and commits each outcome with an
//     UPDATE guarded by owner and status, then untracks the row.
//   - Before each block, asks Healthy: if the self-check found the
//     statuses or the owner column misconfigured (ErrMisconfigured), it
//     shuts the worker down and exits 1, so a rollout fails loudly.
//   - On SIGTERM (or Ctrl-C) it cancels the processing context, finishes
//     the current block, and shuts the recovery worker down with a
//     deadline (-shutdown-timeout): the design's graceful shutdown.
//   - If it is killed instead, a peer's recovery returns its tracked rows
//     to the queue within heartbeat TTL + recovery interval.
//
// Configuration: REDIS_URL and DATABASE_URL (or -redis-url, -database-url),
// and the flags below. Connection strings are never printed.
//
// Try it with a throwaway schema and batch:
//
//	export REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://...
//	go run ./examples/batchworker -create-schema -seed 500 -exit-when-done
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "batchworker:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	// go-redis prints its own dial failures on stderr through a logger of
	// its own, one for the whole process: the program, not the library,
	// decides where they go. Here: to the same log as everything else.
	redis.SetLogger(recovery.RedisLogger(log))

	// SIGTERM (Kubernetes) or Ctrl-C cancels the processing context. The
	// worker then finishes its current block and shuts down; the heartbeat
	// goes on until then, because the recovery worker never uses this
	// context for it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err = run(ctx, cfg, log)
	stop()
	if err != nil {
		log.Error("batchworker failed", "error", err)
		os.Exit(1)
	}
}
