//go:build containers

package testutil

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestContainerHelperAnswersOverItsPipe runs the internal/containers
// module as the fallback does and asks it for a Redis container: with a
// Docker engine, a Redis that answers PING, stopped on request; without
// one, the helper's reason. Either way the helper rejects an unknown
// request and exits when its input closes. Building the helper downloads
// Docker's client and testcontainers-go, so the test has a build tag of its
// own and runs in make test-containers, not in make test.
func TestContainerHelperAnswersOverItsPipe(t *testing.T) {
	h, err := startContainerHelper()
	if err != nil {
		t.Fatalf("start the helper: %v", err)
	}
	defer h.close()

	if _, err := h.request("bogus"); err == nil || !strings.Contains(err.Error(), `unknown request "bogus"`) {
		t.Fatalf("unknown request answered with %v", err)
	}
	reply, err := h.request("redis")
	switch {
	case err != nil && dockerReachable():
		t.Fatalf("Docker looks reachable but no Redis container started: %v", err)
	case err != nil:
		t.Logf("no Docker engine here, as the helper says: %v", err)
		if !strings.Contains(strings.ToLower(err.Error()), "docker") {
			t.Errorf("the helper's failure does not say Docker is the problem: %v", err)
		}
	default:
		id, addr, _ := strings.Cut(reply, " ")
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("the Redis container at %s does not answer: %v", addr, err)
		}
		if _, err := h.request("stop " + id); err != nil {
			t.Fatalf("stop the container: %v", err)
		}
	}
	if err := h.close(); err != nil {
		t.Fatalf("the helper did not exit cleanly when its input closed: %v", err)
	}
}
