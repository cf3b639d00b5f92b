package recovery

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statsJSONKeys is the JSON form of Stats that hosts' health endpoints and
// dashboards read: a key changes only with docs/migrating.md.
var statsJSONKeys = []string{
	"errors", "events_dropped", "heartbeat_failures", "heartbeats", "history_dropped",
	"instance_id", "last_heartbeat", "last_stuck_for_ns", "lease_losses", "lease_valid",
	"max_stuck_for_ns", "misconfigured", "oldest_row_age_ns", "owner_mode", "peers_dead",
	"peers_recovered", "registry_broken", "registry_wrong_type", "rows_gone",
	"rows_locked", "rows_not_reset", "rows_quarantined", "rows_recovered", "rows_refused", "rows_released",
	"scans", "stray_rows_reset", "tracked_rows", "turns_from_strangers", "untracked_rows",
}

// TestStatsMarshalsToFixedSnakeCaseKeys: every field of Stats has a json
// tag, the keys are exactly the documented ones, and durations round-trip
// as nanoseconds under their _ns keys.
func TestStatsMarshalsToFixedSnakeCaseKeys(t *testing.T) {
	s := Stats{InstanceID: "w-1", LastStuckFor: 1500 * time.Millisecond, OldestRowAge: time.Second,
		LastHeartbeat: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	b, err := json.Marshal(s)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	assert.Equal(t, statsJSONKeys, keys, "Stats' JSON keys (a new field needs a tag and a line in docs/migrating.md)")
	assert.Equal(t, "w-1", m["instance_id"])
	assert.EqualValues(t, 1.5e9, m["last_stuck_for_ns"])
	assert.EqualValues(t, 1e9, m["oldest_row_age_ns"])
	assert.Equal(t, "2026-11-28T12:00:00Z", m["last_heartbeat"])

	var back Stats
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, s, back, "Stats round-trips through its JSON form")
}
