package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// The backstop sweep finds rows in progress whose owner is gone even when
// Redis has nothing left about them: the whole fleet was down for longer
// than the rows TTL, or Redis lost the registry and the rows sets. It asks
// the database (Resetter.InProgressOwners) for the distinct owners of rows in
// progress, and hands every owner whose heartbeat was absent at two sweeps
// at least a heartbeat TTL apart to the one dead-peer path, which resets
// its rows by owner. One worker of the fleet sweeps at a time: the holder
// of the sweep turn, which it renews every recovery interval.

// Without an owner column (rows-set mode, Resetter.InProgressRows) the same turn runs
// the look of the sweep by row version (rowSweep, below) instead: the rows in progress that no rows set
// holds, seen unchanged at two looks a rows TTL apart.

// byOwner reports whether s runs the backstop sweep by owner (an owner
// column), which finds rows by owner in PostgreSQL. A nil s runs none.
func (s *sweeper) byOwner() bool {
	_, ok := s.strategy().(*ownerSweep)
	return ok
}

// byVersion reports whether s runs the backstop sweep by row version (no
// owner column): the fleet is taken to run it too. A nil s runs none.
func (s *sweeper) byVersion() bool {
	_, ok := s.strategy().(*rowSweep)
	return ok
}

// strategy returns s's strategy, nil for a nil s.
func (s *sweeper) strategy() sweepStrategy {
	if s == nil {
		return nil
	}
	return s.by
}

// sweepReport says what one backstop sweep found and did.
type sweepReport struct {
	// turnHeld is false when another worker holds the sweep turn; then
	// nothing else was done.
	turnHeld bool
	// owners is how many distinct owners rows in progress had.
	owners int
	// absent lists owners without a heartbeat seen for the first time, or
	// not yet for a whole heartbeat TTL.
	absent []string
	// recovered lists owners whose rows were reset.
	recovered []report.PeerRecovery
	// invalidOwners lists owners that are not valid instance IDs (rows a
	// host marked by other means); they are left alone.
	invalidOwners []string

	// Without an owner column (rowSweep):
	// rowsInProgress is how many rows the database had in progress;
	// nodeHeld is set when a Redis master was too young to trust.
	rowsInProgress int
	nodeHeld       bool
	// strayWaiting is how many rows no rows set held, not yet for a gap.
	strayWaiting int
	// strayFound rows were due for a reset; strayReset of them were reset
	// (strayQuarantined quarantined), the others had changed meanwhile.
	strayFound, strayQuarantined int
	// strayLocked of the rows due were skipped, another session holding
	// them locked; they are due again at the next look.
	strayLocked int
	strayReset  int64
	// strayRefused of them the database refused to change (a BEFORE
	// UPDATE trigger returned NULL); they are tried again a gap later.
	// refusedIDs lists them (sweepNow reports them stuck).
	strayRefused int
	refusedIDs   []int64
	// strayGone of them no longer existed (deleted between the looks).
	strayGone int
	// untracked lists rows committed in progress by a worker that had not
	// tracked them.
	untracked []int64
	// untrackedBy lists them by the instance whose rows set held them at
	// this look ("": none).
	untrackedBy map[string][]int64
	// ownerPeers lists live members that announce owner mode (an
	// owner-column rollout): a sweep by row version leaves the turn to
	// them, since their rows are in no rows set.
	ownerPeers []string
}

// sweeper is the backstop sweep's loop: it takes the sweep turn and, while
// it holds it, sweeps by its strategy, by owner (ownerSweep) or by row
// version (rowSweep, below). New picks the strategy.
type sweeper struct {
	deps   // the settings, the store, the log and the shared parts (worker.go)
	turn   sweepTurn
	by     sweepStrategy
	ousted *atomic.Bool // the lease's: another process holds this instance ID now
}

// sweepTurn is the fleet's one sweep turn, taken and renewed under token.
type sweepTurn struct {
	deps         // the settings, the store, the log and the shared parts (worker.go)
	token string // holds the sweep turn
}

// take takes or renews the sweep turn for a sweep turn's TTL, and reports
// whether this worker holds it. A turn key held by no live worker is
// taken over and logged at Error.
func (t *sweepTurn) take(ctx context.Context) (bool, error) {
	opCtx, cancel := t.opts.opContext(ctx)
	turn, err := t.store.TakeSweepTurn(opCtx, t.token, t.opts.sweepTurnTTL())
	cancel()
	if turn.Stranger != "" {
		t.stats.turnsFromStrangers.Add(1)
		t.rlog.turnFromStranger("sweep", store.SweepTurnKey(t.opts.keyPrefix), turn)
	}
	return turn.Held, err
}

