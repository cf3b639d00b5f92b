//go:build sim || simmutants

package recovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// The deterministic simulation's PostgreSQL: the rows table the host
// fetches from and the resetter resets, with pgxreset.Resetter's semantics
// (pgx_sql.go, pgx_resetter.go, pgx_ledger.go): the status guard, the owner
// guard and owner = NULL on reset (WithOwnerColumn), the recovery count
// and quarantine (WithRecoveryCountColumn, WithMaxRecoveries), the reset
// ledger without an owner column, the rows "not reset", ResetOwner and
// the owners of rows in progress. Each transaction runs atomically at one
// instant of the fake clock, under the world's lock: serializable, which
// PostgreSQL's row locks in ID order give the resetter's statements (a
// fetch's uncommitted rows are still queued to every other statement, so
// no reset ever waits on one). simConn.pg draws the faults: the database
// down, slow, or losing a COMMIT's acknowledgement after the commit.

// Row statuses.
const (
	stQueued = "queued"
	stInprog = "inprog"
	stDone   = "done"
	stFailed = "failed" // quarantined
)

type simRow struct {
	status string
	owner  string // "" is NULL
	count  int    // recovery count
	xmin   int    // the row's version: changed by every write (PostgreSQL's xmin)
	// Bookkeeping of the simulation, not columns.
	takes    int      // committed fetches
	taker    *simProc // the process of the last committed fetch
	takenAt  time.Time
	lockedBy *simProc // an open fetch transaction holds the row
	// lockTill: a session whose host vanished holds the row locked until
	// then (the vanish fault class): an open completion transaction the
	// server ends at its idle_in_transaction_session_timeout.
	lockTill    time.Time
	completions int      // guarded completions that changed the row
	resets      int      // resets that changed the row (recovery and Release)
	doneBy      *simProc // who completed it
}

// simTable is the rows table and the reset ledger.
type simTable struct {
	rows   map[int64]*simRow
	fenced bool // WithOwnerColumn
	ledger bool // the reset ledger (no owner column)
	maxRec int  // WithMaxRecoveries; 0 off
	// recorded is the ledger: instance, incarnation, row.
	recorded map[ledgerKey]bool
}

// locked reports whether another session holds the row locked: a
// vanished session's transaction (resets pass over it with SKIP LOCKED).
func (r *simRow) locked() bool { return time.Now().Before(r.lockTill) }

// errSimLockTimeout is a reset that waited on a row lock (the mutation
// lockWait) until its lock_timeout or deadline.
var errSimLockTimeout = errors.New("sim: canceling statement due to lock timeout")

// waitOnLock plays the mutation lockWait: a reset that meets a locked row
// waits for it until its context ends, then fails, having changed nothing.
func (r *simResetter) waitOnLock(ctx context.Context, waited bool) error {
	if !waited {
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errSimLockTimeout, ctx.Err())
	case <-time.After(simReset): // lock_timeout
		return errSimLockTimeout
	}
}

// skipLocked reports whether the reset passes over row, locked by a
// vanished session, and lists it in NotReset (Locked) unless the mutation
// lockedSettled counts it settled; with the mutation lockWait it sets
// *waited instead, and the caller changes nothing.
func (r *simResetter) skipLocked(id int64, row *simRow, res *ResetResult, waited *bool) bool {
	if !row.locked() || row.status != stInprog {
		return false
	}
	m := r.p.world.mut
	if m.lockWait {
		*waited = true
		return true
	}
	if !m.lockedSettled {
		res.NotReset = append(res.NotReset, RowState{ID: id, Status: row.status, Owner: row.owner, Locked: true})
	}
	return true
}

type ledgerKey struct {
	instance, incarnation string
	row                   int64
}

func newSimTable(n int, fenced, ledger bool, maxRec int) *simTable {
	t := &simTable{rows: map[int64]*simRow{}, fenced: fenced, ledger: ledger, maxRec: maxRec, recorded: map[ledgerKey]bool{}}
	for id := int64(1); id <= int64(n); id++ {
		t.rows[id] = &simRow{status: stQueued}
	}
	return t
}

func (t *simTable) ids() []int64 { return slices.Sorted(maps.Keys(t.rows)) }

