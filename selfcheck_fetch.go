package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

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
	c.opts.sig.preread.Signal(err == nil) // test signal: the read ended
	if err != nil {
		c.log.Debug("self-check: cannot read the state of rows being fetched", slog.Any("error", err))
		return
	}
	inprog := c.opts.info.InProgressStatus
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
	queued := c.opts.info.QueuedStatus
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
	queued := c.opts.info.QueuedStatus
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
	queued := c.opts.info.QueuedStatus
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
		if inProgress(c.opts.info, s, peer) {
			return nil // one row as the resetter expects: nothing swapped
		}
		if queued == nil && s.Status == c.opts.info.QueuedStatus {
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
