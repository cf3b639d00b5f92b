package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// historySuffix names the fleet's history stream, added in the protocol's
// third version: workers of earlier versions neither write nor read it.
const historySuffix = "_HISTORY"

// HistoryKey returns the name of the fleet's history stream under prefix.
// It has no hash tag: one key, so one slot on Cluster.
func HistoryKey(prefix string) string { return prefix + historySuffix }

// A HistoryRecord is one entry of the history stream.
type HistoryRecord struct {
	// ID is the stream entry's ID, "<ms>-<seq>"; Added is the server time
	// in its first part, when the entry was appended.
	ID    string
	Added time.Time
	// Fields are the entry's field-value pairs.
	Fields map[string]string
}

// HistoryQuery says which entries ReadHistory returns: those added at or
// after Since (zero: from the first), at most Count of them (0: all), the
// newest ones when Newest is set, else the oldest. Either way they come
// back oldest first.
type HistoryQuery struct {
	Since  time.Time
	Count  int64
	Newest bool
}

// AppendHistory adds one entry to the history stream with XADD, trimming
// it to about maxLen entries (MAXLEN ~: Redis trims whole nodes, so the
// stream may hold a few more). A retry after a lost reply may append the
// entry twice; the caller's fields carry an ID of the entry's own, by
// which readers drop the copy.
func (s *Redis) AppendHistory(ctx context.Context, fields []string, maxLen int64) error {
	values := make([]any, len(fields))
	for i, f := range fields {
		values[i] = f
	}
	err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: HistoryKey(s.prefix), MaxLen: maxLen, Approx: true, Values: values}).Err()
	if err != nil {
		return fmt.Errorf("append to %s: %w", HistoryKey(s.prefix), err)
	}
	return nil
}

// ReadHistory reads the history stream with XRANGE, or XREVRANGE for the
// newest entries.
func (s *Redis) ReadHistory(ctx context.Context, q HistoryQuery) ([]HistoryRecord, error) {
	key := HistoryKey(s.prefix)
	start := "-"
	if !q.Since.IsZero() {
		start = strconv.FormatInt(max(q.Since.UnixMilli(), 0), 10)
	}
	var (
		msgs []redis.XMessage
		err  error
	)
	switch {
	case q.Newest && q.Count > 0:
		msgs, err = s.rdb.XRevRangeN(ctx, key, "+", start, q.Count).Result()
	case q.Newest:
		msgs, err = s.rdb.XRevRange(ctx, key, "+", start).Result()
	case q.Count > 0:
		msgs, err = s.rdb.XRangeN(ctx, key, start, "+", q.Count).Result()
	default:
		msgs, err = s.rdb.XRange(ctx, key, start, "+").Result()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	out := make([]HistoryRecord, len(msgs))
	for i, m := range msgs {
		r := HistoryRecord{ID: m.ID, Fields: make(map[string]string, len(m.Values))}
		if ms, _, ok := strings.Cut(m.ID, "-"); ok {
			if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
				r.Added = time.UnixMilli(n)
			}
		}
		for k, v := range m.Values {
			r.Fields[k], _ = v.(string)
		}
		out[i] = r
	}
	if q.Newest {
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out, nil
}
