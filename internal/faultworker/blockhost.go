package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/alya/recovery"
)

// blockLoop is the host loop written with the Block handle (-host block):
// -fetchers goroutines each Begin a block, defer its Close, fetch it under
// the block's owner value and Track it before the COMMIT, then Check
// before each row and Done after its commit. Close gives back what a block
// did not finish: on a lost lease, on a fetch that failed between its
// UPDATE and its COMMIT (-fail-fetch-every), and on a panic in processing
// (-panic-every), which the host's own recover stops, or which crashes the
// process (-panic-crash).
func (h *host) blockLoop(ctx context.Context) {
	var fetches, rows atomic.Int64
	var wg sync.WaitGroup
	for range h.cfg.fetchers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if !h.safeBlock(ctx, &fetches, &rows) {
					h.wait(ctx)
				}
			}
		})
	}
	wg.Wait()
}

// safeBlock runs one block and recovers a panic in its processing, as a
// host's framework does; it reports whether it took rows.
func (h *host) safeBlock(ctx context.Context, fetches, rows *atomic.Int64) (took bool) {
	if h.cfg.panicCrash {
		return h.oneBlock(ctx, fetches, rows) // a panic crashes the process, after the block's Close
	}
	defer func() {
		if v := recover(); v != nil {
			h.log.Warn("processing stopped by a recovered fault; the block's deferred Close gave the rest back", "fault", fmt.Sprint(v))
			took = true
		}
	}()
	return h.oneBlock(ctx, fetches, rows)
}

// errFailedFetch is the fault -fail-fetch-every injects between a fetch's
// UPDATE and its COMMIT (before the Track, the last step before the COMMIT).
var errFailedFetch = errors.New("fault: the fetch failed before its COMMIT")

// oneBlock begins a block, fetches it and processes it.
func (h *host) oneBlock(ctx context.Context, fetches, rows *atomic.Int64) bool {
	b, err := h.w.Begin()
	if err != nil {
		return false // the lease is lost or the worker stopped: wait and try again
	}
	defer func() {
		if err := b.Close(); err != nil {
			h.log.Warn("giving the rest of a block back failed; it stays tracked", "error", err)
		}
	}()
	ids, err := h.fetchUnder(ctx, b, fetches.Add(1))
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("fetching a block failed; retrying", "error", err)
		}
		return false
	}
	if len(ids) == 0 {
		return false
	}
	for _, id := range ids {
		if err := b.Check(); err != nil {
			h.log.Warn("heartbeat lease lost mid-block; the block's Close gives the rest back", "rows", len(b.Rows()), "error", err)
			return true
		}
		if h.cfg.work > 0 {
			time.Sleep(h.cfg.work) // the work of the row
		}
		if n := rows.Add(1); h.cfg.panicEvery > 0 && n%int64(h.cfg.panicEvery) == 0 {
			panic(fmt.Sprintf("fault: processing row %d", id))
		}
		h.finishRow(id, b.OwnerValue(), b.Done)
	}
	return true
}

// fetchUnder is fetchBlock for a Block: the owner value is the block's and
// Track is the block's; fetch number n fails before its COMMIT with
// -fail-fetch-every.
func (h *host) fetchUnder(ctx context.Context, b *recovery.Block, n int64) ([]int64, error) {
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	rows, err := tx.Query(ctx, h.fetchSQL, h.cfg.block, b.OwnerValue())
	if err != nil {
		return nil, fmt.Errorf("select block: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	slices.Sort(ids)
	if h.cfg.failFetchEvery > 0 && n%int64(h.cfg.failFetchEvery) == 0 {
		return nil, errFailedFetch // rolled back, nothing tracked: still queued
	}
	if err := b.Track(ctx, ids...); err != nil { // the last step before the COMMIT
		return nil, fmt.Errorf("track block: %w", err) // rolled back: still queued
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit block: %w", err) // Close gives back what this worker owns
	}
	return ids, nil
}
