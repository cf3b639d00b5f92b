package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
)

// noopResetter stands in for a pgxreset.Resetter in examples that recover nothing.
type noopResetter struct{}

func (noopResetter) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "noop", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (r noopResetter) Check(context.Context, bool) (recovery.ResetterInfo, error) {
	return r.Info(), nil
}

func (noopResetter) ResetRows(context.Context, recovery.RowsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noopResetter) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noopResetter) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noopResetter) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, nil
}

func (noopResetter) InProgressOwners(context.Context) ([]string, error) {
	return nil, errors.ErrUnsupported
}

func (noopResetter) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (noopResetter) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

// healthHandler answers 200 while the worker holds its heartbeat lease and
// 503 otherwise: wire it to a Kubernetes readiness probe. Not to the
// liveness probe: a Redis outage fails every pod's at once, and a restart
// helps none (docs/integration.md, "What a batch-worker pod does with
// Healthy()").
func healthHandler(w *recovery.Worker) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		if err := w.Healthy(); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		s := w.Stats()
		fmt.Fprintf(rw, "ok: %d rows tracked\n", s.TrackedRows)
	})
}

// Example_healthCheck serves Worker.Healthy over HTTP.
func Example_healthCheck() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	testutil.NoEviction(mr)
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	w, err := recovery.New(rdb, noopResetter{}, recovery.WithInstanceID("worker-1"))
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(healthHandler(w))
	defer srv.Close()
	probe := func() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s", resp.StatusCode, body)
	}

	probe() // not started yet
	ctx := context.Background()
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	_ = w.Track(ctx, 1, 2)
	probe()
	_ = w.Shutdown(ctx)
	probe()
	fmt.Println(errors.Is(w.Healthy(), recovery.ErrShutdown))
	// Output:
	// 503 recovery: not started
	// 200 ok: 2 rows tracked
	// 503 recovery: shut down
	// true
}
