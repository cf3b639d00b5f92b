package recovery

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
)

// Regression tests, on the real servers, for two bugs of witness.go the
// simulator found (seeds 136 and 616, and 1392).

// shortMarkerTimings: a heartbeat TTL of 2.5 s, so the witness's marker,
// written for the fleet's heartbeat TTL, expires within a test.
func shortMarkerTimings(prefix string) []Option {
	return []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      2500 * time.Millisecond,
		HeartbeatInterval: 500 * time.Millisecond,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2 * time.Hour,
		ResetTimeout:      2 * time.Second,
	})}
}

// A worker cut off from its witness's connection (its heartbeat still
// goes through) is judged by its peer, and the judged marker, which keeps
// the TTL of the one it replaced, expires before the worker is back: it
// does not mark that life again and go on in it. Its waiting CheckLease
// says ErrLeaseLost, a new life begins, and its completion of the reset
// row finds it reset (CheckLease may say nil once the next life began:
// never in the judged one). (Reverted, without the check of writtenTill in
// mark, the worker wrote a new marker for the judged life and CheckLease
// said nil in it; seed 136 of the simulator.)
func TestWitnessAWorkerBackAfterItsJudgedMarkerExpiredDoesNotGoOnInThatLife(t *testing.T) {
	t.Parallel()
	_, rdb, db, prefix, r := onWitnessServers(t, 2, "WE")
	ctx := context.Background()
	ac, proxy := viaProxy(t, rdb)

	a, _ := newWorker(t, rdb, r, "a", shortMarkerTimings(prefix)...)
	a.witness.ws = store.NewRedis(ac, prefix, a.opts.opTimeout) // only the witness through the proxy
	require.NoError(t, a.Start(ctx))
	_, _ = startWorker(t, rdb, r, "b", shortMarkerTimings(prefix)...)
	owner := a.OwnerValue()
	take(t, db, owner, 1)
	require.NoError(t, a.TrackAs(ctx, owner, 1))
	require.NoError(t, a.CheckLease())

	key := store.WitnessKey(prefix, "a")
	cut := time.Now()
	proxy.Cut()
	require.Eventually(t, func() bool { s, _ := rowState(t, db, 1); return s == "queued" }, 3*time.Second, 5*time.Millisecond)
	resetAt := time.Now()
	require.ErrorIs(t, a.Healthy(), ErrLeaseLost, "fenced: no answered ping for longer than the fence")
	checked := make(chan error, 1)
	go func() { checked <- a.CheckLease() }() // the host's: waits out the cut
	marker, err := rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	m, ok := store.ParseWitness(marker)
	require.True(t, ok)
	require.True(t, m.Judged, "the peer judged the life")
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, key).Result()
		require.NoError(t, err)
		return n == 0
	}, 4*time.Second, 10*time.Millisecond, "the judged marker expires with the TTL of the one it replaced")
	expiredAt := time.Now()
	proxy.Restore()
	t.Logf("rows reset %v, judged marker gone %v after the cut", resetAt.Sub(cut), expiredAt.Sub(cut))

	select {
	case err := <-checked:
		if err == nil { // a nil in the next life, once it began, is right
			require.NotEqual(t, owner, a.OwnerValue(), "CheckLease said nil in the judged life")
		} else {
			require.ErrorIs(t, err, ErrLeaseLost)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CheckLease still waiting 5 s after the cut healed")
	}
	judgedLifeEnds(t, a, db, owner)
}

// markerOf returns instance id's witness marker, ok false while it has
// none.
func markerOf(t *testing.T, rdb *redis.Client, prefix, id string) (store.Witness, bool) {
	t.Helper()
	v, err := rdb.Get(context.Background(), store.WitnessKey(prefix, id)).Result()
	if errors.Is(err, redis.Nil) {
		return store.Witness{}, false
	}
	require.NoError(t, err)
	m, ok := store.ParseWitness(v)
	require.True(t, ok, "marker %q", v)
	return m, true
}

// A verdict learnt while a lease loss noted before is still open: the
// heartbeat's connection is cut, the lease is lost and a new life begins
// (a loss in owner mode begins one), the witness marks it, and a peer
// judges that life while the heartbeat is still cut (the witness's own
// connection cut for longer than the grace). The witness, back first,
// learns the verdict; then the heartbeat is back. A new life begins and
// the host's CheckLease returns, nil, within a few seconds. (Reverted,
// without the wasLost branch in judged, the judged life went on once the
// heartbeat regained the lease and CheckLease waited for ever: the
// witness marks no judged life, so the fence never lifts; seed 1392 of
// the simulator.)
func TestWitnessAVerdictLearntDuringALeaseLossBeginsANewLife(t *testing.T) {
	t.Parallel()
	_, rdb, _, prefix, r := onWitnessServers(t, 1, "WV")
	ctx := context.Background()
	pc, heart := viaProxy(t, rdb)
	wc, witness := viaProxy(t, rdb)
	opt := *pc.Options()
	opt.ContextTimeoutEnabled = true // a heartbeat through the cut fails at its operation timeout, not at the 3 s read timeout
	hc := redis.NewClient(&opt)
	t.Cleanup(func() { _ = hc.Close() })

	a, _ := newWorker(t, hc, r, "a", shortMarkerTimings(prefix)...)
	a.witness.ws = store.NewRedis(wc, prefix, a.opts.opTimeout) // the witness through a proxy of its own
	require.NoError(t, a.Start(ctx))
	_, _ = startWorker(t, rdb, r, "b", shortMarkerTimings(prefix)...)
	require.NoError(t, a.CheckLease())
	first := a.OwnerValue()

	heart.Cut()
	waitTurns(t, &signals(a).beat, 5*time.Second, func() bool { return a.OwnerValue() != first },
		"the lease is lost for the TTL and a new life begins")
	lost := a.OwnerValue()
	require.Eventually(t, func() bool {
		m, ok := markerOf(t, rdb, prefix, "a")
		return ok && !m.Judged && strings.Contains(lost, "{"+m.Life+"}")
	}, 3*time.Second, 10*time.Millisecond, "the witness marks the life the loss began")

	witness.Cut()
	require.Eventually(t, func() bool {
		m, ok := markerOf(t, rdb, prefix, "a")
		return ok && m.Judged && strings.Contains(lost, "{"+m.Life+"}")
	}, 3*time.Second, 10*time.Millisecond, "the peer judges that life")
	witness.Restore()
	time.Sleep(time.Second) // real time: the witness reconnects and learns the verdict, the heartbeat still cut
	heart.Restore()
	waitTurns(t, &signals(a).beat, 3*time.Second, func() bool { return a.lease.valid() && !a.lease.lost.Load() },
		"a heartbeat regains the lease")

	checked := make(chan error, 1)
	go func() { checked <- a.CheckLease() }()
	select {
	case err := <-checked:
		require.NoError(t, err, "Redis answers again")
	case <-time.After(5 * time.Second):
		t.Fatal("CheckLease still waiting 5 s after Redis is reachable again")
	}
	assert.NotEqual(t, lost, a.OwnerValue(), "the judged life does not go on")
	assert.NotEqual(t, first, a.OwnerValue())
}
