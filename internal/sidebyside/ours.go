package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// Ours at its defaults: owner mode (the resetter has an owner column),
// recovery.New with no timing option (the liveness witness is on by
// default), a host loop written as examples/batchworker's: Begin, fetch a
// block marking it inprog under the block's owner value, Track before the
// COMMIT, Check before each row, an owner-guarded completion, Done, Close.
//
// A round: the victim starts and takes a block of blockRows rows; the
// survivor starts; after a random wait in [0, 1 s) the victim is killed.
// Picked up is when none of the block's rows is inprog under the victim's
// owner value any more (reset to queued, or taken by the survivor), seen
// by the harness polling PostgreSQL every pollEvery.

const (
	blockRows = 10
	pollEvery = 5 * time.Millisecond
)

const oursSchemaSQL = `
CREATE TABLE batchrows (
	rowid  bigint PRIMARY KEY,
	status text NOT NULL DEFAULT 'queued', -- queued, inprog, done
	owner  text,
	result text
);
CREATE INDEX batchrows_queued ON batchrows (rowid) WHERE status = 'queued';
CREATE INDEX batchrows_inprog_owner ON batchrows (owner, rowid) WHERE status = 'inprog';`

const oursFetchSQL = `
WITH picked AS (
	SELECT rowid FROM batchrows WHERE status = 'queued'
	ORDER BY rowid LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE batchrows r SET status = 'inprog', owner = $2
FROM picked WHERE r.rowid = picked.rowid
RETURNING r.rowid`

const oursCompleteSQL = `
UPDATE batchrows SET status = 'done', result = 'ok'
WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`

// openSchemaPool opens a pool whose search_path is schema ns.
func openSchemaPool(ctx context.Context, url, ns string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = ns
	if maxConns > 0 {
		pc.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL unreachable: %w", err)
	}
	return pool, nil
}

func (w *worker) runOurs(ctx context.Context) error {
	url := os.Getenv("SBS_DATABASE")
	pool, err := openSchemaPool(ctx, url, w.f.ns, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	resetPool, err := openSchemaPool(ctx, url, w.f.ns, 2)
	if err != nil {
		return err
	}
	defer resetPool.Close()
	resetter, err := pgxreset.New(resetPool, postgres.WithStatuses("inprog", "queued"), postgres.WithOwnerColumn("owner"))
	if err != nil {
		return fmt.Errorf("resetter: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("SBS_REDIS"), ContextTimeoutEnabled: true})
	defer rdb.Close()
	rw, err := recovery.New(rdb, resetter, recovery.WithKeyPrefix(w.f.ns), recovery.WithLogger(w.log.With("role", w.f.role)))
	if err != nil {
		return fmt.Errorf("recovery.New: %w", err)
	}
	if err := rw.Start(ctx); err != nil {
		return fmt.Errorf("start recovery: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rw.Shutdown(sctx); err != nil {
			w.log.Warn("recovery shutdown", "error", err)
		}
	}()
	w.emit("ready")
	for ctx.Err() == nil {
		took, err := w.oursBlock(ctx, rw, pool)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("block", "error", err)
		}
		if !took {
			sleep(ctx, 50*time.Millisecond)
		}
	}
	return nil
}

// oursBlock takes a block, if there is one, and processes it.
func (w *worker) oursBlock(ctx context.Context, rw *recovery.Worker, pool *pgxpool.Pool) (took bool, err error) {
	b, err := rw.Begin()
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if cerr := b.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("give the rest of the block back: %w", cerr))
		}
	}()
	ids, err := w.oursFetch(ctx, b, pool)
	if err != nil || len(ids) == 0 {
		return false, err
	}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = strconv.FormatInt(id, 10)
	}
	w.emit("start", strings.Join(strs, ","), b.OwnerValue())
	for _, id := range ids {
		if err := b.Check(); err != nil {
			return true, fmt.Errorf("lease lost mid-block: %w", err)
		}
		sleep(w.stopCtx, w.work)
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		tag, err := pool.Exec(cctx, oursCompleteSQL, id, b.OwnerValue())
		cancel()
		if err != nil {
			return true, fmt.Errorf("complete row %d: %w", id, err)
		}
		if tag.RowsAffected() == 1 {
			w.emit("done", strconv.FormatInt(id, 10))
		}
		if err := b.Done(id); err != nil {
			w.log.Warn("untrack", "row_id", id, "error", err)
		}
	}
	return true, nil
}

