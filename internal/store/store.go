// Package store is everything the recovery library says to Redis: every
// command, pipeline, Lua script and key name, behind methods named for what
// they mean in the recovery protocol (Beat, TrackRows, ClaimDead,
// FinishRecovery, ...). Nothing else in the module sends a Redis command.
//
// Store is an interface so that the Worker's logic can run against another
// implementation (an in-memory model of the Redis semantics it relies on,
// under testing/synctest); Redis, from NewRedis, is the implementation over
// a go-redis client.
//
// Every method is bounded by its ctx; ReadRows, which reads a set in pages,
// also bounds each page by the operation timeout given to NewRedis. Errors
// wrap the go-redis error, so IsWrongType and errors.Is(err, redis.Nil)
// still see it.
package store

import (
	"context"
	"time"
)

// A Store holds the keys of one fleet (one key prefix).
type Store interface {
	// Keys returns the key names of instance id.
	Keys(id string) Keys
	// Registry returns the name of the registry key.
	Registry() string

	// Beat writes one heartbeat of instance id and registers it (see
	// Heartbeat). It is written only over an absent heartbeat key or the
	// caller's own value.
	Beat(ctx context.Context, id string, b Heartbeat) (BeatResult, error)
	// TrackRows adds rows to the rows set of id and renews its TTL, in one
	// round trip.
	TrackRows(ctx context.Context, id string, rows []int64, ttl time.Duration) error
	// UntrackRows removes rows from the rows set of id.
	UntrackRows(ctx context.Context, id string, rows []int64) error
	// RetrackRows adds rows back to the rows set of id, its TTL unchanged:
	// rows tracked again whose removal may have landed after their Track.
	RetrackRows(ctx context.Context, id string, rows []int64) error
	// RotateIncarnation sets the incarnation of id's rows set to next (TTL
	// ttl) and removes gone from the set, in one transaction.
	RotateIncarnation(ctx context.Context, id string, gone []int64, next string, ttl time.Duration) error
	// ReadOwn reads what Start needs of its own instance's keys, in one
	// transaction.
	ReadOwn(ctx context.Context, id string) (Own, error)
	// RecordFleet records serves as what the fleet serves unless another
	// value is recorded, and server as the server it is served on unless
	// one is recorded or the record serves something else, and returns
	// the record.
	RecordFleet(ctx context.Context, serves, server string) (Fleet, error)
	// ReadFleet reads the fleet record.
	ReadFleet(ctx context.Context) (Fleet, error)
	// Leave is Shutdown's clean-up of instance id (see Departure).
	Leave(ctx context.Context, id string, d Departure) (LeaveResult, error)

	// RegistryMembers returns every member of the registry.
	RegistryMembers(ctx context.Context) ([]string, error)
	// IsRegistered reports whether id is in the registry.
	IsRegistered(ctx context.Context, id string) (bool, error)
	// Deregister removes a dead peer from the registry, and puts it back
	// if its heartbeat is there again by then.
	Deregister(ctx context.Context, id string) error
	// Heartbeats asks, in one round trip per node, whether the heartbeat
	// of each of ids exists. It returns an error only if no answer came.
	Heartbeats(ctx context.Context, ids []string) ([]Liveness, error)

	// Records reads, in one round trip per node, what Redis holds of
	// each of peers' recovery record: its rows set's size and TTL, its
	// incarnation's TTL, and whether its claim key exists. The scan reads
	// it to recover first the dead peers that left something to recover.
	Records(ctx context.Context, peers []string) ([]Record, error)
	// DeregisterIdle is Deregister of many peers, in one round trip per
	// node (three on Cluster): each leaves the registry only while
	// neither its heartbeat nor its rows set exists. It returns how many
	// it removed.
	DeregisterIdle(ctx context.Context, ids []string) (int, error)

	// ClaimDead re-checks that peer's heartbeat is absent and takes the
	// recovery claim with token, renewing the TTL of peer's rows set and
	// incarnation to rowsTTL.
	ClaimDead(ctx context.Context, peer, token string, claimTTL, rowsTTL time.Duration) (ClaimResult, error)
	// KeepRows lengthens the TTL of the rows set and incarnation of each
	// of peers to rowsTTL, where they exist and have a shorter one: peers
	// whose death cannot be judged yet (verdicts held after a restart or a
	// failover) keep their record until it can.
	KeepRows(ctx context.Context, peers []string, rowsTTL time.Duration) error
	// ReadRows returns the incarnation of peer's rows set ("" if none) and
	// the set's members without repeats, read with SSCAN in pages and
	// checked whole against SCARD.
	ReadRows(ctx context.Context, peer string) (incarnation string, members []string, err error)
	// LiveRows reads the members of a rows set that may change while it is
	// read (a live worker's): SSCAN pages, no incarnation, no check that
	// the set was read whole. A member present throughout is returned; one
	// added or removed meanwhile may or may not be.
	LiveRows(ctx context.Context, id string) ([]string, error)
	// FinishRecovery ends a recovery held under token: the rows set and
	// incarnation are deleted if the peer is still dead; a tombstone with
	// the result lives tombstoneTTL.
	FinishRecovery(ctx context.Context, peer, token string, tombstoneTTL time.Duration) (FinishResult, error)
	// DropClaim gives up a claim that may or may not have been taken
	// under token (dropScript); a failure note it had taken over goes
	// back, living noteTTL.
	DropClaim(ctx context.Context, peer, token string, noteTTL time.Duration) error
	// FailRecovery gives up a claim held under token, leaving a note that
	// lives noteTTL (failScript).
	FailRecovery(ctx context.Context, peer, token string, noteTTL time.Duration) error

	// NoteUntracked records notes (instance ID: note) in the untracked-rows
	// hash (UntrackedKey) and makes the hash live ttl, in one round trip.
	NoteUntracked(ctx context.Context, notes map[string]string, ttl time.Duration) error
	// UntrackedNote returns the note recorded for id, or "".
	UntrackedNote(ctx context.Context, id string) (string, error)

	// TakeScanTurn takes or renews the fleet's scan turn for holder, and
	// reads holder's note in the untracked-rows hash ("" if none) in the
	// same round trip. A turn held by no live worker is taken over
	// (TurnTake.Stranger says why).
	TakeScanTurn(ctx context.Context, holder string, ttl time.Duration) (turn TurnTake, note string, err error)
	// TakeSweepTurn takes or renews the fleet's sweep turn for holder,
	// taking it over as TakeScanTurn does.
	TakeSweepTurn(ctx context.Context, holder string, ttl time.Duration) (TurnTake, error)

	// NodeOf returns the name of the node that holds id's keys: a Cluster
	// master's address, "" for a single server.
	NodeOf(ctx context.Context, id string) (string, error)
	// NodeInfo returns the INFO server, replication, persistence and stats
	// sections of a node NodeOf or MasterInfos named.
	NodeInfo(ctx context.Context, node string) (string, error)
	// MasterInfos returns NodeInfo of every master, by node name. It
	// returns what it could read, and the first error.
	MasterInfos(ctx context.Context) (map[string]string, error)

	// Masters returns the names of the masters as they are now: the
	// Cluster's masters by address, read afresh from the Cluster, or "" for
	// a single server or a failover client (whatever master it follows).
	Masters(ctx context.Context) ([]string, error)
	// EnableExpiredEvents makes sure a master that Masters named publishes
	// expired-key events (notify-keyspace-events with E and x); with
	// configure it sets them if missing, and returns the value it set
	// ("" when they were there). Without, a master lacking them is an
	// error.
	EnableExpiredEvents(ctx context.Context, node string, configure bool) (set string, err error)
	// SubscribeExpired subscribes to expired-key events on a master that
	// Masters named.
	SubscribeExpired(ctx context.Context, node string) (Subscription, error)
	// MemoryInfos returns the INFO memory and stats sections of every
	// master, by node name as MasterInfos names them. It returns what it
	// could read, and the first error.
	MemoryInfos(ctx context.Context) (map[string]string, error)
	// Ping sends one PING, alone: the first command of Start, so that a
	// server that refuses the client (see IsAuthError) says so before any
	// pipeline or transaction is sent.
	Ping(ctx context.Context) error

	// Describe reads the keys of each of ids in one round trip per node.
	Describe(ctx context.Context, ids []string) ([]Instance, error)
	// Turns reads who holds the scan turn and the sweep turn.
	Turns(ctx context.Context) (scan, sweep Turn, err error)

	// AppendHistory adds an entry (field-value pairs) to the fleet's
	// history stream, trimmed to about maxLen entries.
	AppendHistory(ctx context.Context, fields []string, maxLen int64) error
	// ReadHistory reads entries of the history stream, oldest first.
	ReadHistory(ctx context.Context, q HistoryQuery) ([]HistoryRecord, error)
}

