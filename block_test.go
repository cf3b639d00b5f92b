package recovery

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Close gives back the rows tracked and not Done, once; the block refuses
// further work. (Reverted to Release nothing: rows 2 and 3 stayed in
// progress.)
func TestBlockCloseGivesBackTheRowsNotDone(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "BC")
	ctx := context.Background()
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix))
	b, err := w.Begin()
	require.NoError(t, err)
	assert.Equal(t, w.OwnerValue(), b.OwnerValue())
	take(t, db, b.OwnerValue(), 1, 2, 3)
	require.NoError(t, b.Track(ctx, 1, 2, 3))
	require.True(t, complete(t, db, b.OwnerValue(), 1))
	require.NoError(t, b.Done(1))
	assert.ElementsMatch(t, []int64{2, 3}, b.Rows())

	require.NoError(t, b.Close())
	assertRequeued(t, db, 2, 3)
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "done", s)
	assert.Zero(t, w.Stats().TrackedRows)
	assert.Equal(t, uint64(2), w.Stats().RowsReleased)
	require.NoError(t, b.Close(), "a second Close does nothing")
	assert.ErrorIs(t, b.Track(ctx, 4), ErrBlockClosed)
	assert.ErrorIs(t, b.Check(), ErrBlockClosed)
}

// Close after every row is Done resets nothing, like Rollback after
// Commit. (Reverted to release b's rows whatever was Done: one reset.)
func TestBlockCloseAfterEveryRowIsDoneDoesNothing(t *testing.T) {
	_, rdb := newMini(t)
	ctx := context.Background()
	r := &fakeResetter{}
	w, _ := startWorker(t, rdb, r, "w")
	b, err := w.Begin()
	require.NoError(t, err)
	require.NoError(t, b.Track(ctx, 1, 2))
	require.NoError(t, b.Done(1, 2))
	require.NoError(t, b.Close())
	assert.Zero(t, r.callCount())
}

// A panic in the host's processing unwinds through the deferred Close,
// which gives the block back. (Reverted to no Release in Close: rows 2
// and 3 stayed in progress.)
func TestBlockDeferredCloseGivesBackTheBlockOnAPanic(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "BP")
	ctx := context.Background()
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix))
	func() {
		defer func() { assert.Equal(t, "row 2", recover()) }() // the host's own recover
		b, err := w.Begin()
		require.NoError(t, err)
		defer b.Close()
		take(t, db, b.OwnerValue(), 1, 2, 3)
		require.NoError(t, b.Track(ctx, 1, 2, 3))
		require.True(t, complete(t, db, b.OwnerValue(), 1))
		require.NoError(t, b.Done(1))
		panic("row 2")
	}()
	assertRequeued(t, db, 2, 3)
	assert.Zero(t, w.Stats().TrackedRows)
}

// A block begun before a lost lease stays lost, even once the worker's
// lease is back and it takes rows again: its rows may have been recovered.
// Its Close then resets nothing the worker gave back already, and the
// completion of one of its rows is refused. (Reverted to CheckLease alone:
// Check said nil for the old block once the worker gave its rows back.)
func TestBlockBegunBeforeALostLeaseStaysLostOnceTheLeaseIsBack(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "BL")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	b, err := w.Begin()
	require.NoError(t, err)
	defer b.Close()
	take(t, db, b.OwnerValue(), 1, 2)
	require.NoError(t, b.Track(ctx, 1, 2))

	loseLease(t, rdb, w, fr)
	assert.ErrorIs(t, b.Check(), ErrLeaseLost)
	_, err = w.Begin()
	assert.ErrorIs(t, err, ErrLeaseLost, "no block while the lease is lost")
	fr.thaw()
	waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"the worker gave back the old block's rows")
	assert.ErrorIs(t, b.Check(), ErrLeaseLost, "the old block stays lost")
	assert.ErrorIs(t, b.Track(ctx, 3), ErrLeaseLost)
	assert.False(t, complete(t, db, b.OwnerValue(), 1), "the ended life's completion is refused")

	b2, err := w.Begin()
	require.NoError(t, err)
	assert.NotEqual(t, b.OwnerValue(), b2.OwnerValue(), "a new life")
	take(t, db, b2.OwnerValue(), 3)
	require.NoError(t, b2.Track(ctx, 3))
	require.NoError(t, b2.Check())
	released := w.Stats().RowsReleased
	require.NoError(t, b.Close())
	assert.Equal(t, released, w.Stats().RowsReleased, "nothing left to give back")
	require.NoError(t, b2.Close())
	assertRequeued(t, db, 1, 2, 3)
	assert.Equal(t, 1, logs.Count("the host did not release them"))
}

