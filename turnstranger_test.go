package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// TestScanTurnHeldByAStrangerIsTakenAndLoggedOnce: on a real redis-server,
// a scan turn key written by a stranger (a string without a TTL, then a
// hash) does not stop the scans: the worker takes the turn, recovers a
// dead peer, logs the stranger at Error once however often it writes the
// same again, logs a different one once more, and counts every take in
// Stats.TurnsFromStrangers.
func TestScanTurnHeldByAStrangerIsTakenAndLoggedOnce(t *testing.T) {
	rdb := testutil.Redis(t)
	ctx := context.Background()
	key := store.ScanTurnKey(defaultKeyPrefix)
	const msg = `"level":"ERROR","msg":"took a turn from a key no live worker held`
	require.NoError(t, rdb.Set(ctx, key, "junk", 0).Err())
	plantDeadPeer(t, rdb, defaultKeyPrefix, "deadA", "1", "2")
	r := &fakeResetter{}
	w, logs := startWorker(t, rdb, r, "w1")

	waitTurns(t, &signals(w).scan, 5*time.Second, func() bool { return len(r.resetOf("deadA")) == 2 },
		"the dead peer recovered although a stranger held the scan turn")
	assert.Equal(t, 1, logs.Count(msg))
	assert.Contains(t, logs.String(), `"turn":"scan"`)
	assert.Contains(t, logs.String(), `"reason":"no TTL","found":"junk"`)
	assert.EqualValues(t, 1, w.Stats().TurnsFromStrangers)
	assert.Equal(t, "w1", rdb.Get(ctx, key).Val())

	require.NoError(t, rdb.Set(ctx, key, "junk", 0).Err())
	plantDeadPeer(t, rdb, defaultKeyPrefix, "deadB", "3")
	waitTurns(t, &signals(w).scan, 5*time.Second, func() bool { return len(r.resetOf("deadB")) == 1 })
	assert.EqualValues(t, 2, w.Stats().TurnsFromStrangers)
	assert.Equal(t, 1, logs.Count(msg), "the same stranger again is not logged again")

	require.NoError(t, rdb.Del(ctx, key).Err())
	require.NoError(t, rdb.HSet(ctx, key, "f", "v").Err())
	plantDeadPeer(t, rdb, defaultKeyPrefix, "deadC", "4")
	waitTurns(t, &signals(w).scan, 5*time.Second, func() bool { return len(r.resetOf("deadC")) == 1 })
	assert.EqualValues(t, 3, w.Stats().TurnsFromStrangers)
	assert.Equal(t, 2, logs.Count(msg), "another stranger is logged")
	assert.Contains(t, logs.String(), `"reason":"wrong type","found":"hash"`)
}
