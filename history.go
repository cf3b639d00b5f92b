package recovery

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testsignal"
)

// The fleet's history: every worker appends what an operator wants to read
// after a bad night (which peer died, who recovered it, how many rows, how
// long it took, what failed, who lost its lease) to one capped Redis stream
// per prefix, <prefix>_HISTORY. `recoveryctl history` and `recoveryctl
// watch` read it, as does ops.ReadHistory.
//
// Appending is never on the hot path: dispatcher.emit hands the few events the
// history records to a bounded queue, and a goroutine of its own (the
// historian, started with the first such event, stopped by Shutdown)
// sends the XADDs. A full queue or a failed XADD drops the entry and
// counts it (Stats.HistoryDropped); a recovery never waits for Redis on
// its account, and never fails because of it.

// historyKind returns the kind of history entry an event makes, and false
// for the events the history does not record.
func historyKind(e Event) (string, bool) {
	switch e.Kind {
	case EventPeerClaimed:
		return store.HistoryKindPeerDead, true
	case EventRowsRecovered:
		return store.HistoryKindRowsRecovered, true
	case EventRecoveryFailed:
		// A scan that failed (PeerID empty) is no recovery; its cause is
		// usually Redis itself.
		return store.HistoryKindRecoveryFailed, e.PeerID != ""
	case EventLeaseLost:
		return store.HistoryKindLeaseLost, true
	case EventLeaseRegained:
		return store.HistoryKindLeaseRegained, true
	case EventRowsNotReset:
		return store.HistoryKindRowsNotReset, true
	case EventStrayRowsReset:
		if e.PeerID != "" { // the owner-column sweep's, of a live worker's ended life
			return store.HistoryKindEndedLifeReset, true
		}
		return store.HistoryKindStrayRowsReset, true
	case EventUntrackedRows:
		return store.HistoryKindUntrackedRows, true
	}
	return "", false
}

// newUID returns an entry's uid: 16 random hex digits.
func newUID() string { return newToken()[:16] }

// maxHistoryError bounds the error message an entry carries.
const maxHistoryError = 1024

// historyFields turns an event into an entry's field-value pairs.
func historyFields(kind, uid string, e Event) []string {
	f := []string{store.HistoryFieldKind, kind, store.HistoryFieldTime, e.Time.UTC().Format(time.RFC3339Nano),
		store.HistoryFieldInstance, e.InstanceID, store.HistoryFieldUID, uid}
	if e.PeerID != "" {
		f = append(f, store.HistoryFieldPeer, e.PeerID)
	}
	if e.FoundBy != "" {
		f = append(f, store.HistoryFieldFoundBy, e.FoundBy)
	}
	switch kind {
	case store.HistoryKindRowsRecovered, store.HistoryKindStrayRowsReset, store.HistoryKindEndedLifeReset:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows), store.HistoryFieldRowsReset, strconv.FormatInt(e.RowsReset, 10),
			store.HistoryFieldQuarantined, strconv.Itoa(e.RowsQuarantined))
	case store.HistoryKindRowsQuarantined:
		f = append(f, store.HistoryFieldQuarantined, strconv.Itoa(e.RowsQuarantined))
	case store.HistoryKindUntrackedRows:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows))
	case store.HistoryKindRowsNotReset:
		f = append(f, store.HistoryFieldRows, strconv.Itoa(e.Rows), store.HistoryFieldRowsReset, strconv.FormatInt(e.RowsReset, 10),
			store.HistoryFieldNotReset, strconv.Itoa(e.RowsNotReset))
	}
	if ids := historyRowIDs(kind, e); len(ids) > 0 {
		f = append(f, store.HistoryFieldRowIDs, joinIDs(ids[:min(len(ids), store.HistoryRowIDsMax)]),
			store.HistoryFieldRowIDsTotal, strconv.Itoa(len(ids)))
	}
	if e.Duration > 0 {
		f = append(f, store.HistoryFieldDurationMs, strconv.FormatFloat(float64(e.Duration)/float64(time.Millisecond), 'f', -1, 64))
	}
	if e.Err != nil {
		msg := e.Err.Error()
		if len(msg) > maxHistoryError {
			msg = msg[:maxHistoryError] + "..."
		}
		f = append(f, store.HistoryFieldError, msg)
	}
	return f
}