// oursFetch takes up to blockRows queued rows, tracking them before the
// COMMIT.
func (w *worker) oursFetch(ctx context.Context, b *recovery.Block, pool *pgxpool.Pool) ([]int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, oursFetchSQL, blockRows, b.OwnerValue())
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := b.Track(tctx, ids...); err != nil {
		return nil, fmt.Errorf("track: %w", err)
	}
	if err := tx.Commit(tctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return ids, nil
}

type oursSystem struct {
	h    *harness
	c    config
	ns   string
	pool *pgxpool.Pool
}

func newOursSystem(ctx context.Context, h *harness, c config, ns string) (*oursSystem, error) {
	pool, err := openSchemaPool(ctx, h.f.db, "public", 2)
	if err != nil {
		return nil, err
	}
	s := &oursSystem{h: h, c: c, ns: ns, pool: pool}
	sch := pgx.Identifier{ns}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+sch+`; SET search_path = `+sch+`;`+oursSchemaSQL); err != nil {
		_ = s.cleanup(ctx)
		return nil, fmt.Errorf("create schema %s: %w", ns, err)
	}
	return s, nil
}

func (s *oursSystem) cleanup(ctx context.Context) error {
	defer s.pool.Close()
	if _, err := s.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s.ns}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %s: %w", s.ns, err)
	}
	return nil
}

func (s *oursSystem) round(ctx context.Context, k int) (round, error) {
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
	first := int64(k*blockRows + 1)
	table := pgx.Identifier{s.ns, "batchrows"}.Sanitize()
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+table+` (rowid) SELECT g FROM generate_series($1::bigint, $2::bigint) g`,
		first, first+blockRows-1); err != nil {
		return round{}, fmt.Errorf("insert rows: %w", err)
	}
	started, err := await(ctx, events, startup, "victim takes the block", is("start", "victim"))
	if err != nil {
		return round{}, err
	}
	if len(started.fields) < 2 {
		return round{}, fmt.Errorf("victim's start line has no owner value: %v", started.fields)
	}
	ids, owner := started.fields[0], started.fields[1]
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
	picked, err := s.awaitReset(ctx, table, owner, killed.Add(s.c.limit))
	if errors.Is(err, errTimeout) {
		return round{}, nil
	}
	if err != nil {
		return round{}, err
	}
	done := completions(ctx, events, s.c.watch, s.c.limit, nil)
	twice, finished := 0, 0
	for id := range strings.SplitSeq(ids, ",") {
		if done[id] > 0 {
			finished++
		}
		if done[id] > 1 {
			twice++
		}
	}
	return round{latency: picked.Sub(killed), picked: true, twice: twice > 0,
		detailed: fmt.Sprintf(" (%d of %d rows then done by the survivor; %d done twice)", finished, blockRows, twice)}, nil
}

// awaitReset polls until no row is inprog under owner, and returns when it
// saw that.
func (s *oursSystem) awaitReset(ctx context.Context, table, owner string, deadline time.Time) (time.Time, error) {
	for {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'inprog' AND owner = $1`, owner).Scan(&n); err != nil {
			return time.Time{}, fmt.Errorf("count the victim's rows: %w", err)
		}
		now := time.Now()
		if n == 0 {
			return now, nil
		}
		if now.After(deadline) {
			return time.Time{}, errTimeout
		}
		if !sleep(ctx, pollEvery) {
			return time.Time{}, ctx.Err()
		}
	}
}
