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
	code := m.Run()
	printResults(os.Stdout)
	return code
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
