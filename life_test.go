package recovery

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Issue 22, second half: owner-mode workers write per-life owner values
// (owner.go). These tests run on a real redis-server and PostgreSQL.

// lifeTimings are short timings for the tests of this file: TTL 2 s, a
// heartbeat every 500 ms (an operation timeout of 250 ms), a claim TTL of
// reset timeout + 3 × operation timeout (1.25 s). The tests run in
// parallel: a lease of 1.8 s and Redis calls of 250 ms stay valid on a
// loaded machine, where 900 ms and 125 ms did not always.
func lifeTimings(prefix string) []Option {
	return []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      500 * time.Millisecond,
	})}
}

// frozenWorker starts an owner-mode worker whose Redis calls a freezer
// can stop (a paused process, a network gone).
func frozenWorker(t *testing.T, rdb *redis.Client, r Resetter, id string, opts ...Option) (*Worker, *freezer, *testutil.LogBuffer) {
	t.Helper()
	wc := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = wc.Close() })
	fr := &freezer{}
	wc.AddHook(fr)
	w, logs := startWorker(t, wc, r, id, opts...)
	require.True(t, w.Stats().OwnerMode)
	return w, fr, logs
}

// loseLease freezes w until a peer can see it dead, and thaws it.
func loseLease(t *testing.T, rdb *redis.Client, w *Worker, fr *freezer) {
	t.Helper()
	fr.freeze()
	waitHeartbeatGone(t, rdb, w.opts.keyPrefix, w.InstanceID())
	require.ErrorIs(t, w.CheckLease(), ErrLeaseLost)
}

// complete is the host's guarded completion; it reports whether it
// finished the row.
func complete(t *testing.T, db *pgxpool.Pool, owner string, id int64) bool {
	t.Helper()
	tag, err := db.Exec(context.Background(),
		`UPDATE batchrows SET status = 'done' WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`, id, owner)
	require.NoError(t, err)
	return tag.RowsAffected() == 1
}

// A lost lease begins a new life. The worker takes rows again as soon as
// a heartbeat has recorded it (no hold), and refuses a block fetched under
// the ended life: a host that read Owner before the loss and tracks after
// the regain. (Reverted, TrackAs took rows 1 and 2 under the ended life.)
func TestOwnerModeResumesInANewLifeAndRefusesABlockOfTheEndedOne(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "LF")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	before := w.OwnerValue()

	loseLease(t, rdb, w, fr)
	assert.NotEqual(t, before, w.OwnerValue(), "a new life begins at the loss")
	take(t, db, before, 1, 2) // the host's fetch, under the value it read before the loss
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	regained := time.Now()
	life, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	assert.Equal(t, lifeOwner("w", life), w.OwnerValue(), "the heartbeat recorded the new life")

	err = w.TrackAs(ctx, before, 1, 2)
	require.ErrorIs(t, err, ErrLeaseLost, "rows of the ended life")
	assert.Contains(t, err.Error(), "that life ended")
	assert.Zero(t, w.Stats().TrackedRows)

	require.NoError(t, w.CheckLease(), "no hold in owner mode with per-life values")
	take(t, db, w.OwnerValue(), 3, 4)
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 3, 4))
	assert.Less(t, time.Since(regained), w.opts.heartbeatInterval, "rows taken again within a heartbeat interval of the regain")
}

// Release resets each row under the life it was tracked in: rows tracked
// before a loss are matched by the ended life's value, rows of the new
// life by the new one. (Reverted to the current OwnerValue(): row 1 stayed in
// progress, taken for another owner's.)
func TestOwnerModeReleaseResetsEachRowUnderItsLife(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "LR")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	old := w.OwnerValue()
	take(t, db, old, 1)
	require.NoError(t, w.TrackAs(ctx, old, 1))

	loseLease(t, rdb, w, fr)
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	require.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "row 1, held at the loss, is still tracked")
	require.NoError(t, w.Release(ctx, 1))
	require.NoError(t, w.CheckLease())
	take(t, db, w.OwnerValue(), 2)
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 2))
	require.NoError(t, w.Release(ctx, 2))
	assertRequeued(t, db, 1, 2)
	assert.Zero(t, w.Stats().TrackedRows)
}

