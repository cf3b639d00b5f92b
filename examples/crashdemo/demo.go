package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// proc is one worker process and what the demo knows about it. Only the
// watch loop touches the fields below cmd.
type proc struct {
	name   string // w1, w2, ...: also its instance ID
	cmd    *exec.Cmd
	stderr *tail
	exited chan struct{} // closed once the process is reaped

	state       string
	block       []int64
	doneInBlock int
	blocks      int
	done        int
	hbPresent   bool
	hbTTL       time.Duration
	polled      bool
}

// workerEvent is a JSON line a worker printed.
type workerEvent struct {
	p   *proc
	at  time.Time
	rec map[string]any
}

// exitEvent reports a reaped worker process.
type exitEvent struct {
	p   *proc
	err error
}

// demo runs one demonstration: servers, schema, workers, the kill, the
// verdict, and the clean-up of everything it started.
type demo struct {
	cfg    config
	ui     *ui
	stderr io.Writer

	// What it started or uses; cleanup undoes it.
	mr       *miniredis.Miniredis
	rs       *servers.Redis // the redis-server started, when there is one
	pg       *servers.Postgres
	rdb      *redis.Client
	pool     *pgxpool.Pool
	redisURL string
	dbURL    string
	schema   string
	prefix   string
	procs    []*proc
	readers  sync.WaitGroup
	quit     chan struct{} // closed when nobody reads events any more
	events   chan workerEvent
	exits    chan exitEvent
	cleaned  []string // what cleanup stopped, for the last line

	// Observations.
	victim      *proc
	killedAt    time.Time
	hbExpiredAt time.Time
	recoveredAt time.Time
	rowsReset   int64
	stranded    []int64
	lostByLive  int
	failure     string
	status      map[string]int
}

func newDemo(cfg config, u *ui, stderr io.Writer) *demo {
	return &demo{cfg: cfg, ui: u, stderr: stderr, quit: make(chan struct{}),
		events: make(chan workerEvent, 256), status: map[string]int{}}
}

// run runs the demo and returns the exit status.
func (d *demo) run(ctx context.Context) (code int) {
	defer func() {
		d.cleanup()
		if code == exitInterrupted {
			d.ui.say("interrupted; stopped %s", strings.Join(d.cleaned, ", "))
		}
		d.ui.close()
	}()
	d.header()
	if err := d.setup(ctx); err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintf(d.stderr, "crashdemo: %v\n", redact.Error(err, d.cfg.redisURL, d.cfg.databaseURL))
		return exitUsage
	}
	if err := d.spawn(); err != nil {
		fmt.Fprintf(d.stderr, "crashdemo: %v\n", err)
		return exitUsage
	}
	timedOut, interrupted := d.watch(ctx)
	if interrupted {
		return exitInterrupted
	}
	return d.judge(timedOut)
}

func (d *demo) header() {
	c := d.cfg
	d.ui.say("%s", d.ui.paint(bold, fmt.Sprintf("crash demo: %d worker processes share %d rows (blocks of %d, %v of work a row)",
		c.workers, c.rows, c.block, c.work)))
	d.ui.say("heartbeat TTL %v, refreshed every %v; every worker scans for dead peers every %v", c.ttl, c.beat, c.recovery)
	d.ui.say("promise: a killed worker's rows are queued again within %v (TTL + recovery interval, +10%% jitter)",
		round(c.ttl+c.recovery*11/10))
}

