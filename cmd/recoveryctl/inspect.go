package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/keys"
	"github.com/alya/recovery/internal/scripts"
)

// instance is what Redis holds about one instance ID.
type instance struct {
	ID         string
	Registered bool
	// HeartbeatTTL is the heartbeat key's remaining TTL; HeartbeatPresent
	// says whether the key exists at all (a key without expiry has TTL -1).
	HeartbeatPresent bool
	HeartbeatTTL     time.Duration
	Rows             int64
	RowsPresent      bool
	RowsTTL          time.Duration
	// BeingRecovered is set while a recoverer holds the instance's claim.
	BeingRecovered bool
	// RecoveryFailed is set when the last recovery of the instance failed
	// (the claim key holds the failure note) and none holds it now.
	RecoveryFailed bool
}

// Alive reports whether the instance's heartbeat key exists.
func (i instance) Alive() bool { return i.HeartbeatPresent }

// registry reads the registry set and splits its members into valid
// instance IDs (sorted) and members that are not.
func registry(ctx context.Context, rdb redis.UniversalClient, prefix string) (ids, invalid []string, err error) {
	name := keys.Registry(prefix)
	all, err := rdb.SMembers(ctx, name).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read registry %s: %w", name, err)
	}
	for _, m := range all {
		if keys.ValidateName(m) != nil {
			invalid = append(invalid, m)
			continue
		}
		ids = append(ids, m)
	}
	slices.Sort(ids)
	slices.Sort(invalid)
	return ids, invalid, nil
}

// describe reads the keys of every instance in ids in one pipeline (one
// round trip per node on Cluster). registered says which are in the
// registry; nil means all.
func describe(ctx context.Context, rdb redis.UniversalClient, prefix string, ids []string, registered map[string]bool) ([]instance, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	type cmds struct {
		hbTTL, rowsTTL *redis.DurationCmd
		rows           *redis.IntCmd
		claim          *redis.StringCmd
	}
	pipe := rdb.Pipeline()
	cs := make([]cmds, len(ids))
	for i, id := range ids {
		k := keys.For(prefix, id)
		cs[i] = cmds{
			hbTTL:   pipe.PTTL(ctx, k.Heartbeat),
			rows:    pipe.SCard(ctx, k.Rows),
			rowsTTL: pipe.PTTL(ctx, k.Rows),
			claim:   pipe.Get(ctx, k.Claim),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the keys of %d instances: %w", len(ids), err)
	}
	out := make([]instance, len(ids))
	for i, id := range ids {
		c := cs[i]
		out[i] = instance{
			ID:               id,
			Registered:       registered == nil || registered[id],
			HeartbeatPresent: c.hbTTL.Val() != -2,
			HeartbeatTTL:     c.hbTTL.Val(),
			Rows:             c.rows.Val(),
			RowsPresent:      c.rowsTTL.Val() != -2,
			RowsTTL:          c.rowsTTL.Val(),
			// The claim key holds a recoverer's token, the failure note of
			// the last attempt, or for a moment a finished one's tombstone.
			BeingRecovered: c.claim.Val() != "" && c.claim.Val() != scripts.FailedClaim &&
				!strings.HasPrefix(c.claim.Val(), "done:"),
			RecoveryFailed: c.claim.Val() == scripts.FailedClaim,
		}
	}
	return out, nil
}

// rowIDs reads an instance's rows set and returns the row IDs (sorted) and
// the members that are not decimal int64s.
func rowIDs(ctx context.Context, rdb redis.UniversalClient, prefix, id string) (ids []int64, invalid []string, err error) {
	k := keys.For(prefix, id).Rows
	members, err := rdb.SMembers(ctx, k).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read rows set %s: %w", k, err)
	}
	for _, m := range members {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			invalid = append(invalid, m)
			continue
		}
		ids = append(ids, n)
	}
	slices.Sort(ids)
	slices.Sort(invalid)
	return ids, invalid, nil
}

// registrySet turns a list of IDs into a set.
func registrySet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