// The self-check expects the value each row was tracked under, and takes
// a host that writes the bare instance ID for a configuration that works
// (every recovery resets the bare ID) but holds its regained leases.
// (Reverted to the instance ID: ErrMisconfigured on the per-life rows.)
func TestSelfCheckAcceptsTheWorkersLivesAndNotesABareIDHost(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 2, "LS")
	ctx := context.Background()
	opts := append(lifeTimings(prefix), WithTimings(Timings{SelfCheckWindow: 100 * time.Millisecond}))
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", opts...)
	take(t, db, w.OwnerValue(), 1)
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 1))
	waitTurns(t, &signals(w).look, 5*time.Second, func() bool { return w.checker.verdict.Load() != 0 })
	assert.Equal(t, int32(1), w.checker.verdict.Load(), "verified")
	assert.True(t, w.lease.perLife.Load())
	require.NoError(t, w.Healthy())

	bare, logs := startWorker(t, rdb, fencedResetter(t, db), "b", opts...)
	take(t, db, "b", 2) // a host that writes InstanceID()
	require.NoError(t, bare.Track(ctx, 2))
	waitTurns(t, &signals(bare).look, 5*time.Second, func() bool { return bare.checker.verdict.Load() != 0 })
	assert.Equal(t, int32(1), bare.checker.verdict.Load(), "verified: the bare ID is recovered too")
	assert.False(t, bare.lease.perLife.Load(), "its regained leases are held")
	assert.Equal(t, 1, logs.Count("the host writes the bare instance ID"))
	require.NoError(t, bare.Healthy())
}

// The sweep judges an ended life of a live worker: rows in progress under
// w{old} while w's heartbeats record another life (a fetch committed
// after the loss, rows its host left) are reset after two sightings a TTL
// apart; the rows of its current life stay. (Reverted: row 1 stayed in
// progress for good.)
func TestOwnerModeSweepResetsTheRowsOfAnEndedLifeOfALiveWorker(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "LE")
	r := fencedResetter(t, db)
	// Four times the timings of a sequential run (TTL 500 ms, a heartbeat
	// every 100 ms, a sweep every 200 ms, rows TTL 4 s): live's lease must stay valid
	// beside other tests.
	opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 400 * time.Millisecond,
		RecoveryInterval:  800 * time.Millisecond,
		RowsTTL:           16 * time.Second,
	})}
	live, liveLogs := startWorker(t, rdb, r, "live", opts...)
	take(t, db, lifeOwner("live", "ended0000000000000000000000000000"), 1)
	take(t, db, live.OwnerValue(), 2)
	require.NoError(t, live.TrackAs(context.Background(), live.OwnerValue(), 2))
	other, logs := startWorker(t, rdb, r, "B", opts...)

	require.Eventually(t, func() bool { s, _ := rowState(t, db, 1); return s == "queued" }, 20*time.Second, 20*time.Millisecond,
		"the ended life's row is reset")
	s, _ := rowState(t, db, 2)
	assert.Equal(t, "inprog", s, "the current life's row stays")
	require.NoError(t, live.CheckLease())
	const msg = "reset the rows of an ended life of a live worker"
	assert.Equal(t, 1, logs.Count(msg)+liveLogs.Count(msg), "logged once, by the holder of the sweep turn")
	// The history says which rows of which worker came back.
	require.NoError(t, live.Untrack(2))
	shutdown(t, live, other) // sends the history entries queued
	var ended []string
	for _, e := range readHistory(t, rdb, prefix) {
		if e.Kind == "ended_life_rows_reset" {
			ended = append(ended, e.PeerID+" "+e.FoundBy+" "+e.RowIDs+" "+strconv.FormatInt(e.RowsReset, 10))
		}
	}
	assert.Equal(t, []string{"live sweep 1 1"}, ended)
}

