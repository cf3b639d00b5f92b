package recovery

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/postgres/pgxreset"
)

// scriptedResetter is a ledger resetter whose resets by row ID run
// script with the call's number (1, 2, ...) and the inner reset.
type scriptedResetter struct {
	pgResetterAPI
	calls  atomic.Int32
	script func(n int32, inner func() (ResetResult, error)) (ResetResult, error)
}

func (s *scriptedResetter) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	if len(req.RowIDs) == 0 {
		return s.pgResetterAPI.ResetRows(ctx, req)
	}
	return s.script(s.calls.Add(1), func() (ResetResult, error) { return s.pgResetterAPI.ResetRows(ctx, req) })
}

var errScriptedReset = errors.New("scripted reset failure")

// retakeCrashRecover has the host take row 1 again and track it under w,
// kills w and recovers it: row 1 must be queued again.
func retakeCrashRecover(t *testing.T, ctx context.Context, w *Worker, rdb *redis.Client, db *pgxpool.Pool, plain Resetter, prefix string) {
	t.Helper()
	s, _ := rowState(t, db, 1)
	require.Equal(t, "queued", s, "the release that committed put row 1 back")
	take(t, db, "w", 1)
	require.NoError(t, w.Track(ctx, 1))
	w.crash()
	require.NoError(t, rdb.Del(ctx, w.ownKeys().Heartbeat).Err())
	r, _ := newWorker(t, rdb, plain, "r", WithKeyPrefix(prefix))
	_, err := r.recoverNow(ctx)
	require.NoError(t, err)
	s, _ = rowState(t, db, 1)
	assert.Equal(t, "queued", s, "row 1, taken again by the dead w, is recovered: the ledger entry of the release must not hide it")
}

// Two releases of the same rows under the reset ledger (the give-back and
// Block.Close do this), one failing: the failing one must not drop the
// marks of the one that committed, or row 1, taken again under the same
// incarnation, is dropped by recovery (the ledger says it was reset).
func TestSafetyAFailingReleaseKeepsTheMarksOfAConcurrentOneThatCommitted(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RM1")
	plain, err := pgxreset.New(db) // the ledger, no owner column
	require.NoError(t, err)
	require.True(t, plain.Info().Ledger)

	failing := make(chan struct{}) // the failing release is inside its reset
	letFail := make(chan struct{})
	var once sync.Once
	var failErr error
	failFinished := make(chan struct{}) // the failing release returned
	h := &scriptedResetter{pgResetterAPI: plain}
	h.script = func(n int32, inner func() (ResetResult, error)) (ResetResult, error) {
		if n == 1 { // the failing release
			close(failing)
			<-letFail
			return ResetResult{}, errScriptedReset
		}
		// The release that commits. Without one release at a time it got
		// here while the failing one was inside its reset: let that fail
		// now, between this commit and the untrack.
		res, err := inner()
		once.Do(func() { close(letFail) })
		<-failFinished
		return res, err
	}
	w, _ := startWorker(t, rdb, h, "w", WithKeyPrefix(prefix))
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))

	go func() { failErr = w.Release(ctx, 1, 2); close(failFinished) }()
	<-failing
	okDone := make(chan error, 1)
	go func() { okDone <- w.Release(ctx, 1, 2) }()
	select {
	case err := <-okDone:
		okDone <- err
	case <-time.After(200 * time.Millisecond): // real time: the second release waits on the worker's release lock, which nothing signals
	}
	once.Do(func() { close(letFail) })
	<-failFinished
	require.ErrorIs(t, failErr, errScriptedReset)
	require.NoError(t, <-okDone)

	retakeCrashRecover(t, ctx, w, rdb, db, plain, prefix)
}

// The same, one after the other: a release that fails after one of the
// same rows committed (the incarnation not rotated yet) leaves its marks.
func TestSafetyAFailingReleaseAfterOneThatCommittedKeepsItsMarks(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "RM2")
	plain, err := pgxreset.New(db)
	require.NoError(t, err)
	h := &scriptedResetter{pgResetterAPI: plain}
	h.script = func(n int32, inner func() (ResetResult, error)) (ResetResult, error) {
		if n == 2 {
			return ResetResult{}, errScriptedReset
		}
		return inner()
	}
	w, _ := startWorker(t, rdb, h, "w", WithKeyPrefix(prefix))
	take(t, db, "w", 1, 2)
	require.NoError(t, w.Track(ctx, 1, 2))
	require.NoError(t, w.Release(ctx, 1, 2))                   // the give-back
	require.ErrorIs(t, w.Release(ctx, 1, 2), errScriptedReset) // Block.Close, failing

	retakeCrashRecover(t, ctx, w, rdb, db, plain, prefix)
}
