package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis returns a client for tests that need a real Redis but not their own
// server: the one at REDIS_URL when set, otherwise a fresh redis-server
// stopped when the test ends. Keep tests apart with a Name prefix.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	skipIfShort(t)
	if url := os.Getenv("REDIS_URL"); url != "" {
		return envRedis(t, url)
	}
	if _, err := exec.LookPath("redis-server"); err != nil && dockerReachable() {
		addr, err := containerRedisAddr(t)
		if err != nil {
			Unavailable(t, "no redis-server binary, and %v", err)
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		return c
	}
	return StartRedis(t).Client(t)
}

// RedisURL is Redis for tests that connect by URL (programs under test that
// take a --redis-url): REDIS_URL when set, otherwise the URL of a fresh
// redis-server stopped when the test ends. Keep tests apart with a Name
// prefix.
func RedisURL(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	if url := os.Getenv("REDIS_URL"); url != "" {
		envRedis(t, url)
		return url
	}
	if _, err := exec.LookPath("redis-server"); err != nil && dockerReachable() {
		addr, err := containerRedisAddr(t)
		if err != nil {
			Unavailable(t, "no redis-server binary, and %v", err)
		}
		return "redis://" + addr
	}
	return "redis://" + StartRedis(t).Addr
}

// envRedis returns a client for REDIS_URL, closed when the test ends, after
// checking that it answers.
func envRedis(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("REDIS_URL is not a valid redis URL: %v", redactErr(err, url))
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		Unavailable(t, "REDIS_URL does not answer PING: %v", redactErr(err, url))
	}
	return c
}

// RedisServer is a redis-server process owned by one test.
type RedisServer struct {
	Port int
	Addr string
	bin  string
	dir  string
	args []string
	cmd  *exec.Cmd
	t    testing.TB
}

// redisBinary finds redis-server, or ends the test.
func redisBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server not found in PATH (make test installs it; or set REDIS_URL)")
	}
	return bin
}

// StartRedis starts a redis-server on a free loopback port, without
// persistence, and stops it when the test ends. extra are more
// command-line options (e.g. "--cluster-enabled", "yes").
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	skipIfShort(t)
	bin := redisBinary(t)
	cluster := false
	for _, a := range extra {
		cluster = cluster || a == "--cluster-enabled"
	}
	s := &RedisServer{bin: bin, dir: t.TempDir(), t: t}
	// A free port may be taken by another test's server before ours binds
	// it; ours then exits and the other answers: pick another port.
	for try := 0; ; try++ {
		s.Port = FreePort(t, cluster)
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		s.args = append([]string{
			"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.dir,
			"--daemonize", "no", "--loglevel", "warning", "--protected-mode", "no",
		}, extra...)
		err := s.start()
		if err == nil {
			break
		}
		if !errors.Is(err, errNotOurs) || try == 4 {
			t.Fatalf("start redis-server: %v", err)
		}
	}
	t.Cleanup(s.Kill)
	return s
}

// errNotOurs: the server answering on the port is another process.
var errNotOurs = errors.New("another redis-server answers on the port")

// ours checks that the server c reaches is s's process (INFO server's
// process_id). A server that does not answer INFO is taken to be ours.
func (s *RedisServer) ours(c *redis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok && v != strconv.Itoa(s.cmd.Process.Pid) {
			return fmt.Errorf("%w: %s answers as process %s, ours is %d", errNotOurs, s.Addr, v, s.cmd.Process.Pid)
		}
	}
	return nil
}

func (s *RedisServer) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	out.Close()
	s.cmd = cmd
	pw := ""
	if i := slices.Index(s.args, "--requirepass"); i >= 0 && i+1 < len(s.args) {
		pw = s.args[i+1]
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: pw, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			if err := s.ours(c); err != nil {
				s.Kill()
				return err
			}
			return nil
		}
		if strings.HasPrefix(err.Error(), "NOAUTH") || strings.HasPrefix(err.Error(), "WRONGPASS") { // answers: an ACL of its own
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.dir + "/redis.log")
			s.Kill()
			return fmt.Errorf("redis-server on %s did not answer: %v; log: %s", s.Addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a client for this server, closed when the test ends.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Kill stops the server with SIGKILL and waits for it. It is safe to call
// on a stopped server.
func (s *RedisServer) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server and starts it again, empty, on the same port
// (a snapshot taken with SAVE is deleted first).
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	if err := os.Remove(s.dir + "/dump.rdb"); err != nil && !os.IsNotExist(err) {
		s.t.Fatalf("remove snapshot: %v", err)
	}
	s.restart()
}

