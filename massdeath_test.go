package recovery

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// A zone outage: thousands of registered workers die at once, then one
// more worker holding rows is killed. Its rows must be back within the
// documented bound (TTL + 1.1 × recovery interval + the scan turn, 3.9 s
// at the fast timings), not after the scan has worked through every older
// death: with the scan's old one-by-one walk they came back after 4.5 to
// 8.8 s, or never (rows-set mode without the sweep).

// massDeathEntries is how many dead registry entries the tests plant.
const massDeathEntries = 10_000

// plantMassDeath registers n dead workers under prefix: registry entries
// without a heartbeat, and, with a records TTL, an incarnation (what every
// heartbeat writes) living that long, so that none can be removed without
// its recovery.
func plantMassDeath(t testing.TB, rdb redis.UniversalClient, prefix string, n int, records time.Duration) {
	t.Helper()
	ctx := context.Background()
	ids := make([]any, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("dead-%06d", i)
	}
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), ids...).Err())
	if records == 0 {
		return
	}
	pipe := rdb.Pipeline()
	for _, id := range ids {
		pipe.Set(ctx, store.InstanceKeys(prefix, id.(string)).Incarnation, "life-1", records)
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
}

func TestFreshDeathAmongTenThousandDeadIsRecoveredWithinTheBound(t *testing.T) {
	for _, mode := range []string{"rows-set", "owner"} {
		for _, records := range []bool{false, true} {
			name := mode + "/bare-entries"
			if records {
				name = mode + "/with-records"
			}
			t.Run(name, func(t *testing.T) {
				testFreshDeathAmongMassDeath(t, mode == "owner", records)
			})
		}
	}
}

func testFreshDeathAmongMassDeath(t *testing.T, ownerMode, records bool) {
	ctx := context.Background()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 10)
	prefix := testutil.Name("MD")
	var r *pgxreset.Resetter
	if ownerMode {
		r = fencedResetter(t, db)
	} else {
		var err error
		r, err = pgxreset.New(db)
		require.NoError(t, err)
	}
	opts := []Option{WithKeyPrefix(prefix), WithBackstopSweep(false)} // the scan alone

	a, _ := startWorker(t, rdb, r, "victim", opts...)
	require.Equal(t, ownerMode, a.tracker.heldByOwner())
	if ownerMode {
		take(t, db, a.OwnerValue(), 1, 2, 3, 4, 5)
	} else {
		setStatus(t, db, "inprog", 1, 2, 3, 4, 5)
	}
	require.NoError(t, a.Track(ctx, 1, 2, 3, 4, 5))
	b, _ := startWorker(t, rdb, r, "scanner", opts...)
	var ttl time.Duration
	if records {
		ttl = b.fleet.incarnationTTL() // as their last heartbeats wrote it, just now
	}
	plantMassDeath(t, rdb, prefix, massDeathEntries, ttl)
	a.crash()
	killed := time.Now()

	bound := b.opts.detectionWindow()
	back := func() bool {
		s := statusesOf(t, db, 1, 2, 3, 4, 5)
		for _, v := range s {
			if v != "queued" {
				return false
			}
		}
		return true
	}
	waitTurns(t, &signals(b).scan, bound+2*time.Second, back, "the victim's rows are queued again")
	took := time.Since(killed)
	t.Logf("kill to reset: %v (bound %v) with %d dead entries", took.Round(time.Millisecond), bound, massDeathEntries)
	// The bound runs from the last heartbeat, before the kill; the reset
	// itself and a loaded machine get a second.
	assert.Less(t, took, bound+time.Second, "within TTL + 1.1 × recovery interval + the scan turn")
	if !records {
		waitTurns(t, &signals(b).scan, 10*time.Second, func() bool {
			return rdb.SCard(ctx, store.RegistryKey(prefix)).Val() == 1
		}, "the entries that held nothing are deregistered in bulk; the scanner stays")
	}
}
