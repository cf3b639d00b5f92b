package pgcore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Resets that commit chunk by chunk.
//
// A reset whose rows are each fenced on their own commits every chunk in
// a transaction of its own, so a block of any size comes back: each try
// keeps what its chunks committed, and the next try resumes from what is
// left. A row is fenced on its own when a reset applied to it again, after
// a live worker took it since, would change nothing:
//
//   - by owner (WithOwnerColumn), in a recovery: the reset requires the
//     dead owner, and a worker that takes the row writes its own;
//   - by the reset ledger, in a recovery (RowsReset.FromRowsSet): the
//     chunk records the rows it resets in its own transaction, and every
//     later chunk of the same incarnation skips them (read under the
//     incarnation's lock, chunk by chunk). A Release under the ledger
//     stays whole: on an error the worker takes its rows as not released
//     and may track a row again under the same incarnation, which a
//     committed chunk's record would then hide from its recovery;
//   - by row version (the sweep without an owner column): a row written
//     since has another version.
//
// A reset by IDs with neither (no owner column and no ledger, or an
// unknown incarnation; or rows without an owner read from a rows set, with
// an owner column and no ledger) stays one transaction: a retry after a
// committed chunk would reset again a row a live worker took since.
// So does a Release (a reset by IDs not from a rows set), under the ledger
// (above) or with an owner column: its owner value is a live worker's,
// which may take a row again under it after a partial failure.
//
// The chunk size adapts (chunkSizer): no more rows than fit half the
// session's statement_timeout and half the time the reset has left, at
// the rate of the last chunk; halved after a chunk that ran out of time
// (the next chunk, or the next try, is smaller), doubled after a chunk
// that took under a quarter of its budget, never above WithChunkSize.

// chunkSizer sizes the chunks of a resetter's resets. It is shared by
// every reset of the resetter, concurrent ones included: its fields are
// each read and written atomically, and a race between two resets only
// costs a chunk of a less fitting size.
type chunkSizer struct {
	max         int64
	size        atomic.Int64 // rows of the next chunk, 1 to max
	perRow      atomic.Int64 // nanoseconds a row took in the last chunk; 0 before the first
	stmtTimeout atomic.Int64 // the session's statement_timeout in milliseconds as last read; 0 is none
}

func (c *chunkSizer) init(max int) {
	c.max = int64(max)
	c.size.Store(c.max)
}

// budget is the time a chunk may take: half the statement_timeout, and
// half the time ctx leaves; 0 when neither bounds it.
func (c *chunkSizer) budget(ctx context.Context) time.Duration {
	var b time.Duration
	if st := c.stmtTimeout.Load(); st > 0 {
		b = time.Duration(st) * time.Millisecond / 2
	}
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d) / 2; b == 0 || left < b {
			b = left
		}
	}
	return b
}

// probeChunk is the most rows the first chunk of a resetter takes under a
// budget, before any chunk has told the rate: a block whose rows are slow
// (a trigger) then does not spend its first try on a chunk that cannot
// fit.
const probeChunk = 100

// next returns how many rows the next chunk takes: the current size, no
// more than fit the budget at the last chunk's rate (probeChunk before a
// rate is known), at least 1.
func (c *chunkSizer) next(ctx context.Context) int {
	n := c.size.Load()
	if b := c.budget(ctx); b > 0 {
		if per := c.perRow.Load(); per > 0 {
			n = min(n, int64(b)/per)
		} else {
			n = min(n, probeChunk)
		}
	}
	return int(max(n, 1))
}

// statement returns how many rows a statement inside a transaction takes
// (resetInTx, resetVersionsInTx): the current size, no more than fit half
// the statement_timeout at the last chunk's rate. Unlike next, it does
// not fit the time left nor probe: all the statements of a transaction
// commit together, so smaller ones would not make it fit.
func (c *chunkSizer) statement() int {
	n := c.size.Load()
	if st, per := c.stmtTimeout.Load(), c.perRow.Load(); st > 0 && per > 0 {
		n = min(n, int64(time.Duration(st)*time.Millisecond/2)/per)
	}
	return int(max(n, 1))
}

// done records a chunk that committed in d after working on rows rows
// (the IDs it was given, or the rows it locked by owner): its rate, and,
// when the chunk was full (rows is the current size) and took under a
// quarter of its budget, a size doubled. A chunk that found few rows (an
// owner with none left) tells no rate.
func (c *chunkSizer) done(ctx context.Context, rows int, d time.Duration) {
	if rows < min(probeChunk, int(c.size.Load())) {
		return
	}
	c.perRow.Store(max(int64(d)/int64(rows), 1))
	if b := c.budget(ctx); b > 0 && 4*d < b && int64(rows) >= c.size.Load() {
		c.size.Store(min(2*int64(rows), c.max))
	}
}

// failed records a chunk of n rows that ran out of time: the next is at
// most half as big, and the rate assumed at least twice as slow.
func (c *chunkSizer) failed(n int) {
	c.size.Store(max(min(c.size.Load(), int64(n)/2), 1))
	if per := c.perRow.Load(); per > 0 {
		c.perRow.Store(2 * per)
	}
}

// outOfTime reports whether err ended a chunk for lack of time: the
// session's statement_timeout cancelled a statement, or ctx ended.
func outOfTime(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) ||
		sqlState(err) == "57014" && strings.Contains(serverMessage(err), "statement timeout")
}

// chunkStep runs one chunk of at most n rows in tx and returns what it
// changed, how many rows it worked on (chunkSizer.done), and advance,
// which byChunk calls once the chunk's transaction committed: it moves
// past the chunk and reports whether rows may be left. A step does not
// move on itself: a transaction retried after a deadlock runs the same
// chunk again.
type chunkStep func(ctx context.Context, tx Tx, n int) (res ResetResult, rows int, advance func() (more bool), err error)

