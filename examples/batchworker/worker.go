package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// maxRecoveries is how often a row may be returned to the queue before it
// is set to failed instead: a row that kills every worker that takes it
// must not crash-loop the fleet.
const maxRecoveries = 5

// resetterOptions configures how crash recovery (and Release) returns rows
// to the queue. This is the one place that ties the library to the schema:
//
//	UPDATE batchrows SET status = 'queued', owner = NULL, recoveries = recoveries + 1
//	WHERE rowid = ANY(<the dead worker's tracked rows>)
//	  AND status = 'inprog' AND owner = <the dead worker>
//
// WithOwnerColumn is owner fencing: a reset only changes rows the dead
// worker still owns, never one a peer has taken since. It works together
// with the owner this program sets in fetchBlock and checks in complete.
func resetterOptions() []postgres.Option {
	return []postgres.Option{
		postgres.WithTable("batchrows"),
		postgres.WithIDColumn("rowid"),
		postgres.WithStatusColumn("status"),
		postgres.WithStatuses("inprog", "queued"),
		postgres.WithOwnerColumn("owner"),
		postgres.WithRecoveryCountColumn("recoveries"),
		postgres.WithMaxRecoveries(maxRecoveries, "failed"),
	}
}

// dbTimeout bounds each database call made outside the processing of a
// row: giving rows back, counting what is left.
const dbTimeout = 10 * time.Second

// run connects, starts crash recovery, processes blocks until ctx is
// cancelled (or, with -exit-when-done, until no work is left), and shuts
// down. It closes what it opened.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	pool, err := openPostgres(ctx, cfg, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := openRedis(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()

	if cfg.createSchema {
		if err := createSchema(ctx, pool); err != nil {
			return err
		}
	}
	if cfg.seed > 0 {
		id, err := seedBatch(ctx, pool, cfg.seed)
		if err != nil {
			return err
		}
		log.Info("seeded a batch", "batch_id", id, "rows", cfg.seed)
	}

	// The resetter gets a small pool of its own: with the host's pool held
	// by its long transactions, a recovery would wait for a connection
	// (docs/integration.md, step 2).
	resetPool, err := openPostgres(ctx, cfg, 2)
	if err != nil {
		return err
	}
	defer resetPool.Close()
	resetter, err := pgxreset.New(resetPool, resetterOptions()...)
	if err != nil {
		return err
	}
	opts := []recovery.Option{
		recovery.WithKeyPrefix(cfg.prefix),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      cfg.heartbeatTTL,
			HeartbeatInterval: cfg.heartbeatInterval,
			RecoveryInterval:  cfg.recoveryInterval,
			RowsTTL:           cfg.rowsTTL(),
		}),
		recovery.WithLogger(log),
	}
	if cfg.instanceID != "" {
		opts = append(opts, recovery.WithInstanceID(cfg.instanceID))
	}
	w, err := recovery.New(rdb, resetter, opts...)
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return hideSecrets(fmt.Errorf("start crash recovery: %w", err), cfg.redisURL)
	}
	log = log.With("instance_id", w.InstanceID())
	log.Info("batchworker started", "block", cfg.block)

	h := &host{cfg: cfg, pool: pool, w: w, log: log}
	loopErr := h.loop(ctx)

	// The processing context is done (or there is no work left) and the
	// last block is finished. Shutdown gets a fresh context with a deadline:
	// it deletes the heartbeat and the registry entry so peers see at once
	// that this worker left.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := w.Shutdown(shutdownCtx); err != nil {
		return errors.Join(loopErr, hideSecrets(fmt.Errorf("shut down crash recovery: %w", err), cfg.redisURL))
	}
	log.Info("batchworker stopped", "rows_done", h.done, "rows_lost", h.lost, "rows_given_back", h.givenBack)
	return loopErr
}

// openPostgres opens a pool of at most maxConns connections (0: pgx's
// default).
func openPostgres(ctx context.Context, cfg config, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, hideSecrets(fmt.Errorf("database URL: %w", err), cfg.databaseURL)
	}
	if maxConns > 0 {
		pc.MaxConns = maxConns
	}
	if cfg.schema != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = cfg.schema
	}
	// A host that vanishes inside a transaction keeps its row locks until
	// the server ends its session: bound that (docs/operations.md), unless
	// the URL sets its own value.
	if _, set := pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "15s"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, hideSecrets(fmt.Errorf("open PostgreSQL pool: %w", err), cfg.databaseURL)
	}
	pingCtx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, hideSecrets(fmt.Errorf("PostgreSQL unreachable: %w", err), cfg.databaseURL)
	}
	return pool, nil
}

