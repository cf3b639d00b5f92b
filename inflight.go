package recovery

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
)

// inflight is the worker's own record of the rows it is processing. Redis
// holds the copy peers read; this one survives Redis forgetting (a restart
// without persistence, a failover, eviction) and is written back with every
// heartbeat.
type inflight struct {
	mu sync.Mutex
	// ids are the rows tracked and not yet untracked, each with the
	// generation of its last Track: Release untracks only the rows whose
	// generation did not change while it reset them, so a row the host
	// took again meanwhile stays tracked.
	ids map[int64]uint64
	gen uint64
	// unremoved are rows untracked whose SREM failed; the next heartbeat
	// removes them from Redis.
	unremoved map[int64]struct{}
	// stale are the rows that were tracked when the lease was lost: peers
	// may have recovered them. Until the host has untracked or released
	// every one, the lease counts as lost (lease.check).
	stale map[int64]struct{}
	// lossGen is the generation of the last Track before the lease was
	// last lost: rows tracked no later may have been reset by a recoverer,
	// and the self-check does not judge them.
	lossGen uint64
	// incarnation names the life of the rows set (keys.Keys.Incarnation).
	// Resets without owner fencing are recorded under it, and a recorded
	// row is never reset again for it.
	incarnation string
	// released are rows this worker reset itself (Release, without owner
	// fencing) under the current incarnation. Should one be tracked again,
	// the incarnation changes first (rotateIncarnation), or a recovery
	// would find it in the ledger and skip it.
	released map[int64]struct{}
	// retakenIDs are the released rows a Track took again since they were
	// released. A released row the host has not untracked yet is no
	// retaken one: rotating the incarnation under a Release whose reset is
	// still running (or whose reply was lost, and which the host repeats)
	// would hide the ledger's record of it from the repeat, which would
	// then reset the row again, under whichever worker took it since.
	retakenIDs map[int64]struct{}
	// abandoned are stale rows this worker left to the backstop sweep by
	// row version: its rows set was gone when its heartbeat came back, so
	// the sweep may have reset them, out of the ledger's sight, and peers
	// taken them again. Release of one only forgets it.
	abandoned map[int64]struct{}
	// lossChecked is set once the first heartbeat after the last loss has
	// looked for the rows set (abandonStale).
	lossChecked bool
	// owners is, in owner mode, the owner value each tracked row was
	// fetched under (TrackAs): Release resets it under that value, and the
	// self-check expects it. Rows tracked under the current value are not
	// in it (ownerOf returns the default the caller gives).
	owners map[int64]string
	// written is the incarnation the last heartbeat wrote: in owner mode a
	// row is tracked only under a life Redis has recorded (owner.go).
	written string
	// marks say when generations began, for the age of the oldest row
	// (oldestTracked): one per Track at least trackMarkEvery after the
	// last, so a generation's time is known to within that, from below.
	marks []trackMark

	// assert orders the writes of the rows set. Writers of a snapshot (the
	// heartbeat, which re-adds ids and removes unremoved, Shutdown's
	// clean-up and the deferred Untrack flusher) hold it exclusively from the snapshot until Redis has
	// answered; synchronous Untrack holds it shared from its change in
	// memory until its SREM is answered. So a heartbeat never re-adds a row
	// an Untrack has just removed. Track takes no lock (it must never wait
	// on the heartbeat's I/O, nor make the heartbeat wait on a caller's
	// context); a pending removal that lands after a Track of the same row
	// is undone by retrack.
	assert sync.RWMutex
}

func (s *inflight) init() {
	s.ids = make(map[int64]uint64)
	s.unremoved = make(map[int64]struct{})
	s.stale = make(map[int64]struct{})
	s.released = make(map[int64]struct{})
	s.retakenIDs = make(map[int64]struct{})
	s.abandoned = make(map[int64]struct{})
	s.owners = make(map[int64]string)
	s.incarnation = newToken()
}

// newLife begins a new incarnation (owner mode: a new life, owner.go) and
// returns it.
func (s *inflight) newLife() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation = newToken()
	return s.incarnation
}

// wrote records that a heartbeat wrote incarnation.
func (s *inflight) wrote(incarnation string) {
	s.mu.Lock()
	s.written = incarnation
	s.mu.Unlock()
}

// writtenLife returns the current incarnation, and whether a heartbeat has
// written it.
func (s *inflight) writtenLife() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation, s.written == s.incarnation
}

// addOwned tracks ids fetched under owner value owner (owner mode), if the
// current incarnation is still life: it reports false, tracking nothing,
// when a new life began since the caller looked.
func (s *inflight) addOwned(ids []int64, owner, life string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.incarnation != life {
		return false
	}
	s.gen++
	s.mark()
	for _, id := range ids {
		s.ids[id] = s.gen
		delete(s.unremoved, id)
		s.owners[id] = owner
	}
	return true
}

