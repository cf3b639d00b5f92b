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
// their versions (selfcheck.go). The fast looks are limited to
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
	deps     // the settings, the store, the log and the shared parts (worker.go)
	resetter Resetter
	rows     *inflight
	lease    *lease
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

	// The look at short blocks (selfcheck.go).
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
	return inProgress(c.info, s, owner)
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
	if c.sig.look.On() {
		defer c.sig.looked(c, time.Now(), c.checks.Load(), &done) // test signal: a self-check turn ended
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
	inprog, queued := c.info.InProgressStatus, c.info.QueuedStatus
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
	if owner == c.opts.instanceID || !inProgress(c.info, s, c.opts.instanceID) {
		return false
	}
	c.lease.noteBareOwners()
	return true
}

// The self-check's look at short blocks (issue 21). The two-look rule of
// selfcheck.go needs a row tracked across two looks a window apart, so a
// block whose rows leave the in-progress status sooner was never judged: a
// single look cannot tell a row the fetch committed with the wrong status
// from a row finished (done, 'error', queued again) just before its
// Untrack, or whose fetch rolled back. What tells them apart is the row's
// version (xmin) and its state before the fetch:
//
//   - While the configuration is unverified, Track reads the rows it is
//     given (up to preImageSample of them) before it returns: the fetch
//     has not committed (Track comes before the COMMIT), so each row is
//     locked by it and shows its state before the fetch, at version v0.
//   - Looks soon after (quickLook, backing off while the fetch is still
//     open) see the row committed at a new version v1: the fetch's commit,
//     or a later change. A row seen again at v0 and unlocked was rolled
//     back: it proves nothing.
//   - Statuses swapped: the fetch took a row whose status the resetter
//     calls in progress (the real queued one) and committed it with the
//     status the resetter calls queued (the real in-progress one). A
//     correct fetch takes queued rows; this is an alarm at once.
//   - Otherwise, when the host untracks a row whose version v1 was not in
//     progress, one more read: a row at a version other than v1 and not in
//     progress was written again after v1 while tracked, so v1 was not the
//     row's final outcome but its status while the host processed it,
//     which the resetter does not take for in progress (misspelt, or a
//     foreign owner). A host that finishes rows inside its fetch's
//     transaction leaves v1 as it is until Untrack: no alarm.
//
// Rows tracked before the lease was lost, released rows (Release does not
// call Untrack's hook) and rows tracked again are never judged, as in the
// two-look rule.

const (
	// preImageSample bounds the rows Track reads before the fetch commits.
	preImageSample = 8
	// preImageMax bounds the rows remembered with their state before the
	// fetch.
	preImageMax = 256
	// quickLook is the first delay of a look after a Track with images;
	// it doubles while the fetch stays open, up to a tenth of the window.
	quickLook = 5 * time.Millisecond
)

// fetchImage is what the self-check knows of one tracked row's fetch.
type fetchImage struct {
	gen       uint64 // the Track's generation
	before    string // the version before the fetch
	wasInprog bool   // before the fetch, its status was the configured in-progress one
	fetched   bool   // a look saw it committed at a new version:
	after     string // that version
	state     RowState
}

// leavingRow is a row untracked after a look saw its fetch committed with
// a status not in progress: one more read says whether it was changed
// again since.
type leavingRow struct {
	id int64
	im fetchImage
}