// setup starts or connects to Redis and PostgreSQL and creates the batch.
func (d *demo) setup(ctx context.Context) error {
	d.prefix = "CRASHDEMO-" + randomHex(4)
	if d.cfg.redisURL != "" {
		d.redisURL = d.cfg.redisURL
		d.ui.say("Redis: REDIS_URL, keys under prefix %s (deleted at the end)", d.prefix)
	} else if rs, err := servers.StartRedis(ctx); err == nil {
		// A real server when one is installed: miniredis lacks what the
		// workers read of a real one (INFO's uptime, for the restart
		// check), and they would say so.
		d.rs = rs
		d.redisURL = "redis://" + rs.Addr
		d.ui.say("Redis: throwaway redis-server on %s", rs.Addr)
	} else {
		if !errors.Is(err, servers.ErrNoRedisServer) {
			return err
		}
		d.mr = miniredis.NewMiniRedis()
		d.mr.ClockTTL(true) // keys expire with the wall clock, like a real Redis
		if err := d.mr.StartAddr("127.0.0.1:0"); err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		testutil.NoEviction(d.mr) // miniredis never evicts; it says so as Redis would (INFO memory)
		d.redisURL = "redis://" + d.mr.Addr()
		d.ui.say("Redis: embedded miniredis on %s (no redis-server on PATH; the workers will say that it cannot tell its uptime)", d.mr.Addr())
	}
	opt, err := redis.ParseURL(d.redisURL)
	if err != nil {
		return fmt.Errorf("redis URL: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	d.rdb = redis.NewClient(opt)
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.rdb.Ping(pingCtx).Err(); err != nil {
		return fmt.Errorf("redis unreachable: %w", err)
	}

	if d.cfg.databaseURL != "" {
		d.dbURL, d.schema = d.cfg.databaseURL, "crashdemo_"+randomHex(4)
		d.ui.say("PostgreSQL: DATABASE_URL, schema %s (dropped at the end)", d.schema)
	} else {
		start := time.Now()
		pg, err := servers.StartPostgres(ctx)
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (or set DATABASE_URL): %w", err)
		}
		d.pg, d.dbURL, d.schema = pg, pg.URL, "crashdemo"
		d.ui.say("PostgreSQL: throwaway cluster on %s, started in %v", hostOf(pg.URL), round(time.Since(start)))
	}
	return d.createBatch(ctx)
}

// createBatch creates the schema, the rows and the ledger.
func (d *demo) createBatch(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.dbURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{d.schema}.Sanitize())
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("create schema %s: %w", d.schema, err)
	}
	pc, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = d.schema
	// A host that vanishes inside a transaction keeps its row locks until
	// the server ends its session: bound that (docs/operations.md), unless
	// the URL sets its own value.
	if _, set := pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "15s"
	}
	pc.MaxConns = 4
	if d.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	// The ledger has no unique key on purpose: a row processed twice must
	// show up as two entries, not as a failed transaction.
	_, err = d.pool.Exec(ctx, `
		CREATE TABLE batchrows (
			rowid      bigint PRIMARY KEY,
			status     text NOT NULL DEFAULT 'queued',
			owner      text,
			recoveries int  NOT NULL DEFAULT 0
		);
		CREATE INDEX batchrows_queued ON batchrows (rowid) WHERE status = 'queued';
		CREATE TABLE ledger (
			rowid  bigint NOT NULL,
			worker text   NOT NULL,
			at     timestamptz NOT NULL DEFAULT clock_timestamp()
		);`)
	if err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO batchrows (rowid) SELECT generate_series(1, $1::bigint)`, d.cfg.rows); err != nil {
		return fmt.Errorf("insert rows: %w", err)
	}
	return nil
}

// spawn starts the worker processes.
func (d *demo) spawn() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program to start workers: %w", err)
	}
	d.exits = make(chan exitEvent, d.cfg.workers)
	for i := range d.cfg.workers {
		wc := workerConfig{id: fmt.Sprintf("w%d", i+1), schema: d.schema, prefix: d.prefix,
			block: d.cfg.block, work: d.cfg.work, ttl: d.cfg.ttl, beat: d.cfg.beat, recovery: d.cfg.recovery}
		cmd := exec.Command(exe, wc.args()...)
		cmd.Env = append(os.Environ(), roleEnv+"=worker", redisEnv+"="+d.redisURL, dbEnv+"="+d.dbURL)
		// Own process group: Ctrl-C reaches only the demo, which stops the
		// workers itself. On Linux they die with it if it is killed.
		cmd.SysProcAttr = servers.ChildAttr(nil, true)
		p := &proc{name: wc.id, cmd: cmd, stderr: &tail{}, exited: make(chan struct{}), state: "starting"}
		cmd.Stderr = p.stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return fmt.Errorf("start %s: %w", p.name, err)
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", p.name, err)
		}
		d.procs = append(d.procs, p)
		d.readers.Add(1)
		go d.read(p, stdout)
	}
	d.victim = d.procs[1]
	d.ui.say("%s will be killed with SIGKILL half-way through its block %d.\n", d.victim.name, d.cfg.killBlock)
	return nil
}

// read forwards a worker's JSON lines until it exits, then reaps it.
func (d *demo) read(p *proc, stdout io.Reader) {
	defer d.readers.Done()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		// When it happened: the library's event time, else the log record's.
		at := time.Now()
		for _, k := range []string{"event_time", "time"} {
			if s, ok := rec[k].(string); ok {
				if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
					at = t
					break
				}
			}
		}
		select {
		case d.events <- workerEvent{p: p, at: at, rec: rec}:
		case <-d.quit:
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	err := p.cmd.Wait()
	close(p.exited)
	d.exits <- exitEvent{p: p, err: err} // buffered: one per worker
}

// watch follows the workers until all have exited, the timeout passes or
// ctx ends.
func (d *demo) watch(ctx context.Context) (timedOut, interrupted bool) {
	deadline := time.NewTimer(d.cfg.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for running := len(d.procs); running > 0; {
		select {
		case <-ctx.Done():
			return false, true
		case <-deadline.C:
			d.ui.event(time.Now(), "%s", d.ui.paint(red, fmt.Sprintf("timed out after %v", d.cfg.timeout)))
			return true, false
		case ev := <-d.events:
			d.handle(ev)
		case ex := <-d.exits:
			d.drain()
			d.exited(ex)
			running--
		case now := <-tick.C:
			d.poll(ctx, now)
			d.ui.update(d.table(), d.progress(), now)
		}
	}
	d.drain()
	d.poll(ctx, time.Now())
	d.ui.update(d.table(), "", time.Now())
	return false, false
}

// drain handles the events already queued, so a worker's last lines come
// before its exit.
func (d *demo) drain() {
	for {
		select {
		case ev := <-d.events:
			d.handle(ev)
		default:
			return
		}
	}
}

func (d *demo) handle(ev workerEvent) {
	p, msg := ev.p, str(ev.rec["msg"])
	switch msg {
	case evStarted:
		p.state = "started"
		d.ui.event(ev.at, "%s started (pid %d)", p.name, p.cmd.Process.Pid)
	case evBlock:
		p.block, p.doneInBlock, p.state = ints(ev.rec["rows"]), 0, "working"
		p.blocks++
		if rec := ints(ev.rec["recovered"]); len(rec) > 0 {
			d.ui.event(ev.at, "%s", d.ui.paint(green, fmt.Sprintf("%s took rows %s: %s of them back from recovery",
				p.name, span(p.block), countRows(len(rec)))))
		} else {
			d.ui.event(ev.at, "%s took rows %s", p.name, span(p.block))
		}
	case evRowDone:
		p.done++
		p.doneInBlock++
		d.maybeKill(p)
	case evRowLost:
		d.lostByLive++
		d.ui.event(ev.at, "%s", d.ui.paint(red, fmt.Sprintf("%s lost row %v to recovery while alive", p.name, ev.rec["row"])))
	case evReleased:
		d.ui.event(ev.at, "%s gave rows back: %v", p.name, ev.rec["error"])
	case evIdle:
		p.state = "waiting"
		d.ui.event(ev.at, "%s is waiting: no queued rows, %v still in progress", p.name, ev.rec["rows_left"])
	case evFinished:
		p.state = "finished"
	case evPeerDead:
		d.ui.event(ev.at, "%s", d.ui.paint(yellow, fmt.Sprintf("%s's recovery scan found %s dead", p.name, str(ev.rec["peer_id"]))))
	case evRecovered:
		peer, reset := str(ev.rec["peer_id"]), num(ev.rec["rows_reset"])
		note := ""
		if d.victim != nil && peer == d.victim.name && !d.killedAt.IsZero() && d.recoveredAt.IsZero() {
			d.recoveredAt, d.rowsReset = ev.at, reset
			note = fmt.Sprintf(", %v after the kill (bound %v)", round(ev.at.Sub(d.killedAt)), round(d.bound()))
		}
		d.ui.event(ev.at, "%s", d.ui.paint(yellow, fmt.Sprintf("%s reset %s of %s to queued%s",
			p.name, countRows(int(reset)), peer, note)))
	case evLeaseLost:
		d.ui.event(ev.at, "%s", d.ui.paint(red, p.name+" lost its heartbeat lease: peers may consider it dead"))
	default:
		if lvl := str(ev.rec["level"]); lvl == "WARN" || lvl == "ERROR" {
			d.ui.event(ev.at, "%s", d.ui.paint(yellow, fmt.Sprintf("%s %s: %s %v", p.name, strings.ToLower(lvl), msg, ev.rec["error"])))
		}
	}
}

// maybeKill kills the victim half-way through its kill block.
func (d *demo) maybeKill(p *proc) {
	if p != d.victim || !d.killedAt.IsZero() || p.blocks < d.cfg.killBlock {
		return
	}
	n := len(p.block)
	if p.doneInBlock < (n+1)/2 || p.doneInBlock >= n {
		return
	}
	d.killedAt = time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		d.ui.event(d.killedAt, "could not kill %s: %v", p.name, err)
		return
	}
	p.state = "KILLED"
	d.ui.event(d.killedAt, "%s", d.ui.paint(red+bold, fmt.Sprintf("✗ %s KILLED with SIGKILL in the middle of rows %s: %d done, %s in progress",
		p.name, span(p.block), p.doneInBlock, span(p.block[p.doneInBlock:]))))
}

// exited records a reaped worker.
func (d *demo) exited(ex exitEvent) {
	p, now := ex.p, time.Now()
	switch {
	case p == d.victim && !d.killedAt.IsZero():
		// What it left behind: rows it owned, still in progress.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := d.pool.Query(ctx, `SELECT rowid FROM batchrows WHERE split_part(owner, '{', 1) = $1 AND status = 'inprog' ORDER BY rowid`, p.name)
		if err == nil {
			d.stranded, _ = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		cancel()
		d.ui.event(now, "%s is gone; its heartbeat key lives on until its TTL runs out, rows %s stay in progress",
			p.name, span(d.stranded))
	case ex.err != nil:
		p.state = "FAILED"
		d.failure = fmt.Sprintf("%s: %v: %s", p.name, ex.err, strings.TrimSpace(p.stderr.String()))
		d.ui.event(now, "%s", d.ui.paint(red, p.name+" failed: "+ex.err.Error()))
	default:
		p.state = "finished"
		d.ui.event(now, "%s finished: %d rows", p.name, p.done)
	}
}

// poll reads heartbeat TTLs from Redis and row counts from PostgreSQL.
func (d *demo) poll(ctx context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	pipe := d.rdb.Pipeline()
	ttls := make([]*redis.DurationCmd, len(d.procs))
	for i, p := range d.procs {
		ttls[i] = pipe.PTTL(ctx, store.InstanceKeys(d.prefix, p.name).Heartbeat)
	}
	if _, err := pipe.Exec(ctx); err == nil {
		for i, p := range d.procs {
			p.hbTTL, p.hbPresent, p.polled = ttls[i].Val(), ttls[i].Val() != -2, true
		}
		if v := d.victim; !d.killedAt.IsZero() && d.hbExpiredAt.IsZero() && !v.hbPresent {
			d.hbExpiredAt = now
			d.ui.event(now, "%s", d.ui.paint(yellow, fmt.Sprintf("%s's heartbeat key expired, %v after the kill: its peers now see it dead",
				v.name, round(now.Sub(d.killedAt)))))
		}
	}
	rows, err := d.pool.Query(ctx, `SELECT status, count(*) FROM batchrows GROUP BY status`)
	if err != nil {
		return
	}
	status := map[string]int{}
	var s string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&s, &n}, func() error { status[s] = n; return nil })
	if err == nil {
		d.status = status
	}
}

// table is the live view: one line per worker and the batch's progress.
func (d *demo) table() []string {
	u := d.ui
	lines := []string{"", u.paint(bold, fmt.Sprintf("  %-7s %-8s %-9s %-10s %-16s %5s", "worker", "pid", "state", "heartbeat", "block", "done"))}
	for _, p := range d.procs {
		state := fmt.Sprintf("%-9s", p.state)
		switch p.state {
		case "KILLED", "FAILED":
			state = u.paint(red+bold, state)
		case "finished":
			state = u.paint(green, state)
		}
		hb := fmt.Sprintf("%-10s", "-")
		switch {
		case p.polled && p.hbPresent:
			hb = fmt.Sprintf("%-10s", fmt.Sprintf("♥ %.1fs", p.hbTTL.Seconds()))
			if p.state == "KILLED" {
				hb = u.paint(yellow, hb)
			}
		case p.polled && p.state == "KILLED":
			hb = u.paint(red, fmt.Sprintf("%-10s", "expired"))
		}
		block := "-"
		if len(p.block) > 0 && p.state != "finished" && p.state != "waiting" {
			block = fmt.Sprintf("%s (%d/%d)", span(p.block), p.doneInBlock, len(p.block))
		}
		lines = append(lines, fmt.Sprintf("  %-7s %-8d %s %s %-16s %5d", p.name, p.cmd.Process.Pid, state, hb, block, p.done))
	}
	done, inprog, queued := d.status["done"], d.status["inprog"], d.status["queued"]
	lines = append(lines, fmt.Sprintf("  %-7s %s %d/%d done · %d in progress · %d queued",
		"rows", u.bar(done, inprog, d.cfg.rows, 30), done, d.cfg.rows, inprog, queued), "")
	return lines
}

// progress is the plain-mode progress line.
func (d *demo) progress() string {
	return fmt.Sprintf("progress: %d/%d done, %d in progress, %d queued",
		d.status["done"], d.cfg.rows, d.status["inprog"], d.status["queued"])
}

func (d *demo) bound() time.Duration { return d.cfg.ttl + d.cfg.recovery*11/10 }

// judge reads the final state of the batch and prints the verdict.
func (d *demo) judge(timedOut bool) int {
	d.ui.freeze()
	o := outcome{rows: d.cfg.rows, killed: !d.killedAt.IsZero(), killedAt: d.killedAt,
		recoveredAt: d.recoveredAt, rowsReset: d.rowsReset, stranded: len(d.stranded),
		lostByLive: d.lostByLive, workerFailure: d.failure, timedOut: timedOut,
		ttl: d.cfg.ttl, recoveryInterval: d.cfg.recovery}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'done'),
		       count(*) FILTER (WHERE status = 'failed'),
		       count(*) FILTER (WHERE recoveries > 0),
		       (SELECT count(*) FROM ledger),
		       (SELECT count(*) FROM (SELECT rowid FROM ledger GROUP BY rowid HAVING count(*) > 1) t)
		FROM batchrows`).Scan(&o.done, &o.failed, &o.recovered, &o.ledger, &o.twice)
	if err != nil {
		fmt.Fprintf(d.stderr, "crashdemo: read the results: %v\n", redact.Error(err, d.cfg.databaseURL))
		return exitFail
	}
	broken, lines := o.verdict()
	d.ui.say("%s", d.ui.paint(bold, "verdict"))
	for _, l := range lines {
		l = strings.Replace(l, "FAIL", d.ui.paint(red+bold, "FAIL"), 1)
		d.ui.say("%s", strings.Replace(l, "ok  ", d.ui.paint(green, "ok  "), 1))
	}
	summary := o.summary(broken)
	if len(broken) > 0 {
		d.ui.say("%s", d.ui.paint(red+bold, summary))
		return exitFail
	}
	d.ui.say("%s", d.ui.paint(green+bold, summary))
	return exitPass
}

