package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// The worker processes are this program again, started with roleEnv set.
// Connection strings travel in the environment, never on the command line
// where ps would show them.
const (
	roleEnv  = "CRASHDEMO_ROLE"
	redisEnv = "CRASHDEMO_REDIS_URL"
	dbEnv    = "CRASHDEMO_DATABASE_URL"
)

// Event names a worker writes to stdout, one JSON object a line, mixed with
// the library's own warnings (also JSON). evPeerDead and evRecovered come
// from the library's Observer events.
const (
	evStarted   = "worker started"
	evBlock     = "block taken"
	evRowDone   = "row done"
	evRowLost   = "row no longer ours"
	evReleased  = "rows released"
	evIdle      = "waiting for rows"
	evFinished  = "worker finished"
	evPeerDead  = "peer found dead"
	evRecovered = "rows recovered"
	evLeaseLost = "lease lost"
)

// workerConfig is what the parent tells a worker.
type workerConfig struct {
	id, schema, prefix        string
	block                     int
	work, ttl, beat, recovery time.Duration
	redisURL, dbURL           string
}

func (c workerConfig) args() []string {
	return []string{"-id", c.id, "-schema", c.schema, "-prefix", c.prefix,
		"-block", fmt.Sprint(c.block), "-work", c.work.String(),
		"-ttl", c.ttl.String(), "-heartbeat", c.beat.String(), "-recovery", c.recovery.String()}
}

// rowsTTL keeps a rows set three heartbeat TTLs, and always longer than
// detection + recovery, as New requires.
func rowsTTL(ttl, recoveryInterval time.Duration) time.Duration {
	return max(3*ttl, 2*(ttl+recoveryInterval))
}

// workerMain is the worker process: it returns its exit status.
func workerMain(args []string) int {
	var c workerConfig
	fs := flag.NewFlagSet("crashdemo worker", flag.ContinueOnError)
	fs.StringVar(&c.id, "id", "", "instance ID")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema")
	fs.StringVar(&c.prefix, "prefix", ops.DefaultKeyPrefix, "key prefix")
	fs.IntVar(&c.block, "block", 10, "rows per block")
	fs.DurationVar(&c.work, "work", 100*time.Millisecond, "work per row")
	fs.DurationVar(&c.ttl, "ttl", 2*time.Second, "heartbeat TTL")
	fs.DurationVar(&c.beat, "heartbeat", 500*time.Millisecond, "heartbeat interval")
	fs.DurationVar(&c.recovery, "recovery", time.Second, "recovery interval")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	c.redisURL, c.dbURL = os.Getenv(redisEnv), os.Getenv(dbEnv)

	// One JSON stream on stdout: the demo's events, and the library's
	// warnings and errors.
	log := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// SIGTERM: finish the block, then shut down, as the design says.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runWorker(ctx, c, log); err != nil {
		fmt.Fprintf(os.Stderr, "worker %s: %v\n", c.id, redact.Error(err, c.redisURL, c.dbURL))
		return exitFail
	}
	return exitPass
}

// demoWorker is one worker process's batch loop.
type demoWorker struct {
	c    workerConfig
	pool *pgxpool.Pool
	w    *recovery.Worker
	log  *slog.Logger
	done int
}