// historyRowIDs returns the rows an entry of kind lists (ascending).
func historyRowIDs(kind string, e Event) []int64 {
	switch kind {
	case store.HistoryKindRowsRecovered, store.HistoryKindStrayRowsReset, store.HistoryKindUntrackedRows, store.HistoryKindEndedLifeReset:
		return e.RowIDs
	case store.HistoryKindRowsQuarantined:
		return e.QuarantinedIDs
	}
	return nil
}

// joinIDs writes ids as decimals separated by commas.
func joinIDs(ids []int64) string {
	b := make([]byte, 0, 8*len(ids))
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(b)
}

// historyQueue is how many entries wait for Redis before new ones are
// dropped: an outage's worth of deaths and lease changes of one worker.
const historyQueue = 256

// historyAttempts is how many times an entry is sent while Redis does not
// take it (a heartbeat interval apart, at least a second) before it is
// dropped: 5 minutes at the default interval, so the lease loss that a
// Redis outage caused reaches the stream once Redis is back.
const historyAttempts = 10

// historian appends the history's entries from a goroutine of its own,
// started with the first entry and stopped by close.
type historian struct {
	store  store.Store
	log    *slog.Logger
	maxLen int64
	// running reports whether the Worker's loops run: only then is there
	// a Shutdown to stop the historian's goroutine. A Worker used without
	// Start (ops.RecoverNow from an operator tool) appends inline instead.
	running func() bool
	// opTimeout bounds each XADD; retry is the wait before sending again
	// an entry Redis did not answer.
	opTimeout, retry time.Duration
	sig              *testsignal.Signal[error] // the options' history test signal (testsignals.go)

	mu      sync.Mutex        // guards the fields below and the send on ch
	failing map[string]string // peer → the cause of its last failed recovery, written once
	started bool
	closed  bool
	ch      chan historyItem
	quit    chan struct{} // closed by close: send what is queued once, then end
	abort   context.CancelFunc
	done    chan struct{}

	dropped atomic.Uint64
}

type historyItem struct {
	kind string
	uid  string // the entry's own: every send of it carries the same
	e    Event
}

// newHistorian returns the historian that appends to st with the history
// options of o, or nil when the history is off. running reports whether
// the Worker's loops run (historian.running).
func newHistorian(st store.Store, log *slog.Logger, o *options, running func() bool) *historian {
	if o.historyLen == 0 {
		return nil
	}
	// Retried like a heartbeat, but not more than once a second: the
	// entries are for people, later.
	return &historian{store: st, log: log, maxLen: int64(o.historyLen),
		opTimeout: o.opTimeout, retry: max(o.heartbeatInterval, time.Second),
		running: running, sig: &o.sig.history}
}

// offer queues the entry e makes, if it makes one, without waiting.
func (h *historian) offer(e Event) {
	kind, ok := historyKind(e)
	if !ok {
		return
	}
	items := []historyItem{{kind, newUID(), e}}
	if (kind == store.HistoryKindRowsRecovered || kind == store.HistoryKindStrayRowsReset || kind == store.HistoryKindEndedLifeReset) &&
		e.RowsQuarantined > 0 {
		items = append(items, historyItem{store.HistoryKindRowsQuarantined, newUID(), e})
	}
	if inline := h.queue(kind, e, items); inline {
		// No Start, so maybe no Shutdown: no goroutine of ours may be
		// left behind. Append here, once each, without the lock.
		for _, it := range items {
			h.appendOnce(context.Background(), it)
		}
	}
}

// queue hands items to the historian's goroutine, starting it, or drops
// them; it reports whether the caller must append them itself instead
// (a Worker used without Start).
func (h *historian) queue(kind string, e Event, items []historyItem) (inline bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.repeat(kind, e) {
		return false
	}
	if h.closed {
		h.dropped.Add(uint64(len(items)))
		return false
	}
	if !h.started && h.running != nil && !h.running() {
		return true
	}
	if !h.started {
		h.start()
	}
	for _, it := range items {
		select {
		case h.ch <- it:
		default:
			h.dropped.Add(1)
		}
	}
	return false
}

// maxFailing bounds the peers whose failures repeat remembers.
const maxFailing = 1024

