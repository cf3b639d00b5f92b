package recovery

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Observe(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) of(kind EventKind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func dispatcherGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "recovery.(*dispatcher).run(")
}

func TestSlowObserverNeverDelaysAHeartbeat(t *testing.T) {
	_, rdb := newMini(t)
	stuck := make(chan struct{})
	var delivered int
	obs := func(Event) { <-stuck; delivered++ }
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1", WithObserver(obs),
		WithTimings(Timings{
			HeartbeatTTL:      400 * time.Millisecond,
			HeartbeatInterval: 50 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
		}))

	waitTurns(t, &signals(w).beat, 3*time.Second, func() bool { return w.Stats().Heartbeats >= 8 },
		"heartbeats go on while the observer is stuck on the first event")
	assert.NoError(t, w.Healthy())
	assert.Zero(t, delivered)

	close(stuck)
	require.NoError(t, w.Shutdown(context.Background()))
	assert.Equal(t, int(w.Stats().Heartbeats)+1, delivered, "every heartbeat and the first scan delivered before Shutdown returns")
	assert.Zero(t, dispatcherGoroutines(), "the delivery goroutine ends with Shutdown")
}

func TestEventsDescribeARecovery(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "dead", "1", "2")
	plantDeadPeer(t, rdb, "ALYA", "broken", "3")
	r := &fakeResetter{}
	boom := errors.New("db down")
	r.setFail("broken", boom)
	rec := &recorder{}
	w, _ := newWorker(t, rdb, r, "w1", WithObserver(rec.Observe))

	_, err := w.recoverNow(context.Background())
	require.Error(t, err)
	require.NoError(t, w.Shutdown(context.Background())) // drains the events

	dead := rec.of(EventPeerDead)
	require.Len(t, dead, 2)
	assert.ElementsMatch(t, []string{"dead", "broken"}, []string{dead[0].PeerID, dead[1].PeerID})
	recovered := rec.of(EventRowsRecovered)
	require.Len(t, recovered, 1)
	assert.Equal(t, "dead", recovered[0].PeerID)
	assert.Equal(t, "w1", recovered[0].InstanceID)
	assert.Equal(t, "registry", recovered[0].FoundBy)
	assert.Equal(t, 2, recovered[0].Rows)
	assert.Equal(t, int64(2), recovered[0].RowsReset)
	assert.Greater(t, recovered[0].Duration, time.Duration(0))
	assert.False(t, recovered[0].Time.IsZero())
	failed := rec.of(EventRecoveryFailed)
	require.Len(t, failed, 1)
	assert.Equal(t, "broken", failed[0].PeerID)
	assert.ErrorIs(t, failed[0].Err, boom)
	// The steps of each recovery, in order: claimed, then (if the reset
	// committed) rows reset, with the counts, before the end.
	claimed := rec.of(EventPeerClaimed)
	require.Len(t, claimed, 2)
	assert.ElementsMatch(t, []string{"dead", "broken"}, []string{claimed[0].PeerID, claimed[1].PeerID})
	reset := rec.of(EventRowsReset)
	require.Len(t, reset, 1, "the failed reset committed nothing")
	assert.Equal(t, "dead", reset[0].PeerID)
	assert.Equal(t, "registry", reset[0].FoundBy)
	assert.Equal(t, 2, reset[0].Rows)
	assert.Equal(t, int64(2), reset[0].RowsReset)
	var steps []EventKind
	for _, e := range rec.events {
		if e.PeerID == "dead" {
			steps = append(steps, e.Kind)
		}
	}
	assert.Equal(t, []EventKind{EventPeerDead, EventPeerClaimed, EventRowsReset, EventRowsRecovered}, steps)
	for _, e := range claimed {
		assert.Positive(t, e.Duration, "noticed → claimed")
	}
	assert.LessOrEqual(t, reset[0].Duration, recovered[0].Duration)
	scans := rec.of(EventScanFinished)
	require.Len(t, scans, 1)
	assert.Equal(t, 2, scans[0].PeersChecked)
	assert.Equal(t, 2, scans[0].PeersDead)

	s := w.Stats()
	assert.Equal(t, uint64(1), s.Scans)
	assert.Equal(t, uint64(2), s.PeersDead)
	assert.Equal(t, uint64(1), s.PeersRecovered)
	assert.Equal(t, uint64(2), s.RowsRecovered)
	assert.Equal(t, uint64(1), s.Errors)
}

