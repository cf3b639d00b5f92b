package recovery

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testsignal"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// TestHistoryRecordsWhoRecoveredWhomWithCountsAndDuration: a real recovery
// on redis-server and PostgreSQL leaves, in the fleet's stream, who found
// the peer dead and claimed it, how many rows it reset and quarantined,
// which, and how long that took; a failed recovery leaves its cause.
func TestHistoryRecordsWhoRecoveredWhomWithCountsAndDuration(t *testing.T) {
	rdb, db, prefix := onRealServers(t, 4, "H")
	ctx := context.Background()
	take(t, db, "dead-1", 1, 2, 3, 4)
	_, err := db.Exec(ctx, `UPDATE batchrows SET recoveries = 2 WHERE rowid IN (3, 4)`)
	require.NoError(t, err)
	plantDeadPeer(t, rdb, prefix, "dead-1", "1", "2", "3", "4")
	r := fencedResetter(t, db, postgres.WithRecoveryCountColumn("recoveries"), postgres.WithMaxRecoveries(3, ""))
	w, _ := newWorker(t, rdb, r, "rec-1", WithKeyPrefix(prefix), WithRowsSets())
	began := time.Now()
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)

	// A second dead peer whose reset fails.
	plantDeadPeer(t, rdb, prefix, "dead-2", "9")
	failing, _ := newWorker(t, rdb, &fakeResetter{fail: map[string]error{"dead-2": errors.New("connection refused")}},
		"rec-2", WithKeyPrefix(prefix))
	_, err = failing.recoverNow(ctx)
	require.Error(t, err)
	shutdown(t, w, failing) // sends what is queued

	h := readHistory(t, rdb, prefix)
	var kinds []string
	for _, e := range h {
		kinds = append(kinds, e.Kind+" "+e.PeerID+" by "+e.InstanceID)
	}
	require.Equal(t, []string{
		"peer_dead dead-1 by rec-1", "rows_recovered dead-1 by rec-1", "rows_quarantined dead-1 by rec-1",
		"peer_dead dead-2 by rec-2", "recovery_failed dead-2 by rec-2",
	}, kinds)
	dead, recovered, quarantined, failed := h[0], h[1], h[2], h[4]
	assert.Equal(t, "registry", dead.FoundBy)
	assert.Equal(t, 4, recovered.Rows)
	assert.Equal(t, int64(4), recovered.RowsReset, "quarantined rows count as reset")
	assert.Equal(t, 2, recovered.RowsQuarantined)
	assert.Equal(t, 2, quarantined.RowsQuarantined)
	assert.Equal(t, []string{"1,2,3,4", "4"}, []string{recovered.RowIDs, recovered.RowIDsTotal}, "which rows came back")
	assert.Equal(t, []string{"3,4", "2"}, []string{quarantined.RowIDs, quarantined.RowIDsTotal}, "which rows were quarantined")
	assert.Empty(t, dead.RowIDs)
	assert.Positive(t, recovered.Duration)
	assert.Less(t, recovered.Duration, time.Since(began))
	assert.LessOrEqual(t, dead.Duration, recovered.Duration, "claimed before the end")
	assert.Contains(t, failed.Error, "connection refused")
	for _, e := range h {
		assert.WithinRange(t, e.Time, began, time.Now(), e.Kind)
		assert.WithinDuration(t, e.Time, e.Added, time.Second, "Redis appended it at once")
		assert.NotEmpty(t, e.ID)
	}

}

// shutdown shuts workers down within 10 s.
func shutdown(t *testing.T, ws ...*Worker) {
	t.Helper()
	for _, w := range ws {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, w.Shutdown(ctx))
		cancel()
	}
}

// TestHistoryOffAppendsNothing: WithHistory(0) writes no stream; a
// negative length is refused.
func TestHistoryOffAppendsNothing(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	prefix := testutil.Name("H")
	plantDeadPeer(t, rdb, prefix, "dead-1", "1")
	w, _ := newWorker(t, rdb, &fakeResetter{}, "rec", WithKeyPrefix(prefix), WithHistory(0))
	rep, err := w.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	shutdown(t, w)
	n, err := rdb.Exists(ctx, store.HistoryKey(prefix)).Result()
	require.NoError(t, err)
	assert.Zero(t, n)

	_, err = New(rdb, &fakeResetter{}, WithHistory(-1))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "history length -1")
}

