package recovery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// TestRegistryOfTheWrongTypeIsReportedOnceAndExpiryStillRecovers
// reproduces a finding of issue 10: someone SETs the registry key to a
// string. Every scan fails (WRONGTYPE), and so did every heartbeat (its
// SADD to the registry) and every Start. Now a dead peer is still
// recovered through its expiry notification, the outage is logged at Error
// once (not per scan), emitted once and shown in Stats, heartbeats, Start
// and Shutdown keep working, and it ends when the key is deleted.
func TestRegistryOfTheWrongTypeIsReportedOnceAndExpiryStillRecovers(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t, "--notify-keyspace-events", "Ex")
	rdb := srv.Client(t)
	ctx := context.Background()
	r := &fakeResetter{}
	victim, _ := startWorker(t, rdb, r, "victim")
	require.NoError(t, victim.Track(ctx, 1, 2, 3))
	require.NoError(t, rdb.Set(ctx, registryKey, "oops", 0).Err()) // by hand, by mistake

	events := &recorder{}
	watcher, logs := startWorker(t, rdb, r, "watcher", WithExpiryNotifications(),
		WithTimings(Timings{RecoveryInterval: 200 * time.Millisecond}), WithObserver(events.Observe)) // Start works
	bystander, _ := startWorker(t, rdb, &fakeResetter{}, "bystander")
	require.NoError(t, bystander.Shutdown(ctx), "Shutdown works: there is no registry entry to remove")

	victim.crash()
	require.Eventually(t, func() bool { return len(r.resetOf("victim")) == 3 }, 5*time.Second, 10*time.Millisecond,
		"the dead peer is recovered through its expiry notification")
	scans := watcher.Stats().Scans
	waitTurns(t, &signals(watcher).scan, 5*time.Second, func() bool { return watcher.Stats().Scans >= scans+3 })

	s := watcher.Stats()
	assert.True(t, s.RegistryBroken)
	assert.GreaterOrEqual(t, s.RegistryWrongType, uint64(4), "every scan and heartbeat counts")
	assert.GreaterOrEqual(t, s.PeersRecovered, uint64(1), "the expiry recovery succeeded, deregistration included")
	assert.Zero(t, s.HeartbeatFailures, "the heartbeat and rows set are written; only registering is impossible")
	assert.NoError(t, watcher.CheckLease())
	assert.Equal(t, 1, logs.Count("worker registry key is not a set"), "one Error line per outage, not per scan")
	assert.Contains(t, logs.String(), `"level":"ERROR","msg":"worker registry key is not a set`)
	assert.Contains(t, logs.String(), `"registry_key":"`+registryKey+`"`)
	assert.Contains(t, logs.String(), "Delete the key")
	assert.Zero(t, logs.Count("recovery scan failed"), "not logged twice")
	assert.Zero(t, logs.Count("heartbeat failed"))
	assert.Zero(t, logs.Count("recovery of dead peer failed"))
	_, err := watcher.recoverNow(ctx)
	assert.ErrorIs(t, err, ErrRegistryWrongType)

	require.NoError(t, rdb.Del(ctx, registryKey).Err()) // the runbook's fix
	// The next scan (every 200 ms) or heartbeat (every 500 ms) finds a set
	// again; the scan's turns, the more frequent, see either within one.
	waitTurns(t, &signals(watcher).scan, 5*time.Second, func() bool { return !watcher.Stats().RegistryBroken })
	require.Eventually(t, func() bool { return rdb.SIsMember(ctx, registryKey, "watcher").Val() },
		5*time.Second, 10*time.Millisecond, "re-registered by its next heartbeat")
	assert.Equal(t, 1, logs.Count("worker registry is a set again"))
	require.NoError(t, watcher.Shutdown(ctx)) // delivers the queued events
	assert.Len(t, events.of(EventRegistryWrongType), 1, "one event per outage")
	assert.ErrorContains(t, events.of(EventRegistryWrongType)[0].Err, "WRONGTYPE")
}

// TestBackstopSweepRecoversWhileTheRegistryIsOfTheWrongType: with the
// registry unusable, the backstop sweep (which asks PostgreSQL for the
// owners of rows in progress) still resets a dead owner's rows.
func TestBackstopSweepRecoversWhileTheRegistryIsOfTheWrongType(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	take(t, db, "gone", 1, 2)
	prefix := testutil.Name("S")
	require.NoError(t, rdb.HSet(context.Background(), store.RegistryKey(prefix), "f", "v").Err())
	sweeper, logs := startWorker(t, rdb, fencedResetter(t, db), "sweeper", WithKeyPrefix(prefix), WithBackstopSweep(true),
		WithTimings(Timings{
			HeartbeatTTL:      300 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  100 * time.Millisecond,
			RowsTTL:           time.Second,
		}))
	require.Eventually(t, func() bool {
		s1, _ := rowState(t, db, 1)
		s2, _ := rowState(t, db, 2)
		return s1 == "queued" && s2 == "queued"
	}, 5*time.Second, 20*time.Millisecond)
	// The rows are queued once the reset commits; the log line comes
	// after the finish.
	waitTurns(t, &signals(sweeper).sweep, 5*time.Second, func() bool { return strings.Contains(logs.String(), `"found_by":"sweep"`) })
	assert.True(t, sweeper.Stats().RegistryBroken)
	assert.Equal(t, 1, logs.Count("worker registry key is not a set"))
}

func TestInvalidRegistryMembersAreReportedAndLeftAlone(t *testing.T) {
	mr, rdb := newMini(t)
	long := strings.Repeat("x", 10*1024)
	for _, m := range []string{"", "a{b}c", "with space", long} {
		_, err := mr.SAdd(registryKey, m)
		require.NoError(t, err)
	}
	plantDeadPeer(t, rdb, "ALYA", "good", "1")
	r := &fakeResetter{}
	b, _ := newWorker(t, rdb, r, "workerB")

	rep, err := b.recoverNow(context.Background())

	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"", "a{b}c", "with space", long}, rep.InvalidMembers)
	assert.Equal(t, []int64{1}, r.resetOf("good"))
	n, _ := mr.SMembers(registryKey)
	assert.Len(t, n, 4, "garbage is not ours to delete")
}
