package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/alya/recovery/internal/store"
)

// The fleet record (store.FleetKey): one key prefix serves one fleet.
//
// What the fleet serves (database, schema, table) is recorded under the
// prefix by the first worker that can tell (Start, or any heartbeat after
// a Redis restart or a rolling upgrade from workers that do not record
// it), and Start refuses a worker whose resetter serves something else
// (ErrFleetMismatch): two applications under one prefix would each take
// the other's dead workers for their own and reset the wrong table's rows.
// The mode (owner or rows set) is not part of it: a rolling owner-column
// rollout runs both modes in one fleet on purpose.
//
// Every heartbeat also announces the worker's timings there (heartbeat TTL,
// claim TTL, the longest wait for a scan after a death) and learns the
// longest of the fleet's live announcements. Those hold verdicts a worker
// takes on behalf of the whole fleet: after a Redis restart or failover,
// no death is judged until the longest TTL any live member uses has passed
// (nodeage.go), not the judge's own; a lease that comes back holds for the
// longest claim TTL; rows sets live long enough for the slowest scanner.
// The worker remembers what it learnt in its own memory (fleetMemory), so
// a Redis restarted empty, which has forgotten every announcement, does
// not shorten them. Workers of older versions announce nothing: a fleet
// mixing them gets their timings only from workers that share them.

// fleetView is this worker's side of the fleet record: what it announces,
// what it learnt of the others (mem), and the timings derived from both.
// The heartbeat, the scan, the sweep, the dead-peer path and Start share
// one.
type fleetView struct {
	mem   fleetMemory
	store store.Store
	log   *slog.Logger
	opts  *options
	mode  string // what the heartbeats announce: "owner" or "rows-set"
}

// check finds what this worker serves, and on which server, and
// records both under the prefix, or returns an error wrapping
// ErrFleetMismatch when the prefix serves something else, or the same
// names on another server. A record of the release before the server
// field is filled, not refused (a rolling upgrade). What it serves and
// where are what the resetter's Check read (checked: ResetterInfo's Serves
// and Server); a resetter that cannot tell (Serves empty) is not checked;
// nor, with WithoutSchemaCheck (which lets a worker start while
// PostgreSQL is down), is a worker whose resetter could not ask the
// database (checkSchema logged it). Start calls it before it writes
// anything else. It reports whether it read the fleet record (f): Start
// learns the members' timings from it.
func (v *fleetView) check(ctx context.Context, checked ResetterInfo) (f store.Fleet, read bool, err error) {
	serves, server := checked.Serves, checked.Server
	if serves == "" || mutantNoFleetCheck {
		return f, false, nil // the resetter cannot tell
	}
	opCtx, cancel := v.opts.opContext(ctx)
	defer cancel()
	f, err = v.store.RecordFleet(opCtx, serves, server)
	if err != nil {
		return f, false, err
	}
	if recorded, theirs, differs := f.Differs(serves, server); differs {
		return f, true, v.mismatch(recorded, theirs)
	}
	v.mem.setServes(serves, server)
	return f, true, nil
}

func (v *fleetView) mismatch(recorded, serves string) error {
	return fmt.Errorf("%w: %q serves %s, this worker serves %s; give each application its own key prefix (WithKeyPrefix), and once no worker of the recorded fleet runs under this prefix any more, delete the key %s",
		ErrFleetMismatch, v.opts.keyPrefix, recorded, serves, store.FleetKey(v.opts.keyPrefix))
}

// announcement is what this worker's heartbeats announce.
func (v *fleetView) announcement() store.Announcement {
	return store.Announcement{
		TTL: v.opts.heartbeatTTL, Claim: v.opts.claimTTL(),
		Wait: v.opts.detectionWindow() - v.opts.heartbeatTTL, Mode: v.mode,
	}
}

// note takes in what a heartbeat learnt of the fleet record.
func (v *fleetView) note(read store.FleetView, err error) {
	if err != nil {
		// The memory keeps what it had; the next heartbeat tries again. A
		// reply (a key of the wrong type) is logged once per outage; a
		// timeout is the heartbeat's to report.
		if store.IsReply(err) && v.mem.brokenOnce(true) {
			v.log.Warn("cannot write the fleet record: this worker's timings are not announced to its peers; delete the key if it is not a hash",
				slog.Any("error", err))
		}
		return
	}
	v.mem.brokenOnce(false)
	v.mem.learn(read.Longest, time.Now())
	serves, server := v.mem.served()
	if serves == "" || read.Serves == "" {
		return
	}
	if read.Serves == serves && (server == "" || read.Server == "" || read.Server == server) {
		return
	}
	if v.mem.warnOnce() {
		v.log.Error("the key prefix serves another fleet: its workers would recover this fleet's dead workers in their table, and ours in ours; give each application its own prefix (WithKeyPrefix)",
			slog.String("key_prefix", v.opts.keyPrefix), slog.String("recorded", read.Serves), slog.String("recorded_server", read.Server),
			slog.String("serves", serves), slog.String("server", server))
	}
}