// A heartbeat sent when less than an operation timeout of the lease is
// left may land on an expired key, after a recoverer read the current
// life under its claim: it records a new life instead of renewing that
// one, and the rows of the old life are handled as after a loss.
// (Reverted: the incarnation written is the old life, OwnerValue() unchanged.)
func TestOwnerModeALateHeartbeatBeginsANewLife(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 1, "LL")
	ctx := context.Background()
	w, _ := startWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	old := w.OwnerValue()
	take(t, db, old, 1)
	require.NoError(t, w.TrackAs(ctx, old, 1))

	// The last heartbeat was sent so long ago that less than an operation
	// timeout of the lease is left.
	w.lease.until.Store(int64(time.Since(w.lease.epoch) + w.opts.opTimeout/2))
	require.NoError(t, w.heart.runOnce(ctx))
	w.heart.restored()
	assert.NotEqual(t, old, w.OwnerValue())
	life, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	assert.Equal(t, lifeOwner("w", life), w.OwnerValue(), "the late heartbeat recorded the new life")
	require.ErrorIs(t, w.CheckLease(), ErrLeaseLost, "row 1, of the old life, is stale")
	require.ErrorIs(t, w.TrackAs(ctx, old, 1), ErrLeaseLost)
	require.NoError(t, w.Release(ctx, 1))
	require.NoError(t, w.CheckLease())
	assertRequeued(t, db, 1)
}

// gatedOwnerResetter is a pgxreset.Resetter whose first reset by owner waits
// until open is closed, then runs with a context of its own: a recoverer
// whose reset statements reach PostgreSQL after its context should have
// ended them (a process stopped in the driver, a COMMIT in flight).
type gatedOwnerResetter struct {
	*pgxreset.Resetter
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func newGatedOwnerResetter(r *pgxreset.Resetter) *gatedOwnerResetter {
	return &gatedOwnerResetter{Resetter: r, entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gatedOwnerResetter) ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.open
	}
	return g.Resetter.ResetOwner(context.Background(), req)
}

// recoverBlocked has p recover w in the background; it returns once p's
// reset by owner has begun (and waits at the gate) and a channel closed
// when the recovery returns.
func recoverBlocked(t *testing.T, p *Worker, g *gatedOwnerResetter) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = p.recoverNow(context.Background())
	}()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery never reached its reset")
	}
	return done
}

// Residual 1 of docs/safety.md §12: a reset whose statements reach
// PostgreSQL more than a claim TTL after its claim. p claims w while w is
// away and reads w's life; its reset is stopped before it runs. w comes
// back, and takes rows 3 and 4 once CheckLease lets it (with the bare ID,
// after the hold, a claim TTL). Then p's reset runs: it resets the dead
// life's rows 1 and 2, never rows 3 and 4. (Reverted, OwnerValue() the bare ID:
// rows 3 and 4 reset under live w.)
func TestResidualALateResetReachesOnlyTheDeadLife(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "R1")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	take(t, db, w.OwnerValue(), 1, 2)
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 1, 2))
	g := newGatedOwnerResetter(fencedResetter(t, db))
	p, _ := newWorker(t, rdb, g, "p", lifeTimings(prefix)...)

	loseLease(t, rdb, w, fr)
	done := recoverBlocked(t, p, g)
	fr.thaw()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	require.NoError(t, w.Release(ctx, 1, 2), "the host gives back its block")
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil })
	owner := w.OwnerValue()
	take(t, db, owner, 3, 4)
	require.NoError(t, w.TrackAs(ctx, owner, 3, 4))
	// Nothing marks the end of p's claim TTL: w's first heartbeat deleted
	// the claim key (a heartbeat cancels a claim on its instance), and the
	// claim's context is p's recovery's own (its reset's, which the gate
	// sees, ends at the shorter reset timeout).
	time.Sleep(w.opts.claimTTL()) // real time: past p's claim TTL

	close(g.open)
	<-done
	for _, id := range []int64{3, 4} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "row %d of w's new life", id)
		require.NotNil(t, o)
		assert.Equal(t, owner, *o)
		assert.True(t, complete(t, db, owner, id), "w completes row %d", id)
	}
}