// ownersOf groups the tracked rows among ids by the owner value they were
// fetched under; rows not tracked go under def.
func (s *inflight) ownersOf(ids []int64, def string) map[string][]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]int64)
	for _, id := range ids {
		o, ok := s.owners[id]
		if !ok {
			o = def
		}
		out[o] = append(out[o], id)
	}
	return out
}

// ownerOf returns the owner value row id was fetched under, or def.
func (s *inflight) ownerOf(id int64, def string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.owners[id]; ok {
		return o
	}
	return def
}

// add tracks ids. It reports whether one of them was released under the
// current incarnation (the incarnation must change before it is written).
func (s *inflight) add(ids []int64) (retaken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	s.mark()
	for _, id := range ids {
		s.ids[id] = s.gen
		delete(s.unremoved, id)
		if _, ok := s.released[id]; ok {
			s.retakenIDs[id] = struct{}{}
			retaken = true
		}
	}
	return retaken
}

// generations returns the generation of each of ids that is tracked.
func (s *inflight) generations(ids []int64) map[int64]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]uint64, len(ids))
	for _, id := range ids {
		if g, ok := s.ids[id]; ok {
			out[id] = g
		}
	}
	return out
}

// removeUnchanged removes the rows of gens still tracked with the same
// generation, and returns them; with forget they are also marked for
// removal from Redis (deferred Untrack).
func (s *inflight) removeUnchanged(gens map[int64]uint64, forget bool) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for id, g := range gens {
		// A row left to the sweep is no longer tracked; the host is done
		// with it all the same (heldAtLoss).
		delete(s.abandoned, id)
		if cur, ok := s.ids[id]; ok && cur == g {
			delete(s.ids, id)
			delete(s.owners, id)
			delete(s.stale, id)
			if forget {
				s.unremoved[id] = struct{}{}
			}
			out = append(out, id)
		}
	}
	return out
}

// unmarkReleased forgets that ids were released (their reset failed).
func (s *inflight) unmarkReleased(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		delete(s.released, id)
		delete(s.retakenIDs, id)
	}
	s.mu.Unlock()
}

func (s *inflight) remove(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		delete(s.ids, id)
		delete(s.owners, id)
		delete(s.stale, id)
		delete(s.abandoned, id)
	}
	s.mu.Unlock()
}

// markLoss records that the lease was lost: no row tracked now is judged
// by the self-check any more, and with stale they are marked stale too.
// With life a new incarnation begins in the same step (owner mode: a new
// life), so a Track either came before (its rows are marked) or finds the
// life ended (addOwned).
func (s *inflight) markLoss(stale, life bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if life {
		s.incarnation = newToken()
	}
	s.lossGen = s.gen
	s.lossChecked = false
	if !stale {
		return 0
	}
	for id := range s.ids {
		s.stale[id] = struct{}{}
	}
	return len(s.stale)
}

// needsLossCheck reports whether stale rows wait for the first heartbeat
// after the loss to look for the rows set.
func (s *inflight) needsLossCheck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lossChecked && len(s.stale) > 0
}

// abandonStale ends the check after a loss: with setGone, the stale rows
// stop being tracked (the heartbeat does not write them back) and are
// marked abandoned. It returns them.
func (s *inflight) abandonStale(setGone bool) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lossChecked = true
	if !setGone {
		return nil
	}
	out := make([]int64, 0, len(s.stale))
	for id := range s.stale {
		delete(s.ids, id)
		s.abandoned[id] = struct{}{}
		out = append(out, id)
	}
	clear(s.stale)
	return out
}

// takeAbandoned returns ids without the abandoned rows among them, which
// it forgets, and how many those were.
func (s *inflight) takeAbandoned(ids []int64) (rest []int64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.abandoned) == 0 {
		return ids, 0
	}
	rest = make([]int64, 0, len(ids))
	for _, id := range ids {
		if _, ok := s.abandoned[id]; ok {
			delete(s.abandoned, id)
			n++
			continue
		}
		rest = append(rest, id)
	}
	return rest, n
}

// heldAtLoss returns how many rows held at the last loss the host has not
// released or untracked yet: the stale rows still tracked, and the rows
// left to the backstop sweep (abandoned), which the sweep may reset under
// a host that went on processing them. The lease stays lost while there
// are any.
func (s *inflight) heldAtLoss() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mutantAbandonedFreeLease {
		return len(s.stale)
	}
	return len(s.stale) + len(s.abandoned)
}

func (s *inflight) markUnremoved(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		if _, tracked := s.ids[id]; !tracked {
			s.unremoved[id] = struct{}{}
		}
	}
	s.mu.Unlock()
}

// forget removes ids from the tracked rows and marks them for removal from
// Redis, in one step (deferred Untrack).
func (s *inflight) forget(ids []int64) {
	s.mu.Lock()
	for _, id := range ids {
		delete(s.ids, id)
		delete(s.owners, id)
		delete(s.stale, id)
		delete(s.abandoned, id)
		s.unremoved[id] = struct{}{}
	}
	s.mu.Unlock()
}

