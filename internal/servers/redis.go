package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoRedisServer is returned by StartRedis when no redis-server is on
// PATH.
var ErrNoRedisServer = errors.New("no redis-server on PATH")

// Redis is a throwaway redis-server started by StartRedis.
type Redis struct {
	// Addr is its loopback address, host:port.
	Addr string
	// Dir is its working folder, removed by Stop.
	Dir  string
	cmd  *exec.Cmd
	logf *os.File
	once sync.Once
}

// StartRedis runs the redis-server on PATH on a free loopback port,
// without persistence, in a temporary folder. It returns once the server
// answers PING, or an error (ErrNoRedisServer when there is none) after
// cleaning up what it started. ctx bounds the start; without a deadline,
// DefaultStartTimeout does. Like StartPostgres's, the server has its own
// process group and, on Linux, dies with this process.
func StartRedis(ctx context.Context) (_ *Redis, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedisServer
	}
	dir, err := os.MkdirTemp("", "recovery-redis-")
	if err != nil {
		return nil, fmt.Errorf("create redis folder: %w", err)
	}
	r := &Redis{Dir: dir}
	defer func() {
		if err != nil {
			r.Stop()
		}
	}()
	port, err := FreePort(false)
	if err != nil {
		return nil, err
	}
	r.Addr = "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--daemonize", "no", "--loglevel", "warning", "--protected-mode", "no")
	cmd.SysProcAttr = ChildAttr(nil, true)
	cmd.Dir = dir
	if r.logf, err = os.Create(filepath.Join(dir, "redis.log")); err != nil {
		return nil, fmt.Errorf("create redis.log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = r.logf, r.logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd = cmd
	if err := r.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		return nil, fmt.Errorf("redis-server did not answer: %v; log: %s", err, log)
	}
	return r, nil
}

// waitReady sends PING in the protocol's inline form until the server
// answers +PONG or ctx ends.
func (r *Redis) waitReady(ctx context.Context) error {
	var d net.Dialer
	for {
		err := func() error {
			c, err := d.DialContext(ctx, "tcp", r.Addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Write([]byte("PING\r\n")); err != nil {
				return err
			}
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(string(buf[:n]), "+PONG") {
				return fmt.Errorf("PING answered %q", buf[:n])
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop kills the server, waits for it and removes its folder. It is safe
// to call more than once and on a server that failed to start.
func (r *Redis) Stop() {
	r.once.Do(func() {
		if r.cmd != nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
		if r.logf != nil {
			r.logf.Close()
		}
		if r.Dir != "" {
			os.RemoveAll(r.Dir)
		}
	})
}
