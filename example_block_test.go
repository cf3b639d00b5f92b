package recovery_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
)

// startedWorker is New and Start of a worker over rows, as a host does at
// start-up.
func startedWorker(ctx context.Context, rdb redis.UniversalClient, rows recovery.Resetter) (*recovery.Worker, error) {
	w, err := recovery.New(rdb, rows, recovery.WithInstanceID("worker-1"))
	if err != nil {
		return nil, err
	}
	return w, w.Start(ctx)
}

// One block, the way a host processes it: Begin, defer Close, Track before
// the fetch's COMMIT, Check before each row and Done after its commit. The
// second row fails, the host returns, and the deferred Close gives the
// unfinished rows back to the queue.
func ExampleWorker_Begin() {
	mr, rdb := redisForExample()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()
	rows := newQueue(101, 102, 103)
	w, err := startedWorker(ctx, rdb, rows)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Shutdown(context.Background())

	processBlock := func() error {
		b, err := w.Begin()
		if err != nil {
			return err // the lease is lost, or the worker stopped: wait and begin again
		}
		defer b.Close() // gives back what is not Done: on an error, a panic, a lost lease

		// The fetch: UPDATE ... SET status = 'inprog', owner = b.OwnerValue()
		// ... RETURNING id, then b.Track before the COMMIT.
		block := []int64{101, 102, 103}
		rows.set("inprog", block...)
		if err := b.Track(ctx, block...); err != nil {
			return err // roll the fetch back
		}
		for _, id := range block {
			if err := b.Check(); err != nil {
				return err // the lease was lost: Close gives the rest back
			}
			if id == 102 {
				return errors.New("row 102: processing failed")
			}
			rows.set("done", id) // the completion, guarded by owner = b.OwnerValue()
			if err := b.Done(id); err != nil {
				fmt.Println("done:", err) // the next heartbeat removes it from Redis
			}
		}
		return nil
	}
	fmt.Println("block:", processBlock())
	for _, id := range []int64{101, 102, 103} {
		fmt.Printf("row %d: %s\n", id, rows.get(id))
	}
	fmt.Println("tracked:", w.Stats().TrackedRows)
	// Output:
	// block: row 102: processing failed
	// row 101: done
	// row 102: queued
	// row 103: queued
	// tracked: 0
}

// Close gives back only what is not Done, and nothing once every row is:
// deferred, it is always right, as a Tx's Rollback after Commit.
func ExampleBlock_Close() {
	mr, rdb := redisForExample()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()
	rows := newQueue(1, 2)
	w, err := startedWorker(ctx, rdb, rows)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Shutdown(context.Background())

	b, _ := w.Begin()
	rows.set("inprog", 1, 2)
	_ = b.Track(ctx, 1, 2)
	rows.set("done", 1, 2)
	_ = b.Done(1, 2)
	fmt.Println("close:", b.Close(), "released:", w.Stats().RowsReleased)
	fmt.Println("track after close:", b.Track(ctx, 3))
	// Output:
	// close: <nil> released: 0
	// track after close: recovery: block closed
}