// repeat reports whether the entry only repeats what this worker wrote at
// its last attempt on the same peer: a recovery that keeps failing for the
// same cause is written once (its peer_dead and recovery_failed), not at
// every scan, until it succeeds or the cause changes. h.mu is held.
func (h *historian) repeat(kind string, e Event) bool {
	cause, failed := h.failing[e.PeerID]
	switch kind {
	case store.HistoryKindPeerDead, store.HistoryKindRowsNotReset:
		return failed
	case store.HistoryKindRecoveryFailed:
		msg := ""
		if e.Err != nil {
			msg = e.Err.Error()
		}
		if failed && cause == msg {
			return true
		}
		if h.failing == nil || len(h.failing) >= maxFailing {
			h.failing = make(map[string]string)
		}
		h.failing[e.PeerID] = msg
		if failed { // a new cause: the attempt's peer_dead was held back
			return false
		}
	case store.HistoryKindRowsRecovered:
		delete(h.failing, e.PeerID)
	}
	return false
}

// start starts the goroutine; h.mu is held.
func (h *historian) start() {
	h.started = true
	h.ch = make(chan historyItem, historyQueue)
	h.quit = make(chan struct{})
	h.done = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	h.abort = cancel
	go h.run(ctx)
}

// run appends the queued entries in order until close, then drains.
func (h *historian) run(ctx context.Context) {
	defer close(h.done)
	failing := false
	for {
		select { // close first: a backlog must not be retried at Shutdown
		case <-h.quit:
			h.drain(ctx, failing)
			return
		default:
		}
		select {
		case it := <-h.ch:
			failing = !h.append(ctx, it, failing)
		case <-h.quit:
			h.drain(ctx, failing)
			return
		}
	}
}

// drain sends what is left once each, in order, and drops the rest at the
// first failure: Shutdown waits for at most one failed send here.
func (h *historian) drain(ctx context.Context, failing bool) {
	for {
		select {
		case it := <-h.ch:
			if failing {
				h.dropped.Add(1)
				continue
			}
			failing = !h.appendOnce(ctx, it)
		default:
			return
		}
	}
}

// append sends one entry, again every retry interval while it fails, up
// to historyAttempts times or until close. failing says whether the entry before failed: an outage is
// logged once, at its first failure. It reports whether the entry was
// appended.
func (h *historian) append(ctx context.Context, it historyItem, failing bool) bool {
	for attempt := 1; ; attempt++ {
		err := h.send(ctx, it)
		h.sig.Signal(err) // test signal: a history entry sent
		if err == nil {
			if failing {
				h.log.Info("fleet history appended again", slog.Uint64("history_dropped", h.dropped.Load()))
			}
			return true
		}
		if !failing {
			h.log.Warn("fleet history not appended; entries are kept a while, then dropped",
				slog.String("kind", it.kind), slog.Any("error", err))
			failing = true
		}
		if attempt == historyAttempts {
			h.dropped.Add(1)
			return false
		}
		t := time.NewTimer(h.retry)
		select {
		case <-t.C:
		case <-h.quit:
			t.Stop()
			return h.appendOnce(ctx, it)
		}
	}
}

// appendOnce sends one entry once, dropping it if that fails.
func (h *historian) appendOnce(ctx context.Context, it historyItem) bool {
	if err := h.send(ctx, it); err != nil {
		h.dropped.Add(1)
		return false
	}
	return true
}

func (h *historian) send(ctx context.Context, it historyItem) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	opCtx, cancel := context.WithTimeout(ctx, h.opTimeout)
	defer cancel()
	return h.store.AppendHistory(opCtx, historyFields(it.kind, it.uid, it.e), h.maxLen)
}

// close stops accepting entries and waits, within ctx, until the queued
// ones are sent (once each, the first failure dropping the rest). If ctx
// ends first, the send under way is abandoned and the rest dropped; close
// returns ctx.Err() once the goroutine has ended, which is at once.
func (h *historian) close(ctx context.Context) error {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		if h.started {
			close(h.quit)
		}
	}
	started, done, abort := h.started, h.done, h.abort
	h.mu.Unlock()
	if !started {
		return nil
	}
	defer abort()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		abort()
		<-done
		return ctx.Err()
	}
}
