// Command sidebyside measures kill -9 -> picked up for recovery at its
// defaults, asynq and River, in one run on one machine (issue 34). For each
// configuration and each kill it starts a victim and a survivor worker
// (this binary again, with -role), gives the victim one job (for recovery:
// a block of rows), SIGKILLs it while it processes the job, and records
// when the job is picked up again and whether any job completed twice.
//
//	GOWORK=off go run . -kills 20 -other-kills 10 -out sidebyside-results.md
//
// It is a module of its own so that asynq and River never reach the
// library's go.mod; run it with GOWORK=off (make sidebyside).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// flags is what both the harness and its worker processes are told.
type flags struct {
	role    string // "" (the harness), "victim" or "survivor"
	config  string
	ns      string // schema / key prefix / queue of this configuration's run
	queue   string // River: the queue the victim serves
	work    time.Duration
	configs string
	kills   int
	others  int
	out     string
	redis   string
	db      string
	logs    string
	serial  bool
}

func parseFlags() flags {
	var f flags
	flag.StringVar(&f.role, "role", "", "internal: victim or survivor (a worker process the harness starts)")
	flag.StringVar(&f.config, "config", "", "internal: the configuration a worker process runs")
	flag.StringVar(&f.ns, "ns", "", "internal: the configuration's schema, key prefix and queue")
	flag.StringVar(&f.queue, "queue", "", "internal: the queue a River victim serves")
	flag.DurationVar(&f.work, "work", 0, "internal: how long the survivor's job takes")
	flag.StringVar(&f.configs, "configs", strings.Join(defaultConfigs, ","),
		"configurations to run, comma-separated, from: "+strings.Join(allConfigNames(), ", ")+
			" (river-default takes over an hour: its rescue threshold is 1 h)")
	flag.IntVar(&f.kills, "kills", 20, "kills for recovery's configuration")
	flag.IntVar(&f.others, "other-kills", 5, "kills for each asynq and River configuration (river-default: 1)")
	flag.StringVar(&f.out, "out", "sidebyside-results.md", "file the table is written to")
	flag.StringVar(&f.redis, "redis", "", "Redis address; empty: a throwaway redis-server on a free port")
	flag.StringVar(&f.db, "database", cmpOr(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"PostgreSQL URL (each configuration gets a schema of its own, dropped at the end)")
	flag.StringVar(&f.logs, "logs", "", "directory for the worker processes' logs; empty: a temporary one")
	flag.BoolVar(&f.serial, "serial", false, "run the configurations one after another instead of at the same time")
	flag.Parse()
	return f
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func main() {
	f := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if f.role != "" {
		err = runWorker(ctx, f)
	} else {
		err = runHarness(ctx, f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidebyside:", err)
		os.Exit(1)
	}
}

// config is one column of the comparison: a system and its tuning.
type config struct {
	name   string
	system string // "recovery", "asynq", "River"
	label  string // the configuration, for the table
	// phase: the harness waits a random time in [0, phase) at one step of
	// each round, so the kill lands at a random point of the system's
	// longest periodic loop on the recovery path (asynq's recoverer runs
	// every minute, River's rescuer every 30 s), as in a fleet.
	phase time.Duration
	work  time.Duration // the survivor's job takes this long
	limit time.Duration // kill -> picked up longer than this: not picked up
	watch time.Duration // after the last job ended, how long to look for another start
	ours  bool
}

var configs = []config{
	{name: "ours-default", system: "recovery", label: "defaults: New without timing options (owner mode, witness on)",
		phase: time.Second, work: 100 * time.Millisecond, limit: 3 * time.Minute, watch: 2 * time.Second, ours: true},
	{name: "asynq-default", system: "asynq", label: "defaults",
		phase: time.Minute, work: time.Second, limit: 5 * time.Minute, watch: 10 * time.Second},
	{name: "asynq-tuned", system: "asynq", label: "RetryDelayFunc 0, DelayedTaskCheckInterval 100ms, TaskCheckInterval 10ms",
		phase: time.Minute, work: time.Second, limit: 5 * time.Minute, watch: 10 * time.Second},
	{name: "river-default", system: "River", label: "defaults (RescueStuckJobsAfter 1h)",
		phase: 30 * time.Second, work: time.Second, limit: 75 * time.Minute, watch: 10 * time.Second},
	{name: "river-tuned", system: "River", label: "RescueStuckJobsAfter 1s, JobTimeout 1s, RetryPolicy now, FetchCooldown 1ms, FetchPollInterval 10ms; job 10s",
		phase: 30 * time.Second, work: 10 * time.Second, limit: 3 * time.Minute, watch: 40 * time.Second},
	// The same tuning with a job longer than the rescuer's 30 s interval:
	// a run that is still going at the rescuer's next pass is rescued and
	// runs again beside itself. Its rounds end after limit (attempts keep
	// being rescued until MaxAttempts).
	{name: "river-tuned-longjob", system: "River", label: "as above; job 40s (longer than the rescuer's 30s interval)",
		phase: 30 * time.Second, work: 40 * time.Second, limit: 2 * time.Minute, watch: 40 * time.Second},
}

var defaultConfigs = []string{"ours-default", "asynq-default", "asynq-tuned", "river-tuned", "river-tuned-longjob"}

func allConfigNames() []string {
	names := make([]string, len(configs))
	for i, c := range configs {
		names[i] = c.name
	}
	return names
}

func configNamed(name string) (config, error) {
	for _, c := range configs {
		if c.name == name {
			return c, nil
		}
	}
	return config{}, fmt.Errorf("unknown configuration %q (known: %s)", name, strings.Join(allConfigNames(), ", "))
}

// runWorker is a victim or survivor process.
func runWorker(ctx context.Context, f flags) error {
	c, err := configNamed(f.config)
	if err != nil {
		return err
	}
	// The harness ends a survivor by closing its stdin.
	stopCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan string, 16)
	go func() {
		defer cancel()
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	w := worker{f: f, c: c, victim: f.role == "victim", lines: lines, stopCtx: stopCtx,
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if w.victim {
		w.work = time.Hour // the victim is killed in its job
		// A victim the harness never killed (the harness itself died)
		// ends with its stdin, job or not.
		w.stopCtx = ctx
	} else {
		w.work = f.work
	}
	switch c.system {
	case "recovery":
		return w.runOurs(ctx)
	case "asynq":
		return w.runAsynq(ctx)
	case "River":
		return w.runRiver(ctx)
	}
	return fmt.Errorf("configuration %s: no system %q", c.name, c.system)
}

// worker is the state of a worker process.
type worker struct {
	f      flags
	c      config
	victim bool
	work   time.Duration
	lines  <-chan string // the harness's commands, one a line, closed at EOF
	// stopCtx ends when the process is told to stop (SIGTERM, SIGINT); a
	// job that ignores its own context still ends with it.
	stopCtx context.Context
	log     *slog.Logger
	mu      sync.Mutex
}

// emit prints an event line for the harness.
func (w *worker) emit(kind string, fields ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Println(formatEvent(kind, time.Now(), fields...))
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// harness holds what every configuration's rounds share.
type harness struct {
	f     flags
	exe   string
	redis string
	logs  string
	runID string
	print func(format string, args ...any)
}

func runHarness(ctx context.Context, f flags) error {
	var chosen []config
	for name := range strings.SplitSeq(f.configs, ",") {
		c, err := configNamed(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		chosen = append(chosen, c)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	logs := f.logs
	if logs == "" {
		if logs, err = os.MkdirTemp("", "sidebyside-logs-"); err != nil {
			return fmt.Errorf("log directory: %w", err)
		}
	} else if err := os.MkdirAll(logs, 0o755); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	var printMu sync.Mutex
	h := &harness{f: f, exe: exe, logs: logs, runID: fmt.Sprintf("sbs%d", time.Now().Unix()%1000000),
		print: func(format string, args ...any) {
			printMu.Lock()
			defer printMu.Unlock()
			fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
		}}
	h.redis = f.redis
	if h.redis == "" {
		addr, stopRedis, err := startRedis(logs)
		if err != nil {
			return err
		}
		defer stopRedis()
		h.redis = addr
	}
	h.print("run %s: redis %s, worker logs in %s", h.runID, h.redis, logs)
	began := time.Now()

	rows := make([]summary, len(chosen))
	var wg sync.WaitGroup
	for i, c := range chosen {
		one := func() { rows[i] = h.runConfig(ctx, c) }
		if f.serial {
			one()
		} else {
			wg.Go(one)
		}
	}
	wg.Wait()

	out := fmt.Sprintf("kill -9 -> picked up, %s, one run of %s (%s), this machine.\n\n%s",
		began.UTC().Format(time.RFC3339), time.Since(began).Round(time.Second), strings.Join(f.configsList(), ", "), table(rows))
	fmt.Print("\n" + out)
	if err := os.WriteFile(f.out, []byte(out), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", f.out, err)
	}
	h.print("table written to %s", f.out)
	return ctx.Err()
}

func (f flags) configsList() []string {
	var names []string
	for n := range strings.SplitSeq(f.configs, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	return names
}

// round is what one kill measured.
type round struct {
	latency  time.Duration // kill -> picked up
	picked   bool
	twice    bool
	detailed string
}

// runConfig sets up a configuration's schema and queues, runs its kills
// and cleans up.
func (h *harness) runConfig(ctx context.Context, c config) summary {
	s := summary{system: c.system, config: c.label}
	kills := h.f.others
	switch {
	case c.ours:
		kills = h.f.kills
	case c.name == "river-default":
		kills = 1
	}
	ns := h.runID + "_" + strings.ReplaceAll(c.name, "-", "_")
	sys, err := newSystem(ctx, h, c, ns)
	if err != nil {
		s.note = "setup failed: " + err.Error()
		h.print("%s: %v", c.name, err)
		return s
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := sys.cleanup(cctx); err != nil {
			h.print("%s: cleanup: %v", c.name, err)
		}
	}()
	var latencies []time.Duration
	for k := range kills {
		if ctx.Err() != nil {
			break
		}
		r, err := sys.round(ctx, k)
		if err != nil {
			h.print("%s kill %d: %v (not counted)", c.name, k+1, err)
			s.failed++
			continue
		}
		switch {
		case !r.picked:
			s.missed++
			h.print("%s kill %d: not picked up within %s%s", c.name, k+1, c.limit, r.detailed)
		default:
			latencies = append(latencies, r.latency)
			h.print("%s kill %d: picked up after %s%s", c.name, k+1, r.latency.Round(time.Millisecond), r.detailed)
		}
		if r.twice {
			s.twice++
		}
	}
	s.kills = len(latencies)
	s.median, s.p95, s.max = summarize(latencies)
	if s.kills == 0 && s.missed == 0 {
		s.note = "no kill measured (see the log above)"
	}
	return s
}

// system is one configuration's setup and rounds.
type system interface {
	round(ctx context.Context, k int) (round, error)
	cleanup(ctx context.Context) error
}

func newSystem(ctx context.Context, h *harness, c config, ns string) (system, error) {
	switch c.system {
	case "recovery":
		return newOursSystem(ctx, h, c, ns)
	case "asynq":
		return newAsynqSystem(h, c, ns), nil
	case "River":
		return newRiverSystem(ctx, h, c, ns)
	}
	return nil, fmt.Errorf("no system %q", c.system)
}

// proc is a worker process the harness started.
type proc struct {
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when its stdout ended
}

// spawn starts a worker process whose events go to events.
func (h *harness) spawn(c config, role, ns string, events chan<- event, extra ...string) (*proc, error) {
	args := append([]string{"-role", role, "-config", c.name, "-ns", ns, "-work", c.work.String()}, extra...)
	cmd := exec.Command(h.exe, args...)
	cmd.Env = append(os.Environ(), "SBS_REDIS="+h.redis, "SBS_DATABASE="+h.f.db)
	logf, err := os.OpenFile(filepath.Join(h.logs, ns+"_"+role+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("worker log: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("worker stdout: %w", err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("worker stdin: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	p := &proc{role: role, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if e, ok := parseEvent(sc.Text()); ok {
				e.from = role
				events <- e // buffered generously; see newEvents
			}
		}
	}()
	return p, nil
}

// newEvents is a channel big enough for every event of a round.
func newEvents() chan event { return make(chan event, 4096) }

// kill SIGKILLs the process and returns the time just before the signal.
func (p *proc) kill() (time.Time, error) {
	at := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return at, fmt.Errorf("kill %s: %w", p.role, err)
	}
	<-p.done
	_ = p.cmd.Wait() // "signal: killed"
	return at, nil
}

// stop ends a worker: stdin closed, then SIGKILL if it has not exited
// within a minute.
func (p *proc) stop() {
	_ = p.stdin.Close()
	exited := make(chan struct{})
	go func() {
		<-p.done
		_ = p.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-exited
	}
}

// send writes a command line to the worker.
func (p *proc) send(line string) error {
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return fmt.Errorf("tell %s %q: %w", p.role, line, err)
	}
	return nil
}

var errTimeout = errors.New("timed out")

// await returns the first event from events that match accepts, or an
// error after d.
func await(ctx context.Context, events <-chan event, d time.Duration, what string, match func(event) bool) (event, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return event{}, ctx.Err()
		case <-t.C:
			return event{}, fmt.Errorf("%s: %w after %s", what, errTimeout, d)
		case e := <-events:
			if match(e) {
				return e, nil
			}
		}
	}
}

func is(kind, from string) func(event) bool {
	return func(e event) bool { return e.kind == kind && e.from == from }
}

// randomPhase waits a random time in [0, d).
func randomPhase(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if !sleep(ctx, rand.N(d)) {
		return ctx.Err()
	}
	return nil
}

// completions watches events after the job was picked up: it returns how
// often each job completed (done events) once no survivor job has been
// running for watch, or limit passed.
func completions(ctx context.Context, events <-chan event, watch, limit time.Duration, seen []event) map[string]int {
	done := map[string]int{}
	running := 0
	count := func(e event) {
		if len(e.fields) == 0 {
			return
		}
		switch e.kind {
		case "start": // one job, or a block of rows: "id,id,..."
			if e.from == "survivor" {
				running += strings.Count(e.fields[0], ",") + 1
			}
		case "done":
			done[e.fields[0]]++
			if e.from == "survivor" {
				running--
			}
		}
	}
	for _, e := range seen {
		count(e)
	}
	end := time.NewTimer(limit)
	defer end.Stop()
	quiet := time.NewTimer(watch)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return done
		case <-end.C:
			return done
		case <-quiet.C:
			if running <= 0 {
				return done
			}
			quiet.Reset(watch)
		case e := <-events:
			count(e)
			quiet.Reset(watch)
		}
	}
}
