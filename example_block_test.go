package recovery_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alya/recovery"
)

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
	w, err := recovery.New(rdb, rows, recovery.WithInstanceID("worker-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := w.Start(ctx); err != nil {
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
