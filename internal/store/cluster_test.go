package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

func TestTopologyErrorsAreFailuresAChangedClusterExplains(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{context.Canceled, false},
		{fmt.Errorf("heartbeat: %w", context.DeadlineExceeded), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{io.EOF, true},
		{redisError("CLUSTERDOWN The cluster is down"), true},
		{redisError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{redisError("MASTERDOWN Link with MASTER is down"), true},
		{redisError("LOADING Redis is loading the dataset in memory"), true},
		{redisError("READONLY You can't write against a read only replica."), true},
		{redisError("MOVED 1234 127.0.0.1:7001"), true},
		{redisError("ASK 1234 127.0.0.1:7001"), true},
		{fmt.Errorf("claim: %w", redisError("WRONGTYPE Operation against a key holding the wrong kind of value")), false},
		{redisError("ERR Error running script"), false},
	} {
		assert.Equal(t, c.want, topologyError(c.err), "%v", c.err)
	}
}

func TestIsMovedIsARedirection(t *testing.T) {
	assert.True(t, IsMoved(redisError("MOVED 1234 127.0.0.1:7001")))
	assert.True(t, IsMoved(fmt.Errorf("subscribe: %w", redisError("ASK 1234 127.0.0.1:7001"))))
	assert.False(t, IsMoved(redisError("CLUSTERDOWN The cluster is down")))
	assert.False(t, IsMoved(io.EOF))
	assert.False(t, IsMoved(nil))
}

// redisError is an error reply, as go-redis returns it.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

// clusterStore returns a Store over a new ClusterClient of c (closed when
// the test ends) with the options the fault suite's workers use.
func clusterStore(t *testing.T, c *testutil.Cluster) (*Redis, *redis.ClusterClient) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	return NewRedis(cc, testutil.Name("CL"), 250*time.Millisecond), cc
}

// beatUntilOK beats id's heartbeat every 50 ms until a Beat succeeds, and
// returns when it did.
func beatUntilOK(t *testing.T, s *Redis, id string, timeout time.Duration) time.Time {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		_, err := s.Beat(ctx, id, Heartbeat{Value: "v", TTL: 10 * time.Second, Incarnation: "i",
			IncarnationTTL: 10 * time.Second, RowsTTL: 10 * time.Second})
		cancel()
		if err == nil {
			return time.Now()
		}
		require.True(t, time.Now().Before(deadline), "no heartbeat written within %v: %v", timeout, err)
		time.Sleep(50 * time.Millisecond)
	}
}

// beatOnCluster returns a Store over c (clusterStore) with id's heartbeat
// written, id's slot and the master that serves it.
func beatOnCluster(t *testing.T, c *testutil.Cluster, id string) (*Redis, int64, string) {
	s, cc := clusterStore(t, c)
	ctx := context.Background()
	beatUntilOK(t, s, id, 5*time.Second)
	slot, err := cc.ClusterKeySlot(ctx, s.Keys(id).Heartbeat).Result()
	require.NoError(t, err)
	master, err := c.MasterOf(ctx, slot)
	require.NoError(t, err)
	return s, slot, master
}

// A master SIGKILLed, its replica promoted: the Store's next commands go
// to the promoted replica within reloadEvery of the promotion (plus a
// command's timeout and the background reload). go-redis alone would go
// on dialling the dead master until its slot map is 60 s old.
func TestClusterStoreFollowsAFailoverWithinASecond(t *testing.T) {
	c := testutil.StartClusterWithReplicas(t, 3, 1, time.Second)
	ctx := context.Background()
	const id = "failover-victim"
	s, slot, master := beatOnCluster(t, c, id)
	bystander, _ := clusterStore(t, c) // go-redis's own behaviour, for the log
	_, err := bystander.ReadOwn(ctx, id)
	require.NoError(t, err)
	bystander.slots.cc = nil

	killedAt := time.Now()
	c.Node(master).Kill()
	promoted := c.WaitFailover(t, slot, master, 20*time.Second)
	promotedAt := time.Now()
	okAt := beatUntilOK(t, s, id, 10*time.Second)
	node, err := s.NodeOf(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, promoted, node, "the slot map names the promoted replica")
	after := okAt.Sub(promotedAt)
	t.Logf("failover %v; first heartbeat %v after the promotion", promotedAt.Sub(killedAt).Round(time.Millisecond), after.Round(time.Millisecond))
	assert.LessOrEqual(t, after, reloadEvery+time.Second, "reloadEvery + a command's timeout and the reload")

	rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	_, err = bystander.ReadOwn(rctx, id)
	cancel()
	t.Logf("a Store that does not reload, %v after the promotion: %v", time.Since(promotedAt).Round(time.Millisecond), err)
}

// A master SIGKILLed with no replica to promote: the Store asks for at most
// one slot map reload a second however many of its commands fail.
func TestClusterStoreReloadsTheSlotMapAtMostOnceASecond(t *testing.T) {
	c := testutil.StartCluster(t, 3)
	ctx := context.Background()
	const id = "reload-victim"
	s, _, master := beatOnCluster(t, c, id)
	var survivors []string
	for _, a := range c.Addrs {
		if a != master {
			survivors = append(survivors, a)
		}
	}
	slotsCalls := func() (n int64) {
		for _, a := range survivors {
			n += testutil.CommandCalls(t, a, "cluster|slots")
		}
		return n
	}

	c.Node(master).Kill()
	before, start := slotsCalls(), time.Now()
	failures := 0
	for time.Since(start) < 2500*time.Millisecond {
		rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if _, err := s.ReadOwn(rctx, id); err != nil {
			failures++
		}
		cancel()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the last reload, in the background
	reloads := slotsCalls() - before
	t.Logf("%d failed commands in %v, %d CLUSTER SLOTS on the survivors", failures, time.Since(start).Round(time.Millisecond), reloads)
	require.GreaterOrEqual(t, failures, 10)
	assert.GreaterOrEqual(t, reloads, int64(2), "the slot map reloaded while commands failed")
	assert.LessOrEqual(t, reloads, int64(3), "at most one reload a second (2.5 s: 3)")
}

// KeepRows on Cluster: the peers' keys live on several masters; one
// pipeline reaches each, and each script touches one instance's slot.
func TestKeepRowsReachesPeersOnEveryMaster(t *testing.T) {
	c := testutil.StartCluster(t, 3)
	s, cc := clusterStore(t, c)
	ctx := context.Background()
	var peers []string
	masters := map[string]bool{}
	for i := 0; len(masters) < 3 && i < 100; i++ {
		id := fmt.Sprintf("peer-%d", i)
		require.NoError(t, s.TrackRows(ctx, id, []int64{1}, time.Second))
		node, err := s.NodeOf(ctx, id)
		require.NoError(t, err)
		masters[node] = true
		peers = append(peers, id)
	}
	require.Len(t, masters, 3, "peers on every master")

	require.NoError(t, s.KeepRows(ctx, peers, time.Minute))
	for _, id := range peers {
		assert.Greater(t, cc.PTTL(ctx, s.Keys(id).Rows).Val(), 50*time.Second, id)
	}
}
