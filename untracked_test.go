package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// Issue 21: a host that forgot Track is told. Its worker, asked to
// untrack rows while no Track was ever called since Start, fails Healthy
// with ErrUntrackedRows and logs one Error; a correct host (Track, then
// Untrack, twice; a Track refused and its rows untracked as Track's doc
// says) is not.
func TestUntrackWithoutAnyTrackTellsTheHostThatForgotTrack(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 6)
	ctx := context.Background()
	// No sweep: the test's timings (newWorker's, TTL 2 s) keep the leases
	// that Healthy checks first valid on a loaded machine.
	opts := []Option{WithKeyPrefix(testutil.Name("UT")), WithBackstopSweep(false)}

	forgot, logs := startWorker(t, rdb, r, "forgot", opts...)
	setJobs(t, db, schema, "running", 1) // its fetch, no Track
	setJobs(t, db, schema, "finished", 1)
	require.NoError(t, forgot.Untrack(1))
	require.ErrorIs(t, forgot.Healthy(), ErrUntrackedRows)
	require.NoError(t, forgot.Untrack(2))
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"Untrack was called, but never Track since this worker started`))

	good, goodLogs := startWorker(t, rdb, r, "good", opts...)
	require.NoError(t, good.Track(ctx, 3))
	setJobs(t, db, schema, "running", 3)
	setJobs(t, db, schema, "finished", 3)
	require.NoError(t, good.Untrack(3))
	require.NoError(t, good.Untrack(3), "a second Untrack of the same row")
	require.NoError(t, good.Healthy())

	// A Track refused (here: before Start) and its rows untracked, as
	// Track's doc says to: Track was called, no alarm.
	late, lateLogs := newWorker(t, rdb, r, "late", opts...)
	require.ErrorIs(t, late.Track(ctx, 4), ErrNotStarted)
	require.NoError(t, late.Start(ctx))
	require.NoError(t, late.Untrack(4))
	require.NoError(t, late.Healthy())
	assert.NotContains(t, goodLogs.String()+lateLogs.String(), `"level":"ERROR"`)
}

// Rolling upgrade of the untracked-rows note: a worker of a release
// before it never reads <prefix>_UNTRACKED. The sweep still names it in
// its Error (tracked_late_by), stays healthy itself, and the note is gone
// a rows TTL after the finding. (A sweeper of an earlier release writes no
// note and fails its own Healthy, as it did.) The old worker is its keys,
// written by hand as every release writes them.
func TestUntrackedRowsNoteForAWorkerOfAnEarlierReleaseExpires(t *testing.T) {
	t.Parallel()
	rdb, db, schema, r := backstopWorld(t, 4)
	ctx := context.Background()
	prefix := testutil.Name("UO")
	k := store.InstanceKeys(prefix, "old-1")
	// old-1 lives throughout: TTLs that a loaded machine cannot outrun
	// between its beats and the looks.
	beat := func(rows ...any) {
		require.NoError(t, rdb.Set(ctx, k.Heartbeat, "alive", 20*time.Second).Err())
		require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), "old-1").Err())
		if len(rows) > 0 {
			require.NoError(t, rdb.SAdd(ctx, k.Rows, rows...).Err())
			require.NoError(t, rdb.PExpire(ctx, k.Rows, 30*time.Second).Err())
		}
	}
	beat()
	w, logs := newWorker(t, rdb, r, "new-1", rowsSweepTimings(WithKeyPrefix(prefix))...)
	look := func() sweepReport {
		t.Helper()
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		return rep
	}
	look()
	setJobs(t, db, schema, "running", 1) // old-1's fetch, committed before its Track
	look()
	beat("1") // its Track, after the COMMIT
	rep := look()
	require.Equal(t, map[string][]int64{"old-1": {1}}, rep.untrackedBy)
	assert.Contains(t, logs.String(), `"tracked_late_by":["old-1"]`)
	require.NoError(t, w.untracked.err(), "not the sweeper's fault")

	note, err := rdb.HGet(ctx, store.UntrackedKey(prefix), "old-1").Result()
	require.NoError(t, err)
	assert.Regexp(t, `^\d+ 1 1 new-1$`, note)
	ttl, err := rdb.PTTL(ctx, store.UntrackedKey(prefix)).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0))
	assert.LessOrEqual(t, ttl, w.opts.rowsTTL, "the note lives a rows TTL")
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, store.UntrackedKey(prefix)).Result()
		return err == nil && n == 0
	}, 3*time.Second, 20*time.Millisecond, "gone a rows TTL after the finding")
}