// openRedis returns a client for REDIS_URL. For Redis Cluster, build a
// redis.NewClusterClient instead: recovery.New takes any
// redis.UniversalClient. ContextTimeoutEnabled lets the worker's per-call
// timeouts bound a call to an unresponsive server; without it go-redis
// waits for its ReadTimeout (3 s).
func openRedis(cfg config) (*redis.Client, error) {
	opt, err := redis.ParseURL(cfg.redisURL)
	if err != nil {
		return nil, hideSecrets(fmt.Errorf("redis URL: %w", err), cfg.redisURL)
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt), nil
}

// row is one batch row taken by this worker.
type row struct {
	id      int64
	batchID int64
	payload string
}

// host is the batch loop of one worker process.
type host struct {
	cfg  config
	pool *pgxpool.Pool
	w    *recovery.Worker
	log  *slog.Logger

	// Counters, for the last log line; used by the loop's goroutine only.
	done, lost, givenBack int
}

// loop fetches and processes blocks until ctx is cancelled, or until no
// work is left with -exit-when-done. A block once fetched is always
// finished: processBlock does not look at ctx. Before each block it asks
// the worker's self-check: a misconfiguration ends the loop with an error,
// and the program shuts down and exits non-zero.
func (h *host) loop(ctx context.Context) error {
	failing := false
	for ctx.Err() == nil {
		// The self-check found that a recovery would not reset the rows
		// this worker takes (statuses or owner column wrong): a crash
		// would strand them. Stop, so the rollout fails loudly
		// (docs/integration.md, "What a batch-worker pod does with
		// Healthy()"). A lost lease is not a reason: Begin waits for it.
		if err := h.w.Healthy(); errors.Is(err, recovery.ErrMisconfigured) {
			return fmt.Errorf("stopping: crash recovery is misconfigured, and rows this worker takes would not be recovered after a crash: %w", err)
		}
		took, err := h.runBlock(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			if !failing { // one log line per outage
				h.log.Warn("fetching a block failed; retrying", "error", err)
			}
			failing = true
			h.wait(ctx)
		case !took:
			if failing {
				h.log.Info("fetching blocks works again")
			}
			failing = false
			if h.cfg.exitWhenDone {
				left, err := h.rowsLeft(ctx)
				if err == nil && left == 0 {
					h.log.Info("no queued or in-progress rows left")
					return nil
				}
			}
			h.wait(ctx)
		default:
			if failing {
				h.log.Info("fetching blocks works again")
			}
			failing = false
		}
	}
	return nil
}

// runBlock takes one block and processes it; it reports whether there was
// one. The deferred Close gives back what the block did not finish: rows
// after a lost lease, a row whose outcome could not be committed, a fetch
// whose COMMIT failed, the rest of the block on a panic.
func (h *host) runBlock(ctx context.Context) (took bool, err error) {
	b, err := h.w.Begin() // fails while the lease is lost: the loop waits and retries
	if err != nil {
		return false, err
	}
	defer func() {
		n := len(b.Rows())
		if err := b.Close(); err != nil {
			h.log.Error("giving rows back failed; they stay tracked", "rows", n, "error", err)
			return
		}
		h.givenBack += n
	}()
	block, err := h.fetchBlock(ctx, b)
	if err != nil || len(block) == 0 {
		return false, err
	}
	h.processBlock(b, block)
	return true, nil
}