// Residual 3 of docs/safety.md §12: a worker paused past its TTL resumes
// while a recoverer's reset still runs, and takes rows at once (there is
// no hold in owner mode any more); the reset, which goes on after, reaches
// only the dead life. (Reverted, OwnerValue() the bare ID with no hold: rows 3
// and 4 reset under live w.)
func TestResidualAResetStillRunningWhenAPausedWorkerResumes(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 4, "R3")
	ctx := context.Background()
	w, fr, logs := frozenWorker(t, rdb, fencedResetter(t, db), "w", lifeTimings(prefix)...)
	old := w.OwnerValue()
	take(t, db, old, 1, 2)
	require.NoError(t, w.TrackAs(ctx, old, 1, 2))
	g := newGatedOwnerResetter(fencedResetter(t, db))
	p, _ := newWorker(t, rdb, g, "p", lifeTimings(prefix)...)

	loseLease(t, rdb, w, fr) // paused past its TTL
	done := recoverBlocked(t, p, g)
	fr.thaw() // resumed while p's reset runs
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return logs.Count("heartbeat lease regained") == 1 })
	require.NoError(t, w.Untrack(1, 2), "the host drops the block of its ended life (p resets it)")
	require.NoError(t, w.CheckLease(), "no hold")
	owner := w.OwnerValue()
	take(t, db, owner, 3, 4)
	require.NoError(t, w.TrackAs(ctx, owner, 3, 4))

	close(g.open)
	<-done
	assertRequeued(t, db, 1, 2)
	assert.False(t, complete(t, db, old, 1), "the ended life's completion guard finds nothing")
	for _, id := range []int64{3, 4} {
		assert.True(t, complete(t, db, owner, id), "w completes row %d of its new life", id)
	}
}

// Residual 2 of docs/safety.md §12 (§10): one instance ID taking a row
// twice. Process A of ID w takes row 1 and is paused in the middle of it.
// Process B of the same ID starts, waits A's heartbeat out, recovers A's
// rows as its predecessor's and takes row 1 again, under its own life.
// A resumes and completes row 1: its guard names A's life, and finds
// nothing. (Reverted, both write the bare ID: A's completion matched B's
// row, processed twice.)
func TestResidualAPausedProcessThroughARestartOfItsIDCannotCompleteTheRowAgain(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 1, "R2")
	ctx := context.Background()
	r := fencedResetter(t, db)
	a, fr, _ := frozenWorker(t, rdb, r, "w", lifeTimings(prefix)...)
	ownerA := a.OwnerValue()
	take(t, db, ownerA, 1)
	require.NoError(t, a.TrackAs(ctx, ownerA, 1))

	fr.freeze() // A paused mid-row
	b, _ := startWorker(t, rdb, r, "w", lifeTimings(prefix)...)
	assertRequeued(t, db, 1)
	ownerB := b.OwnerValue()
	assert.NotEqual(t, ownerA, ownerB)
	take(t, db, ownerB, 1)
	require.NoError(t, b.TrackAs(ctx, ownerB, 1))

	fr.thaw() // A resumes and finishes its row
	assert.False(t, complete(t, db, ownerA, 1), "A's completion finds no row of its life")
	assert.True(t, complete(t, db, ownerB, 1), "B's does")
	waitTurns(t, &signals(a).beat, 5*time.Second, func() bool { return a.CheckLease() != nil })
}

