package recovery

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// TestMeasureResumeAfterRedisRestart measures, against a real redis-server
// and PostgreSQL, how long an owner-mode worker takes no rows after Redis
// comes back from an outage that cost it its lease: from the restarted
// server accepting connections to the first Track that succeeds. It is a
// measurement, not a check (issue 22: before and after the per-life owner
// value), so it runs only with RECOVERY_MEASURE=1. With the hold (rows-set
// mode, a host writing the bare ID, or the release before per-life values)
// it takes about the claim TTL (reset timeout + 3 × operation timeout);
// with per-life values, until the first heartbeat retry after the restart.
func TestMeasureResumeAfterRedisRestart(t *testing.T) {
	if os.Getenv("RECOVERY_MEASURE") == "" {
		t.Skip("a measurement: set RECOVERY_MEASURE=1")
	}
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"defaults", []Option{WithTimings(Timings{
			HeartbeatTTL:      defaultHeartbeatTTL,
			HeartbeatInterval: defaultHeartbeatInterval,
			OperationTimeout:  defaultOperationTimeout,
			ResetTimeout:      defaultResetTimeout,
			RecoveryInterval:  defaultRecoveryInterval,
			RowsTTL:           defaultRowsTTL,
		})}},
		// Tight timings: TTL 3 s, as in the Sentinel failover,
		// with the default reset timeout.
		{"ttl3s", []Option{WithTimings(Timings{
			HeartbeatTTL:      3 * time.Second,
			HeartbeatInterval: time.Second,
			OperationTimeout:  500 * time.Millisecond,
			ResetTimeout:      defaultResetTimeout,
			RecoveryInterval:  2 * time.Second,
			RowsTTL:           10 * time.Second,
		})}},
		{"fast", nil}, // the unit tests' timings (helpers_test.go)
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testutil.StartRedis(t)
			rdb := srv.Client(t)
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			opts := append([]Option{WithKeyPrefix(testutil.Name("M"))}, c.opts...)
			w, logs := startWorker(t, rdb, fencedResetter(t, db), "w", opts...)
			ctx := context.Background()
			require.NoError(t, w.Track(ctx, 1))
			require.NoError(t, w.Untrack(1))

			srv.Kill()
			// poll: the lease runs out with the clock alone while the
			// heartbeat fails; its retries back off to an interval (30 s
			// with the defaults), so the first turn after the end of the
			// lease may come past this minute, and the outage would start
			// later than the loss.
			require.Eventually(t, func() bool { return w.CheckLease() != nil }, time.Minute, 5*time.Millisecond)
			restarting := time.Now()
			srv.Restart()
			restored := time.Now()
			require.Eventually(t, func() bool { return w.Track(ctx, 1) == nil }, 2*time.Minute, time.Millisecond)
			took := time.Since(restored)
			require.NoError(t, w.Untrack(1))
			t.Logf("%s: Redis restored to first successful Track: %v; from the restart's start (the server process launched): %v (heartbeat interval %v, claim TTL %v)",
				c.name, took.Round(time.Millisecond), time.Since(restarting).Round(time.Millisecond), w.opts.heartbeatInterval, w.fleet.claimTTL())
			t.Logf("%s: lease lost %d, regained %d, heartbeat restored %d", c.name, logs.Count("heartbeat lease lost"),
				logs.Count("heartbeat lease regained"), logs.Count("heartbeat restored"))
		})
	}
}
