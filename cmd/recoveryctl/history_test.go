package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
)

// picky is the resetter of a recovering test worker: it resets every row
// it is given, except those of the peer fail, whose reset fails.
type picky struct{ fail string }

var _ recovery.Resetter = picky{}

func (p picky) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "picky", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (p picky) Check(context.Context, bool) (recovery.ResetterInfo, error) { return p.Info(), nil }

func (p picky) ResetRows(_ context.Context, req recovery.RowsReset) (recovery.ResetResult, error) {
	if req.InstanceID == p.fail {
		return recovery.ResetResult{}, errors.New("connection refused by the test")
	}
	return recovery.ResetResult{Changed: int64(len(req.RowIDs)), ChangedIDs: req.RowIDs}, nil
}

func (picky) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (picky) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (picky) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (picky) InProgressOwners(context.Context) ([]string, error) { return nil, errors.ErrUnsupported }

func (picky) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (picky) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

// recoveringFleet plants two dead peers under a fresh prefix, dead-1 with
// rows 1, 2, 3 and dead-2 with row 9, and starts a real worker, rec-1,
// whose first scan recovers dead-1 and fails on dead-2. It returns when
// the history holds the four entries that makes, and the live worker.
func recoveringFleet(t *testing.T, rdb redis.UniversalClient, prefix string) *recovery.Worker {
	t.Helper()
	plantDead(t, rdb, prefix, "dead-1", "1", "2", "3")
	plantDead(t, rdb, prefix, "dead-2", "9")
	log, _ := testutil.Logger(t)
	w, err := recovery.New(rdb, picky{fail: "dead-2"}, recovery.WithKeyPrefix(prefix), recovery.WithInstanceID("rec-1"),
		recovery.WithTimings(recovery.Timings{RecoveryInterval: time.Hour, RowsTTL: 3 * time.Hour}), recovery.WithLogger(log))
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() { _ = w.Shutdown(context.Background()) })
	// Only rec-1's entries count: a test may have planted older ones.
	require.Eventually(t, func() bool {
		h, err := ops.ReadHistory(context.Background(), rdb, prefix, ops.HistoryQuery{})
		n := 0
		for _, e := range h {
			if e.InstanceID == "rec-1" {
				n++
			}
		}
		return err == nil && n == 4
	}, 10*time.Second, 5*time.Millisecond, "the first scan's history")
	return w
}

type historyOut struct {
	Prefix  string        `json:"prefix"`
	Stream  string        `json:"stream"`
	Entries []historyJSON `json:"entries"`
}

// byPeer returns the kinds of the entries of each peer, in order.
func byPeer(entries []historyJSON) map[string][]string {
	out := map[string][]string{}
	for _, e := range entries {
		out[e.PeerID] = append(out[e.PeerID], e.Kind)
	}
	return out
}

