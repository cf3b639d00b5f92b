package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// TestRowsStuckForAKilledWorkerIsAtLeastTheTTLAndCloseToTheKill kills a
// real batchworker process with SIGKILL in the middle of a block, and lets
// a peer recover it: the figure the peer reports for how long the rows were
// stuck (Event.StuckFor, Stats) is at least the heartbeat TTL, and within
// a heartbeat interval and a scan of the time from the kill to the reset.
func TestRowsStuckForAKilledWorkerIsAtLeastTheTTLAndCloseToTheKill(t *testing.T) {
	const (
		ttl      = time.Second
		interval = 250 * time.Millisecond
		scan     = 500 * time.Millisecond
	)
	f := setup(t, 60)
	events := make(chan recovery.Event, 64)
	resetter, err := pgxreset.New(f.pool, resetterOptions()...)
	require.NoError(t, err)
	log, _ := testutil.Logger(t)
	peer, err := recovery.New(f.rdb, resetter, recovery.WithKeyPrefix(f.prefix),
		recovery.WithInstanceID("bw-peer"), recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      ttl,
			HeartbeatInterval: interval,
			RecoveryInterval:  scan,
		}),
		// The heartbeat TTL's path: the liveness witness, which would see
		// the kill first, is off on the judge.
		recovery.WithLivenessWitness(false),
		recovery.WithLogger(log), recovery.WithObserver(func(e recovery.Event) {
			if e.Kind == recovery.EventRowsReset && e.PeerID == "bw-victim" {
				events <- e
			}
		}))
	require.NoError(t, err)
	require.NoError(t, peer.Start(context.Background()))
	defer func() { require.NoError(t, peer.Shutdown(context.Background())) }()

	killedAt, _ := killMidBlock(t, f, "bw-victim", 200*time.Millisecond)

	var e recovery.Event
	select {
	case e = <-events:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not reset the killed worker's rows")
	}
	killToReset := e.Time.Sub(killedAt)
	t.Logf("rows stuck for %v (reported), %v from the kill to the reset; found by %s %v after noticed",
		e.StuckFor, killToReset, e.FoundBy, e.Duration)
	require.Equal(t, "bw-victim", e.PeerID)
	require.Positive(t, e.RowsReset)
	assert.GreaterOrEqual(t, e.StuckFor, ttl, "the key had expired: the last heartbeat was at least a TTL before")
	// The last heartbeat came up to an interval (±20% jitter) before the
	// kill: the figure may exceed the kill-to-reset time by that much.
	assert.LessOrEqual(t, e.StuckFor-killToReset, interval*6/5+100*time.Millisecond)
	// A scan notices the death up to 1.1 scan intervals after the expiry,
	// which the lower bound leaves out.
	assert.LessOrEqual(t, killToReset-e.StuckFor, scan*11/10+500*time.Millisecond)

	require.Eventually(t, func() bool { return peer.Stats().LastStuckFor == e.StuckFor }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, e.StuckFor, peer.Stats().MaxStuckFor)
}
