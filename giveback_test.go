package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// A host that abandons its block on a lost lease and never calls Release
// (the forgetful host of issue 32's report) does not leave its worker idle:
// in owner mode the worker gives the ended life's rows back itself half a
// heartbeat interval after the regain, takes rows again within one
// interval, and a late completion under the ended life is refused.
// (Reverted, the heartbeat not waking the give-back: the lease stayed lost
// and Track refused for good.)
func TestOwnerModeWorkerGivesBackTheRowsItsHostLeftAtALostLease(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "GBO")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	old := w.OwnerValue()
	take(t, db, old, 1, 2)
	require.NoError(t, w.TrackAs(ctx, old, 1, 2))

	loseLease(t, rdb, w, fr) // the host abandons the block here, without Release
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	regained := time.Now()
	waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"the rows of the ended life given back by the worker")
	assert.Less(t, time.Since(regained), w.opts.heartbeatInterval, "rows taken again within a heartbeat interval of the regain")
	assertRequeued(t, db, 1, 2)
	assert.False(t, complete(t, db, old, 1), "a late completion under the ended life is refused")
	assert.Equal(t, 1, logs.Count("the host did not release them"))

	take(t, db, w.OwnerValue(), 3)
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 3))
	assert.Equal(t, 1, w.Stats().TrackedRows)
}

// In rows-set mode (the reset ledger, no owner column) the worker gives the
// rows held at the loss back itself once the host has moved on (a Track of
// new rows) and the hold after the regain has ended; until then Track's
// error names the rows and the call that gives them back. (Reverted, the
// heartbeat not waking the give-back: the lease stayed lost and Track
// refused for good.)
func TestRowsSetWorkerGivesBackTheRowsItsHostLeftWhenTheHoldEnds(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "GBR")
	ctx := context.Background()
	w, fr, logs := rowsSetWorker(t, rdb, db, prefix)
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	var err error

	regained := loseRowsSetLease(t, rdb, prefix, w, fr, logs)
	err = w.Track(ctx, 3)
	require.ErrorIs(t, err, ErrLeaseLost, "held after the regain")
	assert.Contains(t, err.Error(), "rows 1, 2")
	assert.Contains(t, err.Error(), "Release them")
	assert.Contains(t, err.Error(), "(rows-set mode: after your next Track or Begin)", "not by itself: the host may still be in its old block")

	waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"the rows held at the loss given back by the worker")
	assert.GreaterOrEqual(t, time.Since(regained), w.fleet.claimTTL()-w.opts.heartbeatInterval, "not before the hold ends")
	assert.Less(t, time.Since(regained), w.fleet.claimTTL()+w.opts.heartbeatInterval, "when the hold ends")
	for _, id := range []int64{1, 2} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "queued", s, "row %d", id)
	}
	take(t, db, "w", 3)
	require.NoError(t, w.Track(ctx, 3))
	assert.Equal(t, 1, w.Stats().TrackedRows)
}

// rowsSetWorker starts a rows-set worker "w" without an owner column (the
// reset ledger) whose Redis calls a freezer can stop.
func rowsSetWorker(t *testing.T, rdb *redis.Client, db *pgxpool.Pool, prefix string) (*Worker, *freezer, *testutil.LogBuffer) {
	t.Helper()
	r, err := pgxreset.New(db)
	require.NoError(t, err)
	wc := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = wc.Close() })
	fr := &freezer{}
	wc.AddHook(fr)
	w, logs := startWorker(t, wc, r, "w", lifeTimings(prefix)...)
	require.False(t, w.Stats().OwnerMode)
	return w, fr, logs
}

// loseRowsSetLease freezes w until its heartbeat is gone, thaws it and
// returns when the regain was seen.
func loseRowsSetLease(t *testing.T, rdb *redis.Client, prefix string, w *Worker, fr *freezer, logs *testutil.LogBuffer) time.Time {
	t.Helper()
	fr.freeze()
	waitHeartbeatGone(t, rdb, prefix, "w")
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	return time.Now()
}