func TestHistoryShowsWhoRecoveredWhomOnARealFleet(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	// An entry from two hours ago, as an older worker of the fleet left it.
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: store.HistoryKey(prefix),
		ID: fmt.Sprintf("%d-0", old.UnixMilli()), Values: []any{"kind", "lease_lost", "instance", "gone-1",
			"time", old.UTC().Format(time.RFC3339Nano), "duration_ms", "61000"}}).Err())
	recoveringFleet(t, rdb, prefix)

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	assert.Regexp(t, `^TIME\s+EVENT\s+PEER\s+BY\s+DETAILS$`, lines[0])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\s+lease_lost\s+-\s+gone-1\s+no heartbeat for 1m1s: peers may recover its rows$`, lines[1])
	assert.Contains(t, out, "rows_recovered")
	assert.Regexp(t, `rows_recovered\s+dead-1\s+rec-1\s+3 rows: 3 reset, 0 quarantined, \S+ after found`, out)
	assert.Regexp(t, `peer_claimed\s+dead-1\s+rec-1\s+found by registry, claimed \S+ later`, out)
	assert.Regexp(t, `recovery_failed\s+dead-2\s+rec-1\s+failed: .*connection refused by the test`, out)

	// --since leaves out the old entry; --json has every field.
	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history", "--since", "1h", "--json")
	require.Equal(t, exitOK, code, errOut)
	var got historyOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, prefix+"_HISTORY", got.Stream)
	require.Len(t, got.Entries, 4)
	assert.Equal(t, map[string][]string{"dead-1": {"peer_claimed", "rows_recovered"}, "dead-2": {"peer_claimed", "recovery_failed"}},
		byPeer(got.Entries))
	for _, e := range got.Entries {
		assert.Equal(t, "rec-1", e.InstanceID)
		if e.Kind == "rows_recovered" {
			require.NotNil(t, e.Rows)
			assert.Equal(t, 3, *e.Rows)
			assert.Equal(t, int64(3), *e.RowsReset)
			assert.Equal(t, 0, *e.RowsQuarantined)
			require.NotNil(t, e.DurationMs)
			assert.Positive(t, *e.DurationMs)
			assert.Equal(t, []int64{1, 2, 3}, e.RowIDs, "which rows came back")
			require.NotNil(t, e.RowIDsTotal)
			assert.Equal(t, 3, *e.RowIDsTotal)
		}
		at, err := time.Parse(time.RFC3339Nano, e.Time)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), at, time.Minute)
	}

	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history", "--last", "1", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Entries, 1)
	assert.NotEqual(t, "peer_claimed", got.Entries[0].Kind, "the newest entry ends a recovery")

	// Another prefix has no history, and says so on stderr.
	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", testutil.Name("OTHER"), "history")
	require.Equal(t, exitOK, code, errOut)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "_HISTORY is empty or absent")
}

// TestHistoryRowsListsTheRowsOfEachReset: --rows adds a ROWS column with
// each entry's row IDs (a sample and how many more past the bound); every
// reset, the sweep's included, says what it did in DETAILS; an entry of a
// release before row IDs shows none.
func TestHistoryRowsListsTheRowsOfEachReset(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	add := func(fields ...any) {
		require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: store.HistoryKey(prefix), Values: fields}).Err())
	}
	at := time.Now().UTC().Format(time.RFC3339Nano)
	add("kind", "rows_recovered", "time", at, "instance", "w-1", "peer", "dead-1", "found_by", "registry", "rows", "3",
		"rows_reset", "2", "rows_quarantined", "0", "duration_ms", "2100")
	add("kind", "stray_rows_reset", "time", at, "instance", "w-1", "found_by", "sweep", "rows", "250", "rows_reset", "250",
		"rows_quarantined", "0", "duration_ms", "6150", "row_ids", "7,9,11", "row_ids_total", "250")
	add("kind", "untracked_rows", "time", at, "instance", "w-1", "rows", "2", "row_ids", "20,21", "row_ids_total", "2",
		"error", "rows in progress that no rows set held")
	add("kind", "ended_life_rows_reset", "time", at, "instance", "w-1", "peer", "live-1", "found_by", "sweep", "rows", "1",
		"rows_reset", "1", "rows_quarantined", "0", "row_ids", "5", "row_ids_total", "1")

	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history", "--rows")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	assert.Regexp(t, `^TIME\s+EVENT\s+PEER\s+BY\s+DETAILS\s+ROWS$`, lines[0])
	assert.Regexp(t, `rows_recovered\s+dead-1\s+w-1\s+3 rows: 2 reset, 0 quarantined, 2.1s after found\s+-$`, lines[1])
	assert.Regexp(t, `stray_rows_reset\s+-\s+w-1\s+sweep: 250 of 250 stray rows reset, 0 quarantined, held by no rows set for 6.2s\s+7,9,11 \(\+247 more\)$`, lines[2])
	assert.Regexp(t, `untracked_rows\s+-\s+w-1\s+sweep: 2 rows in progress that no worker tracked: rows in progress that no rows set held\s+20,21$`, lines[3])
	assert.Regexp(t, `ended_life_rows_reset\s+live-1\s+w-1\s+sweep: 1 rows of an ended life reset, 0 quarantined \(the worker lives on\)\s+5$`, lines[4])

	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history")
	require.Equal(t, exitOK, code, errOut)
	assert.NotContains(t, out, "ROWS", "the column only with --rows")

	out, errOut, code = ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history", "--json")
	require.Equal(t, exitOK, code, errOut)
	var got historyOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got.Entries, 4)
	assert.Nil(t, got.Entries[0].RowIDs)
	assert.Nil(t, got.Entries[0].RowIDsTotal, "an entry without row IDs has no row_ids_total")
	assert.Equal(t, []int64{7, 9, 11}, got.Entries[1].RowIDs)
	require.NotNil(t, got.Entries[1].RowIDsTotal)
	assert.Equal(t, 250, *got.Entries[1].RowIDsTotal)
	require.NotNil(t, got.Entries[1].RowsReset)
	assert.Equal(t, int64(250), *got.Entries[1].RowsReset, "a sweep's entry has its counts")
	assert.Equal(t, []int64{20, 21}, got.Entries[2].RowIDs)
}

func TestHistoryOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartCluster(t, 3)
	rdb := cluster.Client(t)
	prefix := testutil.Name("CTL")
	recoveringFleet(t, rdb, prefix)

	out, errOut, code := ctl(t, nil, "--cluster", strings.Join(cluster.Addrs, ","), "--prefix", prefix, "history", "--json")
	require.Equal(t, exitOK, code, errOut)
	var got historyOut
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, map[string][]string{"dead-1": {"peer_claimed", "rows_recovered"}, "dead-2": {"peer_claimed", "recovery_failed"}},
		byPeer(got.Entries))
}

// TestHistoryNeverPrintsControlCharactersFromRedis: whatever is written
// into the stream, the terminal gets no escape sequence and no newline.
func TestHistoryNeverPrintsControlCharactersFromRedis(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	prefix := testutil.Name("CTL")
	require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: store.HistoryKey(prefix),
		Values: []any{"kind", "recovery_failed", "instance", "w\x1b[2J", "peer", "p\nq", "error", "boom\x1b]0;pwned\x07\nsecond line"}}).Err())
	out, errOut, code := ctl(t, nil, "--redis-url", url, "--prefix", prefix, "history")
	require.Equal(t, exitOK, code, errOut)
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\x07")
	assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2, out)
	assert.Contains(t, out, "failed: boom ]0;pwned  second line")
}

func TestHistoryAndWatchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"history", "--since", "-1h"},
		{"history", "--last", "-1"},
		{"watch", "--interval", "0s"},
		{"watch", "--count", "-2"},
		{"history", "extra"},
		{"watch", "--json"},
	} {
		_, _, code := ctl(t, nil, args...)
		assert.Equal(t, exitUsage, code, args)
	}
}