// settled is the rest query's test: queued, done, quarantined, or (with
// owner fencing) owned by another instance: an owner that is not NULL
// (issue 20.1; the mutation noUnowned takes NULL for another owner).
func (t *simTable) settled(r *simRow, owner string, fenced, noUnowned bool) bool {
	switch r.status {
	case stQueued, stDone:
		return true
	case stFailed:
		if t.maxRec > 0 {
			return true
		}
	}
	return fenced && (r.owner != "" || noUnowned) && !sameOwner(r.owner, owner)
}

// simResetter is one process's pgxreset.Resetter over the simulated table.
type simResetter struct {
	p *simProc
}

var _ Resetter = (*simResetter)(nil)

// fenced reports whether this process's resetter has the owner column:
// with it, during a rollout, only the new workers' (setsOwner).
func (r *simResetter) fenced() bool { return r.p.setsOwner() }

// fleetIdentity tells what the fleet serves only in the foreign fault
// class: elsewhere Start records nothing, so the runs of earlier seeds are
// unchanged.
func (r *simResetter) fleetIdentity(context.Context) (string, error) {
	if r.p.world.cfg.foreign {
		return simServes, nil
	}
	return "", nil
}

// Info is pgxreset.Resetter.Info: owner fencing with the owner column, the
// ledger without it (then Release is safe after a lost lease without
// fencing too: releaseSafeAfterLoss), both lists of rows in progress, and
// no dry run.
func (r *simResetter) Info() ResetterInfo {
	return ResetterInfo{Name: "simResetter", OwnerFencing: r.fenced(), Ledger: r.p.world.table.ledger && !r.fenced(),
		ListsInProgress: true, InProgressStatus: stInprog, QueuedStatus: stQueued}
}

// Check checks no schema and no session: it tells what the fleet serves
// (fleetIdentity). The simulated sessions never idle in a transaction.
func (r *simResetter) Check(ctx context.Context, _ bool) (ResetterInfo, error) {
	info := r.Info()
	serves, err := r.fleetIdentity(ctx)
	if err != nil {
		return info, err
	}
	info.Serves, info.IdleInTxTimeout = serves, time.Minute
	return info, nil
}

// PlanReset is not supported: the simulated resetter has no dry run.
func (r *simResetter) PlanReset(context.Context, PlanRequest) (ResetResult, error) {
	return ResetResult{}, fmt.Errorf("simResetter has no dry run: %w", errors.ErrUnsupported)
}

// ResetRows is pgxreset.Resetter.ResetRows, in one transaction.
func (r *simResetter) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	if len(req.RowIDs) == 0 {
		return ResetResult{}, nil
	}
	ids := slices.Clone(req.RowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var res ResetResult
	var waited bool
	err := r.p.conn.pg(ctx, "reset", true, func(t *simTable) {
		res, waited = ResetResult{}, false
		fenced, mut := r.fenced(), r.p.world.mut.noUnowned
		ledger := t.ledger && req.Incarnation != "" && !fenced
		// With an owner column, the rows without an owner that a dead
		// peer's rows set lists are reset too: without a ledger for an
		// unknown incarnation, under it for a known one, and not at all
		// without the ledger table (pgResetter.unownedReset).
		unowned := false
		if fenced && req.FromRowsSet && !mut && slices.ContainsFunc(ids, func(id int64) bool {
			row := t.rows[id]
			return row != nil && row.status == stInprog && row.owner == ""
		}) {
			unowned = req.Incarnation == "" || t.ledger
			ledger = req.Incarnation != "" && t.ledger
		}
		if ledger {
			ids = slices.DeleteFunc(ids, func(id int64) bool {
				return t.recorded[ledgerKey{req.InstanceID, req.Incarnation, id}]
			})
		}
		skipped := map[int64]bool{}
		for _, id := range ids {
			if row := t.rows[id]; row != nil && r.matches(row, req.InstanceID, fenced, unowned) && r.skipLocked(id, row, &res, &waited) {
				skipped[id] = true
			}
		}
		if waited {
			res = ResetResult{}
			return
		}
		for _, id := range ids {
			row := t.rows[id]
			if row == nil || skipped[id] || !r.matches(row, req.InstanceID, fenced, unowned) {
				continue
			}
			r.apply(t, id, row, req.InstanceID, false, &res)
			if ledger {
				t.recorded[ledgerKey{req.InstanceID, req.Incarnation, id}] = true
			}
		}
		for _, id := range ids {
			if row := t.rows[id]; row != nil && !skipped[id] && !t.settled(row, req.InstanceID, fenced, mut) {
				res.NotReset = append(res.NotReset, RowState{ID: id, Status: row.status, Owner: row.owner})
			}
		}
		r.p.world.tracef("%s reset %s/%s rows %v: changed %d, quarantined %v, not reset %d",
			r.p, req.InstanceID, short(req.Incarnation), ids, res.Changed, res.Quarantined, len(res.NotReset))
	})
	if err == nil {
		err = r.waitOnLock(ctx, waited)
	}
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows of %s: %w", req.InstanceID, err)
	}
	return res, nil
}