// TestHistoryKeepsTheLeaseLossItCouldNotWriteThen: a worker loses its
// lease because Redis is gone; the entries wait and reach the stream once
// Redis is back, in order.
func TestHistoryKeepsTheLeaseLossItCouldNotWriteThen(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	prefix := testutil.Name("H")
	w, _ := startWorker(t, rdb, &fakeResetter{}, "w", WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 200 * time.Millisecond,
			RowsTTL:           4 * time.Second,
			ResetTimeout:      200 * time.Millisecond,
		})) // the hold after the regain: a claim TTL, 500ms
	srv.Kill()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.Stats().LeaseLosses == 1 })
	signals(w).history.WaitFor(t, func(err error) bool { return err != nil }) // the lease_lost entry has failed at least once
	srv.Restart()
	waitTurns(t, &signals(w).beat, 5*time.Second, func() bool { return w.CheckLease() == nil })
	var h []streamEntry
	require.Eventually(t, func() bool {
		h = readHistory(t, rdb, prefix)
		return len(h) == 2
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, store.HistoryKindLeaseLost, h[0].Kind)
	assert.Equal(t, "w", h[0].InstanceID)
	assert.GreaterOrEqual(t, h[0].Duration, 800*time.Millisecond, "since the last heartbeat: the lease's length")
	assert.Equal(t, store.HistoryKindLeaseRegained, h[1].Kind)
	assert.True(t, h[0].Added.After(h[0].Time), "appended after the fact")
	assert.Zero(t, w.Stats().HistoryDropped)
}

// historyStore is a Store whose AppendHistory the test decides: it fails
// while err is set, or blocks while block is set, and records what it
// appended. Every other method is the nil Store's and panics.
type historyStore struct {
	store.Store
	mu       sync.Mutex
	err      error
	block    chan struct{}
	attempts int
	appended [][]string
}

func (s *historyStore) AppendHistory(ctx context.Context, fields []string, maxLen int64) error {
	s.mu.Lock()
	s.attempts++
	err, block := s.err, s.block
	s.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appended = append(s.appended, fields)
	return nil
}

func (s *historyStore) set(err error, block chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err, s.block = err, block
}

func (s *historyStore) peers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, f := range s.appended {
		m := fieldMap(f)
		out = append(out, m[store.HistoryFieldKind]+" "+m[store.HistoryFieldPeer])
	}
	return out
}

func fieldMap(f []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		m[f[i]] = f[i+1]
	}
	return m
}

// streamEntry is a history entry as the stream holds it, decoded for the
// writer's tests here. The reader, ops.ReadHistory (which also drops the
// copies of a retried append and names peer_dead peer_claimed), has its
// own tests in package ops.
type streamEntry struct {
	ID, UID                             string
	Added, Time                         time.Time
	Kind, InstanceID, PeerID, FoundBy   string
	Rows, RowsQuarantined, RowsNotReset int
	RowsReset                           int64
	Duration                            time.Duration
	Error                               string
	RowIDs, RowIDsTotal                 string // as written
}

// readHistory reads the fleet's history stream as it is, oldest first.
func readHistory(t *testing.T, rdb redis.UniversalClient, prefix string) []streamEntry {
	t.Helper()
	recs, err := store.NewRedis(rdb, prefix, time.Second).ReadHistory(context.Background(), store.HistoryQuery{})
	require.NoError(t, err)
	out := make([]streamEntry, len(recs))
	for i, r := range recs {
		f := r.Fields
		e := streamEntry{ID: r.ID, UID: f[store.HistoryFieldUID], Added: r.Added, Kind: f[store.HistoryFieldKind],
			InstanceID: f[store.HistoryFieldInstance], PeerID: f[store.HistoryFieldPeer],
			FoundBy: f[store.HistoryFieldFoundBy], Error: f[store.HistoryFieldError],
			RowIDs: f[store.HistoryFieldRowIDs], RowIDsTotal: f[store.HistoryFieldRowIDsTotal]}
		e.Time, _ = time.Parse(time.RFC3339Nano, f[store.HistoryFieldTime])
		e.Rows, _ = strconv.Atoi(f[store.HistoryFieldRows])
		e.RowsReset, _ = strconv.ParseInt(f[store.HistoryFieldRowsReset], 10, 64)
		e.RowsQuarantined, _ = strconv.Atoi(f[store.HistoryFieldQuarantined])
		e.RowsNotReset, _ = strconv.Atoi(f[store.HistoryFieldNotReset])
		if ms, err := strconv.ParseFloat(f[store.HistoryFieldDurationMs], 64); err == nil {
			e.Duration = time.Duration(ms * float64(time.Millisecond))
		}
		out[i] = e
	}
	return out
}

