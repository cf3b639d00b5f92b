package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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
// the look of rowsweep.go instead: the rows in progress that no rows set
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

	// Without an owner column (rowsweep.go):
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
// version (rowSweep, rowsweep.go). New picks the strategy.
type sweeper struct {
	turn   sweepTurn
	by     sweepStrategy
	opts   *options
	rlog   *recoveryLog
	stats  *counters
	ousted *atomic.Bool // the lease's: another process holds this instance ID now
}

// sweepTurn is the fleet's one sweep turn, taken and renewed under token.
type sweepTurn struct {
	store store.Store
	opts  *options
	token string // holds the sweep turn
	stats *counters
	rlog  *recoveryLog
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
	resetter Resetter // InProgressOwners, Reset by Owner
	store    store.Store
	opts     *options
	rows     *inflight // this worker's current life (lifeEnded)
	fleet    *fleetView
	stats    *counters
	log      *slog.Logger
	rlog     *recoveryLog
	// judge judges the owners' heartbeats (registry.go); peers is the one
	// dead-peer path (recoverDeadLives), which also counts the rows a
	// recovery reset and quarantined (countRows; deadpeer.go).
	judge *judge
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
		s.opts.sig.sweep.Signal(err) // test signal: a sweep turn ended
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
		res, err := s.resetter.Reset(dbCtx, ResetRequest{Owner: v})
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