func (h *host) wait(ctx context.Context) {
	t := time.NewTimer(h.cfg.poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// fetchBlockSQL is FetchBlockOfRows: queued rows of batches that are not
// waiting, locked without waiting for other workers' locks, marked inprog
// and owned by this worker.
const fetchBlockSQL = `
WITH picked AS (
	SELECT r.rowid
	FROM batchrows r JOIN batches b ON b.batchid = r.batchid
	WHERE r.status = 'queued' AND b.status <> 'wait'
	ORDER BY r.rowid
	LIMIT $1
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE batchrows r SET status = 'inprog', owner = $2
FROM picked WHERE r.rowid = picked.rowid
RETURNING r.rowid, r.batchid, r.payload`

// fetchBlock takes a block of rows. It tracks them before committing: a
// crash after the commit then always finds them in this worker's rows set,
// and a crash before it leaves them queued (recovering a queued row changes
// nothing, the reset is guarded by status = 'inprog').
func (h *host) fetchBlock(ctx context.Context, b *recovery.Block) ([]row, error) {
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	rows, err := tx.Query(ctx, fetchBlockSQL, h.cfg.block, b.OwnerValue())
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	block, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.batchID, &x.payload)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	if len(block) == 0 {
		return nil, nil
	}
	slices.SortFunc(block, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	ids := idsOf(block)

	// From here on SIGTERM does not interrupt: the server may commit before
	// its reply is read, and a commit cut off by the signal would give the
	// block back instead of finishing it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	if err := b.Track(ctx, ids...); err != nil {
		if errors.Is(err, recovery.ErrLeaseLost) || errors.Is(err, recovery.ErrShutdown) || errors.Is(err, recovery.ErrNotStarted) {
			// Nothing was tracked; the rollback leaves the rows queued.
			return nil, fmt.Errorf("track block: %w", err)
		}
		// Only the Redis write failed: the worker keeps the IDs and writes
		// them with its next heartbeat, so the rows are still protected.
		h.log.Warn("tracking the block in Redis failed; the next heartbeat retries", "rows", len(ids), "error", err)
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit may or may not have happened: the block's Close gives
		// back whatever this worker owns (nothing if it did not).
		return nil, fmt.Errorf("commit block: %w", err)
	}
	h.log.Debug("fetched a block", "rows", len(block), "first_row", ids[0], "last_row", ids[len(ids)-1])
	return block, nil
}

// processBlock processes every row of the block. It takes no context on
// purpose: once rows are committed as inprog, this worker finishes them
// even after SIGTERM (the design's graceful shutdown). It stops early only
// if the heartbeat lease was lost, when peers may already consider it
// dead: the block's Close then gives the rows it has not started back.
func (h *host) processBlock(b *recovery.Block, block []row) {
	batches := map[int64]bool{}
	for i, r := range block {
		if err := b.Check(); err != nil {
			h.log.Warn("heartbeat lease lost mid-block; giving the rest of the block back",
				"rows", len(block)-i, "error", err)
			break
		}
		h.processRow(b, r)
		batches[r.batchID] = true
	}
	h.finishBatches(batches)
}

// processRow does the work of one row and commits its outcome, then
// marks it Done (untracked; Untrack runs on its own context inside the
// library: a finished row must leave the rows set even during shutdown).
func (h *host) processRow(b *recovery.Block, r row) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.rowTimeout)
	defer cancel()
	result, workErr := process(ctx, r, h.cfg.work)
	owned, err := h.complete(ctx, r, b.OwnerValue(), result, workErr)
	switch {
	case err != nil:
		// The outcome is not committed: the block's Close gives the row back
		// for another try.
		h.log.Error("committing a row failed; giving it back", "row_id", r.id, "error", err)
		return
	case !owned:
		// Recovery returned the row while this worker was presumed dead, and
		// it may have been taken again: the result is discarded, the other
		// worker's counts.
		h.lost++
		h.log.Warn("row is no longer this worker's; result discarded", "row_id", r.id)
	default:
		h.done++
	}
	if err := b.Done(r.id); err != nil {
		h.log.Warn("untrack failed; the next heartbeat removes the row", "row_id", r.id, "error", err)
	}
}

// process is the work of one row: replace it with yours. This one takes
// d and upper-cases the payload. It runs outside any transaction, so no
// connection is held while it works.
func process(ctx context.Context, r row, d time.Duration) (string, error) {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
	return strings.ToUpper(r.payload), nil
}

// completeSQL commits a row's outcome only if the row is still this
// worker's and still in progress. Anything else the work writes belongs in
// the same transaction, so it is discarded with the outcome.
const completeSQL = `
UPDATE batchrows SET status = $3, result = $4
WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`

// complete commits the outcome of row r, taken under owner: done with
// result, or failed with workErr's text. owned is false, and nothing is
// committed, when the row is no longer this worker's.
func (h *host) complete(ctx context.Context, r row, owner, result string, workErr error) (owned bool, err error) {
	status := "done"
	if workErr != nil {
		status, result = "failed", workErr.Error()
	}
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	tag, err := tx.Exec(ctx, completeSQL, r.id, owner, status, result)
	if err != nil {
		return false, fmt.Errorf("mark row %d %s: %w", r.id, status, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil // rollback
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit row %d: %w", r.id, err)
	}
	return true, nil
}

// finishBatchesSQL marks batches done once none of their rows is queued or
// in progress.
const finishBatchesSQL = `
UPDATE batches b SET status = 'done'
WHERE b.batchid = ANY($1) AND b.status = 'inprog'
  AND NOT EXISTS (SELECT 1 FROM batchrows r
                  WHERE r.batchid = b.batchid AND r.status IN ('queued', 'inprog'))`

func (h *host) finishBatches(batches map[int64]bool) {
	if len(batches) == 0 {
		return
	}
	ids := make([]int64, 0, len(batches))
	for id := range batches {
		ids = append(ids, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if _, err := h.pool.Exec(ctx, finishBatchesSQL, ids); err != nil {
		h.log.Warn("marking finished batches done failed; the next block retries", "error", err)
	}
}

// rowsLeft counts rows of active batches that are queued or in progress
// (possibly by a dead worker whose rows recovery will return).
func (h *host) rowsLeft(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var n int
	err := h.pool.QueryRow(ctx, `
		SELECT count(*) FROM batchrows r JOIN batches b ON b.batchid = r.batchid
		WHERE r.status IN ('queued', 'inprog') AND b.status <> 'wait'`).Scan(&n)
	return n, err
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	_ = tx.Rollback(ctx) // after Commit: a no-op
}

func idsOf(block []row) []int64 {
	ids := make([]int64, len(block))
	for i, r := range block {
		ids[i] = r.id
	}
	return ids
}