// newTestHistorian returns a historian that appends to s, with its test
// signal on (h.sig): a test waits on it for the historian's sends.
func newTestHistorian(s store.Store) *historian {
	sig := new(testsignal.Signal[error])
	sig.Init()
	return &historian{store: s, log: discardLogger, maxLen: 100, opTimeout: 250 * time.Millisecond, retry: time.Second, sig: sig}
}

func failedEvent(peer string) Event {
	return Event{Kind: EventRecoveryFailed, PeerID: peer, Time: time.Now(), Err: errors.New("boom")}
}

// TestHistorianRetriesWhileRedisIsDownThenDropsAndCounts: entries wait,
// in order, while Redis fails, each retried a heartbeat interval apart;
// one that fails historyAttempts times is dropped and counted; offer never
// waits; close sends what is left once.
func TestHistorianRetriesWhileRedisIsDownThenDropsAndCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &historyStore{err: errors.New("dial tcp: connection refused")}
		h := newTestHistorian(s)
		start := time.Now()
		h.offer(failedEvent("a"))
		h.offer(failedEvent("b"))
		h.offer(Event{Kind: EventHeartbeat}) // not history
		// Each wait lets the fake clock run to the historian's next send.
		for i := range 4 {
			require.ErrorContains(t, h.sig.WaitOrTimeout(t), "connection refused", "attempt %d", i+1)
			require.Equal(t, time.Duration(i)*time.Second, time.Since(start), "attempt %d, a retry interval after the one before", i+1)
		}
		s.mu.Lock()
		assert.Equal(t, 4, s.attempts, "at 0, 1, 2, 3 s")
		s.mu.Unlock()
		s.set(nil, nil)
		for _, peer := range []string{"a", "b"} {
			require.NoError(t, h.sig.WaitOrTimeout(t), "%s sent", peer)
		}
		assert.Equal(t, 4*time.Second, time.Since(start), "a sent at its next retry, b at once")
		assert.Equal(t, []string{"recovery_failed a", "recovery_failed b"}, s.peers())
		assert.Zero(t, h.dropped.Load())

		s.set(errors.New("i/o timeout"), nil)
		offered := time.Now()
		h.offer(failedEvent("c"))
		for i := range historyAttempts {
			require.ErrorContains(t, h.sig.WaitOrTimeout(t), "i/o timeout", "attempt %d", i+1)
		}
		assert.Equal(t, (historyAttempts-1)*time.Second, time.Since(offered), "attempts a retry interval apart")
		synctest.Wait() // the drop is counted after the last attempt's signal
		assert.Equal(t, uint64(1), h.dropped.Load(), "given up after %d attempts", historyAttempts)
		s.set(nil, nil)
		h.offer(failedEvent("d"))
		require.NoError(t, h.close(context.Background()))
		assert.Equal(t, []string{"recovery_failed a", "recovery_failed b", "recovery_failed d"}, s.peers())
		h.offer(failedEvent("e"))
		assert.Equal(t, uint64(2), h.dropped.Load(), "after close, offers are dropped")
		require.NoError(t, h.close(context.Background()), "twice")
	})
}

// TestHistorianNeverMakesARecoveryWait: with Redis hanging on every XADD,
// offers return at once, the queue's overflow is counted, and close gives
// up with its context and leaves no goroutine.
func TestHistorianNeverMakesARecoveryWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &historyStore{block: make(chan struct{})}
		h := newTestHistorian(s)
		h.opTimeout = time.Hour // a hung server, and no timeout to save us
		start := time.Now()
		h.offer(failedEvent("first"))
		synctest.Wait() // being sent
		for i := range historyQueue + 9 {
			h.offer(failedEvent(fmt.Sprint(i)))
		}
		assert.Zero(t, time.Since(start), "offer never waits")
		synctest.Wait()
		// One is being sent, historyQueue wait: the rest were dropped.
		assert.Equal(t, uint64(9), h.dropped.Load())

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		assert.ErrorIs(t, h.close(ctx), context.DeadlineExceeded)
		assert.Equal(t, time.Second, time.Since(start), "close waited for its context, no longer")
		assert.Equal(t, uint64(historyQueue+10), h.dropped.Load(), "nothing was appended, everything counted")
	})
}

