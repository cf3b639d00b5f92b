// Command faultworker is the batch worker that the fault-injection suite
// (internal/faults, make test-faults) runs as real processes and kills,
// stops, and cuts off from its servers. It uses github.com/alya/recovery
// exactly as a host batch framework would:
//
//   - FetchBlockOfRows: SELECT ... FOR UPDATE SKIP LOCKED of queued rows of
//     batches that are not waiting, marked inprog with owner = this
//     instance, tracked with Track inside the transaction, before COMMIT.
//   - Each row: simulated work (-work), then one transaction that marks the
//     row done (guarded by -guard) and appends (rowid, instance, 'done') to
//     the ledger table; if the guard rejects the row, the work is recorded
//     as (rowid, instance, 'discarded') instead. Then Untrack.
//   - Before each row, CheckLease: with the lease lost, the rest of the
//     block is handed back with Release.
//   - -host forgetful abandons the block there without Release; -host
//     block takes each block through a recovery.Block (Begin, a deferred
//     Close, Track, Check, Done) on -fetchers goroutines, with faults in
//     the host: -panic-every (recovered, or crashing with -panic-crash) and
//     -fail-fetch-every (an error between the fetch's UPDATE and COMMIT).
//   - SIGTERM or Ctrl-C cancels the processing context; the worker
//     finishes its block and calls Shutdown, as the design says.
//   - SIGUSR1 runs one recovery scan now (RecoverNow), so the suite can
//     make many workers recover the same dead peer at the same moment.
//   - Recoverer faults (issue 10): -die-after-reset-of ID SIGKILLs the
//     process right after its first reset of ID's rows committed, before
//     the finish script; -delay-finish-of ID -finish-delay D holds the
//     recovery there for D; -recover-only takes no rows.
//
// It expects the tables batches (batchid, status), the rows table
// (rowid, batchid, status, owner, recoveries) and ledger (rowid, instance,
// outcome); the suite creates them. Connection strings come from REDIS_URL
// (or REDIS_CLUSTER_ADDRS, or REDIS_SENTINEL_ADDRS with REDIS_SENTINEL_MASTER;
// addresses comma-separated), DATABASE_URL and, for a
// resetter pool of its own, RESET_DATABASE_URL, and are never printed.
// Logs are JSON lines on stderr.
//
// Exit status: 0 after a graceful stop, 1 when it could not run (servers
// unreachable, bad configuration), 2 for bad flags.
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
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultworker:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err = run(ctx, cfg, log)
	stop()
	if err != nil {
		log.Error("faultworker failed", "error", err)
		os.Exit(1)
	}
}