// In rows-set mode a host still in its old block (one long row past the
// hold, no Track since) keeps its rows and the lease stays lost: given back,
// the host's next CheckLease would say nil and it would go on with a row
// no longer its own (the simulator, seed 721). Its next Track says it moved
// on, and the worker gives them back. (Reverted to a give-back at the end
// of the hold alone: the lease was valid again without any Track.)
func TestRowsSetWorkerKeepsTheRowsOfAHostStillInItsOldBlock(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "GBS")
	ctx := context.Background()
	w, fr, logs := rowsSetWorker(t, rdb, db, prefix)
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	regained := loseRowsSetLease(t, rdb, prefix, w, fr, logs)

	past := w.fleet.claimTTL() + 2*w.opts.heartbeatInterval
	waitTurns(t, &signals(w).beat, 2*past, func() bool { return time.Since(regained) > past }, // poll: the clock ends the hold
		"the hold over, and two heartbeats more")
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "the host may still be in rows 1 and 2")
	assert.Zero(t, logs.Count("the host did not release them"))

	require.ErrorIs(t, w.Track(ctx, 3), ErrLeaseLost) // a new fetch: the host moved on
	waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"given back once the host fetched again")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "queued", s)
}

// The give-back loop runs only where a lost lease is sticky (here owner
// fencing), and Shutdown stops it with the others.
func TestShutdownStopsTheGiveBackLoop(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{fenced: true}, "w1", WithTimings(Timings{RecoveryInterval: 50 * time.Millisecond}))
	waitTurns(t, &signals(w).scan, 5*time.Second, func() bool { return w.Stats().Scans >= 3 },
		"the loops are running: the recovery loop has scanned a few times")
	require.Equal(t, 4, workerGoroutines(), "two loops, the give-back and their waiter")
	require.NoError(t, w.Shutdown(context.Background()))
	assert.Zero(t, workerGoroutines(), "no goroutine outlives Shutdown")
}

// In rows-set mode a Block begun before a loss keeps its rows while it is
// open, whatever other goroutines do: goroutine A is inside a long row of
// its block while goroutine B retries Begin after the regain, as the docs
// say. Given back at the end of the hold, row 2 would go back to the queue
// under A, and A's status-guarded completion would commit after another
// worker fetched it: done twice. A's Close gives the rest back, and the
// lease is valid again. (Reverted, one movedOn for the whole process: rows
// 1 and 2 were given back at the end of the hold, under A.)
func TestRowsSetWorkerKeepsTheRowsOfAnOpenBlockBegunBeforeTheLoss(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "GBB")
	ctx := context.Background()
	w, fr, logs := rowsSetWorker(t, rdb, db, prefix)
	a, err := w.Begin()
	require.NoError(t, err)
	take(t, db, "w", 1, 2)
	require.NoError(t, a.Track(ctx, 1, 2)) // A goes on with row 1, a long row
	regained := loseRowsSetLease(t, rdb, prefix, w, fr, logs)

	begun := make(chan error)
	go func() { // goroutine B retries Begin, each try refused
		_, err := w.Begin()
		begun <- err
	}()
	require.ErrorIs(t, <-begun, ErrLeaseLost)
	past := w.fleet.claimTTL() + 2*w.opts.heartbeatInterval
	waitTurns(t, &signals(w).beat, 2*past, func() bool { return time.Since(regained) > past }, // poll: the clock ends the hold
		"the hold over, and two heartbeats more")
	go func() {
		_, err := w.Begin()
		begun <- err
	}()
	assert.ErrorIs(t, <-begun, ErrLeaseLost, "B still refused: A's rows are not given back")
	waitBeat(t, w)
	assert.Zero(t, logs.Count("the host did not release them"), "nothing given back while A's block is open")
	for _, id := range []int64{1, 2} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "row %d, A's, is not given back under it", id)
	}

	assert.ErrorIs(t, a.Check(), ErrLeaseLost, "A stops after row 1")
	assert.True(t, complete(t, db, "w", 1), "A's completion of row 1")
	require.NoError(t, a.Done(1))
	require.NoError(t, a.Close()) // gives row 2 back
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"the lease valid again once A's block is closed")
	s, _ := rowState(t, db, 2)
	assert.Equal(t, "queued", s)
	b, err := w.Begin()
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

