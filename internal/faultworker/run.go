package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres/pgxreset"
)

// dbTimeout bounds one database call outside the processing of a row.
const dbTimeout = 5 * time.Second

// run connects, starts crash recovery, processes blocks until ctx is
// cancelled, finishes the block in hand and shuts down. It closes what it
// opened. Its errors never quote a connection string or a password.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	// Register for SIGUSR1 before anything else: its default action would
	// end the process.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)

	pool, err := openPostgres(ctx, cfg, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	resetPool := pool
	if cfg.resetDatabaseURL != "" {
		if resetPool, err = openPostgres(ctx, cfg, cfg.resetDatabaseURL); err != nil {
			return err
		}
		defer resetPool.Close()
	}
	rdb, err := openRedis(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()

	resetter, err := pgxreset.New(resetPool, cfg.resetterOptions()...)
	if err != nil {
		return fmt.Errorf("resetter: %w", err)
	}
	w, err := recovery.New(rdb, resetterWithFaults(resetter, cfg, log), cfg.options(log)...)
	if err != nil {
		return fmt.Errorf("crash recovery: %w", err)
	}
	if err := w.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return redact.Error(fmt.Errorf("start crash recovery: %w", err), cfg.redisURL, cfg.databaseURL, cfg.resetDatabaseURL)
	}
	log = log.With("instance_id", w.InstanceID())
	log.Info("faultworker started", "pid", os.Getpid(), "guard", cfg.guard, "block", cfg.block)

	h := newHost(cfg, pool, w, log)
	stopRecoverNow := h.serveRecoverNow(usr1)
	h.loop(ctx)
	stopRecoverNow()

	// The processing context is done and the last block finished. Shutdown
	// gets a fresh context: it deletes the heartbeat and the registry entry
	// so peers see at once that this worker left.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := w.Shutdown(shutdownCtx); err != nil {
		return redact.Error(fmt.Errorf("shut down crash recovery: %w", err), cfg.redisURL, cfg.databaseURL, cfg.resetDatabaseURL)
	}
	log.Info("faultworker stopped", "rows_done", h.done.Load(), "rows_discarded", h.discarded.Load(),
		"rows_released", h.released.Load(), "rows_abandoned", h.abandoned.Load())
	return nil
}

// openPostgres opens a pool on dbURL (the host's or the resetter's) in
// the configured schema and checks that the server answers.
func openPostgres(ctx context.Context, cfg config, dbURL string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("database URL: %w", err), dbURL)
	}
	if cfg.schema != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = cfg.schema
	}
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("open PostgreSQL pool: %w", err), dbURL)
	}
	pingCtx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, redact.Error(fmt.Errorf("PostgreSQL unreachable: %w", err), dbURL)
	}
	return pool, nil
}

// openRedis returns a client for REDIS_URL, a cluster client for
// REDIS_CLUSTER_ADDRS, or a failover client (the master the sentinels
// name, followed across failovers) for REDIS_SENTINEL_ADDRS. ContextTimeoutEnabled makes go-redis honour the
// deadlines of the contexts it is given: without it socket reads wait for
// ReadTimeout (3 s) whatever the context says, and the library's operation
// timeout (250 ms with these timings) would not bound a call to an
// unresponsive server.
func openRedis(cfg config) (redis.UniversalClient, error) {
	if len(cfg.clusterAddrs) > 0 {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 cfg.clusterAddrs,
			ContextTimeoutEnabled: true,
		}), nil
	}
	if len(cfg.sentinelAddrs) > 0 {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            cfg.sentinelMaster,
			SentinelAddrs:         cfg.sentinelAddrs,
			ContextTimeoutEnabled: true,
		}), nil
	}
	opt, err := redis.ParseURL(cfg.redisURL)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("redis URL: %w", err), cfg.redisURL)
	}
	opt.ContextTimeoutEnabled = true
	return redis.NewClient(opt), nil
}

// serveRecoverNow runs a recovery scan for every SIGUSR1 until the
// returned function is called; that function waits for a scan in progress.
func (h *host) serveRecoverNow(sig <-chan os.Signal) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-sig:
				h.recoverNow()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

func (h *host) recoverNow() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*h.cfg.resetTimeout)
	defer cancel()
	rep, err := ops.RecoverNow(ctx, h.w)
	attrs := []any{"peers_dead", len(rep.Dead), "peers_recovered", len(rep.Recovered),
		"peers_skipped", len(rep.Skipped), "rows_reset", rep.RowsReset}
	if err != nil && !errors.Is(err, recovery.ErrShutdown) {
		attrs = append(attrs, "error", err)
	}
	// Each peer's recovery is logged by the library ("recovered rows of
	// dead peer"), as for the loop's scans.
	h.log.Info("recover now", attrs...)
}
