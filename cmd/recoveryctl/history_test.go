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

func (p picky) Reset(_ context.Context, req recovery.ResetRequest) (recovery.ResetResult, error) {
	if req.InstanceID == p.fail {
		return recovery.ResetResult{}, errors.New("connection refused by the test")
	}
	return recovery.ResetResult{Changed: int64(len(req.RowIDs))}, nil
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
