package servers

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPostgresBinaries is returned by StartPostgres and PostgresBinDir when
// no initdb can be found.
var ErrNoPostgresBinaries = errors.New("no initdb found in PATH or /usr/lib/postgresql/*/bin (make test installs PostgreSQL; or set DATABASE_URL)")

// DefaultStartTimeout bounds StartPostgres when its context has no deadline:
// initdb and the first accepted connection take a few seconds.
const DefaultStartTimeout = 30 * time.Second

// Postgres is a throwaway PostgreSQL cluster: initdb'ed in a temporary
// folder, listening on a free loopback port, trusting every local
// connection. Stop it with Stop, which also removes the folder.
type Postgres struct {
	// URL connects as the superuser postgres to the database postgres. It
	// has no password: the cluster trusts loopback connections.
	URL string
	// Dir is the temporary folder with the data directory, the socket and
	// postgres.log; Stop removes it.
	Dir string

	cmd  *exec.Cmd
	logf *os.File
	once sync.Once
}

// StartPostgres initdb's a cluster in a temporary folder and runs postgres
// on a free loopback port, as the postgres user when running as root
// (PostgreSQL refuses to run as root). It returns once the server accepts
// connections, or an error (ErrNoPostgresBinaries when there is nothing to
// run) after cleaning up what it started. ctx bounds the start; without a
// deadline, DefaultStartTimeout does.
//
// The server runs in its own process group, so a Ctrl-C in the terminal
// does not reach it, and on Linux it is killed if this process dies without
// calling Stop.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	return startCluster(ctx, func(ctx context.Context, bindir, data string, attr *syscall.SysProcAttr) error {
		initdb := exec.CommandContext(ctx, filepath.Join(bindir, "initdb"), "-D", data, "-U", "postgres",
			"--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C")
		initdb.SysProcAttr = attr
		initdb.Dir = filepath.Dir(data)
		if out, err := initdb.CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %v: %s", err, out)
		}
		return nil
	})
}

// StartStandby starts a hot standby of primary (a cluster StartPostgres
// started): pg_basebackup -R of it into a temporary folder, then postgres
// on a free loopback port, streaming from the primary. It accepts
// read-only connections (pg_is_in_recovery() is true). Stop it with Stop.
func StartStandby(ctx context.Context, primary *Postgres) (*Postgres, error) {
	host, port, err := primary.hostPort()
	if err != nil {
		return nil, err
	}
	return startCluster(ctx, func(ctx context.Context, bindir, data string, attr *syscall.SysProcAttr) error {
		backup := exec.CommandContext(ctx, filepath.Join(bindir, "pg_basebackup"), "-h", host, "-p", port,
			"-U", "postgres", "-D", data, "-R", "-X", "stream", "--no-sync")
		backup.SysProcAttr = attr
		backup.Dir = filepath.Dir(data)
		if out, err := backup.CombinedOutput(); err != nil {
			return fmt.Errorf("pg_basebackup: %v: %s", err, out)
		}
		return nil
	})
}

// hostPort returns the host and port of p's URL.
func (p *Postgres) hostPort() (host, port string, err error) {
	u, err := url.Parse(p.URL)
	if err != nil {
		return "", "", fmt.Errorf("server URL: %w", err)
	}
	return u.Hostname(), u.Port(), nil
}

// startCluster makes a data folder with create (initdb, or a base backup)
// in a temporary folder and runs postgres on it, as StartPostgres says.
func startCluster(ctx context.Context, create func(ctx context.Context, bindir, data string, attr *syscall.SysProcAttr) error) (_ *Postgres, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	bindir, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "recovery-pg-")
	if err != nil {
		return nil, fmt.Errorf("create data folder: %w", err)
	}
	p := &Postgres{Dir: dir}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("give the data folder to the postgres user: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	if err := create(ctx, bindir, data, ChildAttr(cred, true)); err != nil {
		return nil, err
	}
	port, err := FreePort(false)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(bindir, "postgres"), "-D", data,
		"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	cmd.SysProcAttr = ChildAttr(cred, true)
	cmd.Dir = dir
	p.logf, err = os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, fmt.Errorf("create postgres.log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = p.logf, p.logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p.cmd = cmd
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := p.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		return nil, fmt.Errorf("postgres did not accept connections: %v; log: %s", err, log)
	}
	return p, nil
}

// waitReady polls until the server accepts a connection or ctx ends.
func (p *Postgres) waitReady(ctx context.Context) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		c, err := pgx.Connect(attempt, p.URL)
		if err == nil {
			c.Close(attempt)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pid returns the postmaster's process ID, or 0 if it was never started.
func (p *Postgres) Pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop shuts the server down (a fast shutdown, then SIGKILL after 10
// seconds), waits for it and removes its folder. It is safe to call more
// than once and on a server that failed to start.
func (p *Postgres) Stop() {
	p.once.Do(func() {
		if p.cmd != nil {
			stopChild(p.cmd, syscall.SIGINT, 10*time.Second) // fast shutdown
		}
		if p.logf != nil {
			p.logf.Close()
		}
		if p.Dir != "" {
			os.RemoveAll(p.Dir)
		}
	})
}

// stopChild sends cmd's process sig, waits for it to exit, and kills it
// if it is still there after grace.
func stopChild(cmd *exec.Cmd, sig syscall.Signal, grace time.Duration) {
	_ = cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// PostgresBinDir finds the folder with initdb and postgres: PATH first,
// then Debian's /usr/lib/postgresql/<version>/bin, newest first.
func PostgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(real), "postgres")); err == nil {
				return filepath.Dir(real), nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgresBinaries
}

func versionOf(bindir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return v
}

// postgresCredential returns the postgres user's credential when running as
// root, nil otherwise.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and no postgres user to run PostgreSQL as: %w", err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("postgres user's uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("postgres user's gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
