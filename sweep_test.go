package recovery

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

func TestSafetyBackstopSweepRecoversRowsAfterADayLongOutage(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	waitUptime(t, rdb, 2*time.Second) // up for the 500ms TTL, counted in whole seconds less one
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix := testutil.Name("S")
	ctx := context.Background()
	// Yesterday's fleet died; Redis has nothing about it any more.
	take(t, db, "gone-1", 1, 2)
	take(t, db, "gone-2", 3)
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = NULL WHERE rowid = 4`)
	require.NoError(t, err)
	r := fencedResetter(t, db)
	// Rows-set mode: in owner mode the live worker would sweep too.
	opts := []Option{WithKeyPrefix(prefix), WithRowsSets(),
		WithTimings(Timings{
			HeartbeatTTL:      500 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
		})}
	live, _ := startWorker(t, rdb, r, "live", opts...) // no sweep of its own
	opts = append(opts, WithBackstopSweep(true))
	take(t, db, "live", 5)
	require.NoError(t, live.Track(ctx, 5))
	// Sweeps are driven by hand here; the loop's part is tested below.
	w, _ := newWorker(t, rdb, r, "newcomer", opts...)
	other, _ := newWorker(t, rdb, r, "other", opts...)

	firstSweep := time.Now()
	rep, err := w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.turnHeld)
	assert.Equal(t, 3, rep.owners, "gone-1, gone-2, live")
	assert.ElementsMatch(t, []string{"gone-1", "gone-2"}, rep.absent, "first sighting: not yet reset")
	assert.Empty(t, rep.recovered)
	orep, err := other.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.False(t, orep.turnHeld, "one sweeper at a time")

	rep, err = w.sweeper.runOnce(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.recovered, "absent for less than a heartbeat TTL")

	var sweepErr error
	require.Eventually(t, func() bool {
		rep, sweepErr = w.sweeper.runOnce(ctx)
		return sweepErr != nil || len(rep.recovered) > 0
	}, 5*time.Second, 50*time.Millisecond, "reset once absent for a heartbeat TTL")
	require.NoError(t, sweepErr)
	assert.GreaterOrEqual(t, time.Since(firstSweep), 500*time.Millisecond, "and not before")
	require.Len(t, rep.recovered, 2)
	assert.Equal(t, uint64(3), w.Stats().RowsRecovered, "the sweep's rows are counted")
	assert.Equal(t, uint64(2), w.Stats().PeersRecovered)
	assertRequeued(t, db, 1, 2, 3)
	s, o := rowState(t, db, 5)
	assert.Equal(t, "inprog", s, "a live owner's row is never swept")
	assert.Equal(t, "live", *o)
	s, _ = rowState(t, db, 4)
	assert.Equal(t, "inprog", s, "rows without an owner are not the sweep's")
}

func TestSafetyBackstopSweepRunsFromTheRecoveryLoop(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	take(t, db, "gone", 1, 2)
	w, logs := startWorker(t, rdb, fencedResetter(t, db), "sweeper", WithKeyPrefix(testutil.Name("S")), WithBackstopSweep(true),
		WithTimings(Timings{
			HeartbeatTTL:      300 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  100 * time.Millisecond,
			RowsTTL:           time.Second,
		}))
	// The recovery is logged after its reset committed: wait for the log.
	waitTurns(t, &signals(w).sweep, 5*time.Second, func() bool { return strings.Contains(logs.String(), `"found_by":"sweep"`) })
	s, _ := rowState(t, db, 2)
	assert.Equal(t, "queued", s)
}

func TestSafetyBackstopSweepNeedsASweeper(t *testing.T) {
	db := testutil.Postgres(t)
	plain, err := pgxreset.New(db)
	require.NoError(t, err)
	w, err := New(idleClient(t), plain)
	require.NoError(t, err)
	require.NotNil(t, w.sweeper, "on by default without an owner column")
	assert.True(t, w.sweeper.byVersion())
	assert.False(t, w.sweeper.byOwner())
	_, err = New(idleClient(t), &fakeResetter{}, WithBackstopSweep(true))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "needs a resetter that lists rows in progress (Info().ListsInProgress); *recovery.fakeResetter does not")
	w, err = New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	assert.Nil(t, w.sweeper, "a resetter that cannot sweep: no sweep")
}

// stallingSweeper is a pgxreset.Resetter whose listing of owners in progress
// waits for its context to end: a sweep caught by Shutdown in the middle
// of its database read.
type stallingSweeper struct {
	*pgxreset.Resetter
	entered chan struct{}
	once    sync.Once
}

func (s *stallingSweeper) InProgressOwners(ctx context.Context) ([]string, error) {
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// A sweep that Shutdown interrupts did not fail: a correct setup's
// metrics show no error and no failed recovery for it (prom's scrape test
// once read recovery_errors_total 1 after a clean shutdown).
func TestSweepInterruptedByShutdownIsNoFailure(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	r := &stallingSweeper{Resetter: fencedResetter(t, db), entered: make(chan struct{})}
	var failed atomic.Int32
	w, logs := newWorker(t, rdb, r, "sweeper", WithKeyPrefix(testutil.Name("SI")), WithBackstopSweep(true),
		WithTimings(Timings{
			HeartbeatTTL:      300 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  100 * time.Millisecond,
			RowsTTL:           time.Second,
		}),
		WithObserver(func(e Event) {
			if e.Kind == EventRecoveryFailed {
				failed.Add(1)
			}
		}))
	require.NoError(t, w.Start(context.Background()))
	select {
	case <-r.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the sweep never read the owners in progress")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, w.Shutdown(ctx))
	assert.Zero(t, w.Stats().Errors, "a sweep cut short by Shutdown is no failure")
	assert.Zero(t, failed.Load(), "nor a failed recovery event")
	assert.NotContains(t, logs.String(), `"level":"ERROR"`)
}
