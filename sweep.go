package recovery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alya/recovery/internal/keys"
	"github.com/alya/recovery/internal/scripts"
)

// The backstop sweep finds rows in progress whose owner is gone even when
// Redis has nothing left about them: the whole fleet was down for longer
// than the rows TTL, or Redis lost the registry and the rows sets. It asks
// the database (an OwnerSweeper) for the distinct owners of rows in
// progress and resets the rows of every owner whose heartbeat was absent at
// two sweeps at least a heartbeat TTL apart. One worker of the fleet sweeps
// at a time: the holder of the sweep lease, which it renews every recovery
// interval.

// WithBackstopSweep turns on the backstop sweep, run after every recovery
// scan by the one worker holding the sweep lease. The resetter must be an
// OwnerSweeper: a PgxResetter WithOwnerColumn. Default: off.
func WithBackstopSweep() Option {
	return optionFunc(func(o *options) { o.sweep = true })
}

// SweepReport says what one backstop sweep found and did.
type SweepReport struct {
	// LeaseHeld is false when another worker holds the sweep lease; then
	// nothing else was done.
	LeaseHeld bool
	// Owners is how many distinct owners rows in progress had.
	Owners int
	// Absent lists owners without a heartbeat seen for the first time, or
	// not yet for a whole heartbeat TTL.
	Absent []string
	// Recovered lists owners whose rows were reset.
	Recovered []PeerRecovery
	// InvalidOwners lists owners that are not valid instance IDs (rows a
	// host marked by other means); they are left alone.
	InvalidOwners []string
}

type sweepState struct {
	mu          sync.Mutex
	token       string
	absentSince map[string]time.Time
}

// sweepLeaseTTL lets the holder miss one renewal (±10% jitter included)
// before another worker may take over (options.sweepLeaseTTL).
func (w *Worker) sweepLeaseTTL() time.Duration { return w.opts.sweepLeaseTTL() }

// sweep runs one backstop sweep.
func (w *Worker) sweep(ctx context.Context) (rep SweepReport, err error) {
	defer func() {
		if err != nil {
			w.stats.errors.Add(1)
		}
	}()
	sw, ok := w.resetter.(OwnerSweeper)
	if !ok {
		return rep, fmt.Errorf("%w: backstop sweep needs an OwnerSweeper resetter", ErrInvalidConfig)
	}
	w.swept.mu.Lock()
	defer w.swept.mu.Unlock()

	opCtx, cancel := w.opContext(ctx)
	held, err := scripts.TakeLease.Run(opCtx, w.rdb, []string{keys.SweepLease(w.opts.keyPrefix)},
		w.swept.token, w.sweepLeaseTTL().Milliseconds()).Int()
	cancel()
	if err != nil {
		return rep, fmt.Errorf("take sweep lease: %w", err)
	}
	if held != 1 {
		clear(w.swept.absentSince) // observations must be our own and recent
		return rep, nil
	}
	rep.LeaseHeld = true

	dbCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	owners, err := sw.InProgressOwners(dbCtx)
	cancel()
	if err != nil {
		return rep, err
	}
	rep.Owners = len(owners)
	candidates := owners[:0:0]
	for _, o := range owners {
		switch {
		case o == w.opts.instanceID:
		case keys.ValidateName(o) != nil:
			rep.InvalidOwners = append(rep.InvalidOwners, o)
		default:
			candidates = append(candidates, o)
		}
	}
	checkedAt := time.Now()
	dead, err := w.deadPeers(ctx, candidates)
	if err != nil {
		return rep, err
	}
	isDead := make(map[string]bool, len(dead))
	for _, o := range dead {
		isDead[o] = true
	}
	for o := range w.swept.absentSince {
		if !isDead[o] {
			delete(w.swept.absentSince, o) // alive again, or no rows left
		}
	}
	var errs []error
	for _, o := range dead {
		since, seen := w.swept.absentSince[o]
		if !seen {
			w.swept.absentSince[o] = checkedAt
		}
		if !seen || checkedAt.Sub(since) < w.opts.heartbeatTTL {
			rep.Absent = append(rep.Absent, o)
			continue
		}
		w.emit(Event{Kind: EventPeerDead, PeerID: o, FoundBy: "sweep"})
		dbCtx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
		res, err := sw.ResetOwnerRows(dbCtx, o)
		cancel()
		if err != nil {
			errs = append(errs, &PeerError{InstanceID: o, Err: err})
			w.emit(Event{Kind: EventRecoveryFailed, PeerID: o, FoundBy: "sweep", Err: err})
			continue
		}
		delete(w.swept.absentSince, o)
		pr := PeerRecovery{InstanceID: o, RowsReset: res.Reset, Quarantined: res.Quarantined}
		rep.Recovered = append(rep.Recovered, pr)
		w.countRows(pr)
		w.countRecovered(pr, "sweep", time.Since(since))
	}
	return rep, errors.Join(errs...)
}
