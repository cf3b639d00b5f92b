package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// asynq's recovery of a killed worker's task is its recoverer: each server
// runs it when it starts and then every minute (hard-coded in NewServer),
// and it retries tasks whose lease expired at least 30 s ago (hard-coded
// in recoverLeaseExpiredTasks). A lease is 30 s (rdb.LeaseDuration,
// internal), extended by the heartbeater every 5 s (hard-coded). The retry
// waits RetryDelayFunc (public; default 15 s + up to 30 s at the first
// retry), then the forwarder (DelayedTaskCheckInterval, public, default
// 5 s) moves the task to pending, and a server dequeues it (polling every
// TaskCheckInterval, public, default 1 s). So the public knobs are the
// last three; the lease, its 30 s grace, the heartbeat and the recoverer's
// minute are not.
//
// A round: the victim starts and takes the task; the survivor starts
// (its recoverer runs at once, then every minute); after a random wait in
// [0, 1 min) (the recoverer's phase) the victim is killed.

const asynqTask = "sidebyside"

// asynqConfig is the server configuration of c (tuned or defaults).
func asynqConfig(c config, ns string) asynq.Config {
	cfg := asynq.Config{Concurrency: 10, Queues: map[string]int{ns: 1}, LogLevel: asynq.WarnLevel}
	if c.name == "asynq-tuned" {
		cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return 0 }
		cfg.DelayedTaskCheckInterval = 100 * time.Millisecond
		cfg.TaskCheckInterval = 10 * time.Millisecond
	}
	return cfg
}

func (w *worker) runAsynq(ctx context.Context) error {
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: os.Getenv("SBS_REDIS")}, asynqConfig(w.c, w.f.ns))
	mux := asynq.NewServeMux()
	mux.HandleFunc(asynqTask, func(tctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(tctx)
		n, _ := asynq.GetRetryCount(tctx)
		w.emit("start", id, fmt.Sprint(n))
		if !sleep(tctx, w.work) {
			return tctx.Err()
		}
		w.emit("done", id)
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	w.emit("ready")
	<-ctx.Done()
	srv.Shutdown()
	return nil
}

type asynqSystem struct {
	h  *harness
	c  config
	ns string
}

func newAsynqSystem(h *harness, c config, ns string) *asynqSystem {
	return &asynqSystem{h: h, c: c, ns: ns}
}

func (s *asynqSystem) cleanup(context.Context) error {
	in := asynq.NewInspector(asynq.RedisClientOpt{Addr: s.h.redis})
	defer in.Close()
	if err := in.DeleteQueue(s.ns, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		return fmt.Errorf("delete asynq queue %s: %w", s.ns, err)
	}
	return nil
}

func (s *asynqSystem) round(ctx context.Context, k int) (round, error) {
	const startup = time.Minute
	events := newEvents()
	victim, err := s.h.spawn(s.c, "victim", s.ns, events)
	if err != nil {
		return round{}, err
	}
	victimAlive := true
	defer func() {
		if victimAlive {
			_, _ = victim.kill()
		}
	}()
	if _, err := await(ctx, events, startup, "victim ready", is("ready", "victim")); err != nil {
		return round{}, err
	}
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: s.h.redis})
	info, err := client.EnqueueContext(ctx, asynq.NewTask(asynqTask, fmt.Appendf(nil, "kill %d", k)), asynq.Queue(s.ns))
	_ = client.Close()
	if err != nil {
		return round{}, fmt.Errorf("enqueue: %w", err)
	}
	if _, err := await(ctx, events, startup, "victim starts the task", is("start", "victim")); err != nil {
		return round{}, err
	}
	survivor, err := s.h.spawn(s.c, "survivor", s.ns, events)
	if err != nil {
		return round{}, err
	}
	defer survivor.stop()
	if _, err := await(ctx, events, startup, "survivor ready", is("ready", "survivor")); err != nil {
		return round{}, err
	}
	if err := randomPhase(ctx, s.c.phase); err != nil {
		return round{}, err
	}
	killed, err := victim.kill()
	victimAlive = false
	if err != nil {
		return round{}, err
	}
	picked, err := await(ctx, events, s.c.limit, "survivor starts the task", func(e event) bool {
		return e.kind == "start" && e.from == "survivor" && len(e.fields) > 0 && e.fields[0] == info.ID
	})
	if errors.Is(err, errTimeout) {
		return round{}, nil
	}
	if err != nil {
		return round{}, err
	}
	done := completions(ctx, events, s.c.watch, s.c.limit, []event{picked})
	return round{latency: picked.at.Sub(killed), picked: true, twice: done[info.ID] > 1,
		detailed: fmt.Sprintf(" (retry %s; task completed %d times)", strings.Join(picked.fields[1:], ""), done[info.ID])}, nil
}