// Heartbeat is what one heartbeat writes.
type Heartbeat struct {
	// Value goes into the heartbeat key (HeartbeatOf), for TTL.
	Value string
	TTL   time.Duration
	// Incarnation names the rows set's life; it lives IncarnationTTL.
	Incarnation    string
	IncarnationTTL time.Duration
	// Remove are rows whose Untrack could not reach Redis; Add every row
	// tracked now. The rows set then lives RowsTTL.
	Remove, Add []int64
	RowsTTL     time.Duration
	// Serves is what the worker serves ("" if it cannot tell), recorded
	// in the fleet record if none is; Server its PostgreSQL server, as
	// RecordFleet records it; Announce its timings there.
	Serves, Server string
	Announce       Announcement
	// HoldsRows says whether the worker tracks rows; OldestRowAge is how
	// long it has tracked the oldest of them. The heartbeat writes both
	// into the instance's OldestRow key, which lives a TTL.
	HoldsRows    bool
	OldestRowAge time.Duration
}

// BeatResult is what a heartbeat found.
type BeatResult struct {
	// Foreign is set when the heartbeat key held another process's value:
	// nothing was written.
	Foreign bool
	// Wrote is set when the script wrote the heartbeat (whatever happened
	// to the registry).
	Wrote bool
	// RegistryErr is the outcome of the registry SADD.
	RegistryErr error
	// Fleet is what the fleet record holds now; FleetErr the outcome of
	// its update (Fleet is empty when it failed).
	Fleet    FleetView
	FleetErr error
}

