package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The self-check finds the configuration mistakes no catalogue can show:
// statuses swapped, a misspelt status in a text column, an owner column
// filled with something other than OwnerValue() (or InstanceID()). Such a worker's rows do
// not look like its rows in progress to the resetter, and recovery would
// leave them alone (swapped: they look queued; foreign owner: they look
// taken) or keep failing on them. The worker itself reads, off the hot
// path, the state of rows it tracks, until it has seen one row as the
// resetter expects: status in progress (and, with an owner column, owned
// by this worker). A row that fails that at two looks at least the
// self-check window apart (Timings.SelfCheckWindow, 500 ms by default),
// tracked all along under the same Track, is an alarm.
//
// When it looks. A Track while the configuration is still unverified asks
// for a look shortly after (a tenth of the window: the fetch's COMMIT
// follows its Track), a row seen not in progress asks for another a window
// later, and, besides, a look runs once a heartbeat interval. So the first
// block is judged about a window after its COMMIT (0.55 s by default)
// provided its rows stay tracked that long; shorter blocks are judged by
// their versions (selfcheck_fetch.go). The fast looks are limited to
// selfCheckFastLooks per worker, then only the heartbeat's remain.
//
// Why two looks: a host marks a row done (or failed, or queued again) and
// then calls Untrack; between the two, the row is tracked and not in
// progress. A row tracked across two looks a window apart, and not in
// progress at both, would need a host that takes longer than the window
// from its completion COMMIT to its Untrack, on rows none of which was
// ever seen in progress. Rows tracked when the lease was lost are never
// judged (a recoverer may have reset them), nor are rows a transaction is
// writing: the PostgreSQL resetters read with FOR SHARE SKIP LOCKED, so an
// uncommitted fetch shows nothing rather than its rows' queued state.

// The self-check reads rows through the resetter's RowStates: their
// committed state and version, and whether another session held them
// locked. A resetter that cannot read rows says so at Start (RowStates of
// no row returns an error wrapping errors.ErrUnsupported): the self-check
// is then off, Start logs it at Warn, and Healthy never reports
// ErrMisconfigured.

const (
	// selfCheckSample bounds how many rows one look reads.
	selfCheckSample = 64
	// selfCheckFastLooks bounds the looks a worker makes besides the
	// heartbeat interval's, while its configuration is unverified.
	selfCheckFastLooks = 64
)

// sighting is a row seen not in progress: under which Track, when the
// look that saw it ended, and what it held.
type sighting struct {
	gen   uint64
	at    time.Time
	state RowState
}

// selfChecker is the self-check loop.
type selfChecker struct {
	resetter Resetter
	opts     *options // read-only after New
	log      *slog.Logger
	rows     *inflight
	lease    *lease
	fleet    *fleetView
	stats    *counters
	events   *dispatcher
	// running reports whether the Worker's loops run (unverifiedHold).
	running func() bool
	// runningSince is when Start ended (Unix nanoseconds): a worker that
	// has not verified its configuration holds suspect recoveries only
	// for a heartbeat TTL after it (unverifiedHold).
	runningSince atomic.Int64

	alarm atomic.Pointer[error] // set once a mismatch is confirmed
	// off is set once the resetter said it cannot read rows
	// (errors.ErrUnsupported): the self-check has stopped.
	off    atomic.Bool
	checks atomic.Uint64 // row-state reads made
	// sightings counts rows seen tracked and not in progress.
	sightings atomic.Uint64
	verdict   atomic.Int32 // 0 pending, 1 verified, 2 alarm
	// fresh is signalled by Track while fast looks are on (fast).
	fresh chan struct{}
	fast  atomic.Bool
	// Only the loop touches the rest.
	fastLeft int
	seen     map[int64]sighting
	// skipped is set when the last look could not read a tracked row: a
	// transaction (its fetch, not committed yet) was writing it.
	skipped bool
	backoff time.Duration // the delay of the next quick look

	// The look at short blocks (selfcheck_fetch.go).
	quick   atomic.Bool // a look is asked for soon (quickLook)
	imu     sync.Mutex
	pre     map[int64]*fetchImage // guarded by imu
	leaving []leavingRow          // guarded by imu
}

