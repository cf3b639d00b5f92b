package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alya/recovery"
)

// host is the batch loop of one worker process.
type host struct {
	cfg  config
	pool *pgxpool.Pool
	w    *recovery.Worker
	me   string // the instance ID, for the ledger
	// owner is the owner value the current block was fetched under
	// (Worker.OwnerValue, read once per block); its completions match it.
	owner string
	log   *slog.Logger

	fetchSQL    string
	completeSQL string
	guardOwner  bool // completeSQL takes the owner as $2

	// Counters for the last log line (several fetchers with -host block).
	done, discarded, released, abandoned atomic.Int64

	stallOnce sync.Once // -stall-completion fires once
}

func newHost(cfg config, pool *pgxpool.Pool, w *recovery.Worker, log *slog.Logger) *host {
	table := pgx.Identifier{cfg.table}.Sanitize()
	h := &host{cfg: cfg, pool: pool, w: w, me: w.InstanceID(), log: log}
	// FetchBlockOfRows: queued rows of batches that are not waiting, locked
	// without waiting for other workers' locks, marked inprog and owned by
	// this worker (the owner is written in every mode, for the record; only
	// owner fencing relies on it).
	h.fetchSQL = fmt.Sprintf(`
WITH picked AS (
	SELECT r.rowid
	FROM %[1]s r JOIN batches b ON b.batchid = r.batchid
	WHERE r.status = 'queued' AND b.status <> 'wait'
	ORDER BY r.rowid
	LIMIT $1
	FOR UPDATE OF r SKIP LOCKED
)
UPDATE %[1]s r SET status = 'inprog', owner = $2
FROM picked WHERE r.rowid = picked.rowid
RETURNING r.rowid`, table)
	switch cfg.guard {
	case guardOwner:
		h.completeSQL = `UPDATE ` + table + ` SET status = 'done' WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`
		h.guardOwner = true
	case guardStatus:
		h.completeSQL = `UPDATE ` + table + ` SET status = 'done' WHERE rowid = $1 AND status = 'inprog'`
	default:
		h.completeSQL = `UPDATE ` + table + ` SET status = 'done' WHERE rowid = $1`
	}
	return h
}

// loop fetches and processes blocks until ctx is cancelled. A block once
// fetched is always finished: processBlock does not look at ctx.
//
// With -recover-only it takes no rows and only waits for ctx: the worker
// heartbeats and recovers peers, so the suite knows which worker does the
// recoveries while no one takes rows.
func (h *host) loop(ctx context.Context) {
	if h.cfg.recoverOnly {
		<-ctx.Done()
		return
	}
	if h.cfg.host == hostBlock {
		h.blockLoop(ctx)
		return
	}
	failing := ""
	for ctx.Err() == nil {
		ids, err := h.fetchBlock(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			state := "fetch"
			if errors.Is(err, recovery.ErrLeaseLost) {
				state = "lease"
			}
			if failing != state { // one log line per outage
				h.log.Warn("fetching a block failed; retrying", "error", err)
			}
			failing = state
			h.wait(ctx)
		case len(ids) == 0:
			if failing != "" {
				h.log.Info("fetching blocks works again")
			}
			failing = ""
			h.wait(ctx)
		default:
			if failing != "" {
				h.log.Info("fetching blocks works again")
			}
			failing = ""
			h.processBlock(ids)
		}
	}
}