// oneRowTimeouts is how many times in a row byChunk tries a chunk of one
// row the statement_timeout cancelled before it gives up: on a loaded
// server a statement may outrun a short statement_timeout once, whatever
// its size; a row whose reset always does never comes back (Start warns).
const oneRowTimeouts = 3

// byChunk runs step chunk after chunk, each chunk in a transaction of its
// own (withRetry) committed before the next begins, until step says no
// row is left. A chunk the statement_timeout cancelled is tried again at
// half the size while ctx lasts (a chunk of one row, oneRowTimeouts times
// in a row); one that ran out of ctx's time halves the size of the next
// try's chunks. On an error, what earlier chunks committed stays
// committed; the error says how many rows they changed.
func (r *Resetter) byChunk(ctx context.Context, step chunkStep) (ResetResult, error) {
	var total ResetResult
	stalls := 0
	for {
		n := r.chunks.next(ctx)
		start := time.Now()
		var (
			advance func() bool
			rows    int
		)
		res, err := r.withRetry(ctx, func(tx Tx) (ResetResult, error) {
			res, worked, adv, err := step(ctx, tx, n)
			rows, advance = worked, adv
			return res, err
		})
		if err != nil {
			if outOfTime(ctx, err) {
				r.chunks.failed(n)
				if n == 1 {
					stalls++
				}
				if ctx.Err() == nil && stalls < oneRowTimeouts {
					continue
				}
			}
			if total.Changed > 0 {
				err = fmt.Errorf("%d rows reset in committed chunks, the rest left for the next try: %w", total.Changed, err)
			}
			return ResetResult{}, err
		}
		r.chunks.done(ctx, rows, time.Since(start))
		stalls = 0
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.ChangedIDs = append(total.ChangedIDs, res.ChangedIDs...)
		total.NotReset = append(total.NotReset, res.NotReset...)
		total.Gone = append(total.Gone, res.Gone...)
		if !advance() {
			return total, nil
		}
	}
}

// commitsByChunk reports whether the reset of req by IDs may commit chunk
// by chunk: every row it may change is fenced on its own (see above).
func (r *Resetter) commitsByChunk(req RowsReset) bool {
	if !req.FromRowsSet {
		// A Release (by IDs, not from a rows set) stays whole, with an
		// owner column too: on an error the worker takes its rows as not
		// released, and may take a row again under the same owner value,
		// which a repeat of the Release would then reset under it.
		return false
	}
	if r.o.OwnerColumn != "" {
		// Rows without an owner read from a rows set are fenced by the
		// ledger alone (unownedReset).
		return !r.o.NoLedger && req.Incarnation != ""
	}
	return r.ledgerFor(req)
}

// resetIDsByChunk resets ids (sorted, without duplicates) for req chunk
// by chunk (byChunk). The ledger's expired entries are cleaned in the last
// chunk's transaction.
func (r *Resetter) resetIDsByChunk(ctx context.Context, req RowsReset, ids []int64) (ResetResult, error) {
	return r.byChunk(ctx, func(ctx context.Context, tx Tx, n int) (ResetResult, int, func() bool, error) {
		n = min(n, len(ids))
		res, err := r.resetInTx(ctx, tx, req, ids[:n], n == len(ids))
		return res, n, func() bool {
			ids = ids[n:]
			return len(ids) > 0
		}, err
	})
}

// resetOwnedByChunk resets the rows of owner chunk by chunk (byChunk), in
// ID order, each chunk the rows above the last ID of the previous one,
// then reads, on its own, the rows of owner the chunks skipped because
// another session held them locked.
func (r *Resetter) resetOwnedByChunk(ctx context.Context, owner string) (ResetResult, error) {
	v := resetValues{owner: owner}
	q := r.byOwner
	var refused []int64 // locked by a committed chunk and refused by the database
	all, err := r.byChunk(ctx, func(ctx context.Context, tx Tx, n int) (ResetResult, int, func() bool, error) {
		var (
			res    ResetResult
			locked int
			after  int64
			refuse []int64
		)
		w := v
		w.limit = n
		err := queryRow(ctx, tx, q.sql, r.bind(q, w), &res.Changed, &res.Quarantined, &res.ChangedIDs, &refuse, &locked, &after)
		return res, locked, func() bool {
			// A short chunk means no unlocked row is left; a full one
			// moves the keyset on.
			refused = append(refused, refuse...)
			q, v.after = r.byOwnerAfter, after
			return locked == n
		}, err
	})
	if err != nil {
		return ResetResult{}, err
	}
	// SKIP LOCKED passed over the rows another session holds; the
	// database refused the rows among refused.
	skipped, err := r.unsettled(ctx, r.conn, r.ownedRest, resetValues{owner: owner}, refused)
	if err != nil {
		return ResetResult{}, fmt.Errorf("%d rows reset; read the rows left: %w", all.Changed, err)
	}
	all.NotReset = skipped
	return all, nil
}

// resetVersionsByChunk resets sorted (in ascending ID order) chunk by
// chunk (byChunk): the version guard fences each row on its own.
func (r *Resetter) resetVersionsByChunk(ctx context.Context, sorted []RowState) (ResetResult, error) {
	return r.byChunk(ctx, func(ctx context.Context, tx Tx, n int) (ResetResult, int, func() bool, error) {
		n = min(n, len(sorted))
		res, err := r.resetVersionsInTx(ctx, tx, sorted[:n])
		return res, n, func() bool {
			sorted = sorted[n:]
			return len(sorted) > 0
		}, err
	})
}