// Goroutines that fetch concurrently each Begin their own block: each
// Close gives back only its own rows.
func TestBlocksOfConcurrentFetchersGiveBackOnlyTheirOwnRows(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "BF")
	ctx := context.Background()
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", WithKeyPrefix(prefix))
	var wg sync.WaitGroup
	for g, ids := range [][]int64{{1, 2}, {3, 4}} {
		wg.Go(func() {
			b, err := w.Begin()
			assert.NoError(t, err)
			defer b.Close()
			take(t, db, b.OwnerValue(), ids...)
			assert.NoError(t, b.Track(ctx, ids...))
			if g == 0 {
				return // gives its block back
			}
			for _, id := range ids {
				assert.True(t, complete(t, db, b.OwnerValue(), id))
				assert.NoError(t, b.Done(id))
			}
		})
	}
	wg.Wait()
	assertRequeued(t, db, 1, 2)
	for _, id := range []int64{3, 4} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "done", s, "row %d", id)
	}
	assert.Zero(t, w.Stats().TrackedRows)
}

// A Track whose Redis write failed (rows-set mode) leaves the rows tracked
// in memory, for the next heartbeat: the block keeps them too, and Close
// gives them back. (Reverted to record nothing on an error: nothing reset.)
func TestBlockKeepsTheRowsATrackWithoutRedisTracked(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	r := &fakeResetter{}
	w, _ := startWorker(t, rdb, r, "w")
	b, err := w.Begin()
	require.NoError(t, err)
	mr.SetError("ERR down")
	require.Error(t, b.Track(ctx, 1, 2))
	mr.SetError("")
	assert.ElementsMatch(t, []int64{1, 2}, b.Rows())
	require.NoError(t, b.Close())
	assert.ElementsMatch(t, []int64{1, 2}, r.resetOf("w"))
	assert.Zero(t, w.Stats().TrackedRows)
}

// A fetch that rolls back after Block.Track (an error between Track and the
// COMMIT) leaves its rows queued, and a peer may take one of them before the
// block's Close: Close's reset, fenced by the owner column (the block's
// owner value in owner mode, the instance ID with rows sets), leaves the
// peer's row alone and the other queued, and untracks both. Without an
// owner column the same steps reset the peer's row (docs/safety.md §3, "Not
// covered"), which is why Block.Track's godoc asks for Done there.
func TestBlockCloseAfterAFetchRolledBackLeavesAPeersRowAlone(t *testing.T) {
	t.Parallel()
	for _, mode := range bothModes {
		t.Run(mode.name, func(t *testing.T) {
			rdb, db, prefix := onRealServers(t, 3, "BRB")
			ctx := context.Background()
			w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", append([]Option{WithKeyPrefix(prefix)}, mode.opts...)...)
			b, err := w.Begin()
			require.NoError(t, err)

			tx, err := db.Begin(ctx) // the fetch
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = $1 WHERE rowid = ANY($2)`,
				b.OwnerValue(), []int64{1, 2})
			require.NoError(t, err)
			require.NoError(t, b.Track(ctx, 1, 2))
			require.NoError(t, tx.Rollback(ctx)) // an error before the COMMIT
			take(t, db, "peer", 1)               // a peer fetches row 1 meanwhile

			require.NoError(t, b.Close())
			s, o := rowState(t, db, 1)
			assert.Equal(t, "inprog", s, "the peer's row 1 is not reset")
			if assert.NotNil(t, o) {
				assert.Equal(t, "peer", *o)
			}
			s, o = rowState(t, db, 2)
			assert.Equal(t, "queued", s)
			assert.Nil(t, o)
			assert.Zero(t, w.Stats().TrackedRows)
		})
	}
}
