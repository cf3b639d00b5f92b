package testutil

import (
	"context"
	"strings"
	"testing"
	"time"
)

func runID(t *testing.T, s *RedisServer) string {
	t.Helper()
	c := s.Client(t)
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatalf("INFO server: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatalf("no run_id in INFO server")
	return ""
}

func TestRestartKeepingDataLoadsTheLastSnapshotAndRestartDoesNot(t *testing.T) {
	s := StartRedis(t)
	c := s.Client(t)
	ctx := context.Background()
	before := runID(t, s)
	if err := c.Set(ctx, "saved", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "expires", "1", 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // "expires" ran out since the snapshot

	s.RestartKeepingData()
	if after := runID(t, s); after == before {
		t.Fatalf("run_id %s unchanged: the server was not restarted", after)
	}
	for key, want := range map[string]int64{"saved": 1, "expires": 0, "after": 0} {
		if n, err := c.Exists(ctx, key).Result(); err != nil || n != want {
			t.Errorf("after RestartKeepingData, EXISTS %s = %d (%v), want %d", key, n, err, want)
		}
	}

	s.Restart()
	if n, err := c.Exists(ctx, "saved").Result(); err != nil || n != 0 {
		t.Errorf("after Restart, EXISTS saved = %d (%v), want 0: Restart starts empty", n, err)
	}
}
