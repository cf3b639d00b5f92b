package recovery

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/alya/recovery/internal/store"
)

// Owner values (docs/safety.md §2, "Per-life owner values"). The owner
// column names who holds a row. A bare instance ID names every life of the
// worker: a recovery by owner of a worker judged dead also reaches rows it
// took after it came back, which is why a regained lease is held when a
// worker's rows carry bare values (lease.hold). A per-life value names one
// life:
//
//	<instanceID>{<life>}
//
// where life is the worker's incarnation at the time (written by every
// heartbeat, in the same script as the heartbeat key). Instance IDs cannot
// contain braces (store.ValidateName), so the value parses back into the
// instance whose heartbeat says whether it lives, and the life a recoverer
// read under its claim. Every member reads such values (the sweep, the
// recovery by owner, Start's predecessor recovery) since the release
// before this one; owner-mode workers write them (Worker.OwnerValue), rows-set
// workers write bare instance IDs (the rolling upgrade of docs/safety.md
// §2).

// lifeWidth is how many characters a life adds to an instance ID in an
// owner value: the braces and an incarnation (newToken, 32 hex digits).
const lifeWidth = 2 + 32

// lifeOwner returns the owner value of one life of instance id.
func lifeOwner(id, life string) string { return id + "{" + life + "}" }

// parseOwner splits an owner value into its instance ID and life (empty for
// a bare instance ID). ok is false when v is neither a valid instance ID
// nor a valid per-life value.
func parseOwner(v string) (id, life string, ok bool) {
	i := strings.IndexByte(v, '{')
	if i < 0 {
		return v, "", store.ValidateName(v) == nil
	}
	id, life = v[:i], v[i+1:]
	if !strings.HasSuffix(life, "}") {
		return "", "", false
	}
	life = life[:len(life)-1]
	if store.ValidateName(id) != nil || store.ValidateName(life) != nil {
		return "", "", false
	}
	return id, life, true
}

// OwnerValue returns the value the host writes into the owner column when it
// takes rows, and matches in its completion guard:
//
//	UPDATE ... SET status = 'inprog', owner = $owner WHERE ...   -- the fetch
//	UPDATE ... SET status = 'done' WHERE id = $id AND owner = $owner AND status = 'inprog'
//
// Read it once per block, before the fetch, pass the same value to TrackAs,
// and use it for the completion of every row of the block. In owner mode
// it names the worker's current life, <instance ID>{<incarnation>}: a new
// life begins at Start, whenever the lease is lost, and before a heartbeat
// sent so late it could land on an expired key, so that a recovery of a
// life judged dead never reaches rows taken in a later one (docs/safety.md
// §2). In rows-set mode it is the instance ID (InstanceID).
func (w *Worker) OwnerValue() string { return w.tracker.ownerValue() }

// ownerTracker is the tracker of owner mode: the owner column the host's
// fetch wrote is what recovery reads, so it keeps the rows in the
// worker's own view (for Release, the lease and the self-check) and sends
// nothing to Redis.
type ownerTracker struct {
	trackerCore
	// noteBareOwners is lease.noteBareOwners (heartbeat.go): the host writes
	// bare instance IDs, so a regained lease is held from now on.
	noteBareOwners func()
	// ownerRead is the life the last call of OwnerValue named: the value a
	// plain Track takes its rows for (trackOwner).
	ownerRead atomic.Pointer[string]
}

// heldByOwner is true: the owner column says which rows a worker holds.
func (t *ownerTracker) heldByOwner() bool { return true }

// checkLoss has nothing to look for: no rows set, and a loss began a new
// life (heartbeat.go).
func (t *ownerTracker) checkLoss(context.Context) error { return nil }

// lateBeat begins a new life before a heartbeat that, answered within the
// operation timeout, may land after the lease ended, on an expired key,
// when a recoverer may have read the current life under its claim: it
// must not renew that life. It records a new one, and the rows of this
// one are handled as after any lost lease.
func (t *ownerTracker) lateBeat() {
	if t.lease.until.Load() > 0 && t.lease.remaining() < t.opts.opTimeout && !mutantNoLateLife {
		t.lease.markLeaseLost(nil)
	}
}

// beatRows is nothing: no rows set, the owner column says it all.
func (t *ownerTracker) beatRows(_, _ []int64) (add, remove []int64) { return nil, nil }

// owningPeers lists the owners of rows in progress (one query) and
// returns which of peers own some, and the per-life owner values of each.
func (t *ownerTracker) owningPeers(ctx context.Context, peers []string) (map[string]bool, map[string][]string, error) {
	dbCtx, cancel := context.WithTimeout(ctx, t.opts.resetTimeout)
	owners, err := t.resetter.InProgressOwners(dbCtx)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	want := make(map[string]bool, len(peers))
	for _, p := range peers {
		want[p] = true
	}
	owning, lives := map[string]bool{}, map[string][]string{}
	for _, o := range owners {
		id, life, ok := parseOwner(o)
		if !ok || !want[id] {
			continue
		}
		owning[id] = true
		if life != "" {
			lives[id] = append(lives[id], o)
		}
	}
	return owning, lives, nil
}

func (t *ownerTracker) track(ctx context.Context, ids []int64) error {
	return t.trackAs(ctx, t.trackOwner(), ids)
}