// prevReleaseRecover is one recovery of peer by an owner-mode worker of the
// release before this one (the reading side of issue 22, bare IDs written),
// as its deadpeer.go sent it: claim, read the incarnation, claim again
// (the life read is the dead one only if the claim still holds), reset by
// owner the bare ID and the life read, finish, deregister. It reports
// whether it claimed.
func prevReleaseRecover(t *testing.T, via *Worker, r Resetter, peer string) bool {
	t.Helper()
	ctx := context.Background()
	s, token := via.store, "prev-release"
	c, err := s.ClaimDead(ctx, peer, token, via.opts.claimTTL(), via.fleet.rowsTTL())
	require.NoError(t, err)
	if !c.Taken() {
		return false
	}
	life, _, err := s.ReadRows(ctx, peer)
	require.NoError(t, err)
	c, err = s.ClaimDead(ctx, peer, token, via.opts.claimTTL(), via.fleet.rowsTTL())
	require.NoError(t, err)
	if !c.Taken() {
		return false
	}
	values := []string{peer}
	if life != "" {
		values = append(values, lifeOwner(peer, life))
	}
	for _, v := range values {
		_, err := r.ResetOwner(ctx, OwnerReset{Owner: v})
		require.NoError(t, err)
	}
	_, err = s.FinishRecovery(ctx, peer, token, via.opts.tombstoneTTL())
	require.NoError(t, err)
	require.NoError(t, s.Deregister(ctx, peer))
	return true
}

// A rolling upgrade from the release that reads per-life values and writes
// bare IDs to this one, which writes them: workers of both recover each
// other, and neither resets a live member's rows. The previous release's
// worker is played by a Worker whose host writes InstanceID() (what
// OwnerValue() returned there) and, for its recoveries, by the previous
// release's recovery steps (prevReleaseRecover).
func TestRollingUpgradePerLifeAndBareIDWorkersRecoverEachOther(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 8, "UL")
	ctx := context.Background()
	r := fencedResetter(t, db)
	// Four times the timings of a sequential run (TTL 500 ms, a heartbeat
	// every 100 ms, a sweep every 200 ms, rows TTL 4 s): the live workers' leases must
	// stay valid beside other tests.
	opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2 * time.Second,
		HeartbeatInterval: 400 * time.Millisecond,
		RecoveryInterval:  800 * time.Millisecond,
		RowsTTL:           16 * time.Second,
	})}

	oldLive, _ := startWorker(t, rdb, r, "old-live", opts...)
	take(t, db, "old-live", 1)
	require.NoError(t, oldLive.TrackAs(ctx, "old-live", 1))
	newLive, _ := startWorker(t, rdb, r, "new-live", opts...)
	take(t, db, newLive.OwnerValue(), 2)
	require.NoError(t, newLive.TrackAs(ctx, newLive.OwnerValue(), 2))

	// A new worker dies holding rows of its life; an old one recovers it.
	newDead, _ := startWorker(t, rdb, r, "new-dead", opts...)
	take(t, db, newDead.OwnerValue(), 3, 4)
	require.NoError(t, newDead.TrackAs(ctx, newDead.OwnerValue(), 3, 4))
	newDead.crash()
	waitHeartbeatGone(t, rdb, prefix, "new-dead")
	require.True(t, prevReleaseRecover(t, oldLive, r, "new-dead"))
	assertRequeued(t, db, 3, 4)

	// An old worker dies holding rows under its bare ID; a new one
	// recovers it.
	oldDead, _ := startWorker(t, rdb, r, "old-dead", opts...)
	take(t, db, "old-dead", 5, 6)
	require.NoError(t, oldDead.TrackAs(ctx, "old-dead", 5, 6))
	oldDead.crash()
	waitHeartbeatGone(t, rdb, prefix, "old-dead")
	rep, err := newLive.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assertRequeued(t, db, 5, 6)

	// An old recoverer finds the live new worker alive; the sweeps (every
	// member runs one, the new workers' judging ended lives too) leave
	// both live workers' rows alone for several TTLs (six). Both sweep
	// every 800 ms, whichever holds the turn: each must have taken at
	// least half of its some fifteen turns across the window.
	assert.False(t, prevReleaseRecover(t, oldLive, r, "new-live"))
	window := 6 * oldLive.opts.heartbeatTTL
	want := int(window/oldLive.opts.recoveryInterval) / 2
	signals(oldLive).sweep.Clear()
	newSweeps := signals(newLive).sweep.Span(t, window)
	require.GreaterOrEqual(t, len(newSweeps), want, "new-live swept throughout the window")
	require.GreaterOrEqual(t, signals(oldLive).sweep.Clear(), want, "old-live swept throughout the window")
	for _, id := range []int64{1, 2} {
		s, _ := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "row %d of a live worker", id)
	}
	require.NoError(t, oldLive.CheckLease())
	require.NoError(t, newLive.CheckLease())
}