// init readies a self-check built with its dependencies: fast looks on,
// nothing seen yet.
func (c *selfChecker) init() *selfChecker {
	c.fresh, c.fastLeft = make(chan struct{}, 1), selfCheckFastLooks
	c.seen, c.pre = make(map[int64]sighting), make(map[int64]*fetchImage)
	c.fast.Store(true)
	return c
}

// inProgress reports whether a row in state s is one the resetter would
// reset as in progress for owner.
func (c *selfChecker) inProgress(s RowState, owner string) bool {
	return inProgress(c.opts.info, s, owner)
}

// probe asks the resetter, at Start, whether it reads rows at all:
// RowStates of no row. One that cannot (an error wrapping
// errors.ErrUnsupported) gets no self-check, said once at Warn; any other
// answer leaves the self-check on. Only this probe decides: a later read
// that fails, whatever its error, is a failed look and nothing more (a
// network error can wrap ENOTSUP, which matches errors.ErrUnsupported).
func (c *selfChecker) probe(ctx context.Context) {
	if c.off.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.resetTimeout)
	defer cancel()
	if _, err := c.resetter.RowStates(ctx, nil); errors.Is(err, errors.ErrUnsupported) {
		c.off.Store(true)
		c.fast.Store(false)
		c.log.Warn("the resetter reads no rows (RowStates returned errors.ErrUnsupported at Start): no self-check, so Healthy cannot catch a host whose rows a recovery would not reset (statuses swapped or misspelt, the owner column not set)",
			slog.String("resetter_type", fmt.Sprintf("%T", c.resetter)), slog.Any("error", err))
	}
}

// readRows reads the rows of ids through the resetter.
func (c *selfChecker) readRows(ctx context.Context, ids []int64) ([]RowState, error) {
	return c.resetter.RowStates(ctx, ids)
}

// tracked tells the loop that rows were just tracked; it never blocks.
func (c *selfChecker) tracked() {
	if !c.fast.Load() {
		return
	}
	select {
	case c.fresh <- struct{}{}:
	default: // a look is asked for already
	}
}

// window is the self-check window (Timings.SelfCheckWindow).
func (c *selfChecker) window() time.Duration { return c.opts.selfCheckWindow }

// run looks at the worker's own rows when a Track or a sighting asks for
// it and once a heartbeat interval, until the configuration is verified or
// found wrong, or ctx ends.
func (c *selfChecker) run(ctx context.Context) {
	slow := time.NewTicker(c.opts.heartbeatInterval)
	defer slow.Stop()
	soon := time.NewTimer(time.Hour)
	soon.Stop()
	defer soon.Stop()
	var due time.Time // when soon fires; zero when it is not set
	arm := func(at time.Time) {
		if !due.IsZero() && !at.Before(due) {
			return
		}
		due = at
		soon.Reset(time.Until(at))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.fresh:
			if c.quick.Swap(false) {
				c.backoff = min(quickLook, c.window()/10)
				arm(time.Now().Add(max(c.backoff, time.Millisecond)))
				continue
			}
			arm(time.Now().Add(max(c.window()/10, time.Millisecond)))
			continue
		case <-soon.C:
			due = time.Time{}
			if c.fastLeft--; c.fastLeft <= 0 {
				c.fast.Store(false)
			}
		case <-slow.C:
		}
		if c.runOnce(ctx) || c.off.Load() {
			return
		}
		if c.fastLeft <= 0 {
			continue
		}
		if c.skipped && c.pendingFetches() {
			// A fetch still open: look again soon, backing off.
			c.backoff = min(2*c.backoff, c.window()/10)
			arm(time.Now().Add(max(c.backoff, time.Millisecond)))
		} else if c.skipped {
			arm(time.Now().Add(max(c.window()/10, time.Millisecond))) // their fetch will have committed
		}
		if at, ok := c.confirmAt(); ok {
			arm(at)
		}
	}
}

