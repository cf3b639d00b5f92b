package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// The self-check finds the configuration mistakes no catalogue can show:
// statuses swapped, a misspelt status in a text column, an owner column
// filled with something other than InstanceID(). Such a worker's rows do
// not look like its rows in progress to the resetter, and recovery would
// leave them alone (swapped: they look queued; foreign owner: they look
// taken) or keep failing on them. The worker itself reads, off the hot
// path, the state of rows it has tracked for a while, once a heartbeat
// interval, until it has seen one row as the resetter expects: status in
// progress (and, with an owner column, owned by this worker). A row that
// fails that at two checks in a row, tracked all along, is an alarm.
//
// Why two checks: a host marks a row done and then calls Untrack; between
// the two, the row is tracked and no longer in progress. A row tracked
// across two checks, an interval apart, and still not in progress at both
// would need a host that takes longer than a heartbeat interval from its
// completion COMMIT to its Untrack.

// A RowStateReader is a RowResetter that can read the state of rows, for
// the worker's self-check. PgxResetter implements it.
type RowStateReader interface {
	RowResetter
	// RowStates returns the status (and owner, if the resetter knows
	// owners) of each of ids that exists.
	RowStates(ctx context.Context, ids []int64) ([]RowState, error)
	// InProgress reports whether a row in state s is one the resetter
	// would reset as in progress for instance owner.
	InProgress(s RowState, owner string) bool
}

// selfCheckSample bounds how many rows one self-check reads.
const selfCheckSample = 64

// selfChecker is the self-check loop.
type selfChecker struct {
	w       *Worker
	reader  RowStateReader
	alarm   atomic.Pointer[error] // set once a mismatch is confirmed
	checks  atomic.Uint64         // row-state reads made
	verdict atomic.Int32          // 0 pending, 1 verified, 2 alarm
	// before are the rows tracked at the previous check, suspect those of
	// them found not in progress. Only runOnce touches them.
	before, suspect map[int64]bool
}

// run checks the worker's own rows every heartbeat interval until the
// configuration is verified or found wrong, or ctx ends.
func (c *selfChecker) run(ctx context.Context) {
	t := time.NewTicker(c.w.opts.heartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.runOnce(ctx) {
			return
		}
	}
}

// runOnce is one check; it reports whether the check is over.
func (c *selfChecker) runOnce(ctx context.Context) (done bool) {
	var tracked, notInProgress map[int64]bool
	tracked, notInProgress, done = c.check(ctx, c.before, c.suspect)
	c.before, c.suspect = tracked, notInProgress
	return done
}

// check compares the rows tracked at the previous check with their state
// now. It returns the rows tracked now and the rows found not in progress,
// for the next, and whether the check is over.
func (c *selfChecker) check(ctx context.Context, before, suspect map[int64]bool) (tracked, notInProgress map[int64]bool, done bool) {
	w, reader := c.w, c.reader
	tracked = w.rows.sampleSettled(selfCheckSample)
	var candidates []int64
	for id := range tracked {
		if before[id] {
			candidates = append(candidates, id) // tracked for an interval at least
		}
	}
	if len(candidates) == 0 {
		return tracked, nil, false
	}
	dbCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	states, err := reader.RowStates(dbCtx, candidates)
	cancel()
	if err != nil {
		w.log.Debug("self-check: cannot read the state of tracked rows", slog.Any("error", err))
		return before, suspect, false // try again with the same rows
	}
	c.checks.Add(1)
	still := w.rows.generations(candidates) // rows untracked during the read are out
	notInProgress = make(map[int64]bool)
	var first *RowState
	for i := range states {
		s := states[i]
		if _, ok := still[s.ID]; !ok {
			continue
		}
		if reader.InProgress(s, w.opts.instanceID) {
			c.verdict.Store(1)
			w.log.Debug("self-check: tracked rows look in progress by this worker", slog.Int64("row_id", s.ID))
			return tracked, nil, true
		}
		notInProgress[s.ID] = true
		if suspect[s.ID] && first == nil {
			first = &states[i]
		}
	}
	if first == nil {
		return tracked, notInProgress, false
	}
	err = fmt.Errorf("%w: row %d, tracked by %s for two heartbeat intervals, has status %q and owner %q, which the resetter does not take for a row in progress by this worker: check WithStatuses, the owner column (the fetch must set it to InstanceID()) and the status the fetch writes",
		ErrMisconfigured, first.ID, w.opts.instanceID, clip(first.Status), clip(first.Owner))
	c.alarm.Store(&err)
	c.verdict.Store(2)
	w.stats.misconfigured.Add(1)
	w.log.Error("self-check: the rows this worker tracks do not look like its rows in progress; a crash would leave them stuck",
		slog.Int64("row_id", first.ID), slog.String("status", clip(first.Status)), slog.String("owner", clip(first.Owner)),
		slog.Int("rows_checked", len(states)), slog.Int("rows_not_in_progress", len(notInProgress)))
	w.emit(Event{Kind: EventMisconfigured, Rows: len(notInProgress), Err: err})
	return tracked, notInProgress, true
}

// misconfigured returns the self-check's alarm, or nil.
func (w *Worker) misconfigured() error {
	if w.checker == nil {
		return nil
	}
	if p := w.checker.alarm.Load(); p != nil {
		return *p
	}
	return nil
}

// ErrMisconfigured is wrapped by Healthy's error once the worker's
// self-check found that the rows it tracks do not look, to its resetter,
// like rows in progress by this worker: statuses swapped or misspelt, or an
// owner column not set to InstanceID(). A crash would leave such rows
// stuck.
var ErrMisconfigured = errors.New("recovery: tracked rows do not match the resetter's configuration")