// matches is the reset's WHERE: the status guard and, fenced, the owner
// guard (with unowned, a row without an owner passes it).
func (r *simResetter) matches(row *simRow, instance string, fenced, unowned bool) bool {
	if fenced && !sameOwner(row.owner, instance) && !(unowned && row.owner == "") {
		return false
	}
	if r.p.world.mut.noStatusGuard {
		return row.status != stQueued
	}
	return row.status == stInprog
}

// sameOwner is the owner guard's comparison: the row's owner value is the
// one the reset names. The mutant mutantOwnerByID compares instance IDs
// only, as a guard that ignored the life would (owner.go).
func sameOwner(rowOwner, value string) bool {
	if mutantOwnerByID {
		a, _, _ := parseOwner(rowOwner)
		b, _, _ := parseOwner(value)
		return rowOwner != "" && a == b
	}
	return rowOwner == value
}

// apply resets one row, after checking the safety invariants on it.
func (r *simResetter) apply(t *simTable, id int64, row *simRow, instance string, byOwner bool, res *ResetResult) {
	w := r.p.world
	// Without owner fencing nothing tells a row of a worker paused past its
	// TTL, which resumed and took its lease back, from the same row of
	// that worker presumed dead (docs/reliability.md: "without owner
	// fencing a paused worker's rows are done twice"): only another
	// instance's rows are protected there.
	if h := row.taker; h != nil && h != r.p && h.holdsLive(id) && (h.setsOwner() || h.id != instance) {
		// What the recoverer learnt the rows from: its claim (by owner) or
		// its read of the rows set (by IDs).
		ref := r.p.conn.readAt[instance]
		if byOwner {
			ref = r.p.conn.claimAt[instance]
		}
		switch {
		case w.freshAfterPromotion(r.p):
			w.known[knownFresh]++
			w.tracef("KNOWN row %d reset under %s by %s, which started less than a TTL after a promotion (docs/safety.md §8)", id, h, r.p)
		case !h.setsOwner() && w.trackedThenRolledBack(instance, id):
			// docs/safety.md §2: a tracked ID whose row is not ours is
			// harmless only under owner fencing.
			w.known[knownRolledBack]++
			w.tracef("KNOWN row %d reset under %s: %s tracked it in a fetch that rolled back (no owner fencing, docs/safety.md §2)", id, h, instance)
		case h.id == instance && row.takenAt.After(ref):
			// Issue 10's closing note: owner fencing cannot tell two
			// takes by one instance ID apart; closing it needs a per-take
			// token in the owner column.
			w.known[knownTwoTakes]++
			w.tracef("KNOWN row %d reset under %s, which took it after %s's claim or read of %s (one instance ID, two takes)", id, h, r.p, instance)
		default:
			w.violate("row %d reset (for %s, by %s) while %s holds it with a valid lease%s", id, instance, r.p, h, h.witnessState())
		}
	}
	row.count++
	row.resets++
	if row.resets > row.takes {
		w.violate("row %d reset %d times for %d takes: a reset applied twice", id, row.resets, row.takes)
	}
	row.status = stQueued
	row.xmin++
	if t.maxRec > 0 && row.count >= t.maxRec {
		row.status = stFailed
		res.Quarantined = append(res.Quarantined, id)
	}
	if t.fenced {
		row.owner = ""
	}
	res.Changed++
}