// preImages reads the state of ids (the rows of one Track) before the
// fetch commits; it runs in Track, while the configuration is unverified.
func (c *selfChecker) preImages(ctx context.Context, ids []int64) {
	if c.off.Load() || c.verdict.Load() != 0 || !c.fast.Load() {
		return
	}
	c.imu.Lock()
	full := len(c.pre) >= preImageMax
	c.imu.Unlock()
	if full {
		return
	}
	sample := ids[:min(len(ids), preImageSample)]
	gens := c.rows.generations(sample)
	// Bounded well below the operation timeout: Track is on the host's
	// path, inside its fetch, and a pool the fetch has exhausted must not
	// hold it up; a read that does not answer in time judges nothing.
	opCtx, cancel := context.WithTimeout(ctx, min(c.opts.opTimeout, max(c.window()/10, 10*time.Millisecond)))
	ims, err := c.readRows(opCtx, sample)
	cancel()
	c.sig.preread.Signal(err == nil) // test signal: the read ended
	if err != nil {
		c.log.Debug("self-check: cannot read the state of rows being fetched", slog.Any("error", err))
		return
	}
	inprog := c.info.InProgressStatus
	c.imu.Lock()
	for _, m := range ims {
		g, ok := gens[m.ID]
		if !ok || !m.Locked {
			// Not locked: Track after the COMMIT, or before the fetch's
			// UPDATE: the state read is not the one before the fetch.
			continue
		}
		c.pre[m.ID] = &fetchImage{gen: g, before: m.Version, wasInprog: m.Status == inprog}
	}
	c.imu.Unlock()
	c.quick.Store(true)
}

// untracking is Untrack's hook: rows whose fetch a look saw committed with
// a status not in progress are read once more.
func (c *selfChecker) untracking(ids []int64) {
	if c.off.Load() || c.verdict.Load() != 0 {
		return
	}
	gens := c.rows.generations(ids)
	queued := c.info.QueuedStatus
	asked := false
	c.imu.Lock()
	for _, id := range ids {
		im, ok := c.pre[id]
		if !ok {
			continue
		}
		delete(c.pre, id)
		// A fetch that committed the queued status with a row that was
		// queued before is a host giving the row back inside its fetch:
		// nothing to judge.
		if im.fetched && gens[id] == im.gen && im.state.Status != queued && len(c.leaving) < preImageMax {
			c.leaving = append(c.leaving, leavingRow{id: id, im: *im})
			asked = true
		}
	}
	c.imu.Unlock()
	if asked {
		c.quick.Store(true)
		c.tracked()
	}
}

// sawFetch records what a look saw of the rows with images: the fetch's
// committed version. It returns the row whose fetch swapped the statuses,
// if any. states are the rows read unlocked; the caller checked the lease.
func (c *selfChecker) sawFetch(states []RowState) (RowState, *fetchImage, bool) {
	queued := c.info.QueuedStatus
	c.imu.Lock()
	defer c.imu.Unlock()
	for _, s := range states {
		im, ok := c.pre[s.ID]
		if !ok {
			continue
		}
		if g, ok := c.rows.settledGeneration(s.ID); !ok || g != im.gen {
			delete(c.pre, s.ID) // untracked, released or taken again
			continue
		}
		if im.fetched || s.Locked || s.Version == im.before {
			continue // judged already, or the fetch not committed (or rolled back)
		}
		im.fetched, im.after, im.state = true, s.Version, s
		if im.wasInprog && s.Status == queued && !c.inProgress(s, c.opts.instanceID) {
			return s, im, true
		}
	}
	return RowState{}, nil, false
}

// pendingFetches reports whether a row with an image has not been seen
// committed yet.
func (c *selfChecker) pendingFetches() bool {
	c.imu.Lock()
	defer c.imu.Unlock()
	for _, im := range c.pre {
		if !im.fetched {
			return true
		}
	}
	return false
}

