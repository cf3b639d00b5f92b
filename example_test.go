package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/ops"
)

// queue is a tiny Resetter over an in-memory table of row statuses: the
// contract a host without PostgreSQL implements. Only rows still in
// progress go back to the queue. It has no owners, no ledger and no dry
// run, and cannot list the rows in progress (no backstop sweep): its Info
// says so.
type queue struct {
	mu     sync.Mutex
	status map[int64]string
}

func newQueue(ids ...int64) *queue {
	q := &queue{status: map[int64]string{}}
	for _, id := range ids {
		q.status[id] = "queued"
	}
	return q
}

func (q *queue) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "queue", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (q *queue) Check(context.Context, bool) (recovery.ResetterInfo, error) { return q.Info(), nil }

func (q *queue) ResetRows(_ context.Context, req recovery.RowsReset) (recovery.ResetResult, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var res recovery.ResetResult
	for _, id := range req.RowIDs {
		if q.status[id] == "inprog" {
			q.status[id] = "queued"
			res.Changed++
		}
	}
	return res, nil
}

// ResetOwner, ResetVersions and PlanReset are not supported: Info says
// the queue has no owners, cannot list rows in progress and has no dry
// run, so the Worker never calls them.
func (q *queue) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (q *queue) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (q *queue) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errors.ErrUnsupported
}

func (q *queue) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

func (q *queue) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (q *queue) RowStates(_ context.Context, ids []int64) ([]recovery.RowState, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []recovery.RowState
	for _, id := range ids {
		if s, ok := q.status[id]; ok {
			out = append(out, recovery.RowState{ID: id, Status: s})
		}
	}
	return out, nil
}

// set gives rows a status, as FetchBlockOfRows and the host's commits do.
func (q *queue) set(status string, ids ...int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, id := range ids {
		q.status[id] = status
	}
}

func (q *queue) get(id int64) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.status[id]
}

// redisForExample starts an in-memory Redis; the examples would use a real
// one: redis.NewClient(&redis.Options{Addr: "redis:6379"}).
func redisForExample() (*miniredis.Miniredis, *redis.Client) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err) // an example has no caller to return the error to
	}
	testutil.NoEviction(mr) // as a real server would be: maxmemory-policy noeviction
	return mr, redis.NewClient(&redis.Options{Addr: mr.Addr()})
}

func ExampleNew() {
	mr, rdb := redisForExample()
	defer mr.Close()
	defer rdb.Close()

	// rdb may also be a *redis.ClusterClient; the resetter is usually
	// pgxreset.New(pool).
	w, err := recovery.New(rdb, newQueue(),
		recovery.WithInstanceID("worker-1"),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      10 * time.Second,
			HeartbeatInterval: 3 * time.Second,
			RecoveryInterval:  10 * time.Second,
			RowsTTL:           30 * time.Second,
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("instance:", w.InstanceID())

	// New checks the options together and names the bad value.
	_, err = recovery.New(rdb, newQueue(), recovery.WithTimings(recovery.Timings{HeartbeatInterval: 90 * time.Second}))
	fmt.Println(err)
	// Output:
	// instance: worker-1
	// recovery: invalid configuration: Timings.HeartbeatInterval 1m30s must be shorter than Timings.HeartbeatTTL 1m0s
}

func ExampleWorker_Track() {
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

	// FetchBlockOfRows marks a block in progress; track it before the
	// fetch transaction commits, so a crash after the commit always finds
	// the rows tracked.
	block := []int64{101, 102, 103}
	rows.set("inprog", block...)
	if err := w.Track(ctx, block...); err != nil {
		fmt.Println("track:", err) // the rows are kept in memory and written by the next heartbeat
	}
	members, _ := rdb.SMembers(ctx, "ALYA_{worker-1}_ROWS").Result()
	slices.Sort(members)
	fmt.Println("tracked in Redis:", members)

	for _, id := range block {
		rows.set("done", id) // process the row and commit its outcome, then:
		if err := w.Untrack(id); err != nil {
			fmt.Println("untrack:", err) // the next heartbeat removes it
		}
		fmt.Printf("row %d done, %d still tracked\n", id, w.Stats().TrackedRows)
	}
	// Output:
	// tracked in Redis: [101 102 103]
	// row 101 done, 2 still tracked
	// row 102 done, 1 still tracked
	// row 103 done, 0 still tracked
}

func ExampleWorker_Shutdown() {
	mr, rdb := redisForExample()
	defer mr.Close()
	defer rdb.Close()
	rows := newQueue(1, 2)
	w, err := recovery.New(rdb, rows, recovery.WithInstanceID("worker-1"))
	if err != nil {
		fmt.Println(err)
		return
	}

	// SIGTERM cancels the processing context. The Worker never uses it for
	// its heartbeat, so peers keep seeing this worker alive while it
	// finishes its block.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := w.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	rows.set("inprog", 1, 2)
	_ = w.Track(ctx, 1, 2)

	// Kubernetes sends SIGTERM; this example sends it to itself.
	self, _ := os.FindProcess(os.Getpid())
	_ = self.Signal(syscall.SIGTERM)
	<-ctx.Done()
	fmt.Println("processing context:", ctx.Err())

	// Finish the block: no mid-block cancellation.
	for _, id := range []int64{1, 2} {
		rows.set("done", id)
		_ = w.Untrack(id)
	}
	alive, _ := rdb.Exists(context.Background(), "ALYA_{worker-1}_HEARTBEAT").Result()
	fmt.Println("heartbeat while finishing the block:", alive)

	// Then shut down with a deadline of its own: the processing context is
	// already cancelled.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Shutdown(shutdownCtx); err != nil {
		fmt.Println("shutdown:", err)
	}
	alive, _ = rdb.Exists(context.Background(), "ALYA_{worker-1}_HEARTBEAT").Result()
	registered, _ := rdb.SIsMember(context.Background(), "ALYA_WORKER_REGISTRY", "worker-1").Result()
	fmt.Println("heartbeat after Shutdown:", alive, "registered:", registered)
	fmt.Println("Track after Shutdown:", w.Track(context.Background(), 3))
	// Output:
	// processing context: context canceled
	// heartbeat while finishing the block: 1
	// heartbeat after Shutdown: 0 registered: false
	// Track after Shutdown: recovery: shut down
}

// ops.RecoverNow runs one scan of a Worker that is never started (moved to
// package ops in v2; the example stays here beside queue, its resetter).
func Example_recoverNow() {
	mr, rdb := redisForExample()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()
	rows := newQueue(7, 8, 9)

	// Worker A takes rows 7-9, finishes 7, and dies.
	a, _ := recovery.New(rdb, rows, recovery.WithInstanceID("worker-a"))
	if err := a.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer a.Shutdown(context.Background())
	rows.set("inprog", 7, 8, 9)
	_ = a.Track(ctx, 7, 8, 9)
	rows.set("done", 7)
	_ = a.Untrack(7)
	// Nothing refreshes A's heartbeat any more; here the in-memory Redis's
	// clock is moved past the heartbeat TTL instead of waiting 60 s.
	mr.FastForward(61 * time.Second)

	// Worker B's scan (it also runs every recovery interval once B is
	// started) finds A dead and resets A's unfinished rows.
	b, _ := recovery.New(rdb, rows, recovery.WithInstanceID("worker-b"))
	report, err := ops.RecoverNow(ctx, b)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("dead peers:", len(report.Dead), "rows reset:", report.RowsReset)
	fmt.Println("rows 7, 8, 9:", rows.get(7), rows.get(8), rows.get(9))
	// Output:
	// dead peers: 1 rows reset: 2
	// rows 7, 8, 9: done queued queued
}
