package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSafetyReleaseWithoutOwnerFencingRefusesOnceTheLeaseIsLost(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	timing := []Option{WithTimings(Timings{
		HeartbeatTTL:      400 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
	})}
	plain := &fakeResetter{}
	a, _ := startWorker(t, rdb, plain, "plain", timing...)
	fenced := &fakeResetter{fenced: true}
	b, _ := startWorker(t, rdb, fenced, "fenced", timing...)
	require.NoError(t, a.Track(ctx, 1))
	require.NoError(t, b.Track(ctx, 2))

	mr.SetError("ERR down")
	// Each worker's failed heartbeat turns, a retry delay apart, note its
	// loss once its lease has run out; both within 2s.
	lost := time.Now()
	waitTurns(t, &signals(a).beat, 2*time.Second, func() bool { return a.CheckLease() != nil })
	waitTurns(t, &signals(b).beat, 2*time.Second-time.Since(lost), func() bool { return b.CheckLease() != nil })

	err := a.Release(ctx, 1)
	assert.ErrorIs(t, err, ErrLeaseLost, "peers may have recovered row 1 and handed it to someone else")
	assert.Zero(t, plain.callCount())
	assert.Equal(t, 1, a.Stats().TrackedRows, "still tracked for a peer to recover")

	require.NoError(t, b.Release(ctx, 2), "an owner guard makes it safe")
	assert.Equal(t, []int64{2}, fenced.resetOf("fenced"))
	mr.SetError("")

	require.NoError(t, a.Shutdown(ctx))
	assert.ErrorIs(t, a.Release(ctx, 1), ErrShutdown)
}

// R1 (fixed). Release racing with a Track of the same row strands the row.
//
// A worker runs several goroutines on one Worker (the README's loop, times
// N). Goroutine A abandons row 1 with Release; goroutine B fetches the
// queue and gets row 1 back, since A's reset just queued it:
//
//	A: Release(1): reset COMMITs (row 1 queued, owner NULL)
//	B: FetchBlockOfRows: row 1 inprog, owner w; Track(1)   (ids += 1; SADD 1)
//	A: Release continues: Untrack(1)                         (ids -= 1; SREM 1)
//	B: processes row 1 ...; w is SIGKILLed
//
// Row 1 is in progress and in no rows set, in memory or in Redis: no
// heartbeat writes it back and no recovery ever resets it (owner fencing
// without the backstop sweep, the default). The same happens if B's Track
// lands between Release's markReleased and its Untrack (the rotation then
// runs, and the Untrack removes the row all the same), and without owner
// fencing. Release's Untrack cannot tell the row it released from the same
// ID tracked since.
func TestSafetyReleaseRacingWithATrackOfTheSameRowLeavesItTracked(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RV1")
	h := &hookResetter{pgResetterAPI: fencedResetter(t, db)}
	w, _ := startWorker(t, rdb, h, "w", WithKeyPrefix(prefix), WithRowsSets()) // rows-set mode: the set is what is checked
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))

	h.after = func() { // right after Release's reset committed: goroutine B
		s, _ := rowState(t, db, 1)
		require.Equal(t, "queued", s, "A's Release put row 1 back in the queue")
		take(t, db, "w", 1) // B's fetch gets it again
		require.NoError(t, w.Track(ctx, 1))
	}
	require.NoError(t, w.Release(ctx, 1))

	s, o := rowState(t, db, 1)
	require.Equal(t, "inprog", s)
	require.Equal(t, "w", *o, "B holds row 1")
	assert.Equal(t, 2, w.Stats().TrackedRows, "rows 1 (B's) and 2 are tracked")
	assert.ElementsMatch(t, []string{"1", "2"}, rowsOf(t, rdb, prefix, "w"), "rows set holds B's row 1")

	w.crash()
	require.NoError(t, rdb.Del(ctx, w.ownKeys().Heartbeat).Err())
	r, _ := newWorker(t, rdb, fencedResetter(t, db), "r", WithKeyPrefix(prefix))
	_, err := r.recoverNow(ctx)
	require.NoError(t, err)
	s, _ = rowState(t, db, 2)
	require.Equal(t, "queued", s, "row 2 recovered")
	s, _ = rowState(t, db, 1)
	assert.Equal(t, "queued", s, "row 1, in progress by the dead w, must be recovered too; it is stuck")
}

func TestReleaseIsCountedAndReported(t *testing.T) {
	_, rdb := newMini(t)
	rec := &recorder{}
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w1", WithObserver(rec.Observe))
	require.NoError(t, w.Track(context.Background(), 1, 2, 3))
	require.NoError(t, w.Release(context.Background(), 1, 2))
	require.NoError(t, w.Shutdown(context.Background()))
	rel := rec.of(EventRowsReleased)
	require.Len(t, rel, 1)
	assert.Equal(t, 2, rel[0].Rows)
	assert.Equal(t, int64(2), rel[0].RowsReset)
	assert.Equal(t, uint64(2), w.Stats().RowsReleased)
	assert.Equal(t, 1, w.Stats().TrackedRows)
	assert.Contains(t, logs.String(), `"msg":"released rows"`)
}
