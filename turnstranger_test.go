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

// TestStrangersOverSharedKeysDoNotStopRecovery: on a real redis-server, a
// string without a TTL written by a stranger over the fleet record, the
// history stream, the untracked-rows hash or a dead peer's claim does not
// stop recovery: the dead peer's rows are reset. The fleet record and the
// history say so at Warn; the claim is taken over as no claim.
func TestStrangersOverSharedKeysDoNotStopRecovery(t *testing.T) {
	for _, c := range []struct{ key, says string }{
		{store.FleetKey(defaultKeyPrefix), "cannot write the fleet record"},
		{store.HistoryKey(defaultKeyPrefix), "fleet history not appended"},
		{store.UntrackedKey(defaultKeyPrefix), ""},
		{keysOf("deadA").Claim, ""},
	} {
		t.Run(c.key, func(t *testing.T) {
			rdb := testutil.Redis(t)
			ctx := context.Background()
			r := &fakeResetter{}
			w, logs := startWorker(t, rdb, r, "w1", WithHistory(100))
			require.NoError(t, rdb.Del(ctx, c.key).Err())
			require.NoError(t, rdb.Set(ctx, c.key, "stray", 0).Err())
			plantDeadPeer(t, rdb, defaultKeyPrefix, "deadA", "1", "2")
			waitTurns(t, &signals(w).scan, 8*time.Second, func() bool { return len(r.resetOf("deadA")) == 2 },
				"the dead peer recovered although a stranger wrote "+c.key)
			switch c.key {
			case store.FleetKey(defaultKeyPrefix):
				waitBeat(t, w) // the fleet record is written with the heartbeat
			case store.HistoryKey(defaultKeyPrefix):
				signals(w).history.WaitFor(t, func(err error) bool { return err != nil })
			}
			if c.says != "" {
				assert.Contains(t, logs.String(), `"level":"WARN","msg":"`+c.says)
			}
		})
	}
}
