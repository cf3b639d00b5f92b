//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/alya/recovery/internal/servers"
)

var (
	// workerBin is the faultworker binary, built once for the whole suite.
	workerBin string
	// sharedPG serves every scenario but the PostgreSQL outage, each in a
	// schema of its own.
	sharedPG *servers.Postgres
	// pgErr says why there is no sharedPG; scenarios then skip, or fail
	// under RECOVERY_REQUIRE_INTEGRATION=1.
	pgErr error
)

// TestMain builds the worker (with the race detector unless FAULTS_RACE=0
// or cgo is off), starts the shared PostgreSQL, runs the scenarios, prints
// the result table, and stops everything it started, also when a scenario
// fails. Redis servers and worker processes belong to each scenario and
// are stopped by its cleanup; every child gets SIGKILL from the kernel
// should this process die first.
func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	dir, err := os.MkdirTemp("", "recovery-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	workerBin = filepath.Join(dir, "faultworker")
	start := time.Now()
	race, err := buildWorker(workerBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults: build the worker:", err)
		return 1
	}
	fmt.Printf("faults: built faultworker (race detector: %v) in %v\n", race, time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	sharedPG, pgErr = servers.StartPostgres(ctx)
	cancel()
	if sharedPG != nil {
		defer sharedPG.Stop()
	}
	versions = serverVersions()
	fmt.Println("faults: " + versions)
	code := m.Run()
	printResults(os.Stdout)
	fmt.Println("  versions: " + versions)
	return code
}

// versions names the servers the suite ran against, for the matrix in
// docs/reliability.md.
var versions string

// serverVersions returns the redis-server and PostgreSQL versions.
func serverVersions() string {
	redisV := "redis-server: not found"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		redisV = strings.TrimSpace(string(out))
		if i := strings.Index(redisV, " sha="); i > 0 {
			redisV = redisV[:i]
		}
	}
	pgV := "PostgreSQL: unavailable"
	if sharedPG != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, sharedPG.URL); err == nil {
			var v string
			if c.QueryRow(ctx, "SHOW server_version").Scan(&v) == nil {
				pgV = "PostgreSQL " + v
			}
			c.Close(ctx)
		}
	}
	return redisV + "; " + pgV
}

// buildWorker builds the worker into out, with the race detector unless
// FAULTS_RACE=0 or cgo (which -race needs) is off; it reports which.
func buildWorker(out string) (race bool, err error) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			return false, errors.New("no go command to build the worker with")
		}
	}
	race = os.Getenv("FAULTS_RACE") != "0"
	if race {
		if cgo, err := exec.Command(gobin, "env", "CGO_ENABLED").Output(); err != nil || strings.TrimSpace(string(cgo)) != "1" {
			fmt.Println("faults: cgo is off, so the workers are built without the race detector")
			race = false
		}
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "github.com/alya/recovery/internal/faultworker")
	if b, err := exec.Command(gobin, args...).CombinedOutput(); err != nil {
		return race, fmt.Errorf("go %v: %v\n%s", args, err, b)
	}
	return race, nil
}
