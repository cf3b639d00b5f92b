package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a Redis master, its replicas and the sentinels that watch
// them, all redis-server processes on loopback owned by one test. The
// sentinels are redis-server --sentinel (the same binary: no
// redis-sentinel package needed).
type Sentinel struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// Data are the data nodes: Data[0] is the first master, the others its
	// replicas. After a failover the roles differ: ask MasterAddr.
	Data []*RedisServer
	// Sentinels are the sentinel processes; SentinelAddrs their addresses.
	Sentinels     []*RedisServer
	SentinelAddrs []string
}

// StartSentinel starts a master with replicas replicas and sentinels
// sentinels (quorum: a majority of them) that declare the master down
// after downAfter without an answer. It returns once every sentinel knows
// every replica and every other sentinel, so that a failover can happen.
func StartSentinel(t testing.TB, replicas, sentinels int, downAfter time.Duration) *Sentinel {
	t.Helper()
	s := &Sentinel{MasterName: Name("master")}
	// Without the delay a master waits 5 s (the default) before it sends
	// a new replica its first copy: a failover before that promotes an
	// empty replica.
	master := StartRedis(t, "--repl-diskless-sync-delay", "0")
	s.Data = append(s.Data, master)
	for range replicas {
		s.Data = append(s.Data, StartRedis(t, "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", strconv.Itoa(master.Port)))
	}
	for range sentinels {
		s.Sentinels = append(s.Sentinels, s.startSentinel(t, master.Port, sentinels/2+1, downAfter))
	}
	for _, sn := range s.Sentinels {
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range s.Data[1:] {
		for !strings.Contains(info(context.Background(), r, "replication"), "master_link_status:up") {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s not in sync with its master", r.Addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, sn := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
		for {
			m, err := sc.Master(context.Background(), s.MasterName).Result()
			if err == nil && m["num-slaves"] == strconv.Itoa(replicas) && m["num-other-sentinels"] == strconv.Itoa(sentinels-1) {
				break
			}
			if time.Now().After(deadline) {
				sc.Close()
				t.Fatalf("sentinel %s does not see %d replicas and %d other sentinels: %v %v", sn.Addr, replicas, sentinels-1, m, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		sc.Close()
	}
	return s
}

func (s *Sentinel) startSentinel(t testing.TB, masterPort, quorum int, downAfter time.Duration) *RedisServer {
	t.Helper()
	sn := &RedisServer{bin: redisBinary(t), dir: t.TempDir(), t: t}
	sn.Port = FreePort(t, false)
	sn.Addr = "127.0.0.1:" + strconv.Itoa(sn.Port)
	conf := filepath.Join(sn.dir, "sentinel.conf") // sentinels rewrite their file
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
loglevel notice
sentinel monitor %s 127.0.0.1 %d %d
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, sn.Port, sn.dir, s.MasterName, masterPort, quorum, s.MasterName, downAfter.Milliseconds(), s.MasterName, s.MasterName)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatalf("write sentinel config: %v", err)
	}
	sn.args = []string{conf, "--sentinel"}
	if err := sn.start(); err != nil {
		t.Fatalf("start sentinel: %v", err)
	}
	t.Cleanup(sn.Kill)
	return sn
}

// MasterAddr returns the master's address as the first sentinel that
// answers reports it.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var last error
	for _, addr := range s.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
		hp, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		sc.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("no sentinel reported the master: %v", last)
}

// Node returns the data node listening on addr, or nil.
func (s *Sentinel) Node(addr string) *RedisServer {
	for _, n := range s.Data {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// info returns the INFO section of node, or "" when it does not answer.
func info(ctx context.Context, node *RedisServer, section string) string {
	rc := redis.NewClient(&redis.Options{Addr: node.Addr, MaxRetries: -1})
	defer rc.Close()
	s, _ := rc.Info(ctx, section).Result()
	return s
}

// Role returns the role line of INFO replication of node ("master" or
// "slave"), or "" when it does not answer.
func Role(ctx context.Context, node *RedisServer) string {
	for _, l := range strings.Split(info(ctx, node, "replication"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "role:"); ok {
			return v
		}
	}
	return ""
}
