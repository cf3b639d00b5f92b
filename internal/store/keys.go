// Key names: the names shared by every worker of a fleet, and the
// validation of the names that go into them.
//
// The key names are a wire protocol: workers of different versions read each
// other's keys, so a change here is a breaking change for running fleets.
//
//	<prefix>_{<instanceID>}_HEARTBEAT  string "alive:<token>" ("alive" from old workers), TTL = heartbeat TTL
//	<prefix>_{<instanceID>}_ROWS       set of decimal row IDs, TTL = rows TTL
//	<prefix>_{<instanceID>}_RECOVERY   string claim token of the recoverer, PX
//	<prefix>_{<instanceID>}_INCARNATION string token of the rows set's life, TTL > rows TTL
//	<prefix>_{<instanceID>}_OLDEST_ROW string "<age ms> <ttl ms>": the age of the oldest row the
//	                                   instance tracks when its heartbeat wrote it ("-" for none), PX
//	                                   <ttl ms> = heartbeat TTL (added in this release: earlier workers
//	                                   neither write nor read it)
//	<prefix>_{<instanceID>}_ROWS_SEEN  string "<rows> <incarnation>": the size of a dead instance's rows set and
//	                                   its incarnation ("" for none) when a scan renewed the set; PX = the
//	                                   set's TTL + rows TTL. Deleted by the instance's heartbeat and by a
//	                                   finished recovery. A recovery that finds the set gone reports the
//	                                   loss from it (added in this release: earlier workers neither write
//	                                   nor read it)
//	<prefix>_{<instanceID>}_WITNESS, <prefix>_WITNESS_TURN, <prefix>_WITNESS_SECOND and the channels
//	                                   <prefix>_{<instanceID>}_LIFE:<life>: the liveness witness, witness.go
//	                                   (added in this release: earlier workers neither write nor read them)
//	<prefix>_WORKER_REGISTRY           set of instance IDs, no TTL
//	<prefix>_SCAN_LEASE                string instance ID of this interval's scanner (the scan turn), PX
//	<prefix>_SWEEP_LEASE               string token of the backstop sweeper (the sweep turn), PX
//	                                   (a turn key without a TTL, of another type, or holding what no
//	                                   live worker writes is a stranger's: takeTurnScript takes it over)
//	<prefix>_HISTORY                   stream of the fleet's recoveries and lease losses, XADD MAXLEN ~
//	                                   (third protocol version: earlier workers ignore it)
//	<prefix>_FLEET                     hash, no TTL (fourth protocol version: earlier workers ignore it):
//	                                   "serves" what the fleet serves (database, schema, table), set once;
//	                                   "server" the PostgreSQL server's system identifier, set once (added in
//	                                   this release: a record without it is filled by the first worker that
//	                                   serves what the record says);
//	                                   "m:<instanceID>" a member's timings, "<ttl ms> <claim ms> <wait ms> <mode> <expires ms>";
//	                                   "longest" the longest of them, "<ttl ms> <claim ms> <wait ms> <due ms>"
//
// The braces are a Redis Cluster hash tag: every key of one instance hashes
// to the same slot, so a script or transaction over them runs on Cluster.
package store

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen bounds instance IDs and prefixes. Real IDs are host-pid-time-random,
// well under 100 bytes; the bound keeps a garbage registry member from
// turning into a multi-kilobyte key.
const MaxNameLen = 512

// Key suffixes and the registry name, as in the design.
const (
	heartbeatSuffix = "_HEARTBEAT"
	rowsSuffix      = "_ROWS"
	claimSuffix     = "_RECOVERY"
	incSuffix       = "_INCARNATION"
	oldestSuffix    = "_OLDEST_ROW"
	rowsSeenSuffix  = "_ROWS_SEEN"
	registrySuffix  = "_WORKER_REGISTRY"
	// HeartbeatValue is what a live worker's heartbeat key held before
	// heartbeats carried a token, and what workers of that version still
	// write. Readers only ever check that the key exists.
	HeartbeatValue = "alive"
)

// HeartbeatOf returns the value a worker whose process token is token
// writes into its heartbeat key: "alive:<token>". The token tells this
// Worker's heartbeat from another process's under the same instance ID.
func HeartbeatOf(token string) string { return HeartbeatValue + ":" + token }

// Keys holds the key names of one instance under one prefix.
type Keys struct {
	Heartbeat string
	Rows      string
	Claim     string
	// Incarnation holds the token that names the life of the rows set:
	// resets without owner fencing are recorded in PostgreSQL under it, so
	// a retried recovery never resets a row twice. Added in the second
	// protocol version; workers of the first neither write nor read it.
	Incarnation string
	// OldestRow holds the age of the oldest row the instance tracks, as
	// its last heartbeat wrote it (WriteOldestRow). Added in this
	// release; no worker's logic reads it.
	OldestRow string
	// RowsSeen holds the size of a dead instance's rows set, and its
	// incarnation, when a scan last renewed the set (KeepRows): any
	// recoverer that then finds the set gone, not only the one whose scan
	// saw it, reports the rows lost. Added in this release.
	RowsSeen string
	// Witness is the liveness witness's marker of the instance's life
	// (witness.go). Added in this release.
	Witness string
}