// sweepStrategy is what the sweeper does around and with the sweep turn:
// the sweep by owner (ownerSweep) or by row version (rowSweep).
type sweepStrategy interface {
	// yield runs before the turn is taken; true leaves the turn to other
	// workers this time, rep saying why.
	yield(ctx context.Context, rep *sweepReport) (bool, error)
	// look is one sweep by the holder of the turn. It counts its own
	// failures.
	look(ctx context.Context, rep *sweepReport) error
	// forget drops what earlier looks saw: observations must be this
	// holder's own and recent.
	forget()
}

// ownerSweep is the sweep by owner: the owners of rows in progress
// (Resetter.InProgressOwners) whose heartbeat stays absent go to the one
// dead-peer path, and the rows of ended lives of live instances are reset
// by owner value (sweepEndedLives).
type ownerSweep struct {
	deps               // the settings, the store, the log and the shared parts (worker.go)
	resetter Resetter  // InProgressOwners, ResetOwner
	rows     *inflight // this worker's current life (lifeEnded)
	// peers is the one dead-peer path (recoverDeadLives), which also
	// counts the rows a recovery reset and quarantined (countRows;
	// deadpeer.go); the judge (deps) judges the owners' heartbeats.
	peers *peerRecoverer
	// absentSince is when each owner was first seen without a heartbeat
	// by this holder of the turn. Only look and forget (runOnce) touch it.
	absentSince map[string]time.Time
	// warned lists the owners that are no instance ID already logged, so
	// each is logged once (up to maxWarnedOwners of them). Only look
	// touches it.
	warned map[string]bool
	// endedSince is when each per-life owner value of a live instance was
	// first seen naming a life that had ended (sweepEndedLives). Only
	// look and forget (runOnce) touch it.
	endedSince map[string]time.Time
}

// maxWarnedOwners bounds the owners that are no instance ID the sweeper
// remembers having logged: a table full of them logs this many, not one
// line per row every sweep.
const maxWarnedOwners = 1000

// run sweeps at once and then every recovery interval (±10%), until ctx is
// done.
func (s *sweeper) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep, err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.rlog.swept(rep, err)
		t.Reset(s.opts.jitter("sweep", s.opts.recoveryInterval, 0.1))
		s.sig.sweep.Signal(err) // test signal: a sweep turn ended
	}
}

// invalidOwnerReason says why owner value o names no instance.
func invalidOwnerReason(o string) error {
	if i := strings.IndexByte(o, '{'); i >= 0 {
		if err := store.ValidateName(o[:i]); err != nil {
			return err
		}
		return errors.New("not <instance ID>{<life>}")
	}
	return store.ValidateName(o)
}

// runOnce is one sweep. A failure of the sweep itself is counted once;
// each owner's recovery counts its own.
func (s *sweeper) runOnce(ctx context.Context) (rep sweepReport, err error) {
	if s.ousted.Load() {
		// Another process holds this instance ID now: this one judges no
		// one (its memory of its own lives is not the ID's any more), and
		// leaves the turn to expire for a live member.
		s.by.forget()
		return rep, nil
	}
	if yield, err := s.by.yield(ctx, &rep); yield || err != nil {
		return rep, err
	}
	held, err := s.turn.take(ctx)
	if err != nil {
		s.stats.countFailure(ctx)
		return rep, fmt.Errorf("take sweep turn: %w", err)
	}
	if !held {
		s.by.forget() // observations must be our own and recent
		return rep, nil
	}
	rep.turnHeld = true
	err = s.by.look(ctx, &rep)
	return rep, err
}

// yield never leaves the turn: the sweep by owner covers every owner.
func (s *ownerSweep) yield(context.Context, *sweepReport) (bool, error) { return false, nil }

// forget drops the owners seen absent and the lives seen ended.
func (s *ownerSweep) forget() {
	clear(s.absentSince)
	clear(s.endedSince)
}

// look is one sweep by owner, by the holder of the turn.
func (s *ownerSweep) look(ctx context.Context, rep *sweepReport) error {
	dbCtx, cancel := context.WithTimeout(ctx, s.opts.resetTimeout)
	owners, err := s.resetter.InProgressOwners(dbCtx)
	cancel()
	if err != nil {
		s.stats.countFailure(ctx)
		return err
	}
	rep.owners = len(owners)
	candidates, lives, own := s.sortOwners(owners, rep)
	checkedAt := time.Now()
	dead, err := s.judge.deadOwners(ctx, candidates)
	if err != nil {
		s.stats.countFailure(ctx)
		return err
	}
	isDead := make(map[string]bool, len(dead))
	for _, o := range dead {
		isDead[o] = true
	}
	for o := range s.absentSince {
		if !isDead[o] {
			delete(s.absentSince, o) // alive again, or no rows left
		}
	}
	errs := []error{s.sweepEndedLives(ctx, livesOfLive(lives, isDead, own), checkedAt, rep)}
	errs = append(errs, s.recoverAbsent(ctx, dead, lives, checkedAt, rep)...)
	return errors.Join(errs...)
}