// confirmAt is when the earliest sighting can be confirmed.
func (c *selfChecker) confirmAt() (time.Time, bool) {
	var first time.Time
	for _, s := range c.seen {
		if first.IsZero() || s.at.Before(first) {
			first = s.at
		}
	}
	return first.Add(c.window()), !first.IsZero()
}

// runOnce is one look; it reports whether the self-check is over.
func (c *selfChecker) runOnce(ctx context.Context) (done bool) {
	if c.opts.sig.look.On() {
		defer c.opts.sig.looked(c, time.Now(), c.checks.Load(), &done) // test signal: a self-check turn ended
	}
	if c.lease.valid() && c.judgeLeaving(ctx) {
		return true
	}
	ids := c.lookIDs()
	c.skipped = false
	if len(ids) == 0 {
		return false
	}
	if !c.lease.valid() {
		c.lease.noteLeaseLoss(nil) // a paused process may look before its heartbeat loop notes it
		return false
	}
	loss := c.rows.lossGeneration()
	before := c.rows.generations(ids)
	start := time.Now()
	images, states, err := c.readStates(ctx, ids)
	if err != nil {
		c.log.Debug("self-check: cannot read the state of tracked rows", slog.Any("error", err))
		return false // the sightings stand; the next look reads them again
	}
	end := time.Now()
	c.checks.Add(1)
	if !c.lease.valid() || c.rows.lossGeneration() != loss {
		return false // a recoverer may have reset them while the read ran
	}
	after := c.rows.generations(ids)
	c.skipped = len(states) < len(after)
	if c.swappedStatuses(images, states, before, after) {
		return true
	}
	return c.judgeStates(states, before, after, start, end)
}

// lookIDs returns the rows a look reads: those sighted before and still
// tracked under the same generation, then the newest settled ones, up to
// selfCheckSample.
func (c *selfChecker) lookIDs() []int64 {
	ids := make([]int64, 0, selfCheckSample)
	for id, s := range c.seen {
		if g, ok := c.rows.settledGeneration(id); ok && g == s.gen {
			ids = append(ids, id)
		} else {
			delete(c.seen, id) // untracked, or taken again: it proved nothing
		}
	}
	return append(ids, c.rows.newestSettled(selfCheckSample-len(ids), c.seen)...)
}

// readStates reads the rows' images, and returns them with the states of
// those no other session held locked.
func (c *selfChecker) readStates(ctx context.Context, ids []int64) (images, states []RowState, err error) {
	dbCtx, cancel := context.WithTimeout(ctx, c.opts.resetTimeout)
	defer cancel()
	images, err = c.readRows(dbCtx, ids)
	for _, m := range images {
		if !m.Locked {
			states = append(states, m)
		}
	}
	return images, states, err
}

// swappedStatuses raises the alarm, and reports true, when the look's
// images show a fetch that committed the status taken for queued over
// the one taken for in progress, and no row of the same look is in
// progress by this worker.
func (c *selfChecker) swappedStatuses(images, states []RowState, before, after map[int64]uint64) bool {
	swapped, _, bad := c.sawFetch(images)
	if bad && !mutantSwappedBeatsInProgress {
		// A row of the same look in progress by this worker is the
		// stronger evidence: a correct fetch may take a row left in
		// progress by a dead run (a visibility timeout) and give it back
		// to the queue inside the fetch, which reads like swapped
		// statuses for that row alone.
		for _, s := range states {
			g, ok := before[s.ID]
			if !ok || after[s.ID] != g {
				continue
			}
			if owner := c.rows.ownerOf(s.ID, c.opts.instanceID); c.inProgress(s, owner) || c.bareOwned(s, owner) {
				bad = false
				break
			}
		}
	}
	if bad {
		c.raiseBecause(swapped, "was committed by its fetch with the status the resetter takes for queued, and had the one it takes for in progress before the fetch", len(images))
	}
	return bad
}