// TestHistoryEntryRoundTrip: what historyFields writes, field by field, as
// the stream holds it. ops.TestHistoryEntryRoundTrip reads these very maps
// back: the two halves of the round trip meet at the wire format.
func TestHistoryEntryRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 23, 3, 12, 7, 123456789, time.UTC)
	e := Event{Kind: EventRowsRecovered, Time: at, InstanceID: "w-1", PeerID: "w-2", FoundBy: "expiry",
		Rows: 7, RowsReset: 6, RowsQuarantined: 1, Duration: 1500 * time.Microsecond,
		RowIDs: []int64{-4, 1, 2, 3, 5, 8}, QuarantinedIDs: []int64{5}}
	assert.Equal(t, map[string]string{"kind": "rows_recovered", "time": "2026-11-23T03:12:07.123456789Z", "instance": "w-1",
		"uid": "u1", "peer": "w-2", "found_by": "expiry", "rows": "7", "rows_reset": "6", "rows_quarantined": "1",
		"duration_ms": "1.5", "row_ids": "-4,1,2,3,5,8", "row_ids_total": "6"}, fieldMap(historyFields(store.HistoryKindRowsRecovered, "u1", e)))
	assert.Equal(t, map[string]string{"kind": "rows_quarantined", "time": "2026-11-23T03:12:07.123456789Z", "instance": "w-1",
		"uid": "u6", "peer": "w-2", "found_by": "expiry", "rows_quarantined": "1", "duration_ms": "1.5",
		"row_ids": "5", "row_ids_total": "1"}, fieldMap(historyFields(store.HistoryKindRowsQuarantined, "u6", e)),
		"the quarantine entry lists the quarantined rows")

	// The backstop sweep's two kinds keep their counts too, and list
	// their rows.
	stray := Event{Kind: EventStrayRowsReset, Time: at, InstanceID: "w-1", FoundBy: "sweep", Rows: 4, RowsReset: 3, RowsQuarantined: 1,
		RowIDs: []int64{10, 11, 12}, QuarantinedIDs: []int64{12}}
	assert.Equal(t, map[string]string{"kind": "stray_rows_reset", "time": "2026-11-23T03:12:07.123456789Z", "instance": "w-1",
		"uid": "u3", "found_by": "sweep", "rows": "4", "rows_reset": "3", "rows_quarantined": "1",
		"row_ids": "10,11,12", "row_ids_total": "3"},
		fieldMap(historyFields(store.HistoryKindStrayRowsReset, "u3", stray)))
	untracked := Event{Kind: EventUntrackedRows, Time: at, InstanceID: "w-1", Rows: 2, RowIDs: []int64{20, 21}}
	assert.Equal(t, map[string]string{"kind": "untracked_rows", "time": "2026-11-23T03:12:07.123456789Z", "instance": "w-1",
		"uid": "u4", "rows": "2", "row_ids": "20,21", "row_ids_total": "2"}, fieldMap(historyFields(store.HistoryKindUntrackedRows, "u4", untracked)),
		"an untracked_rows entry says how many rows, and which")

	// Of many rows an entry lists the lowest HistoryRowIDsMax, and how
	// many there were.
	many := Event{Kind: EventStrayRowsReset, Time: at, InstanceID: "w-1", FoundBy: "sweep", Rows: 250, RowsReset: 250}
	for id := range int64(250) {
		many.RowIDs = append(many.RowIDs, 1000+id)
	}
	f := fieldMap(historyFields(store.HistoryKindStrayRowsReset, "u7", many))
	assert.Equal(t, "250", f[store.HistoryFieldRowIDsTotal])
	assert.Equal(t, joinIDs(many.RowIDs[:store.HistoryRowIDsMax]), f[store.HistoryFieldRowIDs])
	assert.True(t, strings.HasPrefix(f[store.HistoryFieldRowIDs], "1000,1001,") && strings.HasSuffix(f[store.HistoryFieldRowIDs], ",1099"),
		f[store.HistoryFieldRowIDs])

	// A claim is written "peer_dead", the wire value of every release.
	claimed := Event{Kind: EventPeerClaimed, Time: at, InstanceID: "w-1", PeerID: "w-2", FoundBy: "registry", Duration: 2 * time.Millisecond}
	kind, ok := historyKind(claimed)
	require.True(t, ok)
	assert.Equal(t, map[string]string{"kind": "peer_dead", "time": "2026-11-23T03:12:07.123456789Z", "instance": "w-1",
		"uid": "u5", "peer": "w-2", "found_by": "registry", "duration_ms": "2"}, fieldMap(historyFields(kind, "u5", claimed)))

	long := errors.New(string(make([]byte, 5000)))
	f = fieldMap(historyFields(store.HistoryKindRecoveryFailed, "u2", Event{Kind: EventRecoveryFailed, Err: long}))
	assert.Len(t, f[store.HistoryFieldError], maxHistoryError+3, "clipped")

	for kind, want := range map[EventKind]bool{EventPeerClaimed: true, EventRowsRecovered: true, EventLeaseLost: true,
		EventLeaseRegained: true, EventPeerDead: false, EventRowsReset: false, EventHeartbeat: false, EventScanFinished: false} {
		_, ok := historyKind(Event{Kind: kind})
		assert.Equal(t, want, ok, kind.String())
	}
	_, ok = historyKind(Event{Kind: EventRecoveryFailed})
	assert.False(t, ok, "a failed scan is no recovery")
	kind, _ = historyKind(Event{Kind: EventStrayRowsReset, PeerID: "live-1"})
	assert.Equal(t, store.HistoryKindEndedLifeReset, kind, "the owner-column sweep's reset of a live worker's ended life")
}

