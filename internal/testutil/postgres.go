package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	pgOnce sync.Once
	pgURL  string
	pgErr  error
)

// PostgresURL returns the URL of a PostgreSQL for tests: DATABASE_URL when
// set, otherwise a throwaway cluster started once per test binary from the
// local binaries (as the postgres user when running as root: PostgreSQL
// refuses root) and stopped by Main. It ends the test when none can be had.
func PostgresURL(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url
	}
	pgOnce.Do(func() {
		pgURL, pgErr = startPostgres()
		if errors.Is(pgErr, errNoPostgresBinaries) && dockerReachable() {
			pgURL, pgErr = containerPostgresURL()
		}
	})
	if pgErr != nil {
		Unavailable(t, "cannot start PostgreSQL: %v", pgErr)
	}
	return pgURL
}

// Postgres returns a pool whose search_path is a fresh schema of its own,
// dropped (with everything in it) when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		Unavailable(t, "connect to PostgreSQL: %v", redactErr(err, url))
	}
	defer admin.Close(context.Background())
	schema := Name("t_")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse database URL: %v", redactErr(err, url))
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open pool: %v", redactErr(err, url))
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, url); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			c.Close(ctx)
		}
	})
	return pool
}

// BatchSchema is the host schema of the design: batches of rows, each row
// with a status, plus the owner column the safety options use and a ledger
// that records every processing of a row.
const BatchSchema = `
CREATE TABLE batches (
	batchid bigint PRIMARY KEY,
	status  text NOT NULL DEFAULT 'inprog'
);
CREATE TABLE batchrows (
	rowid      bigint PRIMARY KEY,
	batchid    bigint NOT NULL REFERENCES batches,
	status     text NOT NULL DEFAULT 'queued',
	owner      text,
	recoveries int NOT NULL DEFAULT 0
);
CREATE INDEX batchrows_status ON batchrows (status);
`

// CreateBatch creates the BatchSchema tables in pool's schema and one batch
// (id 1, status inprog) of rows 1..n, all queued.
func CreateBatch(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, BatchSchema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO batches (batchid) VALUES (1)`); err != nil {
		t.Fatalf("insert batch: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO batchrows (rowid, batchid) SELECT g, 1 FROM generate_series(1, $1::bigint) g`, n); err != nil {
		t.Fatalf("insert rows: %v", err)
	}
}

// startPostgres initdb's a cluster in a temporary folder and runs postgres
// on a free loopback port. The server is stopped by Main.
func startPostgres() (string, error) {
	bindir, err := postgresBinDir()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "recovery-pg-")
	if err != nil {
		return "", err
	}
	cred, err := postgresCredential()
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bindir, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := freePort(false)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	cmd := exec.Command(filepath.Join(bindir, "postgres"), "-D", data,
		"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return "", fmt.Errorf("start postgres: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		os.RemoveAll(dir)
	}
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			c.Close(ctx)
			cancel()
			break
		}
		cancel()
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			stop()
			return "", fmt.Errorf("postgres did not accept connections: %v; log: %s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	onExit(stop)
	return url, nil
}

var errNoPostgresBinaries = errors.New("no initdb found in PATH or /usr/lib/postgresql/*/bin (make test installs PostgreSQL; or set DATABASE_URL)")

// postgresBinDir finds the folder with initdb and postgres: PATH first,
// then Debian's /usr/lib/postgresql/<version>/bin, newest first.
func postgresBinDir() (string, error) {
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
	return "", errNoPostgresBinaries
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
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