// midLossStore notes a lost lease while one armed heartbeat is in flight
// (the self-check or a resumed process noting it concurrently): that
// heartbeat writes the life it was sent with, not the one just begun.
type midLossStore struct {
	store.Store
	w     *Worker
	armed atomic.Bool
	done  chan struct{}
}

func (s *midLossStore) Beat(ctx context.Context, id string, b store.Heartbeat) (store.BeatResult, error) {
	if s.armed.Swap(false) {
		defer close(s.done)
		s.w.lease.markLeaseLost(nil)
	}
	return s.Store.Beat(ctx, id, b)
}

// A life begun while a heartbeat was in flight is recorded by the next
// heartbeat at once, not an interval later; until then CheckLease reports
// ErrLeaseLost, as TrackAs would refuse. (Reverted: CheckLease nil while
// TrackAs refused, for a whole interval.)
func TestOwnerModeALifeBegunDuringAHeartbeatIsRecordedAtOnce(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 1, "LM")
	ctx := context.Background()
	// A heartbeat every 4 s, and the bound half of it: twice the timings
	// of a sequential run (2 s and 1 s), for a run beside other tests.
	mid := &midLossStore{done: make(chan struct{})}
	w, _ := newWorker(t, rdb, fencedResetter(t, db), "w", withStore(func(s store.Store) store.Store { mid.Store = s; return mid }),
		WithKeyPrefix(prefix), WithTimings(Timings{
			HeartbeatTTL:      12 * time.Second,
			HeartbeatInterval: 4 * time.Second,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
		}))
	mid.w = w
	require.NoError(t, w.Start(ctx))
	mid.armed.Store(true)
	<-mid.done
	waitTurns(t, &signals(w).beat, w.opts.heartbeatInterval/2, func() bool { return w.CheckLease() == nil },
		"the new life is recorded well within the heartbeat interval")
	life, err := rdb.Get(ctx, store.InstanceKeys(prefix, "w").Incarnation).Result()
	require.NoError(t, err)
	assert.Equal(t, lifeOwner("w", life), w.OwnerValue())
	require.NoError(t, w.TrackAs(ctx, w.OwnerValue(), 1), "CheckLease nil: TrackAs works too")
}

// A recovery by owner whose peer's life Redis no longer has (its
// incarnation key evicted, as by a managed Redis's volatile-lru) lists the
// peer's lives in progress in the table under its claim and resets them,
// at the scan's pace: before, it reset the bare ID only and left the
// per-life rows to the sweep (fault scenario E1: 9.1 s against a bound of
// 8.3 s; mutantNoLifeListing).
func TestOwnerModeRecoveryListsThePeersLivesWhenRedisLostItsLife(t *testing.T) {
	t.Parallel()
	rdb, db, prefix := onRealServers(t, 3, "LL")
	ctx := context.Background()
	r := fencedResetter(t, db)
	dead, _ := startWorker(t, rdb, r, "dead", lifeTimings(prefix)...)
	owner := dead.OwnerValue()
	take(t, db, owner, 1, 2)
	require.NoError(t, dead.TrackAs(ctx, owner, 1, 2))
	take(t, db, "other{0123456789abcdef0123456789abcdef}", 3) // another instance's life: not dead's
	dead.crash()
	require.NoError(t, rdb.Del(ctx, store.InstanceKeys(prefix, "dead").Incarnation).Err())
	waitHeartbeatGone(t, rdb, prefix, "dead")

	p, _ := newWorker(t, rdb, r, "p", append(lifeTimings(prefix), WithBackstopSweep(false))...)
	rep, err := p.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(2), rep.Recovered[0].RowsReset)
	assertRequeued(t, db, 1, 2)
	s, _ := rowState(t, db, 3)
	assert.Equal(t, "inprog", s, "another instance's row is left alone")
}
