package recovery

// A rolling deploy from the first protocol version (no incarnation key, no
// failure note, no tombstone) to the second: old and new workers alive
// together must recover each other. The old side is played by the first
// version's scripts and key writes, as its workers sent them.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// v1Claim and v1Finish are the first version's claim and finish scripts.
var (
	v1Claim = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return -1
`)
	v1Finish = redis.NewScript(`
if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
redis.call('DEL', KEYS[2])
return 1
`)
)

// v1Recover is one recovery of peer by a first-version worker: claim,
// SMEMBERS, reset by IDs, finish, deregister. It reports whether it claimed.
func v1Recover(t *testing.T, rdb redis.UniversalClient, r Resetter, prefix, peer string) bool {
	t.Helper()
	ctx := context.Background()
	k := store.InstanceKeys(prefix, peer)
	res, err := v1Claim.Run(ctx, rdb, []string{k.Heartbeat, k.Claim}, "v1-token", 45000).Int()
	require.NoError(t, err)
	if res != 1 {
		return false
	}
	members, err := rdb.SMembers(ctx, k.Rows).Result()
	require.NoError(t, err)
	ids, _ := parseRowIDs(members)
	_, err = r.ResetRows(ctx, RowsReset{InstanceID: peer, RowIDs: ids})
	require.NoError(t, err)
	fin, err := v1Finish.Run(ctx, rdb, []string{k.Heartbeat, k.Rows, k.Claim}, "v1-token").Int()
	require.NoError(t, err)
	require.Equal(t, 1, fin)
	require.NoError(t, rdb.SRem(ctx, store.RegistryKey(prefix), peer).Err())
	return true
}

func TestRollingUpgradeOldAndNewWorkersRecoverEachOther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, db, prefix := onRealServers(t, 20, "UP")
	pg, err := pgxreset.New(db, postgres.WithRecoveryCountColumn("recoveries"))
	require.NoError(t, err)

	t.Run("a new worker recovers a dead old one, which has no incarnation", func(t *testing.T) {
		plantDeadPeer(t, rdb, prefix, "old-1", "1", "2") // what a first-version worker leaves
		setStatus(t, db, "inprog", 1, 2)
		w, _ := newWorker(t, rdb, pg, "new-r", WithKeyPrefix(prefix))
		rep, err := w.recoverNow(ctx)
		require.NoError(t, err)
		require.Len(t, rep.Recovered, 1)
		assert.Equal(t, int64(2), rep.RowsReset)
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM recovery_ledger WHERE instance_id = 'old-1'`).Scan(&n))
		assert.Zero(t, n, "not recorded: under an unknown incarnation a record would hide the row from the ID's next life")
		assert.False(t, registered(t, rdb, prefix, "old-1"))
	})

	t.Run("an old worker recovers a dead new one, and its incarnation expires by itself", func(t *testing.T) {
		victim(t, rdb, db, pg, "new-1", []Option{WithKeyPrefix(prefix)}, 3, 4)
		require.True(t, v1Recover(t, rdb, pg, prefix, "new-1"))
		got := statuses(t, db)
		assert.Equal(t, "queued", got[3])
		assert.Equal(t, "queued", got[4])
		ttl, err := rdb.PTTL(ctx, store.InstanceKeys(prefix, "new-1").Incarnation).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, time.Duration(0), "left behind by the old finish, with a TTL: it does not leak")
		assert.False(t, registered(t, rdb, prefix, "new-1"))
	})

	t.Run("an old recoverer skips a peer whose new recovery failed; a new one takes over at once", func(t *testing.T) {
		plantDeadPeer(t, rdb, prefix, "dead-2", "5")
		setStatus(t, db, "inprog", 5)
		failing := &fakeResetter{}
		failing.setFail("dead-2", assert.AnError)
		f, _ := newWorker(t, rdb, failing, "new-f", WithKeyPrefix(prefix))
		_, err := f.recoverNow(ctx)
		require.Error(t, err)

		assert.False(t, v1Recover(t, rdb, pg, prefix, "dead-2"), "the failure note looks held to an old worker")
		w, _ := newWorker(t, rdb, pg, "new-r2", WithKeyPrefix(prefix))
		rep, err := w.recoverNow(ctx)
		require.NoError(t, err)
		require.Len(t, rep.Recovered, 1)
		assert.Equal(t, "queued", statuses(t, db)[5])
	})
}
