package ops

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/report"
	"github.com/alya/recovery/internal/store"
)

// Read-only inspection of a fleet, for operator tools (cmd/recoveryctl):
// what Redis holds about each instance and the rows one tracks. Everything
// here reads the keys with the same code recovery uses (internal/store)
// and changes nothing.

// operationTimeout bounds each Redis call of the functions here: the
// Worker's default operation timeout.
const operationTimeout = 5 * time.Second

// InstanceState is what Redis holds about one instance.
type InstanceState struct {
	// InstanceID is the instance's ID.
	InstanceID string
	// Registered says whether the ID is in the fleet's registry.
	Registered bool
	// HeartbeatPresent says whether the heartbeat key exists: the instance
	// is alive. HeartbeatTTL is its remaining TTL (-1 without expiry).
	HeartbeatPresent bool
	HeartbeatTTL     time.Duration
	// RowsPresent says whether the rows set exists; Rows is its number of
	// members and RowsTTL its remaining TTL (-1 without expiry).
	RowsPresent bool
	Rows        int64
	RowsTTL     time.Duration
	// Incarnation names the life of the rows set ("" when absent).
	Incarnation string
	// Claim is the state of the recovery claim.
	Claim ClaimState
	// AnnouncedTTL is the heartbeat TTL the instance announced in the
	// fleet record, and Mode its mode ("owner" or "rows-set"); zero and
	// "" when it announced none (a worker of an older version). Inspect
	// fills them in.
	AnnouncedTTL time.Duration
	Mode         string

	// OldestRowKnown says whether the instance's last heartbeat reported
	// the rows it holds (workers of earlier releases do not, and the
	// report lives a heartbeat TTL); HoldsRows whether it held any, and
	// OldestRowAge how long it has held the oldest: the age its heartbeat
	// reported plus the time since, on Redis's clock, to the second.
	OldestRowKnown bool
	HoldsRows      bool
	OldestRowAge   time.Duration
}

// Alive reports whether the instance's heartbeat key exists.
func (s InstanceState) Alive() bool { return s.HeartbeatPresent }

// Known reports whether Redis holds anything about the instance.
func (s InstanceState) Known() bool {
	return s.Registered || s.HeartbeatPresent || s.RowsPresent || s.Incarnation != "" || s.Claim != ClaimNone
}

// FleetState is what Redis holds about every registered instance.
type FleetState struct {
	// Registry is the registry key read.
	Registry string
	// Instances are the registered instances, sorted by ID.
	Instances []InstanceState
	// InvalidMembers lists registry members that are not valid instance
	// IDs, sorted; recovery ignores them.
	InvalidMembers []string
	// Serves is what the fleet record says the fleet serves
	// ("database=... schema=... table=..."), "" when none is recorded.
	Serves string
	// Server is the PostgreSQL server the record names
	// ("system_identifier=..."), "" when none is recorded.
	Server string
}

// fleetStore returns the store of the fleet under prefix, after checking
// the client and the prefix as recovery.New does.
func fleetStore(rdb redis.UniversalClient, prefix string) (*store.Redis, error) {
	if rdb == nil || reflect.ValueOf(rdb).Kind() == reflect.Pointer && reflect.ValueOf(rdb).IsNil() {
		return nil, fmt.Errorf("%w: redis client is nil", recovery.ErrInvalidConfig)
	}
	if err := store.ValidateName(prefix); err != nil {
		return nil, fmt.Errorf("%w: key prefix %q %v", recovery.ErrInvalidConfig, redact.Shown(prefix, maxQuoted), err)
	}
	return store.NewRedis(rdb, prefix, operationTimeout), nil
}

// validID checks an instance ID as recovery.WithInstanceID does.
func validID(id string) error {
	if err := store.ValidateName(id); err != nil {
		return fmt.Errorf("%w: instance ID %q %v", recovery.ErrInvalidConfig, redact.Shown(id, maxQuoted), err)
	}
	return nil
}

