package recovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Start's probe of the resetter (RowStates of no row) is the one place the
// self-check is switched off.

// flakyRowStates is a host's decorator (docs/migrating.md §2c) over a
// bundled resetter whose first read of rows fails once with a transient
// network error, as a connection reset would: the error chain holds a
// syscall.Errno that errors.Is matches against errors.ErrUnsupported
// (EOPNOTSUPP, ENOTSUP, ENOSYS do). Every later read goes through.
type flakyRowStates struct {
	Resetter
	failed atomic.Bool
}

func (f *flakyRowStates) RowStates(ctx context.Context, ids []int64) ([]RowState, error) {
	if len(ids) > 0 && f.failed.CompareAndSwap(false, true) {
		op := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.EOPNOTSUPP)}
		return nil, fmt.Errorf("read row versions: %w", op)
	}
	return f.Resetter.RowStates(ctx, ids)
}

// TestSelfCheckSurvivesATransientReadError: the self-check is turned
// off only by a resetter that cannot read rows, which Start learns from
// RowStates of no row (resetter.go). A resetter that answered that probe,
// and whose one later read failed with an error that happens to match
// errors.ErrUnsupported, keeps its self-check, and a misconfigured worker
// still raises ErrMisconfigured. (Before the fix any read switched it off
// for good, silently.)
func TestSelfCheckSurvivesATransientReadError(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "R23")
	r := &flakyRowStates{Resetter: fencedResetter(t, db)}
	w, _ := startWorker(t, rdb, r, "w", WithKeyPrefix(prefix), WithTimings(Timings{SelfCheckWindow: 100 * time.Millisecond}))
	take(t, db, w.OwnerValue(), 1, 2)
	setStatus(t, db, "in_progress", 1, 2) // the host's status, misspelt
	require.NoError(t, w.Track(ctx, 1, 2))
	waitTurns(t, &signals(w).look, 10*time.Second, func() bool { return errors.Is(w.Healthy(), ErrMisconfigured) },
		fmt.Sprintf("the self-check raises the alarm after one failed read (the read failed: %v)", r.failed.Load()))
}

// TestAResetterThatReadsNoRowsIsToldAtStart: a custom resetter whose
// RowStates returns errors.ErrUnsupported gets no self-check, and Start
// says so once at Warn, naming the resetter's type and what is lost.
func TestAResetterThatReadsNoRowsIsToldAtStart(t *testing.T) {
	rdb, _, prefix := onRealServers(t, 1, "PRB")
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w", WithKeyPrefix(prefix))
	assert.Equal(t, 1, logs.Count("the resetter reads no rows"), logs.String())
	assert.Contains(t, logs.String(), "*recovery.fakeResetter")
	require.NoError(t, w.Track(context.Background(), 1))
	assert.NoError(t, w.Healthy(), "no self-check, no alarm")
	assert.True(t, w.checker.off.Load(), "the self-check is off")
}