// InstanceKeys returns the key names of instance id under prefix. It does not
// validate; call ValidateName first for untrusted input.
func InstanceKeys(prefix, id string) Keys {
	tag := prefix + "_{" + id + "}"
	return Keys{
		Heartbeat: tag + heartbeatSuffix,
		Rows:      tag + rowsSuffix,
		Claim:     tag + claimSuffix,

		Incarnation: tag + incSuffix,
		OldestRow:   tag + oldestSuffix,
		RowsSeen:    tag + rowsSeenSuffix,
		Witness:     tag + witnessSuffix,
	}
}

// RegistryKey returns the name of the registry set under prefix.
func RegistryKey(prefix string) string { return prefix + registrySuffix }

// FleetKey returns the name of the fleet record under prefix: what the
// fleet serves and the timings its members announce (registry.go in the root package). It is one
// key with no hash tag, so every script over it runs on Cluster.
func FleetKey(prefix string) string { return prefix + "_FLEET" }

// Errors returned by ValidateName; callers wrap them with the name's role.
var (
	ErrEmpty    = errors.New("is empty")
	ErrTooLong  = fmt.Errorf("is longer than %d bytes", MaxNameLen)
	ErrBadChars = errors.New("contains '{', '}', whitespace, a control character or invalid UTF-8")
)

// ValidateName reports whether s can be used as an instance ID or a key
// prefix: non-empty, at most MaxNameLen bytes, valid UTF-8, and free of
// braces (they would break the hash tag), whitespace and control characters.
func ValidateName(s string) error {
	if s == "" {
		return ErrEmpty
	}
	if len(s) > MaxNameLen {
		return ErrTooLong
	}
	if !utf8.ValidString(s) {
		return ErrBadChars
	}
	if strings.IndexFunc(s, badRune) >= 0 {
		return ErrBadChars
	}
	return nil
}

func badRune(r rune) bool {
	return r == '{' || r == '}' || unicode.IsSpace(r) || unicode.IsControl(r)
}

// Sanitize turns an arbitrary string (a hostname) into a valid name part by
// replacing every forbidden rune with '-'. An empty input gives "unknown".
func Sanitize(s string) string {
	if s == "" {
		return "unknown"
	}
	s = strings.ToValidUTF8(s, "-")
	s = strings.Map(func(r rune) rune {
		if badRune(r) {
			return '-'
		}
		return r
	}, s)
	if len(s) > MaxNameLen/2 {
		s = s[:MaxNameLen/2]
		s = strings.ToValidUTF8(s, "")
	}
	return s
}

// SweepTurnKey returns the name of the key held by the one worker of the
// fleet that runs the backstop sweep (its name says LEASE: it predates the
// word "turn", and key names are a protocol).
func SweepTurnKey(prefix string) string { return prefix + "_SWEEP_LEASE" }

// ScanTurnKey returns the name of the key held by the worker that runs the
// fleet's recovery scan for the current interval.
func ScanTurnKey(prefix string) string { return prefix + "_SCAN_LEASE" }

// InstanceOfHeartbeat returns the instance ID whose heartbeat key under
// prefix is key, and false when key is not a valid instance's heartbeat key
// (an expiry notification of any other key).
func InstanceOfHeartbeat(prefix, key string) (string, bool) {
	head, tail := prefix+"_{", "}"+heartbeatSuffix
	if len(key) <= len(head)+len(tail) || !strings.HasPrefix(key, head) || !strings.HasSuffix(key, tail) {
		return "", false
	}
	id := key[len(head) : len(key)-len(tail)]
	return id, ValidateName(id) == nil
}

// FleetKeys returns the names of the keys the fleet under prefix shares:
// the registry, the scan and sweep turns, the history, the fleet record,
// the untracked-rows notes and the witness turns. A tool that removes a fleet deletes these
// and every registered instance's Keys.
func FleetKeys(prefix string) []string {
	return []string{RegistryKey(prefix), ScanTurnKey(prefix), SweepTurnKey(prefix), HistoryKey(prefix), FleetKey(prefix),
		UntrackedKey(prefix), WitnessTurnKey(prefix), WitnessSecondKey(prefix)}
}

// UntrackedKey returns the name of the hash in which the backstop sweep
// tells a worker that it tracked rows only after their COMMIT: field
// instance ID, value "<until, Unix ms> <rows> <first row> <sweeper>". The
// key lives a rows TTL from the last note; workers of releases before it
// never read it.
func UntrackedKey(prefix string) string { return prefix + "_UNTRACKED" }
