// Command sqlworker is a batch worker on database/sql (lib/pq) with crash
// recovery, for a table without an owner column whose states are text:
//
//	batch.jobs: pending -> running -> finished or error
//
// Without an owner column the Worker records each process's rows in Redis
// (rows-set mode) and every recovery in a reset ledger, batch.recovery_ledger,
// so that a recovery whose outcome was lost is never applied twice
// (docs/integration.md, "Without an owner column"). -migrate creates the
// tables and the ledger; for an existing table the migration is the ledger
// alone (sqlreset.Resetter.LedgerDDL gives its statements).
//
// It takes blocks of pending jobs through a recovery.Block: marks them
// running and tracks them before the commit, does each one and commits its
// outcome, then marks it done; the block's deferred Close gives back what it
// did not finish (a lost lease, a failed commit). On SIGTERM it finishes its block and shuts down; killed, a peer returns its
// running jobs to pending within heartbeat TTL + 1.1 × recovery interval +
// the scan lease. With -exit-when-done it stops once no job is pending or
// running and prints a verdict on the whole table: every job finished once.
//
//	export REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://...
//	go run ./examples/sqlworker -migrate -seed 500 -exit-when-done
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/lib/pq"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/sqlreset"
)

const schemaSQL = `
CREATE SCHEMA IF NOT EXISTS batch;
CREATE TABLE IF NOT EXISTS batch.jobs (
	id         bigint PRIMARY KEY,
	state      text   NOT NULL DEFAULT 'pending', -- pending, running, finished, error
	recoveries int    NOT NULL DEFAULT 0,         -- how often recovery returned it
	payload    text   NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_pending ON batch.jobs (id) WHERE state = 'pending';
-- What the work produces, written with the job's state in one transaction.
-- No unique key, so that the verdict would see a job finished twice.
CREATE TABLE IF NOT EXISTS batch.results (
	job_id bigint NOT NULL,
	output text   NOT NULL
);`

// resetterOptions tie the library to the table: a dead worker's running
// jobs go back to pending, and one that was recovered 5 times (it kills
// every worker that takes it) is set to error instead.
var resetterOptions = []postgres.Option{
	postgres.WithSchema("batch"), postgres.WithTable("jobs"),
	postgres.WithIDColumn("id"), postgres.WithStatusColumn("state"),
	postgres.WithStatuses("running", "pending"),
	postgres.WithDoneStatuses("finished", "error"),
	postgres.WithRecoveryCountColumn("recoveries"),
	postgres.WithMaxRecoveries(5, "error"),
}

// idleInTransaction is the connections' idle_in_transaction_session_timeout,
// unless DATABASE_URL sets one: PostgreSQL ends a session that sits in a
// transaction longer, and with it the row locks of a process that froze
// mid-transaction, which would otherwise hold a recovery's reset until its
// timeout (30 s). Longer than anything done inside a transaction here (a
// Track to Redis: at most the operation timeout, 5 s).
const idleInTransaction = "15s"

// dbTimeout bounds each database call outside a job's work.
const dbTimeout = 10 * time.Second

type config struct {
	block                            int
	work, poll, shutdown             time.Duration
	ttl, heartbeat, recoveryInterval time.Duration
	instanceID, prefix               string
	migrate, exitWhenDone            bool
	seed                             int
}