// TestHistoryWritesARepeatedFailureOnce: a recovery that keeps failing for
// the same cause is written once, not at every scan; a new cause is
// written, and so is the recovery that ends it, and the next death.
func TestHistoryWritesARepeatedFailureOnce(t *testing.T) {
	s := &historyStore{}
	h := newTestHistorian(s)
	claimed := Event{Kind: EventPeerClaimed, PeerID: "x", Time: time.Now()}
	fail := func(cause string) Event {
		return Event{Kind: EventRecoveryFailed, PeerID: "x", Time: time.Now(), Err: errors.New(cause)}
	}
	for _, e := range []Event{
		claimed, fail("connection refused"),
		claimed, fail("connection refused"),
		claimed, fail("connection refused"),
		claimed, fail("table batchrows does not exist"),
		claimed, {Kind: EventRowsRecovered, PeerID: "x", Time: time.Now(), Rows: 2, RowsReset: 2},
		claimed,
	} {
		h.offer(e)
	}
	require.NoError(t, h.close(context.Background()))
	assert.Equal(t, []string{"peer_dead x", "recovery_failed x", "recovery_failed x", "rows_recovered x", "peer_dead x"}, s.peers())
	assert.Zero(t, h.dropped.Load(), "held back, not dropped")
}

// TestStatsCountHistoryEntriesNotAppended: an entry that comes after
// Shutdown, when nothing sends it any more, is counted in Stats.
func TestStatsCountHistoryEntriesNotAppended(t *testing.T) {
	_, rdb := newMini(t)
	w, _ := newWorker(t, rdb, &fakeResetter{}, "w")
	require.NoError(t, w.Shutdown(context.Background()))
	w.events.emit(Event{Kind: EventLeaseLost})
	w.events.emit(Event{Kind: EventHeartbeat}) // not history: not counted
	assert.Equal(t, uint64(1), w.Stats().HistoryDropped)

	off, _ := newWorker(t, rdb, &fakeResetter{}, "off", WithHistory(0))
	off.events.emit(Event{Kind: EventLeaseLost})
	assert.Zero(t, off.Stats().HistoryDropped, "no history, nothing to drop")
}

// TestShutdownWaitsForOneFailedSendNotTheBacklog: with Redis hanging and
// a backlog queued, close without a deadline still returns after one more
// failed send, dropping and counting the rest.
func TestShutdownWaitsForOneFailedSendNotTheBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &historyStore{block: make(chan struct{})} // every XADD hangs until its timeout
		h := newTestHistorian(s)
		for i := range 50 {
			h.offer(failedEvent(fmt.Sprint(i)))
		}
		require.ErrorIs(t, h.sig.WaitOrTimeout(t), context.DeadlineExceeded, "the first send timed out")
		synctest.Wait() // its retry waits
		start := time.Now()
		require.NoError(t, h.close(context.Background()))
		assert.Equal(t, h.opTimeout, time.Since(start), "one last send of the entry under way, then the rest dropped")
		assert.Equal(t, uint64(50), h.dropped.Load())
		s.mu.Lock()
		assert.Equal(t, 2, s.attempts)
		s.mu.Unlock()
	})
}

