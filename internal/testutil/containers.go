package testutil

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// The last resort, for a machine with a Docker engine but without the
// servers' binaries: containers started by testcontainers-go. It lives in
// the module internal/containers, run as a separate process (go run), so
// that neither this module's go.mod nor a user's go.sum carries Docker's
// client. Tests that must kill, pause or restart a server, or need a
// Cluster, want a local process and do not use this.

// dockerReachable reports whether a Docker engine may be there to ask.
func dockerReachable() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	_, err := os.Stat("/var/run/docker.sock")
	return err == nil
}

// containerHelper is the running internal/containers program: one
// request line in, one reply line out (see its package doc).
type containerHelper struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *LogBuffer
}

var (
	helperOnce sync.Once
	helper     *containerHelper
	helperErr  error
)

// containers returns the helper process, started once per test binary
// and stopped (with every container it started) by Main.
func containers() (*containerHelper, error) {
	helperOnce.Do(func() {
		helper, helperErr = startContainerHelper()
		if helperErr == nil {
			onExit(func() { _ = helper.close() })
		}
	})
	return helper, helperErr
}

// containersModuleDir is internal/containers in the source tree this
// package was built from.
func containersModuleDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source of internal/testutil")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "containers")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("the containers module is not in the source tree: %w", err)
	}
	return dir, nil
}

// startContainerHelper builds and starts internal/containers with go run,
// as a module of its own (GOWORK=off: its go.mod and go.sum say
// everything it needs).
func startContainerHelper() (*containerHelper, error) {
	dir, err := containersModuleDir()
	if err != nil {
		return nil, err
	}
	h := &containerHelper{stderr: &LogBuffer{}}
	h.cmd = exec.Command("go", "run", ".")
	h.cmd.Dir = dir
	h.cmd.Env = append(os.Environ(), "GOWORK=off")
	h.cmd.Stderr = h.stderr
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	h.out = bufio.NewScanner(stdout)
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("go run %s: %w", dir, err)
	}
	return h, nil
}

// request sends one request and returns the reply's text after "ok", or
// the helper's error.
func (h *containerHelper) request(line string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := fmt.Fprintln(h.in, line); err != nil {
		return "", fmt.Errorf("containers helper: %w (stderr: %s)", err, h.tail())
	}
	if !h.out.Scan() {
		return "", fmt.Errorf("containers helper exited without a reply to %q (stderr: %s)", line, h.tail())
	}
	reply := h.out.Text()
	if rest, ok := strings.CutPrefix(reply, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", errors.New(strings.TrimPrefix(reply, "err "))
}

// close ends the helper's input, so it stops its containers and exits,
// and waits for it.
func (h *containerHelper) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.in.Close()
	return h.cmd.Wait()
}

// startContainer asks the helper for a container of kind ("redis" or
// "postgres") and returns its ID and address.
func startContainer(kind string) (id, addr string, err error) {
	h, err := containers()
	if err != nil {
		return "", "", err
	}
	reply, err := h.request(kind)
	if err != nil {
		return "", "", err
	}
	id, addr, ok := strings.Cut(reply, " ")
	if !ok {
		return "", "", fmt.Errorf("containers helper: malformed reply %q", reply)
	}
	return id, addr, nil
}

// containerRedisAddr starts a Redis container for the test, stopped when
// it ends, and returns its address.
func containerRedisAddr(t testing.TB) (string, error) {
	id, addr, err := startContainer("redis")
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { _, _ = helper.request("stop " + id) })
	return addr, nil
}

// containerPostgresURL starts one PostgreSQL container per test binary,
// stopped by Main with the helper.
func containerPostgresURL() (string, error) {
	_, url, err := startContainer("postgres")
	return url, err
}

// tail returns the last 2 KiB of what the helper wrote to stderr.
func (h *containerHelper) tail() string {
	s := h.stderr.String()
	if len(s) > 2048 {
		s = s[len(s)-2048:]
	}
	return strings.TrimSpace(s)
}