func TestEventsAndStatsOfAHeartbeatOutage(t *testing.T) {
	mr, rdb := newMini(t)
	rec := &recorder{}
	w, logs := startWorker(t, rdb, &fakeResetter{}, "w1", WithObserver(rec.Observe),
		WithTimings(Timings{
			HeartbeatTTL:      400 * time.Millisecond,
			HeartbeatInterval: 100 * time.Millisecond,
			RecoveryInterval:  time.Hour,
			RowsTTL:           2 * time.Hour,
			ResetTimeout:      100 * time.Millisecond,
		}))
	assert.NoError(t, w.Healthy())
	before := w.Stats().LastHeartbeat
	require.False(t, before.IsZero())

	mr.SetError("ERR down")
	// Each failed heartbeat turn, a retry delay apart, notes the loss once
	// the lease has run out.
	waitTurns(t, &signals(w).beat, 3*time.Second, func() bool { return w.Healthy() != nil })
	assert.ErrorIs(t, w.Healthy(), ErrLeaseLost)
	s := w.Stats()
	assert.False(t, s.LeaseValid)
	assert.Equal(t, before, s.LastHeartbeat, "no success during the outage")
	mr.SetError("")
	waitTurns(t, &signals(w).deliver, 3*time.Second, func() bool { return len(rec.of(EventLeaseRegained)) == 1 })

	failures := rec.of(EventHeartbeatFailed)
	require.NotEmpty(t, failures)
	assert.Equal(t, 1, failures[0].Attempt)
	assert.Equal(t, len(failures), failures[len(failures)-1].Attempt)
	lost := rec.of(EventLeaseLost)
	require.Len(t, lost, 1)
	assert.GreaterOrEqual(t, lost[0].Duration, 360*time.Millisecond, "TTL minus the margin")
	restored := rec.of(EventHeartbeatRestored)
	require.Len(t, restored, 1)
	assert.Greater(t, restored[0].Duration, 200*time.Millisecond, "from the first failure to the first success")
	assert.False(t, w.Stats().LeaseValid, "held for a claim TTL after the regain (250ms here)")
	waitTurns(t, &signals(w).beat, 3*time.Second, func() bool { return w.Stats().LeaseValid })
	s = w.Stats()
	assert.Equal(t, uint64(1), s.LeaseLosses)
	assert.GreaterOrEqual(t, s.HeartbeatFailures, uint64(len(failures)))
	assert.Equal(t, 1, logs.Count(`"level":"WARN","msg":"heartbeat failed`))
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"heartbeat lease lost`))
	assert.Equal(t, 1, logs.Count(`"level":"INFO","msg":"heartbeat restored`))
	require.NoError(t, w.Shutdown(context.Background()))
	assert.ErrorIs(t, w.Healthy(), ErrShutdown)
}

func TestPanickingObserverIsContained(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w1",
		WithObserver(func(Event) { panic("observer bug") }))
	waitTurns(t, &signals(w).deliver, 2*time.Second, func() bool { return w.Stats().EventsDropped >= 2 })
	assert.NoError(t, w.Healthy())
}

func TestNilObserverIsRefused(t *testing.T) {
	_, err := New(idleClient(t), &fakeResetter{}, WithObserver(nil))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "observer is nil")
	var nilFunc func(Event)
	_, err = New(idleClient(t), &fakeResetter{}, WithObserver(nilFunc))
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

func TestEventKindNames(t *testing.T) {
	for k := EventHeartbeat; k <= EventRowsReset; k++ {
		assert.NotEqual(t, "unknown", k.String(), "kind %d", k)
	}
	assert.Equal(t, "rows_recovered", EventRowsRecovered.String())
	assert.Equal(t, "registry_wrong_type", EventRegistryWrongType.String())
	assert.Equal(t, "peer_claimed", EventPeerClaimed.String())
	assert.Equal(t, "rows_reset", EventRowsReset.String())
	assert.Equal(t, "unknown", EventKind(0).String())
}
