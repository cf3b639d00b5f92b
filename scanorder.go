package recovery

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/alya/recovery/internal/store"
)

// How a scan orders its dead peers, so that a fresh death is recovered
// within the bound however many peers died before it (a zone outage
// leaves thousands of registry entries without a heartbeat):
//
//   - one pipelined read of every dead peer's record (store.Records) and
//     one renewal of every rows set and incarnation found that might not
//     outlive two more scans (store.KeepRows), in batches, before any
//     recovery: no set waits in the queue long enough to expire, whatever
//     its place in it;
//   - the peers that left something to recover (a rows set, an
//     incarnation, a claim key) go first, those this worker has not seen
//     dead before ahead of the rest, each group in the order its records
//     were last written (newest first);
//   - the peers that left nothing (a registry entry alone; in owner mode,
//     also no row in progress under their ID in the table) are removed
//     from the registry in pipelined batches (store.DeregisterIdle: the
//     same check as one deregistration) when there are more than
//     idleOneByOne of them; fewer go down the one path like any other;
//   - a scan starts no recovery once scanBudget has passed, and no bulk
//     removal half a budget after that (at least one of each): the rest
//     is left to the next scan, which orders them again, behind any newer
//     death.

// idleOneByOne is how many dead peers with nothing to recover a scan
// hands one by one to the dead-peer path; more are deregistered in bulk.
const idleOneByOne = 32

// idleBatch is how many registry entries one bulk deregistration sends
// in one pipeline, under one operation timeout.
const idleBatch = 1000

// scanBudget is how long a scan may start recoveries: half the recovery
// interval. With the next scan starting a recovery interval after this
// one started (recoverer.run), scans never queue behind each other.
func (o *options) scanBudget() time.Duration {
	return max(o.recoveryInterval/2, time.Millisecond)
}

// deadSeen is what this worker remembers of the dead peers its scans
// found: when it first saw each dead, and how many rows its rows set held
// when last seen (0: none). A peer found alive or gone from the registry
// is forgotten at the next scan.
type deadSeen struct {
	mu    sync.Mutex
	peers map[string]seenPeer
}

type seenPeer struct {
	first  time.Time
	rows   int64
	at     time.Time // when rows was read
	failed bool      // a recovery of it failed: it holds rows it could not reset yet
}

// rowsSeen returns how many rows peer's rows set held when a scan last
// saw it, and when; 0 when none was seen.
func (d *deadSeen) rowsSeen(peer string) (int64, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.peers[peer]
	return s.rows, s.at
}

// failedBefore reports whether a recovery of peer failed since a scan
// first saw it dead.
func (d *deadSeen) failedBefore(peer string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peers[peer].failed
}

// boolFirst orders true before false.
func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// failedOnce notes that a recovery of peer failed.
func (d *deadSeen) failedOnce(peer string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.peers[peer]; ok {
		s.failed = true
		d.peers[peer] = s
	}
}

// heldRows reports whether a scan saw peer's rows set hold rows.
func (d *deadSeen) heldRows(peer string) bool {
	rows, _ := d.rowsSeen(peer)
	return rows > 0
}

// forget drops peer (recovered, or deregistered).
func (d *deadSeen) forget(peer string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.peers, peer)
}

// scanPlan is what a scan does with its dead peers: one by one, in
// order, then the idle ones in bulk.
type scanPlan struct {
	order []string
	idle  []string
	lives map[string][]string // owner mode: per-life owner values in progress, by peer
}

// scanEntry is one dead peer whose record a scan read, with what orders
// it in the plan.
type scanEntry struct {
	peer  string
	fresh bool
	first time.Time
	ttl   time.Duration
	retry bool // its last recovery failed: it holds rows for sure
	rows  bool // a scan saw its rows set hold rows
}

