// Package testutil gives the tests of this module real servers: throwaway
// redis-server processes (standalone and Cluster) and a throwaway
// PostgreSQL, started from local binaries on free loopback ports and
// stopped when the test (or, for PostgreSQL, the test binary) ends.
//
// REDIS_URL and DATABASE_URL, when set, are used instead of starting
// servers. When no server can be had, tests skip with the reason, except
// under RECOVERY_REQUIRE_INTEGRATION=1, where they fail.
package testutil

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/alya/recovery/internal/servers"
)

// RequireIntegration reports whether integration tests must run: set
// RECOVERY_REQUIRE_INTEGRATION=1 (CI does) to turn a missing server into a
// failure instead of a skip.
func RequireIntegration() bool { return os.Getenv("RECOVERY_REQUIRE_INTEGRATION") == "1" }

// Unavailable ends the test because a server it needs cannot be had: a
// skip, or a failure under RECOVERY_REQUIRE_INTEGRATION=1.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if RequireIntegration() {
		t.Fatalf("integration server unavailable (RECOVERY_REQUIRE_INTEGRATION=1): %s", msg)
	}
	t.Skipf("integration server unavailable, skipping: %s (set RECOVERY_REQUIRE_INTEGRATION=1 to fail instead)", msg)
}

// skipIfShort skips integration tests under go test -short (make test-unit).
func skipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
}

// Main runs the tests of a package and then stops the servers shared by
// them (PostgreSQL). Call it from TestMain.
func Main(m interface{ Run() int }) int {
	code := m.Run()
	stopShared()
	return code
}

// MainCheckingLeaks is Main, then a check that no goroutine outlived the
// tests (goleak); a leak fails the run. Call it from TestMain and pass the
// result to os.Exit.
func MainCheckingLeaks(m interface{ Run() int }) int {
	code := Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	return code
}

var (
	sharedMu    sync.Mutex
	sharedStops []func()
)

func onExit(f func()) {
	sharedMu.Lock()
	sharedStops = append(sharedStops, f)
	sharedMu.Unlock()
}

func stopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for i := len(sharedStops) - 1; i >= 0; i-- {
		sharedStops[i]()
	}
	sharedStops = nil
}

// Name returns a random name that is a valid instance ID, key prefix and
// SQL identifier, for keeping tests that share a server apart.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. If
// withBus is set, port+10000 (a Cluster node's bus port) was free too.
func FreePort(t testing.TB, withBus bool) int {
	t.Helper()
	port, err := freePort(withBus)
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	return port
}

func freePort(withBus bool) (int, error) { return servers.FreePort(withBus) }

// LogBuffer collects JSON log lines from a logger made by Logger.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything logged so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count returns how many log lines contain s.
func (b *LogBuffer) Count(s string) int {
	n := 0
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// Logger returns a debug-level JSON logger that writes to the returned
// buffer, and also to the test log when the test fails.
func Logger(t testing.TB) (*slog.Logger, *LogBuffer) {
	t.Helper()
	b := &LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", b.String())
		}
	})
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
