package recovery

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
)

// TestARowReleasedButNotYetUntrackedIsNoRetakenRow: Release marks its rows
// released before its reset and untracks them after. A heartbeat in
// between must not take them for rows tracked again and rotate the
// incarnation: a Release repeated after a lost reply would then reset
// under the new incarnation, out of the ledger's sight, rows a peer took
// once the first reset committed (simulator seed 1193: five rows reset
// under the peer that held them).
func TestARowReleasedButNotYetUntrackedIsNoRetakenRow(t *testing.T) {
	var s inflight
	s.init()
	s.add([]int64{1, 2, 3})
	s.markReleased([]int64{1, 2})
	assert.False(t, s.retaken(), "released, still tracked until the Release untracks them")

	assert.True(t, s.add([]int64{2}), "Track of a released row")
	assert.True(t, s.retaken())
	gone, next := s.rotation()
	assert.Equal(t, []int64(nil), gone, "row 1 is still tracked: the Release has not untracked it yet")
	s.rotated(next, gone)
	assert.False(t, s.retaken(), "a new incarnation: nothing released under it")

	s.markReleased([]int64{3})
	s.unmarkReleased([]int64{3}) // its reset failed
	s.add([]int64{3})
	assert.False(t, s.retaken(), "a row whose release failed is no released row")
}

// lastBeatStore records the last heartbeat it was sent.
type lastBeatStore struct {
	store.Store
	mu   sync.Mutex
	last store.Heartbeat
}

func (s *lastBeatStore) Beat(_ context.Context, _ string, b store.Heartbeat) (store.BeatResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = b
	return store.BeatResult{Wrote: true}, nil
}

func (s *lastBeatStore) lastBeat() store.Heartbeat {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// TestOldestRowAgeIsHowLongTheOldestTrackedRowHasBeenHeld: on a fake
// clock, Stats.OldestRowAge and each heartbeat's report follow the oldest
// row tracked now: it grows with the clock, moves to the next oldest when
// that row is untracked, starts again when the row is tracked again, and
// is none when no row is tracked. The marks behind it do not pile up.
func TestOldestRowAgeIsHowLongTheOldestTrackedRowHasBeenHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &lastBeatStore{}
		w, _ := newWorker(t, idleClient(t), &fakeResetter{}, "w1", WithHistory(0),
			WithTimings(Timings{HeartbeatTTL: 5 * time.Minute, HeartbeatInterval: time.Minute, RecoveryInterval: time.Hour, RowsTTL: 2 * time.Hour}),
			withStore(func(store.Store) store.Store { return s }))
		ctx := context.Background()
		beat := func() store.Heartbeat {
			t.Helper()
			require.NoError(t, w.heart.runOnce(ctx))
			return s.lastBeat()
		}
		assert.Zero(t, w.Stats().OldestRowAge)
		assert.False(t, beat().HoldsRows)

		// Each wait is shorter than the lease (heartbeat TTL 5m), each
		// heartbeat renews it.
		w.rows.add([]int64{1, 2})
		time.Sleep(30 * time.Second) // fake clock: the age is clock time
		w.rows.add([]int64{3})
		time.Sleep(10 * time.Second) // fake clock: the age is clock time
		assert.Equal(t, 40*time.Second, w.Stats().OldestRowAge)
		b := beat()
		assert.True(t, b.HoldsRows)
		assert.Equal(t, 40*time.Second, b.OldestRowAge)

		w.rows.remove([]int64{1})
		assert.Equal(t, 40*time.Second, w.Stats().OldestRowAge, "row 2, tracked with row 1")
		w.rows.add([]int64{2}) // tracked again: its age starts again
		assert.Equal(t, 10*time.Second, w.Stats().OldestRowAge, "row 3 is the oldest now")
		w.rows.remove([]int64{3})
		assert.Zero(t, w.Stats().OldestRowAge, "row 2, tracked just now")

		// A Track per 100ms for a minute: the marks stay one per second.
		for i := range 600 {
			time.Sleep(100 * time.Millisecond) // fake clock: the age is clock time
			w.rows.add([]int64{2})
			if i%300 == 0 {
				beat()
			}
		}
		assert.Zero(t, w.Stats().OldestRowAge)
		w.rows.mu.Lock()
		marks := len(w.rows.marks)
		w.rows.mu.Unlock()
		assert.LessOrEqual(t, marks, 1, "marks older than the oldest row are dropped")

		w.rows.remove([]int64{2})
		assert.Zero(t, w.Stats().OldestRowAge)
		assert.False(t, beat().HoldsRows)
	})
}
