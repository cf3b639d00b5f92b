package modcheck_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"

	"github.com/alya/recovery/internal/modcheck"
)

// repoRoot is the repository's root directory, two levels up from this
// package's.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// published returns the modules users may require and the version the
// nested ones require of the root.
func published(t *testing.T) ([]modcheck.Module, string) {
	t.Helper()
	mods, err := modcheck.PublishedModules(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	version, err := modcheck.RootRequirement(mods)
	if err != nil {
		t.Fatal(err)
	}
	return mods, version
}

// TestNestedModulesRequireARealRootVersion: prom/ and otel/ require the
// root module at one released version, with no replace directive, as a
// user's go command needs.
func TestNestedModulesRequireARealRootVersion(t *testing.T) {
	mods, version := published(t)
	var dirs []string
	for _, m := range mods {
		dirs = append(dirs, m.Dir)
	}
	t.Logf("modules %v; nested modules require %s %s", dirs, modcheck.RootPath, version)
	for _, want := range []string{".", "prom", "otel"} {
		found := false
		for _, d := range dirs {
			found = found || d == want
		}
		if !found {
			t.Errorf("module %s is not published: found %v", want, dirs)
		}
	}
}

// A userModule is a module outside the repository that requires it
// through a file-based proxy made from the working tree.
type userModule struct {
	t   *testing.T
	dir string
	env []string
}

// newUserModule publishes the repository's modules to a file proxy and
// makes a module requiring the given modules of it (at the version the
// nested modules require of the root) with main.go as its only source.
// Third-party modules come from the local module cache's download
// directory, and failing that from the configured proxy; the module cache
// itself is fresh, so nothing published by an earlier run is reused.
func newUserModule(t *testing.T, requires []string, mainGo string) *userModule {
	t.Helper()
	if testing.Short() {
		t.Skip("builds modules through a module proxy: skipped in -short mode")
	}
	mods, version := published(t)
	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	if err := modcheck.WriteProxy(proxy, repoRoot(t), mods, version); err != nil {
		t.Fatal(err)
	}
	u := &userModule{t: t, dir: filepath.Join(tmp, "user")}
	if err := os.MkdirAll(u.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env, err := modcheck.Env(proxy, filepath.Join(tmp, "modcache"))
	if err != nil {
		t.Fatal(err)
	}
	u.env = append(os.Environ(), env...)
	var gomod strings.Builder
	gomod.WriteString("module example.com/user\n\ngo 1.26.0\n\nrequire (\n")
	for _, r := range requires {
		gomod.WriteString("\t" + r + " " + version + "\n")
	}
	gomod.WriteString(")\n")
	u.write("go.mod", gomod.String())
	u.write("main.go", mainGo)
	return u
}

func (u *userModule) write(name, content string) {
	u.t.Helper()
	if err := os.WriteFile(filepath.Join(u.dir, name), []byte(content), 0o644); err != nil {
		u.t.Fatal(err)
	}
}

// goOutput runs the go command in the user module and returns its output.
func (u *userModule) goOutput(args ...string) string {
	u.t.Helper()
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = u.dir
	cmd.Env = u.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		u.t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	u.t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// buildAndRun tidies the user module, builds it and runs the program,
// returning what it printed.
func (u *userModule) buildAndRun() string {
	u.t.Helper()
	u.goOutput("mod", "tidy")
	// -trimpath: the module cache is new at every run, and without it
	// its path would make every package a build cache miss.
	u.goOutput("build", "-trimpath", "-o", "user", ".")
	out, err := exec.Command(filepath.Join(u.dir, "user")).CombinedOutput()
	if err != nil {
		u.t.Fatalf("run the user program: %v\n%s", err, out)
	}
	return string(out)
}

// goSum returns the lines of the user module's go.sum.
func (u *userModule) goSum() []string {
	u.t.Helper()
	data, err := os.ReadFile(filepath.Join(u.dir, "go.sum"))
	if err != nil {
		u.t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// TestAnOutsideModuleBuildsAgainstEveryModule: a program outside the
// repository that imports the library, its Prometheus module and its
// OpenTelemetry module resolves all three by version through a module
// proxy, builds and runs.
func TestAnOutsideModuleBuildsAgainstEveryModule(t *testing.T) {
	u := newUserModule(t, []string{modcheck.RootPath, modcheck.RootPath + "/prom", modcheck.RootPath + "/otel"}, `package main

import (
	"fmt"

	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/alya/recovery"
	recoveryotel "github.com/alya/recovery/otel"
	recoveryprom "github.com/alya/recovery/prom"
)

func main() {
	c := recoveryprom.NewCollector()
	o, err := recoveryotel.New(recoveryotel.WithMeterProvider(noop.NewMeterProvider()),
		recoveryotel.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		panic(err)
	}
	both := func(e recovery.Event) { c.Observe(e); o.Observe(e) }
	both(recovery.Event{Kind: recovery.EventScanFinished})
	fmt.Println("built against", recovery.EventScanFinished)
}
`)
	if out := u.buildAndRun(); out != "built against scan_finished\n" {
		t.Fatalf("the user program printed %q", out)
	}
	sum := u.goSum()
	t.Logf("go.sum of a module using all three: %d lines", len(sum))
}

// TestAMinimalUserGetsNoDockerInGoSum: a worker that imports only the
// library and pgx gets nothing of the Docker client or testcontainers-go
// (the tests' fallback, internal/containers) in its go.sum. Before that
// fallback moved to a module of its own, the same module's go.sum had 141
// lines, 12 of them Docker's and testcontainers'.
func TestAMinimalUserGetsNoDockerInGoSum(t *testing.T) {
	u := newUserModule(t, []string{modcheck.RootPath}, `package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alya/recovery/postgres/pgxreset"
)

func main() {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	_, err = pgxreset.New(pool)
	fmt.Println("resetter:", err == nil)
}
`)
	if out := u.buildAndRun(); out != "resetter: true\n" {
		t.Fatalf("the user program printed %q", out)
	}
	sum := u.goSum()
	t.Logf("go.sum of a module using the library and pgx: %d lines", len(sum))
	for _, line := range sum {
		if l := strings.ToLower(line); strings.Contains(l, "docker") || strings.Contains(l, "testcontainers") {
			t.Errorf("go.sum carries %s", line)
		}
	}
}

// TestTheTestCommandBuildsNothingOfDocker: make test (and make lint) work in
// the workspace, so go.work leaves out internal/containers, whose
// requirements are Docker's client and testcontainers-go (44 modules,
// 213 MB), and no package make test builds depends on a module of theirs.
// Before internal/containers left the workspace, make lint downloaded and
// vetted them all. The same holds for internal/sidebyside (make
// sidebyside), whose requirements are asynq and River.
func TestTheTestCommandBuildsNothingOfDocker(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range work.Use {
		if filepath.Clean(u.Path) == filepath.Join("internal", "containers") {
			t.Errorf("go.work uses %s: every workspace command then needs Docker's modules", u.Path)
		}
		if filepath.Clean(u.Path) == filepath.Join("internal", "sidebyside") {
			t.Errorf("go.work uses %s: every workspace command then needs asynq and River", u.Path)
		}
	}
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{.Path}}{{end}}",
		"./...", "./prom/...", "./otel/...", "./internal/modcheck/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	modules := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		modules[m] = true
	}
	t.Logf("make test builds packages of %d modules", len(modules))
	for m := range modules {
		if l := strings.ToLower(m); strings.Contains(l, "docker") || strings.Contains(l, "testcontainers") || strings.Contains(l, "moby") ||
			strings.Contains(l, "hibiken/asynq") || strings.Contains(l, "riverqueue") {
			t.Errorf("make test builds a package of %s", m)
		}
	}
}
