package recovery

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrBlockClosed is returned by a Block's calls after its Close.
var ErrBlockClosed = errors.New("recovery: block closed")

// A Block is one block of rows a host takes and processes: the host's part
// of the protocol in one handle, as database/sql's Tx is for a
// transaction. Begin one per fetch, and defer its Close at once:
//
//	b, err := w.Begin()
//	if err != nil { ... } // the lease is lost or the worker is not running: wait and retry
//	defer b.Close()       // gives back what the host did not finish: on an error, a panic, a lost lease
//	// fetch: UPDATE ... SET status = 'inprog', owner = b.OwnerValue() ... RETURNING id;
//	//        b.Track(ctx, ids...) before the COMMIT
//	for _, id := range ids {
//		if b.Check() != nil { return } // the lease was lost: Close gives the rest back
//		// process; complete: UPDATE ... WHERE id = $id AND owner = b.OwnerValue() AND status = 'inprog'
//		b.Done(id)
//	}
//
// A Block carries the owner value the block is fetched under (read once,
// at Begin), so a goroutine's completions name the value its own fetch
// wrote: goroutines that fetch concurrently each Begin their own Block.
// Check stays failed, for good, once the lease was lost after Begin: the
// block's rows may have been recovered, even if the worker's lease is back
// (then the next Begin succeeds). Close releases the rows tracked and not
// Done (Release); after every row is Done it does nothing. In rows-set
// mode the worker gives back no rows held at a loss while a Block begun
// before it is open: Close every Block. A Block is used
// by one goroutine; Close may be called any number of times.
type Block struct {
	w      *Worker
	owner  string
	losses uint64 // the worker's lease losses at Begin
	mu     sync.Mutex
	rows   map[int64]struct{} // tracked, not Done
	closed bool
}

// Begin returns a handle for the next block of rows, carrying the owner
// value to fetch it under (Block.OwnerValue). It fails, beginning nothing,
// with CheckLease's error: ErrNotStarted, ErrShutdown, or one wrapping
// ErrLeaseLost while peers may consider this worker dead (wait and call
// Begin again: a lost lease comes back with Redis). Begin sends nothing.
func (w *Worker) Begin() (*Block, error) {
	b := &Block{w: w, rows: make(map[int64]struct{})}
	// Open before the check, with the losses so far: a loss after it fails
	// the block, and the give-back waits for its Close.
	b.losses = w.lease.blocks.open(b, &w.stats.leaseLosses)
	if err := w.lease.checkTrack(&w.state); err != nil { // CheckLease; the host has moved on
		w.lease.blocks.close(b)
		return nil, fmt.Errorf("begin a block: %w", err)
	}
	b.owner = w.OwnerValue()
	return b, nil
}

// OwnerValue returns the value the block's fetch writes into the owner
// column and its completions match (Worker.OwnerValue, read at Begin).
func (b *Block) OwnerValue() string { return b.owner }

// Track records the rows the block's fetch took (Worker.TrackAs under the
// block's owner value): call it inside the fetch's transaction, as the last
// step before its COMMIT. Close gives back what Track took if the COMMIT
// fails, committed or not; an error between Track and a COMMIT never sent
// (the transaction certainly rolled back) wants Done of those rows instead
// in rows-set mode without an owner column, where Close's reset cannot
// tell them from another worker's that took them since. On an error wrapping ErrLeaseLost, ErrShutdown or ErrNotStarted
// nothing is tracked: roll the fetch back. On another (rows-set mode: only
// the Redis write failed) the rows are tracked all the same, in memory, and
// the next heartbeat writes them, as with Worker.Track. It refuses,
// with an error wrapping ErrLeaseLost, once the lease was lost after Begin
// (Begin again and fetch under the new value), and with ErrBlockClosed
// after Close.
func (b *Block) Track(ctx context.Context, rowIDs ...int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBlockClosed
	}
	if err := b.lost(); err != nil {
		return fmt.Errorf("track %d rows: %w", len(rowIDs), err)
	}
	err := b.w.TrackAs(ctx, b.owner, rowIDs...)
	tracked := rowIDs
	if err != nil {
		// Only the Redis write failed (rows-set mode): the worker keeps
		// the rows, and so does the block, for Close.
		tracked = b.w.rows.trackedAmong(rowIDs)
	}
	for _, id := range tracked {
		b.rows[id] = struct{}{}
	}
	return err
}

// Check reports whether the host may process the block's next row: nil
// while the worker's lease is valid and has not been lost since Begin;
// CheckLease's error, or one wrapping ErrLeaseLost for good once the lease
// was lost after Begin (peers may have recovered the block's rows), and
// ErrBlockClosed after Close. On an error stop processing the block; Close
// gives the rest back.
func (b *Block) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrBlockClosed
	}
	if err := b.lost(); err != nil {
		return err
	}
	return b.w.CheckLease()
}

// lost reports a lease lost since Begin; the caller holds b.mu.
func (b *Block) lost() error {
	if b.w.stats.leaseLosses.Load() != b.losses {
		return fmt.Errorf("%w: lost since the block began; its rows may have been recovered", ErrLeaseLost)
	}
	return nil
}

// Done records that the host has finished rowIDs, successfully or not,
// once each outcome is committed: it untracks them (Worker.Untrack) and
// Close will not give them back. It works after Close too.
func (b *Block) Done(rowIDs ...int64) error {
	b.mu.Lock()
	for _, id := range rowIDs {
		delete(b.rows, id)
	}
	b.mu.Unlock()
	return b.w.Untrack(rowIDs...)
}

// Rows returns the rows tracked by the block and not Done, in no order.
func (b *Block) Rows() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return members(b.rows)
}

// Close gives back the block's rows tracked and not Done (Worker.Release,
// bounded by the reset timeout, not by any context of the host's) and ends
// the block: later calls but Done and Close return ErrBlockClosed. With
// every row Done, or after a first Close, it does nothing and returns nil.
// Rows the worker gave back already (after a lost lease, docs/safety.md
// §3) are not reset again. Its error is Release's: the rows it could not
// give back stay tracked, for a peer to recover should this worker die.
//
// After a fetch that rolled back, Close's reset finds the rows queued and
// leaves them so, with owner fencing also once another worker took them.
// Without an owner column it cannot tell them from another worker's: Track
// as the last step before the COMMIT (see Track).
func (b *Block) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ids := b.w.rows.heldAmong(members(b.rows))
	clear(b.rows)
	b.mu.Unlock()
	// Then the give-back may go on without this block (giveback.go): its
	// rows are released below or were done.
	defer b.w.giver.wake()
	defer b.w.lease.blocks.close(b)
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.w.opts.resetTimeout)
	defer cancel()
	if err := b.w.Release(ctx, ids...); err != nil {
		return fmt.Errorf("close the block: %w", err)
	}
	return nil
}

// heldAmong returns the rows of ids that are tracked now or were left to
// the backstop sweep at a lost lease: those a Release of ids acts on.
func (s *inflight) heldAmong(ids []int64) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, id := range ids {
		_, tracked := s.ids[id]
		_, left := s.abandoned[id]
		if tracked || left {
			out = append(out, id)
		}
	}
	return out
}