// sortOwners sorts the owner values of rows in progress: an owner value
// is an instance ID or one life of one (owner.go). The instance's
// heartbeat judges every life, and a recovery resets the lives the sweep
// saw with the instance's other rows. It returns the other instances to
// judge, the values listed of each, and this worker's per-life values;
// the values that name no instance go to rep, each logged once.
func (s *ownerSweep) sortOwners(owners []string, rep *sweepReport) (candidates []string, lives map[string][]string, own []string) {
	candidates = owners[:0:0]
	lives = make(map[string][]string)
	for _, o := range owners {
		id, life, ok := parseOwner(o)
		switch {
		case ok && id == s.opts.instanceID:
			if life != "" {
				own = append(own, o)
			}
		case !ok:
			rep.invalidOwners = append(rep.invalidOwners, o)
			if !s.warned[o] && len(s.warned) < maxWarnedOwners {
				s.warned[o] = true
				s.rlog.invalidOwner(o, invalidOwnerReason(o))
			}
		default:
			if _, seen := lives[id]; !seen {
				candidates = append(candidates, id)
			}
			lives[id] = append(lives[id], o)
		}
	}
	return candidates, lives, own
}

// recoverAbsent sends down the one dead-peer path the owners found dead
// whose heartbeat has stayed absent for the fleet's TTL since this
// holder of the turn first saw it absent; it returns their errors.
func (s *ownerSweep) recoverAbsent(ctx context.Context, dead []string, lives map[string][]string, checkedAt time.Time, rep *sweepReport) []error {
	var errs []error
	for _, o := range dead {
		since, seen := s.absentSince[o]
		if !seen {
			s.absentSince[o] = checkedAt
		}
		if !seen || checkedAt.Sub(since) < s.fleet.ttl() {
			rep.absent = append(rep.absent, o)
			continue
		}
		pr, claimed, err := s.peers.recoverDeadLives(ctx, o, foundBySweep, since, lives[o])
		switch {
		case err != nil:
			errs = append(errs, &report.PeerError{InstanceID: o, Err: err})
		case claimed:
			delete(s.absentSince, o)
			rep.recovered = append(rep.recovered, pr)
		}
	}
	return errs
}

