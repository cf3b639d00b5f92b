package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrNoPgBouncer is returned by StartPgBouncer when no pgbouncer binary can
// be found.
var ErrNoPgBouncer = errors.New("no pgbouncer in PATH or /usr/sbin (Debian package pgbouncer; scripts/install-deps.sh installs it)")

// PgBouncer is a throwaway PgBouncer in transaction pooling mode, on a free
// loopback port, in front of one PostgreSQL server, trusting every client.
// Stop it with Stop, which also removes its folder.
type PgBouncer struct {
	// Addr is host:port to connect to, with the server's user and
	// database names.
	Addr string
	// Version is the binary's version, as "1.18.0".
	Version string
	// Dir holds pgbouncer.ini, the users file and pgbouncer.log.
	Dir string

	cmd  *exec.Cmd
	once sync.Once
}

// PgBouncerBinary returns the path of the pgbouncer binary: PATH first,
// then /usr/sbin (Debian's, not on a user's PATH).
func PgBouncerBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoPgBouncer
}

var pgbouncerVersion = regexp.MustCompile(`(?i)pgbouncer (\d+)\.(\d+)(\.\d+)?`)

// StartPgBouncer runs pgbouncer in transaction pooling mode in front of the
// PostgreSQL server at serverHost:serverPort, for user (who must exist on
// the server and be trusted on loopback). Server connections are handed
// out round robin from a pool of three kept open (min_pool_size), so
// consecutive transactions of one client run on different ones, and server-side named prepared
// statements are not tracked (max_prepared_statements = 0 on versions that
// know it), so a client that relies on a named prepared statement across
// transactions fails as it does in production. It runs as the postgres
// user when running as root (pgbouncer refuses root), in its own process
// group, and on Linux dies with this process. ctx bounds the start.
func StartPgBouncer(ctx context.Context, serverHost string, serverPort int, user string) (_ *PgBouncer, err error) {
	bin, err := PgBouncerBinary()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer --version: %v: %s", err, out)
	}
	m := pgbouncerVersion.FindStringSubmatch(string(out))
	if m == nil {
		return nil, fmt.Errorf("pgbouncer --version said %q", out)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "recovery-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("create pgbouncer folder: %w", err)
	}
	b := &PgBouncer{Dir: dir, Version: m[1] + "." + m[2] + m[3]}
	defer func() {
		if err != nil {
			b.Stop()
		}
	}()
	port, err := FreePort(false)
	if err != nil {
		return nil, err
	}
	b.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 3
min_pool_size = 3
server_round_robin = 1
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
`, serverHost, serverPort, port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	if major > 1 || minor >= 21 {
		ini += "max_prepared_statements = 0\n"
	}
	files := map[string]string{"pgbouncer.ini": ini, "users.txt": strconv.Quote(user) + ` ""` + "\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("give the pgbouncer folder to the postgres user: %w", err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = ChildAttr(cred, true)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b.cmd = cmd
	if err := waitListening(ctx, b.Addr); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		return nil, fmt.Errorf("pgbouncer did not listen on %s: %v; log: %s", b.Addr, err, log)
	}
	return b, nil
}

// waitListening polls until addr accepts a TCP connection or ctx ends.
func waitListening(ctx context.Context, addr string) error {
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends pgbouncer (SIGTERM, then SIGKILL after 5 seconds), waits for it
// and removes its folder. It is safe to call more than once.
func (b *PgBouncer) Stop() {
	b.once.Do(func() {
		if b.cmd != nil {
			stopChild(b.cmd, syscall.SIGTERM, 5*time.Second) // immediate shutdown
		}
		if b.Dir != "" {
			os.RemoveAll(b.Dir)
		}
	})
}