// Own is what Start reads of its own instance's keys.
type Own struct {
	Value  string        // heartbeat value; "" when absent
	PTTL   time.Duration // heartbeat's remaining TTL; < 0 when none
	Record bool          // a rows set or an incarnation exists
	// RowsSet is set when the rows set exists.
	RowsSet bool
}

// Departure is Shutdown's clean-up: delete the heartbeat if it still holds
// Value; deregister unless Stay (rows are still held: the peers must find
// this instance dead); write Tracked back into the rows set (TTL RowsTTL)
// and remove Unremoved from it.
type Departure struct {
	Value     string
	Stay      bool
	Tracked   []int64
	Unremoved []int64
	RowsTTL   time.Duration
}

// LeaveResult is what Leave did.
type LeaveResult struct {
	// Deregistered is set when the registry SREM was sent; RegistryErr
	// is its outcome.
	Deregistered bool
	RegistryErr  error
}

// Liveness is what Heartbeats learnt of one heartbeat key.
type Liveness int

// Liveness values.
const (
	Unknown Liveness = iota // the node did not answer
	Alive                   // the key exists
	Absent                  // the key does not exist
)

// Subscription delivers expired-key events of one master. It follows
// its node across reconnections (go-redis subscribes again), not across a
// failover: the node it was made on stays its node.
type Subscription interface {
	// Next returns the key of the next expired-key event; ok is false
	// once ctx is done or the subscription is closed.
	Next(ctx context.Context) (key string, ok bool)
	// Close ends the subscription.
	Close() error
}

// Instance is what Describe read of one instance's keys.
type Instance struct {
	ID           string
	HeartbeatTTL time.Duration // -2 when absent, -1 without expiry
	Rows         int64
	RowsTTL      time.Duration // -2 when absent, -1 without expiry
	Claim        string        // the claim key's value, "" when absent
	Incarnation  string        // "" when absent
	// OldestRow is the age of the oldest row the instance tracks, as of
	// now, by its last heartbeat's report; OldestRowKnown says whether
	// that heartbeat reported it (workers of earlier releases do not,
	// and a key a stranger wrote reads as unknown), HoldsRows whether it
	// tracked any.
	OldestRow                 time.Duration
	OldestRowKnown, HoldsRows bool
}

// Record is what Records read of one peer's recovery record. A TTL is -2
// when the key is absent, -1 when it has no expiry.
type Record struct {
	Rows           int64 // members of the rows set
	RowsTTL        time.Duration
	IncarnationTTL time.Duration
	Claim          bool // the claim key exists (a claim, a failure note or a tombstone)
	// RowsSeen is the size of the rows set when a scan last renewed it
	// while the peer was dead (the rows-seen key), if that was in the
	// peer's current life; 0 if none.
	RowsSeen int64
}

// Empty reports whether Redis holds nothing of the peer's recovery: no
// rows set, no incarnation, no claim, no rows seen.
func (r Record) Empty() bool {
	return r.RowsTTL == -2 && r.IncarnationTTL == -2 && !r.Claim && r.RowsSeen == 0
}