// A Worker used without Start (RecoverNow from an operator tool) may never
// be shut down: its history entries are appended inline, and no goroutine
// of the historian is left behind.
func TestHistoryOfAWorkerWithoutStartLeavesNoGoroutine(t *testing.T) {
	rdb := testutil.Redis(t)
	prefix := testutil.Name("H")
	plantDeadPeer(t, rdb, prefix, "dead", "1", "2")
	w, err := New(rdb, &fakeResetter{}, WithKeyPrefix(prefix), WithLogger(discardLogger))
	require.NoError(t, err)

	rep, err := w.recoverNow(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)

	buf := make([]byte, 1<<20)
	assert.NotContains(t, string(buf[:runtime.Stack(buf, true)]), "recovery.(*historian).run", "no goroutine without Start")
	assert.NotEmpty(t, readHistory(t, rdb, prefix), "the entries were appended inline")
}

// An XADD whose reply is lost is sent again by go-redis, and Redis
// appends the entry twice: both copies carry the entry's uid, so readers
// see it once (ops.TestReadHistoryDropsTheCopyOfARetriedAppend).
func TestHistoryShowsAnEntryAppendedTwiceByARetryOnce(t *testing.T) {
	ctx := context.Background()
	direct, proxy, rdb := behindProxy(t)
	prefix := testutil.Name("HD")
	plantDeadPeer(t, direct, prefix, "dead", "1")
	w, _ := newWorker(t, rdb, &fakeResetter{}, "rec", WithKeyPrefix(prefix)) // no Start: entries are appended inline

	dropped := proxy.DropReplyTo([]byte("xadd"))
	_, err := w.recoverNow(ctx)
	require.NoError(t, err)
	select {
	case <-dropped:
	case <-time.After(5 * time.Second):
		t.Fatal("no XADD reply was dropped")
	}
	require.Equal(t, int64(3), direct.XLen(ctx, store.HistoryKey(prefix)).Val(),
		"peer_dead twice (the retry) and rows_recovered once")

	h := readHistory(t, direct, prefix)
	require.Len(t, h, 3)
	assert.Equal(t, []string{store.HistoryKindPeerDead, store.HistoryKindPeerDead, store.HistoryKindRowsRecovered},
		[]string{h[0].Kind, h[1].Kind, h[2].Kind})
	assert.Equal(t, h[0].UID, h[1].UID, "the copy carries the entry's uid, by which ops.ReadHistory drops it")
	assert.NotEqual(t, h[0].UID, h[2].UID)
}

// Issue 21: rows a recovery found in a dead peer's set and could not reset
// are in the history with their counts, once while the recovery keeps
// failing for that cause, beside the recovery_failed entry.
func TestHistoryRecordsRowsNotResetOnce(t *testing.T) {
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 10, "HN")
	right, err := pgxreset.New(db)
	require.NoError(t, err)
	v, _ := startWorker(t, rdb, right, "victim", WithKeyPrefix(prefix), WithBackstopSweep(false))
	setStatus(t, db, "inprog", 1, 2, 3)
	require.NoError(t, v.Track(ctx, 1, 2, 3))
	v.crash()
	require.NoError(t, rdb.Del(ctx, v.ownKeys().Heartbeat).Err())

	misspelled, err := pgxreset.New(db, postgres.WithStatuses("in_progress", "queued"))
	require.NoError(t, err)
	r, _ := newWorker(t, rdb, misspelled, "r", WithKeyPrefix(prefix))
	for range 2 {
		_, err := r.recoverNow(ctx)
		require.ErrorIs(t, err, ErrRowsNotReset)
	}
	entries := readHistory(t, rdb, prefix)
	var notReset []streamEntry
	for _, e := range entries {
		if e.Kind == store.HistoryKindRowsNotReset {
			notReset = append(notReset, e)
		}
	}
	require.Len(t, notReset, 1, "once while the cause lasts: %+v", entries)
	assert.Equal(t, "victim", notReset[0].PeerID)
	assert.Equal(t, 3, notReset[0].Rows)
	assert.Zero(t, notReset[0].RowsReset)
	assert.Equal(t, 3, notReset[0].RowsNotReset)
	assert.Equal(t, uint64(6), r.Stats().RowsNotReset, "counted at each attempt")
}