// judgeStates holds the states a look began at start read (by end)
// against the sightings before: a row in progress by this worker ends
// the self-check; one not in progress at two looks a window apart raises
// the alarm. It reports whether the self-check is over.
func (c *selfChecker) judgeStates(states []RowState, before, after map[int64]uint64, start, end time.Time) bool {
	for _, s := range states {
		g, ok := before[s.ID]
		if !ok || after[s.ID] != g {
			delete(c.seen, s.ID) // untracked or taken again during the read
			continue
		}
		if owner := c.rows.ownerOf(s.ID, c.opts.instanceID); c.inProgress(s, owner) || c.bareOwned(s, owner) {
			c.verdict.Store(1)
			c.fast.Store(false)
			c.log.Debug("self-check: tracked rows look in progress by this worker", slog.Int64("row_id", s.ID))
			return true
		}
		prev, seen := c.seen[s.ID]
		if !seen || prev.gen != g {
			c.seen[s.ID] = sighting{gen: g, at: end, state: s}
			c.sightings.Add(1)
			continue
		}
		if start.Sub(prev.at) >= c.window() {
			c.raiseBecause(s, fmt.Sprintf("was not in progress at two looks %v apart", start.Sub(prev.at).Round(time.Millisecond)), len(states))
			return true
		}
	}
	return false
}

// raiseBecause records the alarm about row s; what says what was seen of
// it, and read rows were read.
func (c *selfChecker) raiseBecause(s RowState, what string, read int) {
	inprog, queued := c.opts.info.InProgressStatus, c.opts.info.QueuedStatus
	expect := fmt.Sprintf(" (the resetter takes status %q for in progress", inprog)
	switch s.Status {
	case queued:
		expect += fmt.Sprintf(", and %q for queued: statuses swapped?)", queued)
	case inprog:
		expect += ": the owner differs)"
	default:
		expect += ": misspelt?)"
	}
	err := fmt.Errorf("%w: row %d, tracked by %s, %s: it has status %q and owner %q%s; check WithStatuses, the owner column (the fetch must set it to OwnerValue()) and the status the fetch writes",
		ErrMisconfigured, s.ID, c.opts.instanceID, what, clip(s.Status), clip(s.Owner), expect)
	c.alarm.Store(&err)
	c.verdict.Store(2)
	c.fast.Store(false)
	c.stats.misconfigured.Add(1)
	attrs := []any{slog.Int64("row_id", s.ID), slog.String("status", clip(s.Status)), slog.String("owner", clip(s.Owner))}
	if expect != "" {
		attrs = append(attrs, slog.String("expected", strings.Trim(expect, " ()")))
	}
	attrs = append(attrs, slog.Int("rows_checked", read), slog.Int("rows_not_in_progress", len(c.seen)))
	c.log.Error("self-check: the rows this worker tracks do not look like its rows in progress; a crash would leave them stuck", attrs...)
	c.events.emit(Event{Kind: EventMisconfigured, Rows: len(c.seen), Err: err})
}

// alarmErr returns the self-check's alarm, or nil (also on a nil c).
func (c *selfChecker) alarmErr() error {
	if c == nil {
		return nil
	}
	if p := c.alarm.Load(); p != nil {
		return *p
	}
	return nil
}

// bareOwned reports whether row s, tracked under per-life owner value
// owner, is in progress under the bare instance ID instead: the host writes
// InstanceID(), which every recovery of this worker resets too, so the
// configuration is right but a regained lease must be held
// (noteBareOwners).
func (c *selfChecker) bareOwned(s RowState, owner string) bool {
	if owner == c.opts.instanceID || !inProgress(c.opts.info, s, c.opts.instanceID) {
		return false
	}
	c.lease.noteBareOwners()
	return true
}
