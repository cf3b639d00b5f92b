package testutil

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Memory pressure from another application sharing a Redis server with
// maxmemory set (the managed-Redis scenarios of issue 20): its keys are
// named prefix + ":data:<n>" (kept, no TTL) and prefix + ":cache:<n>"
// (with a TTL).

// Ballast fills the server with keys without a TTL (data the other
// application keeps) until less than headroom bytes are left below
// maxmemory: what is left for keys with a TTL is then small, and under
// volatile-lru each lives a short while before it is evicted.
func Ballast(t testing.TB, rdb *redis.Client, prefix string, headroom int64) {
	t.Helper()
	ctx := context.Background()
	limit := InfoField(t, rdb, "memory", "maxmemory")
	if limit == 0 {
		t.Fatal("Ballast needs a server with maxmemory set")
	}
	val := strings.Repeat("b", 64<<10)
	for i := 0; InfoField(t, rdb, "memory", "used_memory") < limit-headroom; i++ {
		if err := rdb.Set(ctx, fmt.Sprintf("%s:data:%d", prefix, i), val, 0).Err(); err != nil {
			t.Fatalf("write ballast: %v", err)
		}
	}
}

// Pressure writes keys with a TTL until ctx ends, about 2 MB a second, so
// that a server full of Ballast keeps evicting. It returns how many keys
// it wrote.
func Pressure(ctx context.Context, rdb *redis.Client, prefix string) int {
	val := strings.Repeat("x", 4096)
	n := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		pipe := rdb.Pipeline()
		for range 5 {
			n++
			pipe.Set(ctx, fmt.Sprintf("%s:cache:%d", prefix, n), val, 10*time.Minute)
		}
		_, _ = pipe.Exec(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return n
}

// DropPressure deletes the other application's keys (prefix + ":*"):
// evictions stop.
func DropPressure(t testing.TB, rdb *redis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+":*", 1000).Result()
		if err != nil {
			t.Fatalf("scan %s keys: %v", prefix, err)
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				t.Fatalf("unlink %s keys: %v", prefix, err)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// InfoField reads one number of an INFO section.
func InfoField(t testing.TB, rdb *redis.Client, section, name string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s %s: %v", section, name, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, name)
	return 0
}

// AwaitEvicted waits for the evicted-key event of one of keys on sub, a
// subscription to their keyspace channels (the server runs with
// notify-keyspace-events including K and e), and returns that key; it
// fails the test after limit.
func AwaitEvicted(t testing.TB, sub *redis.PubSub, limit time.Duration, keys ...string) string {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case m := <-sub.Channel():
			for _, k := range keys {
				if m.Payload == "evicted" && strings.HasSuffix(m.Channel, ":"+k) {
					return k
				}
			}
		case <-timer.C:
			t.Fatalf("no eviction of %v within %v", keys, limit)
			return ""
		}
	}
}