// RestartKeepingData kills the server with SIGKILL and starts it again on
// the same port and directory, so it loads the last snapshot taken with
// SAVE or BGSAVE (dump.rdb), as a server restarted from its RDB file does:
// keys whose TTL ran out since the snapshot are gone, the others are back
// with the absolute expiry times they had.
func (s *RedisServer) RestartKeepingData() {
	s.t.Helper()
	s.Kill()
	s.restart()
}

func (s *RedisServer) restart() {
	s.t.Helper()
	var err error
	for range 50 { // the port may linger for a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("restart redis-server: %v", err)
}

// Signal sends sig (SIGSTOP, SIGCONT) to the server process.
func (s *RedisServer) Signal(sig syscall.Signal) error {
	if s.cmd == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}

// Cluster is a Redis Cluster owned by one test.
type Cluster struct {
	Addrs []string
	Nodes []*RedisServer
}

// StartCluster starts n redis-server nodes with cluster mode on loopback,
// joins them with redis-cli --cluster create (masters only) and waits
// until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWithReplicas(t, n, 0, 2*time.Second)
}

// StartClusterWithReplicas starts masters × (1 + replicas) nodes with
// cluster mode and the given cluster-node-timeout (how long a master may
// be unreachable before its replica is promoted), joins them with
// redis-cli --cluster create --cluster-replicas, and waits until every
// node reports cluster_state:ok and every replica is in sync.
func StartClusterWithReplicas(t testing.TB, masters, replicas int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Unavailable(t, "redis-cli not found in PATH: cannot create a Redis Cluster")
	}
	c := &Cluster{}
	for range masters * (1 + replicas) {
		s := StartRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0") // a replica's first copy at once, not after 5 s
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			repl, err2 := rc.Info(context.Background(), "replication").Result()
			if err == nil && err2 == nil && strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("cluster node %s not ok: %v %v %s", s.Addr, err, err2, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *RedisServer {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterOf returns the address of the master that serves slot, as the
// first node that answers (other than those in skip) sees it.
func (c *Cluster) MasterOf(ctx context.Context, slot int64, skip ...string) (string, error) {
	var last error
	for _, s := range c.Nodes {
		if slices.Contains(skip, s.Addr) {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		ranges, err := rc.ClusterSlots(ctx).Result()
		rc.Close()
		if err != nil {
			last = err
			continue
		}
		for _, r := range ranges {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr, nil
			}
		}
		return "", fmt.Errorf("slot %d not served (as %s sees it)", slot, s.Addr)
	}
	return "", fmt.Errorf("no node answered CLUSTER SLOTS: %v", last)
}

// WaitFailover waits until slot is served by a master other than old, as
// the surviving nodes see it, and returns that master; the test fails if
// it takes longer than timeout.
func (c *Cluster) WaitFailover(t testing.TB, slot int64, old string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, err := c.MasterOf(context.Background(), slot, old)
		if err == nil && m != old {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %d still on %s after %v (%q, %v)", slot, old, timeout, m, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CommandCalls returns how many times the server at addr ran command, as
// INFO commandstats names it ("get", "cluster|slots" on Redis 7).
func CommandCalls(t testing.TB, addr, command string) int64 {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats of %s: %v", addr, err)
	}
	prefix := "cmdstat_" + command + ":calls="
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
			if err != nil {
				t.Fatalf("INFO commandstats of %s: %q: %v", addr, line, err)
			}
			return n
		}
	}
	return 0
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// FollowingClient returns a cluster client for a test's own reads that
// reloads its slot map whenever it is used and older than 100 ms, so it
// follows a failover the test caused; go-redis's default keeps a slot map
// for 60 s, and a dead master answers no MOVED. Closed when the test ends.
// (Workers get Client: following a failover is the library's job.)
func (c *Cluster) FollowingClient(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ClusterStateReloadInterval: 100 * time.Millisecond})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// redactErr returns err's text with any occurrence of secret removed, so a
// URL with a password never reaches a test log.
func redactErr(err error, secret string) string {
	msg := err.Error()
	if secret != "" {
		msg = strings.ReplaceAll(msg, secret, "<redacted>")
	}
	return msg
}