func (t *ownerTracker) trackAs(ctx context.Context, owner string, ids []int64) error {
	if err := t.lease.checkTrack(ctx, t.state); err != nil {
		return err
	}
	life, written := t.rows.writtenLife()
	switch id, l, ok := parseOwner(owner); {
	case !ok || id != t.id:
		return fmt.Errorf("track %d rows of %s under owner %q: %w: not a value of this worker's OwnerValue()",
			len(ids), t.id, clip(owner), ErrInvalidConfig)
	case l == "":
		// A bare ID names every life: a recovery of a life judged dead
		// resets such rows whenever its statements run.
		t.noteBareOwners()
		if t.lease.held() {
			return fmt.Errorf("track %d rows of %s under its bare instance ID: %w: held after a regained lease (write OwnerValue() to resume at once)",
				len(ids), t.id, ErrLeaseLost)
		}
	case l != life:
		return fmt.Errorf("track %d rows of %s fetched under %q: %w: that life ended (the lease was lost since); roll the fetch back and fetch under OwnerValue()",
			len(ids), t.id, clip(owner), ErrLeaseLost)
	}
	if !written {
		// Recorded by the next heartbeat: until then a recoverer could
		// not tell this life from an ended one.
		return fmt.Errorf("track %d rows of %s: %w: the new life is not recorded in Redis yet", len(ids), t.id, ErrLeaseLost)
	}
	if len(ids) == 0 {
		return nil
	}
	if !t.rows.addOwned(ids, owner, life) {
		return fmt.Errorf("track %d rows of %s fetched under %q: %w: the lease was lost meanwhile", len(ids), t.id, clip(owner), ErrLeaseLost)
	}
	t.checkTracked(ctx, ids)
	return nil // the owner column says it all: nothing is sent to Redis
}

func (t *ownerTracker) untrack(ids []int64) error {
	t.checkUntracking(ids)
	t.rows.remove(ids)
	return nil
}

// untrackUnchanged untracks the rows of gens that were not tracked again
// since gens was taken (Release), as Untrack would.
func (t *ownerTracker) untrackUnchanged(gens map[int64]uint64) error {
	t.rows.removeUnchanged(gens, false)
	return nil
}

func (t *ownerTracker) ownerValue() string {
	life := t.rows.currentIncarnation()
	t.ownerRead.Store(&life) // what a plain Track takes (trackOwner)
	return lifeOwner(t.id, life)
}

// currentOwner is OwnerValue for the library's own use: it leaves alone the
// value a plain Track takes (trackOwner), which only the host's reads set.
func (t *ownerTracker) currentOwner() string {
	return lifeOwner(t.id, t.rows.currentIncarnation())
}

// trackOwner is the owner value a plain Track takes its rows for in owner
// mode: the value OwnerValue last returned, which a host that reads Owner once
// per block and then calls Track (the quickstart of the release before
// TrackAs) wrote in its fetch. Should a loss have begun a new life since,
// TrackAs refuses it as an ended life's. A host that never called OwnerValue
// gets the current life's value.
func (t *ownerTracker) trackOwner() string {
	if p := t.ownerRead.Load(); p != nil && !mutantTrackCurrentLife {
		return lifeOwner(t.id, *p)
	}
	return t.currentOwner()
}

// rotateLocked has nothing to do: a worker in owner mode has a resetter
// that fences by owner, so Release marks no row released and none is
// retaken. retrack has nothing to write back: there is no rows set.
func (t *ownerTracker) rotateLocked(context.Context) error { return nil }
func (t *ownerTracker) retrack(context.Context, []int64)   {}

// trackCalled is false: the untracked-rows note is rows-set mode's.
func (t *ownerTracker) trackCalled() bool { return false }

// loop is nil: no deferred Untrack, nothing to flush.
func (t *ownerTracker) loop() func(context.Context) { return nil }

// Owner mode. When the resetter fences by owner and lists the owners of
// rows in progress (ResetterInfo's OwnerFencing and ListsInProgress: a
// pgxreset.Resetter with postgres.WithOwnerColumn), PostgreSQL knows which rows each worker
// holds, atomically with the fetch that set the owner column: the worker
// mirrors nothing into Redis. Track and Untrack keep the worker's own view
// (Release, the lease, the self-check) and send nothing; the heartbeat
// writes no rows; a dead peer goes down the one dead-peer path as ever
// (claim, reset, finish, deregister), its reset being
//
//	UPDATE ... SET status = queued, owner = NULL WHERE owner = $dead AND status = inprog
//
// (chunked, lock-ordered, with the recovery count and quarantine), which is
// idempotent (a second one finds nothing the dead peer owns) and which no
// Redis expiry can undo. The backstop sweep is always on: the owners of rows
// in progress in PostgreSQL are part of what recovery looks at, so a Redis
// that forgets its registry cannot strand a row.
//
// WithRowsSets keeps the design's rows sets instead, as releases before
// owner mode did.

// ownerModeOf reports whether a Worker whose resetter says info, with
// options o, runs in owner mode: the resetter fences by owner (it resets
// by owner) and lists the owners of rows in progress, and WithRowsSets is
// not set.
func ownerModeOf(info ResetterInfo, o options) bool {
	return !o.rowsSets && info.OwnerFencing && info.ListsInProgress
}