func runWorker(ctx context.Context, c workerConfig, log *slog.Logger) error {
	pc, err := pgxpool.ParseConfig(c.dbURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = c.schema
	// A host that vanishes inside a transaction keeps its row locks until
	// the server ends its session: bound that (docs/operations.md), unless
	// the URL sets its own value.
	if _, set := pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "15s"
	}
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	defer pool.Close()
	opt, err := redis.ParseURL(c.redisURL)
	if err != nil {
		return fmt.Errorf("redis URL: %w", err)
	}
	opt.ContextTimeoutEnabled = true // the worker's per-call timeouts bound every call
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	resetter, err := pgxreset.New(pool,
		postgres.WithOwnerColumn("owner"), postgres.WithRecoveryCountColumn("recoveries"))
	if err != nil {
		return err
	}
	w, err := recovery.New(rdb, resetter,
		recovery.WithInstanceID(c.id), recovery.WithKeyPrefix(c.prefix),
		recovery.WithTimings(recovery.Timings{
			HeartbeatTTL:      c.ttl,
			HeartbeatInterval: c.beat,
			RecoveryInterval:  c.recovery,
			RowsTTL:           rowsTTL(c.ttl, c.recovery),
		}),
		recovery.WithLogger(slog.New(warnAndAbove{log.Handler()})), recovery.WithObserver(func(e recovery.Event) {
			at := slog.Time("event_time", e.Time)
			switch e.Kind {
			case recovery.EventPeerDead:
				log.Info(evPeerDead, "peer_id", e.PeerID, at)
			case recovery.EventRowsRecovered:
				log.Info(evRecovered, "peer_id", e.PeerID, "rows_reset", e.RowsReset, "found_by", e.FoundBy, at)
			case recovery.EventLeaseLost:
				log.Info(evLeaseLost, at)
			}
		}))
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	log.Info(evStarted, "pid", os.Getpid())
	d := &demoWorker{c: c, pool: pool, w: w, log: log}
	loopErr := d.loop(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.Shutdown(shutdownCtx); err != nil {
		return errors.Join(loopErr, fmt.Errorf("shutdown: %w", err))
	}
	log.Info(evFinished, "rows_done", d.done)
	return loopErr
}

// loop takes blocks until no row is queued or in progress, or ctx ends.
func (d *demoWorker) loop(ctx context.Context) error {
	idle := false
	for ctx.Err() == nil {
		owner := d.w.OwnerValue() // once per block, for the fetch and every completion
		ids, recovered, err := d.fetch(ctx, owner)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(ids) == 0 {
			left, err := d.rowsLeft(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if left == 0 {
				return nil
			}
			if !idle {
				d.log.Info(evIdle, "rows_left", left)
				idle = true
			}
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		idle = false
		d.log.Info(evBlock, "rows", ids, "recovered", recovered)
		d.process(ids, owner)
	}
	return nil
}

// fetch is FetchBlockOfRows: it marks a block inprog with owner (the
// worker's Owner) and tracks it before the commit. recovered lists the rows that
// recovery returned to the queue before.
func (d *demoWorker) fetch(ctx context.Context, owner string) (ids, recovered []int64, err error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `
		WITH picked AS (
			SELECT rowid FROM batchrows WHERE status = 'queued'
			ORDER BY rowid LIMIT $1 FOR UPDATE SKIP LOCKED
		)
		UPDATE batchrows r SET status = 'inprog', owner = $2
		FROM picked WHERE r.rowid = picked.rowid
		RETURNING r.rowid, r.recoveries`, d.c.block, owner)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch block: %w", err)
	}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("fetch block: %w", err)
		}
		ids = append(ids, id)
		if n > 0 {
			recovered = append(recovered, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("fetch block: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	slices.Sort(ids)
	slices.Sort(recovered)
	if err := d.w.TrackAs(ctx, owner, ids...); err != nil && // refused if owner's life ended since
		(errors.Is(err, recovery.ErrLeaseLost) || errors.Is(err, recovery.ErrShutdown)) {
		return nil, nil, fmt.Errorf("track block: %w", err)
	} // any other error: the IDs are kept and the next heartbeat writes them
	if err := tx.Commit(ctx); err != nil {
		release(d.w, ids)
		return nil, nil, fmt.Errorf("commit block: %w", err)
	}
	return ids, recovered, nil
}

// process works through the whole block, even after SIGTERM; owner is the
// value the block was fetched under.
func (d *demoWorker) process(ids []int64, owner string) {
	for i, id := range ids {
		if err := d.w.CheckLease(); err != nil {
			release(d.w, ids[i:])
			d.log.Info(evReleased, "rows", ids[i:], "error", err.Error())
			return
		}
		time.Sleep(d.c.work) // the work
		owned, err := d.complete(id, owner)
		switch {
		case err != nil:
			release(d.w, []int64{id})
			d.log.Info(evReleased, "rows", []int64{id}, "error", err.Error())
			continue // Release untracked it
		case owned:
			d.done++
			d.log.Info(evRowDone, "row", id)
		default:
			d.log.Info(evRowLost, "row", id)
		}
		_ = d.w.Untrack(id) // a failure is retried by the next heartbeat
	}
}

// complete marks the row done and writes the ledger in one transaction,
// only if the row is still owner's.
func (d *demoWorker) complete(id int64, owner string) (owned bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE batchrows SET status = 'done'
			WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`, id, owner)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		owned = true
		_, err = tx.Exec(ctx, `INSERT INTO ledger (rowid, worker) VALUES ($1, $2)`, id, d.c.id)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("complete row %d: %w", id, err)
	}
	return owned, nil
}

func (d *demoWorker) rowsLeft(ctx context.Context) (int, error) {
	var n int
	err := d.pool.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status IN ('queued', 'inprog')`).Scan(&n)
	return n, err
}

// release gives rows back to the queue through the library.
func release(w *recovery.Worker, ids []int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = w.Release(ctx, ids...) // on failure they stay tracked
}

// warnAndAbove passes on the library's warnings and errors only: its Info
// lines would repeat what the Observer events already say.
type warnAndAbove struct{ slog.Handler }

func (h warnAndAbove) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnAndAbove) WithAttrs(as []slog.Attr) slog.Handler {
	return warnAndAbove{h.Handler.WithAttrs(as)}
}

func (h warnAndAbove) WithGroup(name string) slog.Handler {
	return warnAndAbove{h.Handler.WithGroup(name)}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