// ResetOwner is pgxreset.Resetter.ResetOwner: every row in progress
// req.Owner owns, in one transaction.
func (r *simResetter) ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error) {
	owner := req.Owner
	if !r.fenced() {
		return ResetResult{}, fmt.Errorf("%w: resetting by owner needs WithOwnerColumn", ErrInvalidConfig)
	}
	var res ResetResult
	var waited bool
	// A stream per owner: the witness resets the lives a count judged in
	// goroutines of their own, started at one instant.
	err := r.p.conn.pg(ctx, "resetowner "+owner, true, func(t *simTable) {
		res, waited = ResetResult{}, false
		var todo, changed []int64
		for _, id := range t.ids() {
			if row := t.rows[id]; r.matches(row, owner, true, false) && !r.skipLocked(id, row, &res, &waited) {
				todo = append(todo, id)
			}
		}
		if waited {
			res = ResetResult{}
			return
		}
		for _, id := range todo {
			r.apply(t, id, t.rows[id], owner, true, &res)
			changed = append(changed, id)
		}
		r.p.world.tracef("%s reset rows owned by %s: %v, locked %d", r.p, owner, changed, len(res.NotReset))
	})
	if err == nil {
		err = r.waitOnLock(ctx, waited)
	}
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows owned by %s: %w", owner, err)
	}
	return res, nil
}