func (h *host) wait(ctx context.Context) {
	t := time.NewTimer(h.cfg.poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// fetchBlock takes a block of rows and tracks them before the transaction
// that marks them in progress commits: a crash after the commit always
// finds them tracked, a crash before it leaves them queued.
func (h *host) fetchBlock(ctx context.Context) ([]int64, error) {
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	owner := h.w.OwnerValue() // once per block: names this worker's current life
	rows, err := tx.Query(ctx, h.fetchSQL, h.cfg.block, owner)
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	h.owner = owner
	if h.cfg.track != "before" {
		return h.commitThenTrack(ctx, tx, ids)
	}
	if err := h.w.TrackAs(ctx, owner, ids...); err != nil {
		if errors.Is(err, recovery.ErrLeaseLost) || errors.Is(err, recovery.ErrShutdown) || errors.Is(err, recovery.ErrNotStarted) {
			return nil, fmt.Errorf("track block: %w", err) // rolled back: still queued
		}
		// Only the Redis write failed: the IDs are kept in memory and the
		// next heartbeat writes them.
		h.log.Warn("tracking the block in Redis failed; the next heartbeat retries", "rows", len(ids), "error", err)
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit may or may not have happened: give back what this
		// worker owns (nothing if it did not) and stop tracking it.
		h.giveBack(ids)
		return nil, fmt.Errorf("commit block: %w", err)
	}
	h.log.Debug("fetched a block", "rows", len(ids), "first_row", ids[0], "last_row", ids[len(ids)-1])
	return ids, nil
}

// commitThenTrack is the fetch of a host that breaks the design's rule:
// it commits first and tracks after (-track after), or never (-track
// never). With -die-after-commit the process dies between the two.
func (h *host) commitThenTrack(ctx context.Context, tx pgx.Tx, ids []int64) ([]int64, error) {
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit block: %w", err)
	}
	if h.cfg.dieAfterCommit {
		h.log.Info("dying between the fetch's COMMIT and its Track", "rows", len(ids))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if h.cfg.track == "after" {
		if err := h.w.TrackAs(ctx, h.owner, ids...); err != nil {
			h.log.Warn("tracking the block failed", "rows", len(ids), "error", err)
		}
	}
	return ids, nil
}

// processBlock works through every row of the block. It takes no context:
// rows committed as inprog are finished even after SIGTERM. It stops early
// only when the heartbeat lease is lost, when peers may already consider
// this worker dead, and hands the rows it has not started back.
func (h *host) processBlock(ids []int64) {
	for i, id := range ids {
		if err := h.w.CheckLease(); err != nil {
			if h.cfg.host == hostForgetful {
				h.log.Warn("heartbeat lease lost mid-block; abandoning the rest of the block without Release",
					"rows", len(ids)-i, "error", err)
				return
			}
			h.log.Warn("heartbeat lease lost mid-block; handing the rest of the block back",
				"rows", len(ids)-i, "error", err)
			h.giveBack(ids[i:])
			return
		}
		if h.cfg.work > 0 {
			time.Sleep(h.cfg.work) // the work of the row
		}
		h.finishRow(id, h.owner, h.w.Untrack)
	}
}

// finishRow commits the row's outcome, retrying while the database fails
// (the row stays tracked meanwhile), then untracks it (Worker.Untrack, or
// Block.Done).
func (h *host) finishRow(id int64, owner string, untrack func(...int64) error) {
	deadline := time.Now().Add(h.cfg.rowTimeout)
	backoff := 50 * time.Millisecond
	var owned bool
	for attempt := 1; ; attempt++ {
		var err error
		owned, err = h.complete(id, owner)
		if err == nil {
			if attempt > 1 {
				h.log.Info("committing the row worked again", "row_id", id, "attempts", attempt)
			}
			break
		}
		if attempt == 1 {
			h.log.Warn("committing a row failed; retrying", "row_id", id, "error", err)
		}
		if time.Now().Add(backoff).After(deadline) {
			// Left tracked: should this worker die, a peer recovers it.
			h.abandoned.Add(1)
			h.log.Error("giving up on a row; it stays tracked", "row_id", id, "error", err)
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
	if owned {
		h.done.Add(1)
	} else {
		// Recovered while this worker was presumed dead: the result is
		// discarded, and recorded as such for the suite.
		h.discarded.Add(1)
		h.log.Warn("row is no longer this worker's; result discarded", "row_id", id)
		h.record(id, "discarded")
	}
	if err := untrack(id); err != nil {
		h.log.Warn("untrack failed; the next heartbeat removes the row", "row_id", id, "error", err)
	}
}

// complete marks row id done, fetched under owner, under the guard and writes the ledger in the
// same transaction. owned is false, and nothing is committed, when the
// guard rejects the row.
func (h *host) complete(id int64, owner string) (owned bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	args := []any{id}
	if h.guardOwner {
		args = append(args, owner)
	}
	tag, err := tx.Exec(ctx, h.completeSQL, args...)
	if err != nil {
		return false, fmt.Errorf("mark row %d done: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if h.cfg.stallCompletion > 0 {
		h.stallOnce.Do(func() {
			h.log.Warn("fault: stalling in the completion transaction, holding the row's lock",
				"row_id", id, "stall", h.cfg.stallCompletion)
			time.Sleep(h.cfg.stallCompletion) // the test kills the process meanwhile
		})
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (rowid, instance, outcome) VALUES ($1, $2, 'done')`, id, h.me); err != nil {
		return false, fmt.Errorf("ledger row %d: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit row %d: %w", id, err)
	}
	return true, nil
}

// record appends an outcome other than done to the ledger.
func (h *host) record(id int64, outcome string) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if _, err := h.pool.Exec(ctx, `INSERT INTO ledger (rowid, instance, outcome) VALUES ($1, $2, $3)`, id, h.me, outcome); err != nil {
		h.log.Warn("ledger entry lost", "row_id", id, "outcome", outcome, "error", err)
	}
}

// giveBack returns rows this worker will not finish to the queue through
// Release (guarded like a recovery), retrying while the database fails. If
// it never succeeds the rows stay tracked, for a peer to recover should
// this worker die.
//
// A release counts in the recoveries column like a recovery does; the
// suite tells the two apart by the "handing rows back" line, which names
// the rows by ID. It is written before the first Release, so a worker
// killed while its release commits has still recorded it.
func (h *host) giveBack(ids []int64) {
	h.log.Info("handing rows back", "rows", len(ids), "row_ids", ids)
	deadline := time.Now().Add(h.cfg.rowTimeout)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		err := h.w.Release(ctx, ids...)
		cancel()
		if err == nil {
			h.released.Add(int64(len(ids)))
			return
		}
		if attempt == 1 {
			h.log.Warn("handing rows back failed; retrying", "rows", len(ids), "error", err)
		}
		if time.Now().Add(backoff).After(deadline) {
			h.abandoned.Add(int64(len(ids)))
			h.log.Error("giving up handing rows back; they stay tracked", "rows", len(ids), "error", err)
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	_ = tx.Rollback(ctx) // after Commit: a no-op
}