func main() {
	var c config
	flag.IntVar(&c.block, "block", 50, "jobs per block")
	flag.DurationVar(&c.work, "work", 20*time.Millisecond, "simulated work per job")
	flag.DurationVar(&c.poll, "poll", time.Second, "wait when no job is pending")
	flag.DurationVar(&c.shutdown, "shutdown-timeout", 10*time.Second, "deadline for Shutdown after the last block")
	flag.DurationVar(&c.ttl, "heartbeat-ttl", 60*time.Second, "how long a dead worker goes unnoticed")
	flag.DurationVar(&c.heartbeat, "heartbeat-interval", 30*time.Second, "heartbeat refresh interval (< TTL)")
	flag.DurationVar(&c.recoveryInterval, "recovery-interval", 60*time.Second, "how often to look for dead peers")
	flag.StringVar(&c.instanceID, "instance-id", "", "this worker's ID (default <hostname>-<pid>-<start>-<random>)")
	flag.StringVar(&c.prefix, "prefix", ops.DefaultKeyPrefix, "Redis key prefix of the fleet")
	flag.BoolVar(&c.migrate, "migrate", false, "create the schema, tables and reset ledger if they do not exist")
	flag.IntVar(&c.seed, "seed", 0, "insert this many pending jobs at start")
	flag.BoolVar(&c.exitWhenDone, "exit-when-done", false, "exit once no job is pending or running, with a verdict")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// SIGTERM or Ctrl-C cancels ctx: the worker finishes its block and
	// shuts down. The heartbeat never uses ctx, so it goes on until then.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, c, log)
	stop()
	if err != nil {
		log.Error("sqlworker failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	redis.SetLogger(recovery.RedisLogger(log)) // go-redis's own lines into the same log
	db, err := openDB(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return errors.New("REDIS_URL is not a redis:// URL") // the message could show its password
	}
	opt.ContextTimeoutEnabled = true // the worker's timeouts bound every call
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	// The resetter gets a small pool of its own: with the host's
	// connections held by its transactions, a recovery would wait for one
	// (docs/integration.md).
	resetDB, err := openDB(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer resetDB.Close()
	resetDB.SetMaxOpenConns(2)
	resetter, err := sqlreset.New(resetDB, resetterOptions...)
	if err != nil {
		return err
	}
	if c.migrate {
		if err := migrate(ctx, db, resetter); err != nil {
			return err
		}
	}
	if c.seed > 0 {
		if _, err := db.ExecContext(ctx, `INSERT INTO batch.jobs (id, payload)
			SELECT base + g, 'job ' || (base + g) FROM generate_series(1, $1::bigint) g,
			       (SELECT coalesce(max(id), 0) AS base FROM batch.jobs) b`, c.seed); err != nil {
			return fmt.Errorf("seed %d jobs: %w", c.seed, err)
		}
	}
	opts := []recovery.Option{recovery.WithLogger(log), recovery.WithKeyPrefix(c.prefix),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      c.ttl,
			HeartbeatInterval: c.heartbeat,
			RecoveryInterval:  c.recoveryInterval,
		})}
	if c.instanceID != "" {
		opts = append(opts, recovery.WithInstanceID(c.instanceID))
	}
	w, err := recovery.New(rdb, resetter, opts...)
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil { // checks the table and the ledger first
		return err
	}
	log = log.With("instance_id", w.InstanceID())
	log.Info("sqlworker started")

	h := &host{c: c, db: db, w: w, log: log}
	loopErr := h.loop(ctx)
	// A fresh context: ctx is cancelled by now. Shutdown deletes the
	// heartbeat; with jobs still tracked (the lease was lost) it leaves the
	// registry entry, so a peer recovers them at its next scan.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), c.shutdown)
	defer cancel()
	if err := w.Shutdown(shutdownCtx); err != nil {
		return errors.Join(loopErr, fmt.Errorf("shut down crash recovery: %w", err))
	}
	log.Info("sqlworker stopped", "jobs_done", h.done)
	if loopErr == nil && c.exitWhenDone && ctx.Err() == nil {
		return verdict(db)
	}
	return loopErr
}

// openDB opens DATABASE_URL with lib/pq, adding idleInTransaction.
func openDB(url string) (*sql.DB, error) {
	cfg, err := pq.NewConfig(url)
	if err != nil {
		return nil, errors.New("DATABASE_URL is not a PostgreSQL connection string") // nor shown: it may hold a password
	}
	if cfg.Runtime == nil {
		cfg.Runtime = map[string]string{}
	}
	if _, set := cfg.Runtime["idle_in_transaction_session_timeout"]; !set {
		cfg.Runtime["idle_in_transaction_session_timeout"] = idleInTransaction
	}
	conn, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL connector: %w", err)
	}
	return sql.OpenDB(conn), nil
}

// migrate creates the tables and the reset ledger the library records its
// resets in (batch.recovery_ledger); Start refuses to run without it.
func migrate(ctx context.Context, db *sql.DB, resetter *sqlreset.Resetter) error {
	if _, err := db.ExecContext(ctx, schemaSQL); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return resetter.CreateLedger(ctx)
}

type host struct {
	c    config
	db   *sql.DB
	w    *recovery.Worker
	log  *slog.Logger
	done int
}

func (h *host) loop(ctx context.Context) error {
	for ctx.Err() == nil {
		took, err := h.runBlock(ctx)
		switch {
		case took: // fetched is finished, SIGTERM or not
			continue
		case ctx.Err() != nil:
			return nil
		case err != nil:
			h.log.Warn("fetching a block failed; retrying", "error", err)
		case h.c.exitWhenDone && h.left(ctx) == 0:
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(h.c.poll):
		}
	}
	return nil
}

// runBlock takes one block and does it; it reports whether there was one.
// The deferred Close gives back what the block did not finish: the jobs
// left after a lost lease, a job whose outcome could not be committed, a
// fetch whose COMMIT failed. With the reset ledger that is safe in any
// state, also once peers may have recovered the jobs: a job a recovery
// already reset is left alone, whoever holds it now.
func (h *host) runBlock(ctx context.Context) (took bool, err error) {
	b, err := h.w.Begin() // fails while the lease is lost: the loop waits and retries
	if err != nil {
		return false, err
	}
	defer func() {
		if err := b.Close(); err != nil {
			h.log.Error("giving jobs back failed; they stay tracked", "error", err)
		}
	}()
	ids, err := h.fetch(ctx, b)
	if err != nil || len(ids) == 0 {
		return false, err
	}
	h.processBlock(b, ids)
	return true, nil
}