// planScan reads the dead peers' records, renews their rows sets, and
// orders them. Peers whose records could not be read go down the one
// path after those whose could.
func (r *recoverer) planScan(ctx context.Context, dead []string, now time.Time) scanPlan {
	if len(dead) == 0 {
		return scanPlan{}
	}
	recs, unread, kept := r.readRecords(ctx, dead)
	r.keepRows(ctx, kept)
	first := r.peers.seen.note(dead, recs, now)
	var rec, idle []scanEntry
	var later []string
	for i, p := range dead {
		e := scanEntry{peer: p, first: first[i], fresh: first[i].Equal(now), ttl: max(recs[i].RowsTTL, recs[i].IncarnationTTL),
			retry: r.peers.seen.failedBefore(p), rows: recs[i].Rows > 0 || r.peers.seen.heldRows(p)}
		switch {
		case unread[p]:
			later = append(later, p)
		case recs[i].Empty() && !r.peers.seen.heldRows(p):
			// A peer whose set a scan saw holding rows is not idle: its
			// set is lost, which its recovery reports (ErrRowsSetLost).
			idle = append(idle, e)
		default:
			rec = append(rec, e)
		}
	}
	if len(rec) > idleOneByOne {
		r.markOwning(ctx, rec)
	}
	sortScanEntries(rec)
	plan := scanPlan{order: make([]string, 0, len(dead))}
	for _, e := range rec {
		plan.order = append(plan.order, e.peer)
	}
	plan.order = append(plan.order, later...)
	idleIDs := make([]string, 0, len(idle))
	for _, e := range idle {
		idleIDs = append(idleIDs, e.peer)
	}
	if len(idleIDs) > idleOneByOne {
		idleIDs = r.owningIdle(ctx, &plan, idleIDs)
	}
	if len(idleIDs) <= idleOneByOne {
		plan.order = append(plan.order, idleIDs...)
	} else {
		plan.idle = idleIDs
	}
	return plan
}

// readRecords reads the dead peers' records, in batches, each under its
// own operation timeout: one pipeline of 10,000 peers' reads outlasts a
// short timeout on a loaded machine. It returns the records (an unread
// one counts as not idle), the peers whose records could not be read,
// and those whose rows set or incarnation needs renewing: a set is
// renewed when it might not outlive the next two scans. One comes within
// the longest recovery wait, so a set renewed when it gets shorter than
// two is never lost in the queue, and a backlog of thousands costs a
// renewal every other scan or so, not every scan.
func (r *recoverer) readRecords(ctx context.Context, dead []string) (recs []store.Record, unread map[string]bool, kept []string) {
	renewBelow := 2 * r.opts.longestRecoveryWait()
	recs = make([]store.Record, len(dead))
	unread = map[string]bool{}
	for from := 0; from < len(dead); from += idleBatch {
		batch := dead[from:min(from+idleBatch, len(dead))]
		opCtx, cancel := r.opts.opContext(ctx)
		got, err := r.store.Records(opCtx, batch)
		cancel()
		if err != nil {
			if len(unread) == 0 {
				r.log.Warn("reading the records of dead peers failed; they are recovered after the others",
					slog.Int("peers_dead", len(batch)), slog.Any("error", err))
			}
			for i, p := range batch {
				unread[p] = true
				recs[from+i] = store.Record{Claim: true, RowsTTL: -2, IncarnationTTL: -2} // unknown: not idle
			}
			continue
		}
		copy(recs[from:], got)
		for i, rec := range got {
			if rec.RowsTTL != -2 && rec.RowsTTL < renewBelow || rec.IncarnationTTL != -2 && rec.IncarnationTTL < renewBelow {
				kept = append(kept, batch[i])
			}
		}
	}
	return recs, unread, kept
}

// keepRows renews the rows sets and incarnations of kept, in batches,
// before any recovery; it stops at the first failure.
func (r *recoverer) keepRows(ctx context.Context, kept []string) {
	for from := 0; from < len(kept); from += idleBatch {
		opCtx, cancel := r.opts.opContext(ctx)
		kerr := r.store.KeepRows(opCtx, kept[from:min(from+idleBatch, len(kept))], r.peers.fleet.rowsTTL())
		cancel()
		if kerr != nil {
			r.log.Warn("renewing the rows sets of dead peers before their recovery failed; each claim renews its own",
				slog.Int("peers_dead", len(kept)), slog.Any("error", kerr))
			return
		}
	}
}