// Inspect reads what Redis holds about every instance in the registry of
// the fleet under prefix (recovery.WithKeyPrefix; DefaultKeyPrefix by
// default), changing nothing: the registry as a recovery scan reads it,
// then the keys of every instance in one pipeline (one round trip per node
// on Cluster). Each call is bounded by ctx and the Worker's default
// operation timeout (5 s). A bad prefix is an error wrapping
// recovery.ErrInvalidConfig; a registry key of the wrong type one wrapping
// recovery.ErrRegistryWrongType.
func Inspect(ctx context.Context, rdb redis.UniversalClient, prefix string) (FleetState, error) {
	s, err := fleetStore(rdb, prefix)
	if err != nil {
		return FleetState{}, err
	}
	fs := FleetState{Registry: s.Registry()}
	ids, invalid, err := registered(ctx, s)
	if err != nil {
		return fs, err
	}
	fs.InvalidMembers = invalid
	fs.Instances, err = describe(ctx, s, ids)
	if err != nil {
		return fs, err
	}
	opCtx, cancel := context.WithTimeout(ctx, operationTimeout)
	rec, err := s.ReadFleet(opCtx)
	cancel()
	if store.IsWrongType(err) {
		err = nil // a key that is not a hash records nothing; the workers log it (Warn)
	}
	fs.Serves, fs.Server = rec.Serves, rec.Server
	announced := make(map[string]store.Member, len(rec.Members))
	for _, m := range rec.Members {
		announced[m.ID] = m
	}
	for i := range fs.Instances {
		fs.Instances[i].Registered = true
		m := announced[fs.Instances[i].InstanceID]
		fs.Instances[i].AnnouncedTTL, fs.Instances[i].Mode = m.TTL, m.Mode
	}
	return fs, err
}

// registered reads the registry as a recovery scan does: the valid
// instance IDs and the invalid members, both sorted.
func registered(ctx context.Context, s *store.Redis) (ids, invalid []string, err error) {
	opCtx, cancel := context.WithTimeout(ctx, operationTimeout)
	defer cancel()
	all, err := s.RegistryMembers(opCtx)
	if store.IsWrongType(err) {
		return nil, nil, fmt.Errorf("%w (%v)", recovery.ErrRegistryWrongType, err)
	}
	if err != nil {
		return nil, nil, err
	}
	for _, id := range all {
		if store.ValidateName(id) != nil {
			invalid = append(invalid, id)
		} else {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	slices.Sort(invalid)
	return ids, invalid, nil
}

// InspectInstance reads what Redis holds about one instance, registered or
// not, changing nothing. An invalid ID or prefix is an error wrapping
// recovery.ErrInvalidConfig.
func InspectInstance(ctx context.Context, rdb redis.UniversalClient, prefix, id string) (InstanceState, error) {
	if err := validID(id); err != nil {
		return InstanceState{}, err
	}
	s, err := fleetStore(rdb, prefix)
	if err != nil {
		return InstanceState{}, err
	}
	opCtx, cancel := context.WithTimeout(ctx, operationTimeout)
	isRegistered, err := s.IsRegistered(opCtx, id)
	cancel()
	if err != nil {
		return InstanceState{}, err
	}
	st, err := describe(ctx, s, []string{id})
	if err != nil {
		return InstanceState{}, err
	}
	st[0].Registered = isRegistered
	return st[0], nil
}

// ReadTrackedRows reads an instance's rows set and incarnation the way a
// recovery reads them (SSCAN in pages, each under the operation timeout),
// changing nothing. An invalid ID or prefix is an error wrapping
// recovery.ErrInvalidConfig.
func ReadTrackedRows(ctx context.Context, rdb redis.UniversalClient, prefix, id string) (TrackedRows, error) {
	if err := validID(id); err != nil {
		return TrackedRows{}, err
	}
	s, err := fleetStore(rdb, prefix)
	if err != nil {
		return TrackedRows{}, err
	}
	incarnation, members, err := s.ReadRows(ctx, id)
	if err != nil {
		return TrackedRows{}, err
	}
	return report.Tracked(incarnation, members), nil
}

// describe reads the keys of every instance in ids in one pipeline.
// Registered is left false.
func describe(ctx context.Context, s *store.Redis, ids []string) ([]InstanceState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	opCtx, cancel := context.WithTimeout(ctx, operationTimeout)
	defer cancel()
	keys, err := s.Describe(opCtx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]InstanceState, len(keys))
	for i, k := range keys {
		out[i] = InstanceState{
			InstanceID:       k.ID,
			HeartbeatPresent: k.HeartbeatTTL != -2,
			HeartbeatTTL:     k.HeartbeatTTL,
			RowsPresent:      k.RowsTTL != -2,
			Rows:             k.Rows,
			RowsTTL:          k.RowsTTL,
			Incarnation:      k.Incarnation,
			Claim:            report.ClaimOf(k.Claim),
			OldestRowKnown:   k.OldestRowKnown,
			HoldsRows:        k.HoldsRows,
			OldestRowAge:     k.OldestRow,
		}
	}
	return out, nil
}

// maxQuoted is how much of a rejected name an error quotes.
const maxQuoted = 64