// fetch marks a block of pending jobs running and tracks it before the
// commit: a crash after the commit always finds the jobs tracked, and one
// before leaves them pending.
//
// The transaction runs under a context SIGTERM does not cancel, bounded by
// dbTimeout: database/sql rolls a transaction back when the context it was
// begun with ends, so a SIGTERM between Track and COMMIT would otherwise
// give a fetched block back instead of finishing it. The loop checks for
// SIGTERM before each fetch.
func (h *host) fetch(ctx context.Context, b *recovery.Block) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() // after Commit: a no-op
	rows, err := tx.QueryContext(ctx, `
		WITH picked AS (
			SELECT id FROM batch.jobs WHERE state = 'pending'
			ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
		)
		UPDATE batch.jobs j SET state = 'running' FROM picked
		WHERE j.id = picked.id RETURNING j.id`, h.c.block)
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("select block: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return nil, err
	}
	// SIGTERM does not interrupt what follows either: a COMMIT cut off
	// after the server applied it would give the block back instead of
	// finishing it.
	if err := b.Track(ctx, ids...); err != nil {
		if errors.Is(err, recovery.ErrLeaseLost) || errors.Is(err, recovery.ErrShutdown) {
			return nil, fmt.Errorf("track block: %w", err) // the rollback leaves them pending
		} // otherwise the worker keeps the IDs and its next heartbeat writes them
		h.log.Warn("tracking the block failed; the next heartbeat retries", "error", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit block: %w", err) // committed or not: the block's Close gives back what is running
	}
	return ids, nil
}

// processBlock does every job of the block, even after SIGTERM, and stops
// only when the lease was lost: the block's Close gives the rest back.
func (h *host) processBlock(b *recovery.Block, ids []int64) {
	for i, id := range ids {
		if err := b.Check(); err != nil {
			h.log.Warn("heartbeat lease lost mid-block; giving the rest of the block back", "jobs", len(ids)-i, "error", err)
			return
		}
		output, workErr := work(id, h.c.work)
		if err := h.complete(id, output, workErr); err != nil {
			h.log.Error("committing a job failed; the block's Close gives it back", "job_id", id, "error", err)
			continue
		}
		if err := b.Done(id); err != nil { // its own context, after the commit
			h.log.Warn("untrack failed; the next heartbeat retries", "job_id", id, "error", err)
		}
	}
}

// work is the job: replace it with yours. It runs outside any
// transaction, so no connection is held while it works.
func work(id int64, d time.Duration) (string, error) {
	time.Sleep(d)
	return fmt.Sprintf("JOB %d", id), nil
}

// complete commits a job's outcome and its output in one transaction,
// guarded by state = 'running': a job recovery returned to pending (this
// worker was presumed dead) is not finished by it.
func (h *host) complete(id int64, output string, workErr error) error {
	state := "finished"
	if workErr != nil {
		state, output = "error", workErr.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit: a no-op
	res, err := tx.ExecContext(ctx, `UPDATE batch.jobs SET state = $2 WHERE id = $1 AND state = 'running'`, id, state)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		h.log.Warn("job is no longer running; output discarded", "job_id", id)
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO batch.results (job_id, output) VALUES ($1, $2)`, id, output); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	h.done++
	return nil
}

// left counts jobs pending or running (possibly by a dead worker whose jobs
// recovery will return); -1 when it cannot tell.
func (h *host) left(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	n := -1
	_ = h.db.QueryRowContext(ctx, `SELECT count(*) FROM batch.jobs WHERE state IN ('pending', 'running')`).Scan(&n)
	return n
}

// verdict prints whether every job of the table finished exactly once,
// and returns an error if not.
func verdict(db *sql.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	var jobs, finished, failed, outputs, twice int
	err := db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'finished'),
		count(*) FILTER (WHERE state = 'error'), (SELECT count(*) FROM batch.results),
		(SELECT count(*) FROM (SELECT job_id FROM batch.results GROUP BY job_id HAVING count(*) > 1) t)
		FROM batch.jobs`).Scan(&jobs, &finished, &failed, &outputs, &twice)
	if err != nil {
		return fmt.Errorf("verdict: %w", err)
	}
	var broken []string
	if finished+failed != jobs {
		broken = append(broken, fmt.Sprintf("%d jobs never finished", jobs-finished-failed))
	}
	if twice > 0 {
		broken = append(broken, fmt.Sprintf("%d jobs finished twice", twice))
	}
	if len(broken) > 0 {
		fmt.Println("verdict: FAIL:", strings.Join(broken, "; "))
		return errors.New("verdict: FAIL")
	}
	fmt.Printf("verdict: PASS: %d/%d jobs finished (%d error), finished twice: 0 (%d outputs)\n", finished+failed, jobs, failed, outputs)
	return nil
}