// livesOfLive returns the per-life owner values of the instances not found
// dead, and own (this worker's).
func livesOfLive(lives map[string][]string, isDead map[string]bool, own []string) []string {
	out := own
	// In a fixed order: each value costs a read of Redis, and a run of the
	// simulation must replay step for step.
	for _, id := range slices.Sorted(maps.Keys(lives)) {
		vs := lives[id]
		if isDead[id] {
			continue // its recovery resets every life listed
		}
		for _, v := range vs {
			if _, life, _ := parseOwner(v); life != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

// sweepEndedLives resets the rows of ended lives of live instances: rows
// in progress under <id>{<life>} while the instance's current life, as its
// heartbeats record it, is another. A worker tracks rows only under a life
// a heartbeat has recorded (TrackAs) and begins a new one at each lost
// lease, so such rows were committed by a fetch of a life that ended (a
// COMMIT that landed after the loss, a host that let a refused Track
// commit, rows left by a host that untracked without finishing): nobody
// processes them under a valid lease. A value is reset once it was seen
// ended at two sweeps at least a heartbeat TTL apart and again just before
// the reset, by owner value alone, with no claim: the reset is guarded by
// that value, which no live life writes, so it is idempotent whoever runs
// it. An instance with no recorded life (Redis lost it) is not judged.
func (s *ownerSweep) sweepEndedLives(ctx context.Context, values []string, checkedAt time.Time, rep *sweepReport) error {
	seen := make(map[string]bool, len(values))
	var errs []error
	for _, v := range values {
		id, life, _ := parseOwner(v)
		ended, err := s.lifeEnded(ctx, id, life)
		if err != nil {
			errs = append(errs, &report.PeerError{InstanceID: id, Err: fmt.Errorf("read the current life: %w", err)})
			_, seen[v] = s.endedSince[v] // keep what was seen
			continue
		}
		if !ended {
			continue
		}
		seen[v] = true
		since, ok := s.endedSince[v]
		if !ok {
			s.endedSince[v] = checkedAt
			continue
		}
		if checkedAt.Sub(since) < s.fleet.ttl() {
			continue
		}
		if ended, err = s.lifeEnded(ctx, id, life); err != nil || !ended {
			continue // read again at the next sweep
		}
		dbCtx, cancel := context.WithTimeout(ctx, s.opts.resetTimeout)
		res, err := s.resetter.ResetOwner(dbCtx, OwnerReset{Owner: v})
		cancel()
		if err != nil {
			s.stats.countFailure(ctx)
			errs = append(errs, &report.PeerError{InstanceID: id, Err: fmt.Errorf("reset the rows of ended life %s: %w", clip(v), err)})
			continue
		}
		delete(s.endedSince, v)
		pr := report.PeerRecovery{InstanceID: id, RowsFound: int(res.Changed) + len(res.NotReset), RowsReset: res.Changed,
			Quarantined: res.Quarantined, NotReset: res.NotReset}
		s.peers.countRows(pr)
		rep.recovered = append(rep.recovered, pr)
		s.log.Warn("backstop sweep: reset the rows of an ended life of a live worker (committed after that life ended, or left by its host)",
			"owner", clip(v), "rows_reset", res.Changed, "rows_quarantined", len(res.Quarantined), "rows_not_reset", len(res.NotReset))
		if res.Changed > 0 {
			s.peers.events.emit(Event{Kind: EventStrayRowsReset, PeerID: id, FoundBy: foundBySweep, Rows: pr.RowsFound,
				RowsReset: res.Changed, RowsQuarantined: len(res.Quarantined),
				RowIDs: sortedIDs(res.ChangedIDs), QuarantinedIDs: sortedIDs(res.Quarantined)})
		}
	}
	for v := range s.endedSince {
		if !seen[v] {
			delete(s.endedSince, v) // its rows are gone, or the sighting is not ours
		}
	}
	return errors.Join(errs...)
}

// lifeEnded reports whether life is not instance id's current life, as
// recorded in Redis. This worker's own current life is never ended; its
// other lives are judged by the record like anyone's: a value of its ID
// that it does not know may be the life of another process that took the
// ID since (this one paused past its TTL, then ousted), whose heartbeats
// record it as current.
func (s *ownerSweep) lifeEnded(ctx context.Context, id, life string) (bool, error) {
	if id == s.opts.instanceID && life == s.rows.currentIncarnation() && !mutantOwnLivesByMemory {
		return false, nil
	}
	if id == s.opts.instanceID && mutantOwnLivesByMemory {
		return true, nil
	}
	opCtx, cancel := s.opts.opContext(ctx)
	defer cancel()
	cur, _, err := s.store.ReadRows(opCtx, id)
	if err != nil {
		return false, err
	}
	return cur != "" && cur != life, nil
}

// The backstop sweep without an owner column. In rows-set mode the rows
// sets in Redis are the only record of who holds a row; when a set is gone
// before a peer reset its rows (the whole fleet down longer than the rows
// TTL, Redis flushed or restarted empty while its worker was dead, a
// misspelt status fixed later), the database still shows the rows in
// progress. Each look of the sweep, by the one worker holding the sweep
// turn, reads:
//
//  1. the rows in progress with their version (Resetter.InProgressRows;
//     PostgreSQL: xmin), then
//  2. every rows set of every registered instance, and the TTLs of their
//     heartbeats and sets, then
//  3. the age of every Redis master (INFO).
//
// A row in progress that no set held, at two looks whose set reads are at
// least a gap apart, at the same version, both from masters up for a
// heartbeat TTL (strict node age), is reset with its version in the
// statement's WHERE clause. The gap is the longest rows TTL in the fleet:
// this worker's, the longest heartbeat TTL a live member announced (a
// member Redis has just forgotten, with its registry entry, is known by
// that), or the longest TTL left on any registered instance's heartbeat
// or rows set, whichever is longest; every worker's heartbeat
// interval is shorter than its heartbeat TTL, itself shorter than its rows
// TTL, so a live worker has written every row it tracks back into its set
// (heartbeat.go) at least once between the two set reads. docs/design.md
// ("The backstop sweep") has the model, docs/safety.md §5 the guarantees.
//
// The same looks tell a host that does not Track (or Tracks after its
// COMMIT): a row that was not in progress at that version at the previous
// look, in no set at this one, and unchanged at the next, was committed in
// progress by a worker that had not tracked it. Healthy fails with
// ErrUntrackedRows, long before the row is reset.

// strayRow is a row in progress that no rows set held at a look.
type strayRow struct {
	version string
	// absentAt is when the set read that first found it unheld, at this
	// version, ended.
	absentAt time.Time
	// fresh: the row was not in progress at this version at the previous
	// look, recent enough that a worker that tracked it before its COMMIT
	// must still have it in its set.
	fresh bool
}

// rowsMemory is what the holder of the sweep turn remembers between looks.
// Only runOnce touches it; it is cleared whenever a look is not trusted.
type rowsMemory struct {
	stray  map[int64]strayRow
	prev   map[int64]string // rows in progress at the previous look, by ID: version
	prevAt time.Time        // when the previous look's database read began
	// registered are the instances the registry listed at the previous look.
	registered map[string]bool
}

func (m *rowsMemory) clear() { *m = rowsMemory{} }

// rowSweep is the sweep by row version, the strategy without an owner
// column. It alone reads other workers' rows sets (heldRows).
type rowSweep struct {
	deps              // the settings, the store, the log and the shared parts (worker.go)
	resetter Resetter // InProgressRows, ResetVersions, RowStates
	// untracked is this worker's ErrUntrackedRows alarm (untrackedFound).
	untracked *untrackedAlarm
	// misconfigured is the self-check's alarm, or nil (selfcheck.go).
	misconfigured func() error
	// nodes is the memory of Redis nodes' ages and evictions (registry.go)
	// that mastersTrusted asks.
	nodes *nodeWatch
	mem   rowsMemory // what absentSince is to the sweep by owner
}

// yield leaves the turn when the fleet has owner-mode members.
func (s *rowSweep) yield(ctx context.Context, rep *sweepReport) (bool, error) {
	// Without an owner column, the fleet's owner-mode members (an
	// owner-column rollout) hold rows that no rows set lists: a sweep
	// by row version would take them for stray rows and reset them
	// under their live workers. It leaves the turn to those members,
	// whose sweep by owner covers their rows.
	peers, err := s.ownerColumnMembers(ctx)
	if err != nil {
		s.stats.countFailure(ctx)
		s.mem.clear()
		return true, err
	}
	if len(peers) > 0 {
		s.mem.clear()
		rep.ownerPeers = peers
		return true, nil
	}
	return false, nil
}

// forget drops what the looks remembered.
func (s *rowSweep) forget() { s.mem.clear() }

// look is rowsLook, its failure counted.
func (s *rowSweep) look(ctx context.Context, rep *sweepReport) error {
	if err := s.rowsLook(ctx, rep); err != nil {
		s.stats.countFailure(ctx)
		return err
	}
	return nil
}

// rowsLook is one look of the sweep without an owner column.
func (s *rowSweep) rowsLook(ctx context.Context, rep *sweepReport) error {
	lk, err := s.readLook(ctx, rep)
	if err != nil || lk == nil {
		s.mem.clear()
		return err
	}
	due, dueAs := s.judgeRows(lk, rep)
	rep.strayWaiting = len(s.mem.stray)
	if len(rep.untracked) > 0 {
		s.untrackedFound(ctx, rep.untracked, rep.untrackedBy)
	}
	if len(due) == 0 {
		return nil
	}
	return s.resetDue(ctx, rep, due, dueAs, lk.gap)
}

// rowsRead is what one look read: the rows in progress, the rows the
// rows sets hold (by holder), and when.
type rowsRead struct {
	rows       []RowState
	held       map[int64]string
	gap        time.Duration
	registered map[string]bool
	dbAt       time.Time // when the database read began
	setsAt     time.Time // when the sets' read began
	setsDone   time.Time // when it ended
}

// readLook reads the rows in progress and the rows sets, and checks that
// the look can be trusted. It returns nil, and the error if any, when
// the look must stop there (the caller clears the memory).
func (s *rowSweep) readLook(ctx context.Context, rep *sweepReport) (*rowsRead, error) {
	lk := &rowsRead{dbAt: time.Now()}
	dbCtx, cancel := context.WithTimeout(ctx, s.opts.resetTimeout)
	rows, err := s.resetter.InProgressRows(dbCtx)
	cancel()
	if err != nil {
		return nil, err
	}
	lk.rows, lk.setsAt = rows, time.Now()
	lk.held, lk.gap, lk.registered, err = s.heldRows(ctx)
	if err != nil {
		return nil, err
	}
	lk.setsDone = time.Now()
	if mutantSweepIgnoresSets {
		lk.held = map[int64]string{}
	}
	rep.rowsInProgress = len(rows)
	if !s.mastersTrusted(ctx, lk.setsAt) && !mutantSweepAnyNode {
		rep.nodeHeld = true
		return nil, nil
	}
	if err := s.misconfigured(); err != nil {
		return nil, fmt.Errorf("backstop sweep held: %w", err)
	}
	if suspect(rows, lk.held) && !s.heldRowsStale(ctx, lk.held) {
		return nil, fmt.Errorf("%w: backstop sweep held: the rows sets hold %d rows and none of them is in progress by the resetter's statuses, %d other rows are", ErrMisconfigured, len(lk.held), len(rows))
	}
	return lk, nil
}

// judgeRows holds the look's rows against the memory of the looks before:
// it notes the rows tracked after their COMMIT (rep.untracked), remembers
// the rows found in no set, and returns those in no set for a gap, due
// for a reset, with what each was remembered as.
func (s *rowSweep) judgeRows(lk *rowsRead, rep *sweepReport) ([]RowState, map[int64]strayRow) {
	m := &s.mem
	rep.untrackedBy = make(map[string][]int64)
	freshOK := m.prev != nil && lk.setsAt.Sub(m.prevAt) <= s.opts.rowsTTL-s.opts.heartbeatTTL
	stray := make(map[int64]strayRow)
	now := make(map[int64]string, len(lk.rows))
	var due []RowState
	dueAs := make(map[int64]strayRow) // what each due row was remembered as
	for _, r := range lk.rows {
		now[r.ID] = r.Version
		st, seen := m.stray[r.ID]
		if holder, ok := lk.held[r.ID]; ok {
			if seen && st.fresh && st.version == r.Version && (m.registered[holder] || mutantAccuseUnregistered) {
				// Tracked after the COMMIT: in no set at the last look,
				// unchanged since, and in holder's set now. Only a holder
				// registered at the last look: one that was not (Redis
				// flushed, or its keys lost) had no set to hold the row
				// then, however early it tracked it, and its heartbeat
				// has written the set back since.
				rep.untracked = append(rep.untracked, r.ID)
				rep.untrackedBy[holder] = append(rep.untrackedBy[holder], r.ID)
			}
			continue
		}
		if mutantSweepOneLook && (!seen || st.version != r.Version) {
			due = append(due, r)
			continue
		}
		if !seen || st.version != r.Version {
			prevVersion, wasThere := m.prev[r.ID]
			stray[r.ID] = strayRow{version: r.Version, absentAt: lk.setsDone,
				fresh: freshOK && (!wasThere || prevVersion != r.Version)}
			continue
		}
		if st.fresh {
			// In progress at this version since before the set read that
			// found it unheld, and committed after the look before it: no
			// set ever held it, and nothing says whose it is.
			rep.untracked = append(rep.untracked, r.ID)
			rep.untrackedBy[""] = append(rep.untrackedBy[""], r.ID)
			st.fresh = false
		}
		if lk.setsAt.Sub(st.absentAt) >= lk.gap {
			due = append(due, r)
			dueAs[r.ID] = st
			continue
		}
		stray[r.ID] = st
	}
	m.stray, m.prev, m.prevAt, m.registered = stray, now, lk.dbAt, lk.registered
	return due, dueAs
}

// resetDue resets the due rows by version and counts and reports what
// the reset did. A row another session held locked is still due:
// remembered as it was, it is tried again at the next look, not a gap
// later.
func (s *rowSweep) resetDue(ctx context.Context, rep *sweepReport, due []RowState, dueAs map[int64]strayRow, gap time.Duration) error {
	resetCtx, cancel := context.WithTimeout(ctx, s.opts.resetTimeout)
	res, err := s.resetter.ResetVersions(resetCtx, VersionsReset{Versions: due})
	cancel()
	if err != nil {
		return err
	}
	rep.strayFound, rep.strayReset, rep.strayQuarantined = len(due), res.Changed, len(res.Quarantined)
	for _, st := range res.NotReset {
		if was, ok := dueAs[st.ID]; ok && st.Locked {
			s.mem.stray[st.ID] = was
			rep.strayLocked++
		}
		if st.Refused {
			rep.strayRefused++
			rep.refusedIDs = append(rep.refusedIDs, st.ID)
		}
	}
	s.stats.rowsRecovered.Add(uint64(res.Changed))
	s.stats.rowsQuarantined.Add(uint64(len(res.Quarantined)))
	s.stats.strayRowsReset.Add(uint64(res.Changed))
	rep.strayGone = len(res.Gone)
	s.stats.rowsLocked.Add(uint64(rep.strayLocked))
	s.stats.rowsRefused.Add(uint64(rep.strayRefused))
	s.stats.rowsGone.Add(uint64(rep.strayGone))
	s.events.emit(Event{Kind: EventStrayRowsReset, FoundBy: foundBySweep, Rows: len(due), RowsReset: res.Changed,
		RowsQuarantined: len(res.Quarantined), RowsGone: rep.strayGone, Duration: gap,
		RowIDs: sortedIDs(res.ChangedIDs), QuarantinedIDs: sortedIDs(res.Quarantined)})
	return nil
}

// maxStaleSample bounds the rows heldRowsStale reads.
const maxStaleSample = 100

// heldRowsStale tells stale entries from swapped statuses when suspect
// trips: the rows sets hold rows, and none of them is in progress. With
// swapped statuses the rows workers track show the status configured as
// queued (it is the table's real in-progress one); entries an Untrack
// whose reply was lost left in a set (docs/safety.md §7) show a finished
// one. It reads the states of up to maxStaleSample held rows and reports
// true when none of them is queued (ResetterInfo.QueuedStatus). A failed
// read keeps the hold.
func (s *rowSweep) heldRowsStale(ctx context.Context, held map[int64]string) bool {
	ids := make([]int64, 0, min(len(held), maxStaleSample))
	for id := range held {
		if len(ids) == maxStaleSample {
			break
		}
		ids = append(ids, id)
	}
	dbCtx, cancel := context.WithTimeout(ctx, s.opts.resetTimeout)
	states, err := s.resetter.RowStates(dbCtx, ids)
	cancel()
	if err != nil {
		s.log.Debug("backstop sweep: cannot read the states of rows the sets hold", slog.Any("error", err))
		return false
	}
	for _, st := range states {
		if st.Status == s.info.QueuedStatus {
			return false
		}
	}
	return true
}

// ownerColumnMembers lists the members of the fleet record that announce owner
// mode and have not lapsed. Members of releases before the fleet record
// announce nothing and are not listed (docs/safety.md §5b).
func (s *rowSweep) ownerColumnMembers(ctx context.Context) ([]string, error) {
	opCtx, cancel := s.opts.opContext(ctx)
	f, err := s.store.ReadFleet(opCtx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("backstop sweep: read the fleet record: %w", err)
	}
	now := time.Now()
	var out []string
	for _, m := range f.Members {
		if m.Mode == "owner" && m.ID != s.opts.instanceID && m.Expires.After(now) {
			out = append(out, m.ID)
		}
	}
	return out, nil
}

// suspect reports a configuration the sweep must not act on: the rows sets
// hold rows, and not one of them is in progress by the resetter's statuses
// while other rows are (statuses swapped or misspelt: the sweep would
// "reset" rows that are not in progress at all).
func suspect(rows []RowState, held map[int64]string) bool {
	if len(held) == 0 || len(rows) == 0 {
		return false
	}
	for _, r := range rows {
		if _, ok := held[r.ID]; ok {
			return false
		}
	}
	return true
}

// heldRows reads every rows set of every registered instance (this
// worker's included) and returns the rows they hold, each with the
// instance whose set holds it, and the gap two looks need: the longest
// rows TTL in the fleet (see above), and at least the longest heartbeat
// TTL a live member announced.
func (s *rowSweep) heldRows(ctx context.Context) (map[int64]string, time.Duration, map[string]bool, error) {
	opCtx, cancel := s.opts.opContext(ctx)
	ids, err := s.store.RegistryMembers(opCtx)
	cancel()
	if err != nil {
		return nil, 0, nil, err
	}
	registered := make(map[string]bool, len(ids))
	for _, id := range ids {
		registered[id] = true
	}
	// A live member not registered at this look (Redis flushed, the
	// registry evicted) is known by the heartbeat TTL it announced, longer
	// than its heartbeat interval: wait that long too.
	gap := max(s.opts.rowsTTL, s.fleet.ttl())
	if len(ids) > 0 {
		opCtx, cancel := s.opts.opContext(ctx)
		insts, err := s.store.Describe(opCtx, ids)
		cancel()
		if err != nil {
			return nil, 0, nil, err
		}
		for _, in := range insts {
			gap = max(gap, in.HeartbeatTTL, in.RowsTTL)
		}
	}
	held := make(map[int64]string)
	for _, id := range ids {
		// Live sets change while they are read: no check that each was
		// read whole (ReadRows' is for a dead peer's set), which a Track
		// between two SSCAN pages would fail. A row tracked throughout is
		// read; one tracked meanwhile is read at the next look.
		members, err := s.store.LiveRows(ctx, id)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("read rows set of %s: %w", id, err)
		}
		for _, m := range members {
			if n, err := strconv.ParseInt(m, 10, 64); err == nil {
				held[n] = id
			}
		}
	}
	return held, gap, registered, nil
}

// mastersTrusted reports whether every Redis master has been up, with the
// data it has now, for a heartbeat TTL before sent (strict node age: a
// master that started empty is held too, as it has forgotten the rows sets
// of live workers until their next heartbeat), nor evicted keys less than
// a TTL before (registry.go: a live worker's rows set may have been
// evicted). When no master's INFO can be read, looks count as the scans'
// verdicts do (infoUnavailable, or held with evictions accepted); when
// some masters answer and another does not, the look does not count.
func (s *rowSweep) mastersTrusted(ctx context.Context, sent time.Time) bool {
	opCtx, cancel := context.WithTimeout(ctx, 2*s.opts.opTimeout)
	infos, err := s.store.MasterInfos(opCtx)
	cancel()
	recv := time.Now()
	if err != nil && len(infos) == 0 {
		if s.nodes.holdForEvictions("", nodeFacts{evicted: -1}, err, sent, recv, 0) {
			return false // evictions accepted: the server may be evicting rows sets
		}
		s.nodes.infoUnavailable(err)
		return true
	}
	trusted := true
	if err != nil {
		// Some masters answered and one did not: it may be down, or the
		// old address of a master that just failed over, whose promoted
		// replica answered the set reads (through a redirection) without
		// being asked its age.
		s.log.Debug("backstop sweep: rows no set holds not judged this time: a Redis master could not be asked its age",
			slog.Any("error", err))
		trusted = false
	}
	for node, info := range infos {
		f, err := parseNodeFacts(info)
		if err != nil {
			s.nodes.infoUnavailable(err)
			continue
		}
		if !f.master {
			trusted = false
			continue
		}
		until, first, youngOnly := s.nodes.nodeHold(node, f, recv, true)
		if s.nodes.holdForEvictions(node, f, nil, sent, recv, 0) {
			// An evicted rows set of a live worker is back within a
			// heartbeat interval, as its heartbeat is (registry.go).
			trusted = false
			continue
		}
		if until.IsZero() || !sent.Before(until) {
			continue
		}
		trusted = false
		switch {
		case first && youngOnly:
			s.log.Debug("backstop sweep: rows no set holds not judged yet: the Redis server has been up for less than a heartbeat TTL, so live workers may not have written their rows sets to it yet",
				slog.String("redis_node", node), slog.Duration("uptime", f.uptime),
				slog.Duration("held_for", until.Sub(recv)))
		case first:
			s.log.Warn("backstop sweep holds its verdicts: the Redis server restarted or was promoted less than a heartbeat TTL ago, so live workers may not have written their rows sets again",
				slog.String("redis_node", node), slog.Duration("uptime", f.uptime),
				slog.Duration("held_for", until.Sub(recv)))
		}
	}
	return trusted
}

// untrackedFound reports rows committed in progress by a worker that had
// not tracked them; by lists them by the instance whose rows set holds
// them now ("": none, Track forgotten). A worker that tracked them after
// their COMMIT is told through its note in the untracked-rows hash (it
// reads it with its scan turn, untrackedAlarm.note) and its Healthy fails; this
// worker's Healthy fails only for rows its own set holds. Rows no set
// holds name no worker: they are logged and counted here.
func (s *rowSweep) untrackedFound(ctx context.Context, ids []int64, by map[string][]int64) {
	s.stats.untrackedRows.Add(uint64(len(ids)))
	now := time.Now()
	notes := make(map[string]string)
	var culprits []string
	for holder, rows := range by {
		if holder == "" {
			continue
		}
		culprits = append(culprits, holder)
		notes[holder] = fmt.Sprintf("%d %d %d %s", now.Add(s.opts.rowsTTL).UnixMilli(), len(rows), rows[0], s.opts.instanceID)
		if holder == s.opts.instanceID {
			s.untracked.at.Store(now.UnixNano())
		}
	}
	slices.Sort(culprits)
	err := fmt.Errorf("%w: %d rows in progress (first %d) that no rows set held after their COMMIT; they will be reset by the backstop sweep after a rows TTL, while the worker that took them may still process them",
		ErrUntrackedRows, len(ids), ids[0])
	attrs := []any{slog.Int("rows", len(ids)), slog.Int64("first_row", ids[0]), slog.Any("error", err)}
	if len(culprits) > 0 {
		attrs = append(attrs, slog.Any("tracked_late_by", culprits))
	}
	if n := len(by[""]); n > 0 {
		attrs = append(attrs, slog.Int("rows_no_set_held", n))
	}
	s.log.Error("rows in progress were committed by a worker that had not tracked them: call Track inside the fetch's transaction, before its COMMIT", attrs...)
	s.events.emit(Event{Kind: EventUntrackedRows, FoundBy: foundBySweep, Rows: len(ids), Err: err, RowIDs: sortedIDs(ids)})
	if len(notes) > 0 {
		opCtx, cancel := s.opts.opContext(ctx)
		nerr := s.store.NoteUntracked(opCtx, notes, s.opts.rowsTTL)
		cancel()
		if nerr != nil {
			s.log.Warn("backstop sweep: cannot tell the workers that tracked rows after their COMMIT", slog.Any("workers", culprits), slog.Any("error", nerr))
		}
	}
}
