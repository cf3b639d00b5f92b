// Command twinworker starts one recovery Worker and holds it, for the tests
// of instance-ID collisions (twin_test.go): two processes with the same
// hostname and PID in their own namespaces, or a fixed ID restarted after
// SIGKILL. It prints "id <instance ID>", then "started" or "error <error>"
// (exit 1), then, with -track, "tracked"; it runs until stdin closes or
// SIGTERM, then shuts down. Rows are never reset by it: it recovers no
// peer (its resetter refuses), it only heartbeats and tracks.
//
// Flags: -redis host:port, -prefix, -id (empty: the default ID), -ttl,
// -interval, -track "1,2,3".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
)

// refuse is a resetter that resets nothing: the process under test must
// not recover the test's rows.
type refuse struct{}

func (refuse) Info() recovery.ResetterInfo {
	return recovery.ResetterInfo{Name: "refuse", InProgressStatus: "inprog", QueuedStatus: "queued"}
}

func (refuse) Check(context.Context, bool) (recovery.ResetterInfo, error) {
	return recovery.ResetterInfo{Name: "refuse", InProgressStatus: "inprog", QueuedStatus: "queued"}, nil
}

// errRefused is what every reset of refuse returns.
var errRefused = errors.New("twinworker resets nothing")

func (refuse) ResetRows(context.Context, recovery.RowsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errRefused
}

func (refuse) ResetOwner(context.Context, recovery.OwnerReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errRefused
}

func (refuse) ResetVersions(context.Context, recovery.VersionsReset) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errRefused
}

func (refuse) PlanReset(context.Context, recovery.PlanRequest) (recovery.ResetResult, error) {
	return recovery.ResetResult{}, errRefused
}

func (refuse) InProgressOwners(context.Context) ([]string, error) { return nil, errors.ErrUnsupported }

func (refuse) InProgressRows(context.Context) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func (refuse) RowStates(context.Context, []int64) ([]recovery.RowState, error) {
	return nil, errors.ErrUnsupported
}

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "redis address")
	prefix := flag.String("prefix", "ALYA", "key prefix")
	id := flag.String("id", "", "instance ID (empty: the default)")
	ttl := flag.Duration("ttl", 2*time.Second, "heartbeat TTL")
	interval := flag.Duration("interval", 500*time.Millisecond, "heartbeat interval")
	track := flag.String("track", "", "row IDs to track, comma-separated")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	opts := []recovery.Option{recovery.WithKeyPrefix(*prefix), recovery.WithTimings(recovery.Timings{
		HeartbeatTTL:      *ttl,
		HeartbeatInterval: *interval,
		RecoveryInterval:  time.Hour,
		RowsTTL:           2**ttl + 2*time.Hour,
	})}
	if *id != "" {
		opts = append(opts, recovery.WithInstanceID(*id))
	}
	w, err := recovery.New(rdb, refuse{}, opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("id", w.InstanceID())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("started")
	if *track != "" {
		var ids []int64
		for _, f := range strings.Split(*track, ",") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			ids = append(ids, n)
		}
		if err := w.Track(ctx, ids...); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("tracked")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-stop:
	case <-eof:
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = w.Shutdown(sctx)
}