// trackedAmong returns the rows of ids that are tracked now.
func (s *inflight) trackedAmong(ids []int64) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, id := range ids {
		if _, ok := s.ids[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// pendingRemovals returns the rows waiting for their SREM.
func (s *inflight) pendingRemovals() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.unremoved)
}

// snapshot returns the tracked and the unremoved rows, and the
// incarnation.
func (s *inflight) snapshot() (tracked, unremoved []int64, incarnation string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.ids), members(s.unremoved), s.incarnation
}

// settledGeneration returns the generation of id if it is tracked since
// the last loss of the lease.
func (s *inflight) settledGeneration(id int64) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.ids[id]
	return g, ok && g > s.lossGen
}

// lossGeneration returns the generation of the last Track before the
// lease was last lost.
func (s *inflight) lossGeneration() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lossGen
}

// newestSettled returns up to n rows tracked since the last loss of the
// lease and not in skip, those of the latest Tracks first.
func (s *inflight) newestSettled(n int, skip map[int64]sighting) []int64 {
	if n <= 0 {
		return nil
	}
	s.mu.Lock()
	type row struct {
		id  int64
		gen uint64
	}
	rows := make([]row, 0, min(len(s.ids), 4*n))
	for id, g := range s.ids {
		if g <= s.lossGen {
			continue
		}
		if _, ok := skip[id]; ok {
			continue
		}
		rows = append(rows, row{id, g})
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.gen, a.gen) })
	out := make([]int64, 0, min(n, len(rows)))
	for _, r := range rows[:min(n, len(rows))] {
		out = append(out, r.id)
	}
	return out
}

// currentIncarnation returns the incarnation of the rows set.
func (s *inflight) currentIncarnation() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation
}

// markReleased records rows this worker reset itself under the current
// incarnation, and returns those not marked yet: the only ones a failed
// reset may unmark.
func (s *inflight) markReleased(ids []int64) (marked map[int64]struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	marked = make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		if _, ok := s.released[id]; !ok {
			s.released[id] = struct{}{}
			marked[id] = struct{}{}
		}
	}
	return marked
}

// retaken reports whether a row released under the current incarnation
// was tracked again since (Track), not merely still tracked because the
// Release that reset it has not untracked it yet.
func (s *inflight) retaken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.retakenIDs {
		if _, ok := s.ids[id]; ok {
			return true
		}
	}
	return false
}

// rotation returns the released rows not tracked again, which must leave
// the rows set with the old incarnation, and a new incarnation.
func (s *inflight) rotation() (gone []int64, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.released {
		if _, ok := s.ids[id]; !ok {
			gone = append(gone, id)
		}
	}
	return gone, newToken()
}

// rotated records that Redis now holds incarnation next and none of gone.
func (s *inflight) rotated(next string, gone []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation = next
	clear(s.released)
	clear(s.retakenIDs)
	for _, id := range gone {
		delete(s.unremoved, id)
	}
}

// forgetUnremoved drops rows whose SREM has now succeeded.
func (s *inflight) forgetUnremoved(done []int64) {
	s.mu.Lock()
	for _, id := range done {
		delete(s.unremoved, id)
	}
	s.mu.Unlock()
}

func (s *inflight) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// trackMarkEvery is the resolution of the oldest row's age: a Track costs
// a clock read, and a mark at most once this often.
const trackMarkEvery = time.Second

// A trackMark says that generations from gen on began at or after at.
type trackMark struct {
	gen uint64
	at  time.Time
}

// mark records when generation s.gen began, unless the last mark is
// recent enough to stand for it; s.mu is held.
func (s *inflight) mark() {
	now := time.Now()
	if n := len(s.marks); n > 0 && now.Sub(s.marks[n-1].at) < trackMarkEvery {
		return
	}
	s.marks = append(s.marks, trackMark{gen: s.gen, at: now})
}

// oldestTracked returns when the oldest row tracked now was tracked (its
// last Track), to within trackMarkEvery earlier, and false when none is.
// It reads every tracked row once (the heartbeat's snapshot does too) and
// drops the marks no tracked row needs any more.
func (s *inflight) oldestTracked() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) == 0 {
		s.marks = s.marks[:0]
		return time.Time{}, false
	}
	oldest := uint64(math.MaxUint64)
	for _, g := range s.ids {
		oldest = min(oldest, g)
	}
	// The last mark at or before the oldest generation: every generation
	// has one, the first Track after the marks were emptied makes one.
	i, found := slices.BinarySearchFunc(s.marks, oldest, func(m trackMark, g uint64) int { return cmp.Compare(m.gen, g) })
	if !found {
		i--
	}
	if i < 0 {
		return time.Time{}, false
	}
	s.marks = s.marks[i:]
	return s.marks[0].at, true
}

func members[V any](set map[int64]V) []int64 {
	if len(set) == 0 {
		return nil
	}
	out := make([]int64, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	return out
}
