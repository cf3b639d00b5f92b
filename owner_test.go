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

// Per-life owner values (owner.go).

func TestParseOwnerSplitsPerLifeValuesAndRefusesOthers(t *testing.T) {
	for _, c := range []struct {
		v, id, life string
		ok          bool
	}{
		{"pod-0", "pod-0", "", true},
		{"host-12~x/y", "host-12~x/y", "", true}, // ~ and / are valid in IDs: not separators
		{lifeOwner("pod-0", "3f2a"), "pod-0", "3f2a", true},
		{"pod-0{}", "", "", false},
		{"pod-0{3f2a", "", "", false},
		{"{3f2a}", "", "", false},
		{"pod-0{3f{2a}", "", "", false},
		{"pod 0", "pod 0", "", false},
		{"", "", "", false},
	} {
		id, life, ok := parseOwner(c.v)
		assert.Equal(t, c.ok, ok, c.v)
		if c.ok {
			assert.Equal(t, c.id, id, c.v)
			assert.Equal(t, c.life, life, c.v)
		}
	}
	assert.Error(t, invalidOwnerReason("pod-0{"))
	assert.Error(t, invalidOwnerReason("po}d{x}"))
}

func TestOwnerNamesTheCurrentLifeInOwnerModeAndTheIDInRowsSetMode(t *testing.T) {
	_, rdb := newMini(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 1)
	w, _ := newWorker(t, rdb, fencedResetter(t, db), "w")
	id, life, ok := parseOwner(w.OwnerValue())
	require.True(t, ok, w.OwnerValue())
	assert.Equal(t, "w", id)
	assert.Equal(t, w.rows.currentIncarnation(), life, "the life is the incarnation")
	assert.Len(t, w.OwnerValue(), len("w")+lifeWidth)
	rs, _ := newWorker(t, rdb, fencedResetter(t, db), "r", WithRowsSets())
	assert.Equal(t, "r", rs.OwnerValue(), "rows-set mode writes the bare instance ID")
}

// A worker of the release that writes per-life values dies holding rows of
// its current life (named by the incarnation its heartbeats wrote), rows of
// the bare ID, and rows of a life it has not begun as far as Redis knows:
// a recovery by owner resets the first two and never the third.
func TestOwnerModeRecoveryResetsTheLifeReadUnderItsClaimAndNoOther(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 6)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db)
	ctx := context.Background()

	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix))
	life, err := rdb.Get(ctx, store.InstanceKeys(prefix, "A").Incarnation).Result()
	require.NoError(t, err, "every heartbeat writes the incarnation")
	take(t, db, "A", 1, 2)
	take(t, db, lifeOwner("A", life), 3, 4)
	take(t, db, lifeOwner("A", "later"), 5)
	take(t, db, lifeOwner("C", life), 6) // another instance with the same token
	a.crash()

	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix))
	waitHeartbeatGone(t, rdb, prefix, "A")
	rep, err := b.recoverNow(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Recovered, 1)
	assert.Equal(t, int64(4), rep.Recovered[0].RowsReset)
	assertRequeued(t, db, 1, 2, 3, 4)
	for id, owner := range map[int64]string{5: lifeOwner("A", "later"), 6: lifeOwner("C", life)} {
		s, o := rowState(t, db, id)
		assert.Equal(t, "inprog", s, "row %d", id)
		assert.Equal(t, owner, *o, "row %d", id)
	}
}

// Redis forgot everything; rows in progress carry per-life values of a
// dead instance. The sweep judges the instance by its heartbeat and resets
// every life it saw; a live instance's per-life rows stay.
func TestOwnerModeSweepRecoversPerLifeOwnerValuesOfADeadInstance(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	rdb := srv.Client(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 4)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db)
	opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      500 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		RecoveryInterval:  200 * time.Millisecond,
	})}

	take(t, db, lifeOwner("gone", "l1"), 1)
	take(t, db, lifeOwner("gone", "l2"), 2)
	take(t, db, "gone", 3)
	live, _ := startWorker(t, rdb, r, "live", opts...)
	take(t, db, live.OwnerValue(), 4)
	b, logs := startWorker(t, rdb, r, "B", opts...)

	require.Eventually(t, func() bool {
		for _, id := range []int64{1, 2, 3} {
			if s, _ := rowState(t, db, id); s != "queued" {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the sweep resets every life of a dead instance it saw")
	// The peer is counted after the finish, in the sweep turn. Live
	// started first: its sweep at Start takes the sweep turn and it is live
	// that recovers the peer. Were it B, live's next turn, an interval
	// later, would see the count all the same.
	waitTurns(t, &signals(live).sweep, 5*time.Second, func() bool { return b.Stats().PeersRecovered+live.Stats().PeersRecovered == 1 })
	s, _ := rowState(t, db, 4)
	assert.Equal(t, "inprog", s, "the instance heartbeats in this life: not judged")
	assert.Zero(t, logs.Count(`not a valid instance ID`))
}

// returnStore is a store whose ReadRows lets the peer come back in a new
// life just before the recoverer's read: the peer's heartbeat (which
// cancels the claim) writes the incarnation life, and the read finds it.
type returnStore struct {
	store.Store
	peer, life string
}

func (s *returnStore) ReadRows(ctx context.Context, peer string) (string, []string, error) {
	if _, err := s.Store.Beat(ctx, s.peer, store.Heartbeat{Value: store.HeartbeatOf("back"), TTL: time.Minute,
		Incarnation: s.life, IncarnationTTL: time.Minute, RowsTTL: time.Minute}); err != nil {
		return "", nil, err
	}
	return s.Store.ReadRows(ctx, peer)
}

// The life a recovery resets is the one read while its claim held: a peer
// that came back between the claim and the read has begun a new life, and
// the rows it took in it are its own. The claim sent again after the read
// finds the claim cancelled, and nothing is reset.
func TestOwnerModeRecoveryLeavesThePeersNewLifeWhenItCameBackBeforeTheRead(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 2)
	prefix := testutil.Name("O")
	r := fencedResetter(t, db)
	ctx := context.Background()

	a, _ := startWorker(t, rdb, r, "A", WithKeyPrefix(prefix))
	a.crash()
	b, _ := newWorker(t, rdb, r, "B", WithKeyPrefix(prefix),
		withStore(func(s store.Store) store.Store { return &returnStore{Store: s, peer: "A", life: "l2"} }))
	waitHeartbeatGone(t, rdb, prefix, "A")
	take(t, db, lifeOwner("A", "l2"), 1) // taken in the new life, under a valid lease

	rep, err := b.recoverNow(ctx)
	s, _ := rowState(t, db, 1)
	assert.Equal(t, "inprog", s, "the new life's row is never reset")
	require.NoError(t, err)
	assert.Empty(t, rep.Recovered)
	assert.Equal(t, []string{"A"}, rep.Skipped, "left alone, as a peer found alive at the claim")
}
