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
	"time"

	"testing"

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

// TestMain builds the worker (with the race detector unless
// FAULTS_RACE=0), starts the shared PostgreSQL, runs the scenarios, prints
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
	if err := buildWorker(workerBin); err != nil {
		fmt.Fprintln(os.Stderr, "faults: build the worker:", err)
		return 1
	}
	fmt.Printf("faults: built faultworker (race detector: %v) in %v\n", raceWorkers(), time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	sharedPG, pgErr = servers.StartPostgres(ctx)
	cancel()
	if sharedPG != nil {
		defer sharedPG.Stop()
	}
	code := m.Run()
	printResults(os.Stdout)
	return code
}

// raceWorkers reports whether the workers are built with -race: yes unless
// FAULTS_RACE=0 (a data race in a worker fails its scenario).
func raceWorkers() bool { return os.Getenv("FAULTS_RACE") != "0" }

func buildWorker(out string) error {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			return errors.New("no go command to build the worker with")
		}
	}
	args := []string{"build", "-o", out}
	if raceWorkers() {
		args = append(args, "-race")
	}
	args = append(args, "github.com/alya/recovery/internal/faultworker")
	cmd := exec.Command(gobin, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, b)
	}
	return nil
}
