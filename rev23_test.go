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

// Reproductions of the review of the v2 API (rev23). Each test fails on v2
// at the commit it was written against; see the review report.

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

// TestRev23SelfCheckSurvivesATransientReadError: the self-check is turned
// off only by a resetter that cannot read rows, which Start learns from
// RowStates of no row (resetter.go). A resetter that answered that probe,
// and whose one later read failed with an error that happens to match
// errors.ErrUnsupported, must keep its self-check: on v2 readRows
// (selfcheck.go) switches it off for good, silently, on any read, and a
// misconfigured worker never raises ErrMisconfigured.
func TestRev23SelfCheckSurvivesATransientReadError(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 4, "R23")
	r := &flakyRowStates{Resetter: fencedResetter(t, db)}
	w, _ := startWorker(t, rdb, r, "w", WithKeyPrefix(prefix), WithTimings(Timings{SelfCheckWindow: 100 * time.Millisecond}))
	take(t, db, w.OwnerValue(), 1, 2)
	setStatus(t, db, "in_progress", 1, 2) // the host's status, misspelt
	require.NoError(t, w.Track(ctx, 1, 2))
	assert.Eventually(t, func() bool { return errors.Is(w.Healthy(), ErrMisconfigured) }, 10*time.Second, 20*time.Millisecond,
		"the self-check raises the alarm after one failed read (the read failed: %v)", r.failed.Load())
}