// Each loss waits for the host to move on from its own rows: a host that
// moved on after a first loss (a Track refused) has not moved on from a
// second one before the give-back. (Reverted, movedOn cleared only after a
// heartbeat with nothing held: the rows were given back at the end of the
// second hold without any Track since.)
func TestRowsSetWorkerWaitsForTheHostAgainAfterASecondLoss(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "GBL")
	ctx := context.Background()
	w, fr, logs := rowsSetWorker(t, rdb, db, prefix)
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	loseRowsSetLease(t, rdb, prefix, w, fr, logs)
	require.ErrorIs(t, w.Track(ctx, 3), ErrLeaseLost) // the host moved on from the first loss

	w.lease.markLeaseLost(nil) // a second loss before the give-back (a heartbeat sent too late), within the first hold
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 2 })
	regained := time.Now()
	require.EqualValues(t, 2, w.Stats().LeaseLosses)

	past := w.fleet.claimTTL() + 2*w.opts.heartbeatInterval
	waitTurns(t, &signals(w).beat, 2*past, func() bool { return time.Since(regained) > past }, // poll: the clock ends the hold
		"the second hold over, and two heartbeats more")
	assert.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "the host may still be in rows 1 and 2")
	assert.Zero(t, logs.Count("the host did not release them"))

	require.ErrorIs(t, w.Track(ctx, 3), ErrLeaseLost) // the host moves on again
	waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.CheckLease() == nil },
		"given back once the host fetched again")
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "queued", s)
}

// A Block.Close whose reset fails once (a database blip) leaves its rows
// tracked and in progress; the worker gives them back itself, a heartbeat
// interval later, in both modes: owner mode (by owner value) and rows-set
// mode with the reset ledger. Healthy says nothing of a failed Close, and
// the quickstart ignores its error: without the retry the rows stayed in
// progress until the process exited. (Reverted, no retry: rows 2 and 3
// stayed in progress.)
func TestAFailedBlockCloseIsTriedAgainByTheWorker(t *testing.T) {
	for _, mode := range []struct {
		name  string
		owner bool
	}{{"owner mode", true}, {"rows sets with the ledger", false}} {
		t.Run(mode.name, func(t *testing.T) {
			rdb, db, prefix := onRealServers(t, 3, "GBC")
			ctx := context.Background()
			var inner pgResetterAPI = fencedResetter(t, db)
			if !mode.owner {
				plain, err := pgxreset.New(db) // no owner column: rows sets, the reset ledger
				require.NoError(t, err)
				inner = plain
			}
			r := &scriptedResetter{pgResetterAPI: inner}
			r.script = func(n int32, reset func() (ResetResult, error)) (ResetResult, error) {
				if n == 1 {
					return ResetResult{}, errScriptedReset // Close's reset
				}
				return reset()
			}
			w, logs := startWorker(t, rdb, r, "w", WithKeyPrefix(prefix))
			require.Equal(t, mode.owner, w.Stats().OwnerMode)

			b, err := w.Begin()
			require.NoError(t, err)
			take(t, db, b.OwnerValue(), 1, 2, 3)
			require.NoError(t, b.Track(ctx, 1, 2, 3))
			require.True(t, complete(t, db, b.OwnerValue(), 1))
			require.NoError(t, b.Done(1))
			require.ErrorIs(t, b.Close(), errScriptedReset)
			closed := time.Now()
			assert.Equal(t, map[int64]string{1: "done", 2: "inprog", 3: "inprog"}, statuses(t, db))

			waitTurns(t, &signals(w).gave, 5*time.Second, func() bool { return w.Stats().TrackedRows == 0 },
				"the rows of the failed Close given back by the worker")
			assert.Less(t, time.Since(closed), 2*w.opts.heartbeatInterval, "tried again within a heartbeat interval")
			assert.Equal(t, map[int64]string{1: "done", 2: "queued", 3: "queued"}, statuses(t, db))
			assert.EqualValues(t, 2, r.calls.Load(), "one try more, then nothing left to give back")
			assert.Equal(t, 1, logs.Count("released rows"))
			require.NoError(t, w.Healthy())
		})
	}
}
