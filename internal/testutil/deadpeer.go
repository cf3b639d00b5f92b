package testutil

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// DeadPeer creates a batch of n rows (CreateBatch) that look like those of
// a worker that died holding them all: in progress and owned by peer in
// PostgreSQL, in peer's rows set and peer in the registry of a fresh key
// prefix, with no heartbeat. It returns the prefix.
func DeadPeer(t testing.TB, rdb *redis.Client, db *pgxpool.Pool, peer string, n int) string {
	t.Helper()
	CreateBatch(t, db, n)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog', owner = $1`, peer); err != nil {
		t.Fatalf("mark rows of %s in progress: %v", peer, err)
	}
	prefix := Name("P")
	ids := make([]any, n)
	for i := range ids {
		ids[i] = i + 1
	}
	if err := rdb.SAdd(ctx, prefix+"_WORKER_REGISTRY", peer).Err(); err != nil {
		t.Fatalf("register %s: %v", peer, err)
	}
	if err := rdb.SAdd(ctx, prefix+"_{"+peer+"}_ROWS", ids...).Err(); err != nil {
		t.Fatalf("rows set of %s: %v", peer, err)
	}
	return prefix
}
