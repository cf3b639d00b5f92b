package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// River's recovery of a killed worker's job is its job rescuer: a
// maintenance service that runs on the elected leader only, every 30 s
// (JobRescuerIntervalDefault; not configurable through Config), and moves
// jobs running for longer than Config.RescueStuckJobsAfter (default 1 h)
// to retryable with the retry policy's time; the scheduler (every 5 s, not
// configurable) makes them available, and a client fetches them. The
// rescue looks at a job's age, not at its worker: a job that runs longer
// than RescueStuckJobsAfter is rescued while it runs, and runs twice.
//
// A round: the survivor starts first, on an idle queue, and becomes the
// leader (as one survivor of a fleet would be, for all but 1/N of the
// deaths); after a random wait in [0, 30 s) (the rescuer's phase) the
// victim starts on the round's queue and takes the job; the survivor adds
// that queue (Client.Queues().Add) and the victim is killed.

type riverArgs struct{}

func (riverArgs) Kind() string { return "sidebyside" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	w *worker
}

func (rw *riverWorker) Work(ctx context.Context, job *river.Job[riverArgs]) error {
	id := strconv.FormatInt(job.ID, 10)
	rw.w.emit("start", id, strconv.Itoa(job.Attempt))
	// The job does not stop when its context does (JobTimeout), as a job
	// blocked in a call without a context does not: only such a job runs
	// longer than RescueStuckJobsAfter >= JobTimeout and can be rescued
	// while it runs. The process's own end still stops it.
	if !sleep(rw.w.stopCtx, rw.w.work) {
		return rw.w.stopCtx.Err()
	}
	rw.w.emit("done", id)
	return nil
}

// nowRetryPolicy retries at once: the shortest wait a RetryPolicy allows.
type nowRetryPolicy struct{}

func (nowRetryPolicy) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// riverConfig is the client configuration of c (tuned or defaults).
func riverConfig(c config, ns, id string, queues map[string]river.QueueConfig, workers *river.Workers, log *slog.Logger) *river.Config {
	cfg := &river.Config{ID: id, Schema: ns, Queues: queues, Workers: workers, Logger: log}
	if strings.HasPrefix(c.name, "river-tuned") {
		// RescueStuckJobsAfter may not be below JobTimeout (default 1 min),
		// and the rescuer leaves alone a job whose timeout has not passed
		// (JobTimeout -1, no timeout, turns the rescue off): both at 1 s.
		cfg.JobTimeout = time.Second
		cfg.RescueStuckJobsAfter = time.Second
		cfg.RetryPolicy = nowRetryPolicy{}
		cfg.FetchCooldown = river.FetchCooldownMin
		cfg.FetchPollInterval = 10 * time.Millisecond
	}
	return cfg
}

func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL unreachable: %w", err)
	}
	return pool, nil
}

func (w *worker) runRiver(ctx context.Context) error {
	pool, err := openPool(ctx, os.Getenv("SBS_DATABASE"))
	if err != nil {
		return err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{w: w})
	queue := w.f.ns + "_idle"
	if w.victim {
		queue = w.f.queue
	}
	id := fmt.Sprintf("%s_%s_%d", w.f.ns, w.f.role, os.Getpid())
	cfg := riverConfig(w.c, w.f.ns, id, map[string]river.QueueConfig{queue: {MaxWorkers: 10}}, workers,
		w.log.With("role", w.f.role))
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start river client: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(sctx); err != nil {
			w.log.Warn("river stop", "error", err)
		}
	}()
	if !w.victim {
		if err := awaitLeader(ctx, pool, w.f.ns, id); err != nil {
			return err
		}
	}
	w.emit("ready")
	for line := range w.lines {
		queue, ok := strings.CutPrefix(line, "take ")
		if !ok {
			continue
		}
		if err := client.Queues().Add(queue, river.QueueConfig{MaxWorkers: 10}); err != nil {
			return fmt.Errorf("add queue %s: %w", queue, err)
		}
		w.emit("took", queue)
	}
	return nil
}

// awaitLeader waits until the client id is River's leader in schema ns.
func awaitLeader(ctx context.Context, pool *pgxpool.Pool, ns, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var leader string
		err := pool.QueryRow(ctx, `SELECT leader_id FROM `+pgx.Identifier{ns, "river_leader"}.Sanitize()).Scan(&leader)
		if err == nil && leader == id {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read river_leader: %w", err)
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("client %s not elected leader within 2 min", id)
}

type riverSystem struct {
	h      *harness
	c      config
	ns     string
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
}

func newRiverSystem(ctx context.Context, h *harness, c config, ns string) (*riverSystem, error) {
	pool, err := openPool(ctx, h.f.db)
	if err != nil {
		return nil, err
	}
	s := &riverSystem{h: h, c: c, ns: ns, pool: pool}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{ns}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create schema %s: %w", ns, err)
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: ns})
	if err != nil {
		_ = s.cleanup(ctx)
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		_ = s.cleanup(ctx)
		return nil, fmt.Errorf("migrate river schema %s: %w", ns, err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{})
	s.client, err = river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: ns, Workers: workers})
	if err != nil {
		_ = s.cleanup(ctx)
		return nil, fmt.Errorf("river insert client: %w", err)
	}
	return s, nil
}

func (s *riverSystem) cleanup(ctx context.Context) error {
	defer s.pool.Close()
	if _, err := s.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s.ns}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %s: %w", s.ns, err)
	}
	return nil
}

func (s *riverSystem) round(ctx context.Context, k int) (round, error) {
	const startup = 2 * time.Minute
	events := newEvents()
	survivor, err := s.h.spawn(s.c, "survivor", s.ns, events)
	if err != nil {
		return round{}, err
	}
	defer survivor.stop()
	if _, err := await(ctx, events, startup, "survivor leader and ready", is("ready", "survivor")); err != nil {
		return round{}, err
	}
	if err := randomPhase(ctx, s.c.phase); err != nil {
		return round{}, err
	}
	queue := fmt.Sprintf("%s_q%d", s.ns, k)
	victim, err := s.h.spawn(s.c, "victim", s.ns, events, "-queue", queue)
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
	res, err := s.client.Insert(ctx, riverArgs{}, &river.InsertOpts{Queue: queue})
	if err != nil {
		return round{}, fmt.Errorf("insert job: %w", err)
	}
	jobID := strconv.FormatInt(res.Job.ID, 10)
	if _, err := await(ctx, events, startup, "victim starts the job", is("start", "victim")); err != nil {
		return round{}, err
	}
	if err := survivor.send("take " + queue); err != nil {
		return round{}, err
	}
	if _, err := await(ctx, events, startup, "survivor takes the queue", is("took", "survivor")); err != nil {
		return round{}, err
	}
	killed, err := victim.kill()
	victimAlive = false
	if err != nil {
		return round{}, err
	}
	picked, err := await(ctx, events, s.c.limit, "survivor starts the job", func(e event) bool {
		return e.kind == "start" && e.from == "survivor" && len(e.fields) > 0 && e.fields[0] == jobID
	})
	if errors.Is(err, errTimeout) {
		return round{}, nil
	}
	if err != nil {
		return round{}, err
	}
	done := completions(ctx, events, s.c.watch, s.c.limit, []event{picked})
	return round{latency: picked.at.Sub(killed), picked: true, twice: done[jobID] > 1,
		detailed: fmt.Sprintf(" (attempt %s; job completed %d times)", strings.Join(picked.fields[1:], ""), done[jobID])}, nil
}