// stopGrace is how long workers get to finish their block after SIGTERM
// before they are killed.
const stopGrace = 3 * time.Second

// cleanup stops every process and server the demo started and removes what
// it created in servers it did not start. Safe to call on a half-set-up
// demo.
func (d *demo) cleanup() {
	close(d.quit)
	var alive []*proc
	for _, p := range d.procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM) // finish the block, shut down
			alive = append(alive, p)
		}
	}
	grace := time.After(stopGrace)
	for _, p := range alive {
		select {
		case <-p.exited:
		case <-grace:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	d.readers.Wait()
	if len(d.procs) > 0 {
		d.cleaned = append(d.cleaned, fmt.Sprintf("%d worker processes", len(d.procs)))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d.pool != nil {
		d.pool.Close()
	}
	switch {
	case d.pg != nil:
		d.pg.Stop()
		d.cleaned = append(d.cleaned, "PostgreSQL")
	case d.schema != "" && d.dbURL != "":
		if conn, err := pgx.Connect(ctx, d.dbURL); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE")
			conn.Close(ctx)
			d.cleaned = append(d.cleaned, "schema "+d.schema)
		}
	}
	if d.rdb != nil {
		if d.mr == nil && d.rs == nil { // someone else's Redis: remove our keys
			ks := store.FleetKeys(d.prefix)
			for _, p := range d.procs {
				k := store.InstanceKeys(d.prefix, p.name)
				ks = append(ks, k.Heartbeat, k.Rows, k.Claim, k.Incarnation, k.OldestRow, k.RowsSeen, k.Witness)
			}
			_ = d.rdb.Del(ctx, ks...).Err()
			d.cleaned = append(d.cleaned, "keys "+d.prefix+"_*")
		}
		d.rdb.Close()
	}
	if d.rs != nil {
		d.rs.Stop()
		d.cleaned = append(d.cleaned, "redis-server")
	}
	if d.mr != nil {
		d.mr.Close()
		d.cleaned = append(d.cleaned, "miniredis")
	}
}

// tail keeps the last 4 KiB written to it: a worker's stderr.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// span shows sorted row IDs compactly: "11-20", "3, 7-9".
func span(ids []int64) string {
	if len(ids) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(ids[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

func countRows(n int) string {
	if n == 1 {
		return "1 row"
	}
	return fmt.Sprintf("%d rows", n)
}

func str(v any) string { s, _ := v.(string); return s }

func num(v any) int64 { f, _ := v.(float64); return int64(f) }

func ints(v any) []int64 {
	list, _ := v.([]any)
	out := make([]int64, 0, len(list))
	for _, x := range list {
		if f, ok := x.(float64); ok {
			out = append(out, int64(f))
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// hostOf returns host:port of a URL without anything else.
func hostOf(url string) string {
	_, rest, ok := strings.Cut(url, "@")
	if !ok {
		return "?"
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}