// judgeLeaving reads the rows untracked since the last look once more; it
// reports whether it raised the alarm.
func (c *selfChecker) judgeLeaving(ctx context.Context) bool {
	c.imu.Lock()
	rows := c.leaving
	c.leaving = nil
	c.imu.Unlock()
	if len(rows) == 0 {
		return false
	}
	loss := c.rows.lossGeneration()
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	dbCtx, cancel := context.WithTimeout(ctx, c.opts.resetTimeout)
	ims, err := c.readRows(dbCtx, ids)
	cancel()
	if err != nil {
		c.log.Debug("self-check: cannot read the state of rows just untracked", slog.Any("error", err))
		return false
	}
	c.checks.Add(1)
	if !c.lease.valid() || c.rows.lossGeneration() != loss {
		return false // a recoverer may have reset them
	}
	by := make(map[int64]RowState, len(ims))
	for _, m := range ims {
		by[m.ID] = m
	}
	queued := c.info.QueuedStatus
	for _, r := range rows {
		m, ok := by[r.id]
		if !ok || m.Locked || r.im.gen <= loss || m.Version == r.im.after || c.inProgress(m, c.opts.instanceID) {
			continue
		}
		// Evidence only if the status itself moved on, and not back to
		// the queue: a completion in two statements (a status, then a
		// column of its own) changes the version only, and a retry job
		// may give a row the fetch failed back to the queue before the
		// host's Untrack. What the look saw may then have been the
		// completion's status, not the fetch's.
		if (m.Status == r.im.state.Status || m.Status == queued) && !mutantMisspeltOnAnyChange {
			continue
		}
		c.raiseBecause(r.im.state, fmt.Sprintf("was committed by its fetch with a status not in progress and changed again (to %q) before its Untrack, so the fetch's status is the one the table uses for rows in progress",
			clip(m.Status)), len(ims))
		return true
	}
	return false
}

// unverifiedHold keeps a worker whose self-check has no verdict yet from
// recovering a dead peer whose rows read as the queued status. With
// statuses swapped, a dead peer's rows in progress show the status the
// resetter calls queued: the reset would count them settled and drop the
// peer's rows set, before the self-check (which needs a block of this
// worker's own) could raise the alarm that holds every verdict
// (recoverDeadLives). So, while unverified (and running), the recovery
// first reads the state of up to maxStaleSample of the peer's rows; if
// none reads as in progress and one reads as the queued status it is held (an error: the claim goes back, the set and the
// registry entry stay) until this worker has seen a row of its own in
// progress, or a worker whose configuration is verified takes the scan
// turn, for at most a heartbeat TTL after Start. In a correct fleet such a
// row is one whose fetch rolled back, or that its host gave back, before
// it untracked it: the hold only delays it. Start's recovery of its own
// predecessor is not held.
func (c *selfChecker) unverifiedHold(ctx context.Context, peer string, ids []int64) error {
	if c == nil || c.off.Load() || c.verdict.Load() != 0 || !c.running() {
		return nil // verified, alarmed (recoverDeadLives holds), or RecoverNow before Start
	}
	if time.Since(time.Unix(0, c.runningSince.Load())) >= c.fleet.ttl() && !mutantUnboundedUnverifiedHold {
		// Long enough: a worker that fetched nothing in a TTL (an idle
		// fleet) would otherwise hold the peer for good, and its rows
		// set would hold the backstop sweep too. A worker whose statuses
		// are swapped and that has not fetched yet now counts the
		// peer's rows settled: they are then in progress in no set, and
		// a worker configured right resets them with its backstop sweep.
		return nil
	}
	dbCtx, cancel := context.WithTimeout(ctx, c.opts.resetTimeout)
	states, err := c.readRows(dbCtx, ids[:min(len(ids), maxStaleSample)])
	cancel()
	if err != nil {
		// The reset reports what is wrong with the table; the hold is
		// only a precaution.
		c.log.Debug("recovery: cannot read the state of a dead peer's rows", slog.String("peer_id", peer), slog.Any("error", err))
		return nil
	}
	var queued *RowState
	for i, s := range states {
		if inProgress(c.info, s, peer) {
			return nil // one row as the resetter expects: nothing swapped
		}
		if queued == nil && s.Status == c.info.QueuedStatus {
			queued = &states[i]
		}
	}
	if queued == nil {
		return nil
	}
	return fmt.Errorf("%w: recovery of %s held: none of its rows is in progress by the resetter's statuses and row %d reads as the queued status %q, and this worker has not yet seen a row of its own in progress (statuses swapped?); left to a worker whose configuration is verified, or to this one once it is",
		errUnverified, peer, queued.ID, clip(queued.Status))
}

// errUnverified is wrapped by the error of a recovery unverifiedHold held.
var errUnverified = errors.New("recovery: configuration not verified yet")