// InProgressRows is pgxreset.Resetter.InProgressRows: the rows in progress and
// their xmin.
func (r *simResetter) InProgressRows(ctx context.Context) ([]RowState, error) {
	if r.fenced() {
		return nil, fmt.Errorf("%w: a resetter WithOwnerColumn sweeps by owner", ErrInvalidConfig)
	}
	var out []RowState
	err := r.p.conn.pg(ctx, "inprogress", false, func(t *simTable) {
		out = out[:0]
		for _, id := range t.ids() {
			if row := t.rows[id]; row.status == stInprog {
				out = append(out, RowState{ID: id, Version: strconv.Itoa(row.xmin)})
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list rows in progress: %w", err)
	}
	return out, nil
}

// ResetVersions is pgxreset.Resetter.ResetVersions: the rows still in
// progress at the version given, in one transaction. The mutation
// noVersionGuard drops the version from the WHERE clause.
func (r *simResetter) ResetVersions(ctx context.Context, req VersionsReset) (ResetResult, error) {
	rows := req.Versions
	var res ResetResult
	var waited bool
	extra := r.operatorRequeues(rows)
	err := r.p.conn.pgDelayed(ctx, "resetversions", true, extra, func(t *simTable) {
		res, waited = ResetResult{}, false
		var todo, changed []int64
		for _, rv := range rows {
			row := t.rows[rv.ID]
			if row == nil || !r.matches(row, "", false, false) {
				continue
			}
			if !r.p.world.mut.noVersionGuard && strconv.Itoa(row.xmin) != rv.Version {
				continue
			}
			if !r.skipLocked(rv.ID, row, &res, &waited) {
				todo = append(todo, rv.ID)
			}
		}
		if waited {
			res = ResetResult{}
			return
		}
		for _, id := range todo {
			r.apply(t, id, t.rows[id], "", false, &res)
			changed = append(changed, id)
		}
		r.p.world.tracef("%s reset stray rows: %v, locked %d", r.p, changed, len(res.NotReset))
	})
	if err == nil {
		err = r.waitOnLock(ctx, waited)
	}
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset %d stray rows: %w", len(rows), err)
	}
	return res, nil
}

// operatorRequeues is the operator fault class (simConfig.operator): now
// and then, the rows of a sweep's reset that are
// still in progress at the version it read, for a dead taker, are
// re-queued by an operator as the reset is sent, and the reset arrives
// 100 to 600 ms later: a host has usually taken them again by then. It
// returns the delay.
func (r *simResetter) operatorRequeues(rows []RowState) time.Duration {
	w := r.p.world
	if !w.cfg.operator {
		return 0
	}
	var hit bool
	var extra time.Duration
	r.p.conn.draw("operator", func(rr *rand.Rand) {
		hit = rr.IntN(2) == 0
		extra = 100*time.Millisecond + dur(rr, 500*time.Millisecond)
	})
	if !hit {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var requeued []int64
	for _, rv := range rows {
		row := w.table.rows[rv.ID]
		if row == nil || row.status != stInprog || strconv.Itoa(row.xmin) != rv.Version || row.taker.alive() || row.lockedBy != nil {
			continue
		}
		row.status = stQueued
		row.xmin++
		row.resets++
		requeued = append(requeued, rv.ID)
	}
	if len(requeued) == 0 {
		return 0
	}
	w.tracef("OPERATOR re-queues %v as %s's reset of them is sent; it arrives %v later", requeued, r.p, extra)
	return extra
}

func (r *simResetter) InProgressOwners(ctx context.Context) ([]string, error) {
	if !r.fenced() {
		return nil, fmt.Errorf("%w: in-progress owners need WithOwnerColumn", ErrInvalidConfig)
	}
	var out []string
	err := r.p.conn.pg(ctx, "owners", false, func(t *simTable) {
		seen := map[string]bool{}
		for _, row := range t.rows {
			if row.status == stInprog && row.owner != "" {
				seen[row.owner] = true
			}
		}
		out = slices.Sorted(maps.Keys(seen))
	})
	if err != nil {
		return nil, fmt.Errorf("list owners of rows in progress: %w", err)
	}
	return out, nil
}

// RowStates is pgResetter.RowStates: each row's committed state and
// version, and whether an open fetch holds it (Locked: its state is then
// the one before the fetch: a fetch changes the row only at its commit
// here). The mutation readLocked reports no row locked.
func (r *simResetter) RowStates(ctx context.Context, ids []int64) ([]RowState, error) {
	if len(ids) == 0 {
		return nil, nil // as pgResetter: no round trip
	}
	var out []RowState
	err := r.p.conn.pg(ctx, "rowimages", false, func(t *simTable) {
		out = nil
		for _, id := range slices.Sorted(slices.Values(ids)) {
			if row := t.rows[id]; row != nil {
				out = append(out, RowState{ID: id, Status: row.status, Owner: row.owner,
					Version: strconv.Itoa(row.xmin), Locked: row.lockedBy != nil && !r.p.world.mut.readLocked})
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read row versions: %w", err)
	}
	return out, nil
}

// The host's statements.

// lockBlock is the fetch's first statement, in its transaction: up to n
// queued rows not locked by another transaction (SKIP LOCKED), locked by
// p, lowest IDs first.
func (p *simProc) lockBlock(ctx context.Context, n int) ([]int64, error) {
	var ids []int64
	err := p.conn.pg(ctx, "fetch", false, func(t *simTable) {
		ids = nil
		for _, id := range t.ids() {
			if row := t.rows[id]; row.status == stQueued && row.lockedBy == nil {
				row.lockedBy = p
				ids = append(ids, id)
				if len(ids) == n {
					break
				}
			}
		}
	})
	return ids, err
}

// commitBlock marks the locked rows in progress and owned by p (when p
// sets the owner column), and commits. On an error the
// transaction is rolled back.
func (p *simProc) commitBlock(ctx context.Context, ids []int64, owner string) error {
	err := p.conn.pg(ctx, "commit", false, func(t *simTable) {
		for _, id := range ids {
			row := t.rows[id]
			row.lockedBy = nil
			row.status = stInprog
			row.xmin++
			if p.setsOwner() {
				row.owner = owner
			}
			row.takes++
			row.taker = p
			row.takenAt = time.Now()
		}
	})
	if err != nil {
		p.rollback(ids)
	}
	return err
}

// rollback ends p's fetch transaction without effect (the connection is
// gone, or the host rolled it back).
func (p *simProc) rollback(ids []int64) {
	w := p.world
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if row := w.table.rows[id]; row.lockedBy == p {
			row.lockedBy = nil
			p.rolledBack[id] = true
		}
	}
}

// complete is the guarded completion: done only while the row is in
// progress (and, fenced, owned by p). It reports whether it changed the
// row.
func (p *simProc) complete(ctx context.Context, id int64) (bool, error) {
	var changed bool
	owner := p.heldOwner(id)
	err := p.conn.pg(ctx, "complete", true, func(t *simTable) {
		row := t.rows[id]
		changed = row.status == stInprog && (!p.setsOwner() || row.owner == owner)
		if !changed {
			return
		}
		row.status = stDone
		row.xmin++
		row.completions++
		row.doneBy = p
		if row.completions > 1 {
			p.world.violate("row %d completed %d times", id, row.completions)
		}
	})
	return changed, err
}

var errSimPG = errors.New("sim: PostgreSQL connection lost")