// markOwning marks the entries whose peer owns rows in progress, where
// the table says who holds rows (owner mode, which keeps no rows in
// Redis): which of many queued peers hold rows, so that a fresh death's
// rows are not queued behind a mass death's empty records (one query).
// Without the answer the order stays by age.
func (r *recoverer) markOwning(ctx context.Context, rec []scanEntry) {
	ids := make([]string, len(rec))
	for i, e := range rec {
		ids[i] = e.peer
	}
	if owning, _, err := r.peers.held.owningPeers(ctx, ids); err == nil {
		for i := range rec {
			rec[i].rows = rec[i].rows || owning[rec[i].peer]
		}
	}
}

// sortScanEntries orders the peers to recover: those not seen dead
// before first, newest record first; then those known to hold rows; then
// the rest, the one waiting longest first.
func sortScanEntries(rec []scanEntry) {
	slices.SortStableFunc(rec, func(a, b scanEntry) int {
		switch {
		case a.fresh != b.fresh:
			if a.fresh {
				return -1
			}
			return 1
		case a.fresh:
			return cmp.Compare(b.ttl, a.ttl) // newest record first
		case a.retry != b.retry, a.rows != b.rows:
			// Peers known to hold rows before those that may hold none:
			// a peer whose reset a lock held up is not queued behind a
			// mass death's empty records once the lock is gone.
			return cmp.Or(boolFirst(a.retry, b.retry), boolFirst(a.rows, b.rows))
		}
		return a.first.Compare(b.first) // waited longest first
	})
}

// owningIdle sends down the one path, with the lives the table lists,
// the idle peers that own rows in progress, where the table says who
// holds rows: nothing in Redis, but rows in progress may carry the ID.
// It returns the peers left idle; when the owners cannot be listed,
// every idle peer goes down the one path.
func (r *recoverer) owningIdle(ctx context.Context, plan *scanPlan, idleIDs []string) []string {
	owning, lives, err := r.peers.held.owningPeers(ctx, idleIDs)
	if owning == nil && err == nil {
		return idleIDs // the table keeps no owners
	}
	if err != nil {
		r.log.Warn("listing the owners of rows in progress failed; dead peers with nothing in Redis are recovered one by one",
			slog.Int("peers_dead", len(idleIDs)), slog.Any("error", err))
		plan.order = append(plan.order, idleIDs...)
		return nil
	}
	plan.lives = lives
	var rest []string
	for _, p := range idleIDs {
		if owning[p] {
			plan.order = append(plan.order, p)
		} else {
			rest = append(rest, p)
		}
	}
	return rest
}

// note records the peers of this scan's dead list (with their records)
// and forgets the others; it returns when each was first seen dead (now
// for a peer not seen before).
func (d *deadSeen) note(dead []string, recs []store.Record, now time.Time) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := make(map[string]seenPeer, len(dead))
	first := make([]time.Time, len(dead))
	for i, p := range dead {
		s, ok := d.peers[p]
		if !ok {
			s.first = now
		}
		if recs[i].Rows > 0 {
			s.rows, s.at = recs[i].Rows, now
		}
		if s.rows > 0 || s.failed || !recs[i].Empty() {
			next[p] = s // an idle entry is not remembered: nothing to lose
		}
		first[i] = s.first
	}
	d.peers = next
	return first
}

// deregisterIdle removes the idle dead peers from the registry in
// batches, until half a scan budget after the scan's budget (from now, if
// later) or ctx ends; it returns how many it removed, and the first
// error.
func (r *recoverer) deregisterIdle(ctx context.Context, idle []string, deadline time.Time) (int, error) {
	removed := 0
	if d := time.Now().Add(r.opts.scanBudget() / 2); d.After(deadline) {
		deadline = d
	}
	for len(idle) > 0 && ctx.Err() == nil && time.Now().Before(deadline) {
		n := min(len(idle), idleBatch)
		opCtx, cancel := r.opts.opContext(ctx)
		got, err := r.store.DeregisterIdle(opCtx, idle[:n])
		cancel()
		r.judge.noteRegistry(err)
		if err != nil {
			return removed, err
		}
		removed += got
		idle = idle[n:]
	}
	return removed, nil
}