// learnRecord reads the fleet record and learns every announcement in
// it, lapsed ones too (a record loaded from an old snapshot still lists
// the members it had then): a Worker that does not heartbeat (ops.RecoverNow
// before Start) learns the fleet's timings no other way, and Start learns
// them before its first heartbeat's recount drops the lapsed ones. A record that
// cannot be read leaves the memory as it was; the scan reports Redis
// failures itself.
func (v *fleetView) learnRecord(ctx context.Context) {
	opCtx, cancel := v.opts.opContext(ctx)
	f, err := v.store.ReadFleet(opCtx)
	cancel()
	if err != nil {
		return
	}
	v.learnMembers(f)
}

// learnMembers learns every announcement of the fleet record f.
func (v *fleetView) learnMembers(f store.Fleet) {
	now := time.Now()
	for _, m := range f.Members {
		v.mem.learn(m.Announcement, now)
	}
}

// fleetMemory is what a worker remembers of the fleet's announcements:
// the longest of each timing, kept until no announcement has repeated it
// for three of it (a member that announced it is dead or changed by then).
type fleetMemory struct {
	mu            sync.Mutex
	serves        string
	server        string
	warned        bool
	broken        bool // the record's last update got an error reply
	ttl, claim, w remembered
}

// remembered is one remembered timing and when it was last announced.
type remembered struct {
	d    time.Duration
	seen time.Time
}

// learn takes in a timing announced at now: a longer one replaces the
// memory at once, a shorter one only once the memory is three of itself
// old.
func (r *remembered) learn(d time.Duration, now time.Time) {
	d = min(d, maxAnnounced)
	if d >= r.d || now.Sub(r.seen) > satMul(r.d, 3) {
		r.d, r.seen = d, now
	}
}

// maxAnnounced caps an announced timing: a garbage value in Redis must not
// hold verdicts back for years. The longest a valid worker announces is a
// claim TTL, at most 4 × maxDuration.
const maxAnnounced = 4 * maxDuration

func (m *fleetMemory) learn(a store.Announcement, now time.Time) {
	if mutantOwnTimingsOnly {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ttl.learn(a.TTL, now)
	m.claim.learn(a.Claim, now)
	m.w.learn(a.Wait, now)
}

func (m *fleetMemory) longest() (ttl, claim, wait time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ttl.d, m.claim.d, m.w.d
}

func (m *fleetMemory) setServes(serves, server string) {
	m.mu.Lock()
	m.serves, m.server = serves, server
	m.mu.Unlock()
}

// served is what this worker serves and its server, as Start recorded
// them ("" when not).
func (m *fleetMemory) served() (serves, server string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.serves, m.server
}

// brokenOnce records whether the record's update failed, and reports a
// failure that starts an outage.
func (m *fleetMemory) brokenOnce(failed bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := failed && !m.broken
	m.broken = failed
	return first
}

func (m *fleetMemory) warnOnce() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := !m.warned
	m.warned = true
	return first
}

// ttl is the longest heartbeat TTL of the fleet: this worker's, or a
// longer one a member announced. Verdicts held after a restart or a
// failover wait it out.
func (v *fleetView) ttl() time.Duration {
	ttl, _, _ := v.mem.longest()
	return max(v.opts.heartbeatTTL, ttl)
}

// claimTTL is the longest recovery claim TTL of the fleet: a lease
// that comes back is held for it, so that a recovery any member claimed
// meanwhile has ended.
func (v *fleetView) claimTTL() time.Duration {
	_, claim, _ := v.mem.longest()
	return max(v.opts.claimTTL(), claim)
}

// rowsTTL is how long this worker's rows set lives after a write: the
// option, lengthened by as much as a member's wait for a scan after a
// death (its recovery interval and scan turn) exceeds ours, so the set
// outlives the slowest scanner's first look by the margin the option
// keeps over our own.
func (v *fleetView) rowsTTL() time.Duration {
	_, _, wait := v.mem.longest()
	own := v.opts.detectionWindow() - v.opts.heartbeatTTL
	if wait <= own {
		return v.opts.rowsTTL
	}
	return min(satAdd(v.opts.rowsTTL, wait-own), maxAnnounced)
}

// incarnationTTL outlives the rows set by a heartbeat interval: the
// heartbeat writes both, Track renews only the set.
func (v *fleetView) incarnationTTL() time.Duration {
	return satAdd(v.rowsTTL(), v.opts.heartbeatInterval)
}

// failureNoteTTL is how long a failed recovery's note lives: as long as a
// rows set renewed now, and an interval more.
func (v *fleetView) failureNoteTTL() time.Duration {
	return satAdd(v.rowsTTL(), v.opts.recoveryInterval)
}
