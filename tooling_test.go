package recovery

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// installDeps runs scripts/install-deps.sh for set on a PATH that has
// nothing it looks for, with apt-get replaced by a stub that prints what it
// was asked to install; it returns those packages (PostgreSQL's only where
// the host has no PostgreSQL binaries in Debian's place).
func installDeps(t *testing.T, set string, env ...string) []string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("install-deps.sh stops before apt-get when not root and has no sudo")
	}
	bin := t.TempDir()
	stub := "#!/bin/sh\n[ \"$1\" = install ] && shift 4 && echo \"$@\"\nexit 0\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "apt-get"), []byte(stub), 0o755))
	for _, tool := range []string{"id", "sh"} {
		path, err := exec.LookPath(tool)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(path, filepath.Join(bin, tool)))
	}
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	cmd := exec.Command(bash, "scripts/install-deps.sh", set)
	cmd.Env = append([]string{"PATH=" + bin}, env...)
	out, err := cmd.Output()
	require.NoError(t, err, "install-deps.sh %s", set)
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if p != "postgresql" {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs
}

// TestEachTargetInstallsOnlyWhatItNeeds: make test installs the servers,
// tmux, promtool and pgbouncer, never spin or gcc; make demo nothing but
// the servers; make model only spin and gcc; and each target's
// recipe asks for its own set.
func TestEachTargetInstallsOnlyWhatItNeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/install-deps.sh")
	}
	assert.Equal(t, []string{"redis-server", "redis-tools", "tmux", "prometheus", "pgbouncer"}, installDeps(t, "test"))
	assert.Equal(t, []string{"tmux", "prometheus", "pgbouncer"}, installDeps(t, "test", "REDIS_URL=redis://x", "DATABASE_URL=postgres://x"))
	assert.Equal(t, []string{"redis-server"}, installDeps(t, "demo"))
	assert.Equal(t, []string{"spin", "gcc"}, installDeps(t, "model"))
	assert.Equal(t, []string{"redis-server", "redis-tools", "iproute2", "pgbouncer"}, installDeps(t, "faults"))
	assert.Equal(t, []string{"redis-server", "redis-tools", "iproute2", "tmux", "prometheus", "pgbouncer", "spin", "gcc"}, installDeps(t, "all"))

	makefile, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	for target, set := range map[string]string{"test": "test", "demo": "demo", "model": "model",
		"test-faults": "faults", "test-integration": "test", "bench": "test", "deps": "all"} {
		recipe := regexp.MustCompile(`(?ms)^` + regexp.QuoteMeta(target) + `:[^\n]*\n((?:\t[^\n]*\n)*)`).FindSubmatch(makefile)
		require.NotNil(t, recipe, "target %s", target)
		assert.Contains(t, string(recipe[1]), "scripts/install-deps.sh "+set+"\n", "make %s installs the %q set", target, set)
	}
}

// The PostgreSQL packages keep to their side of the import graph: a
// database/sql user and recoveryctl's ops link no
// pgx (go list -deps ./postgres/sqlreset ./ops holds no github.com/jackc/),
// and nothing under ./postgres/... or internal/pgcore imports the root, so
// the root's own tests can import pgxreset and sqlreset.
func TestPostgresPackagesKeepTheirImportGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "./postgres/sqlreset", "./ops").Output()
	require.NoError(t, err, "go list -deps")
	for _, dep := range strings.Fields(string(out)) {
		assert.False(t, strings.HasPrefix(dep, "github.com/jackc/"), "sqlreset or ops links %s", dep)
	}
	out, err = exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`,
		"./postgres/...", "./internal/pgcore").Output()
	require.NoError(t, err, "go list -f")
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.GreaterOrEqual(t, len(lines), 4, "postgres, pgxreset, sqlreset and pgcore")
	for _, line := range lines {
		pkg, deps, _ := strings.Cut(line, ":")
		for _, dep := range strings.Fields(deps) {
			assert.NotEqual(t, "github.com/alya/recovery", dep, "%s imports the root package", pkg)
		}
	}
	out, err = exec.Command("go", "list", "-deps", "./postgres/pgxreset").Output()
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(out)), "github.com/jackc/pgx/v5", "the check sees pgx where it is")
}

// A worker's binary links what the package's production code imports:
// the loops hold test signals (internal/testsignal), and that package must
// not bring the testing package (its flags and code) into users' programs.
func TestTheLibraryDoesNotLinkTheTestingPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".", "./ops", "./postgres/...").Output()
	require.NoError(t, err, "go list -deps")
	deps := strings.Fields(string(out))
	require.True(t, slices.Contains(deps, "github.com/alya/recovery/internal/testsignal"), "the check sees the signals' package")
	assert.False(t, slices.Contains(deps, "testing"), "the library's packages link the testing package")
}

// sleepKinds are the reasons a time.Sleep may stay in the package's tests
// (issue 23: tests wait on the loops' signals, not on the clock). Each
// remaining sleep says which, in a comment on its line or ending on the line
// above that begins with the marker:
//   - "real time:" the time passing is what the test measures, and nothing
//     a test can observe marks it (a snapshot's absolute expiry times);
//   - "pace:" a simulated host's work, back-off or crashes take this long;
//     nothing is awaited;
//   - "fake clock:" the sleep moves a testing/synctest bubble's fake clock.
var sleepKinds = []string{"real time:", "pace:", "fake clock:"}

// sleepsIn reads the _test.go files of dir, whatever their build tags, and
// returns the places (file:line) of their time.Sleep calls by the kind their
// comment names, and those that name none.
func sleepsIn(t *testing.T, dir string) (byKind map[string][]string, unmarked []string) {
	t.Helper()
	byKind = map[string][]string{}
	eachTestFile(t, dir, sleepKinds, func(fset *token.FileSet, f *ast.File, markerAt map[int]string) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Sleep" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "time" {
				return true
			}
			line := fset.Position(call.Pos()).Line
			if k, ok := markerAt[line]; ok {
				byKind[k] = append(byKind[k], place(fset, call))
			} else {
				unmarked = append(unmarked, place(fset, call))
			}
			return true
		})
	})
	return byKind, unmarked
}

// eachTestFile parses each _test.go file of dir, whatever its build tags,
// and hands fn the file and the markers among kinds that its lines carry
// (markersOf).
func eachTestFile(t *testing.T, dir string, kinds []string, fn func(fset *token.FileSet, f *ast.File, markerAt map[int]string)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, name := range files {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		require.NoError(t, err)
		fn(fset, f, markersOf(fset, f, src, kinds))
	}
}

// place is where n is: its file's base name and its line.
func place(fset *token.FileSet, n ast.Node) string {
	pos := fset.Position(n.Pos())
	return fmt.Sprintf("%s:%d", filepath.Base(pos.Filename), pos.Line)
}

// markersOf returns the marker among kinds that each line of f (its source
// src) carries: a comment on the line that begins with it, or a comment
// group alone on its lines, ending on the line before, whose first line
// begins with it. A comment after the code of the line before marks only
// that line.
func markersOf(fset *token.FileSet, f *ast.File, src []byte, kinds []string) map[int]string {
	lines := strings.Split(string(src), "\n")
	markerAt := map[int]string{}
	for _, g := range f.Comments {
		text := strings.TrimSpace(strings.TrimPrefix(g.List[0].Text, "//"))
		for _, k := range kinds {
			if strings.HasPrefix(text, k) {
				start := fset.Position(g.Pos())
				end := fset.Position(g.End()).Line
				markerAt[end] = k // a comment at the end of the line
				if strings.TrimSpace(lines[start.Line-1][:start.Column-1]) == "" {
					markerAt[end+1] = k // a comment group just above it
				}
			}
		}
	}
	return markerAt
}

// No test of the package waits for a loop by sleeping: each sleep left says
// why the clock is what it needs (sleepKinds). A new sleep without a marker
// fails here; waits on a loop use its test signal (testsignals.go).
func TestEverySleepInTheTestsSaysWhyItIsNotAWait(t *testing.T) {
	byKind, unmarked := sleepsIn(t, ".")
	for _, k := range sleepKinds {
		t.Logf("%-12s %2d  %v", k, len(byKind[k]), byKind[k])
	}
	assert.Empty(t, unmarked, "sleeps with no marker (%v): wait on the loop's test signal instead, or say why the clock is needed", sleepKinds)
}

// The check of TestEverySleepInTheTestsSaysWhyItIsNotAWait sorts sleeps by
// their markers, on the line or just above (not after the code of the line
// above), and finds the unmarked ones,
// in files of any build tag (testdata/testwaits holds a test file
// tagged sim, and a file that is not a test).
func TestSleepsInSortsSleepsByTheirMarkers(t *testing.T) {
	byKind, unmarked := sleepsIn(t, "testdata/testwaits")
	assert.Equal(t, map[string][]string{
		"pace:":       {"x_test.go:8"},
		"fake clock:": {"x_test.go:11"},
		"real time:":  {"x_test.go:14"},
	}, byKind)
	assert.Equal(t, []string{"x_test.go:12", "x_test.go:16", "x_test.go:17", "x_test.go:19"}, unmarked, "not x.go: only tests")
}

// pollsIn reads the _test.go files of dir, whatever their build tags, and
// returns the places (file:line) of the Eventually polls (testify's
// Eventually and EventuallyWithT) whose condition reads a log (a call of
// Count or String on a name ending in "log" or "logs", any case), a
// Worker's Stats, or a loop's state through an atomic Load: what a loop's
// test signal tells instead (issue 23), or Healthy and CheckLease, which
// read that state; directly or through a closure of the file that the
// condition calls. It goes by names, not types; a poll of PostgreSQL or
// Redis is not counted, nor a log in the message of a check inside the
// condition, nor a poll marked "poll:" (on its line or just above: a state
// that the clock changes with no loop's turn, a lease running out while its
// heartbeat is frozen, say), which says why.
func pollsIn(t *testing.T, dir string) []string {
	t.Helper()
	logName := regexp.MustCompile(`(?i)logs?$`)
	var polls []string
	eachTestFile(t, dir, []string{"poll:"}, func(fset *token.FileSet, f *ast.File, marked map[int]string) {
		// The closures the file names (scans := func() ...), by name: a
		// condition that calls one reads what it reads.
		closures := map[string][]*ast.FuncLit{}
		ast.Inspect(f, func(n ast.Node) bool {
			if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
				for i, rhs := range as.Rhs {
					id, isID := as.Lhs[i].(*ast.Ident)
					if lit, isLit := rhs.(*ast.FuncLit); isID && isLit {
						closures[id.Name] = append(closures[id.Name], lit)
					}
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Eventually" && sel.Sel.Name != "EventuallyWithT") {
				return true
			}
			if _, ok := marked[fset.Position(call.Pos()).Line]; ok {
				return true
			}
			reads := false
			seen := map[*ast.FuncLit]bool{}
			var walk func(lit *ast.FuncLit)
			walk = func(lit *ast.FuncLit) {
				if seen[lit] {
					return
				}
				seen[lit] = true
				ast.Inspect(lit.Body, func(n ast.Node) bool {
					c, ok := n.(*ast.CallExpr)
					if !ok {
						return !reads
					}
					if id, ok := c.Fun.(*ast.Ident); ok {
						for _, cl := range closures[id.Name] {
							walk(cl) // a closure of the file the condition calls
						}
						return !reads
					}
					s, ok := c.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					if id, ok := s.X.(*ast.Ident); ok && (id.Name == "require" || id.Name == "assert" || id.Name == "t") {
						return false // a check inside the condition: a log in its message is not polled
					}
					switch s.Sel.Name {
					case "Stats", "Load", "Healthy", "CheckLease":
						reads = true
					case "Count", "String":
						if id, ok := s.X.(*ast.Ident); ok && logName.MatchString(id.Name) {
							reads = true
						}
					}
					return !reads
				})
			}
			for _, arg := range call.Args {
				if lit, ok := arg.(*ast.FuncLit); ok {
					walk(lit)
				}
			}
			if reads {
				polls = append(polls, place(fset, call))
			}
			return true
		})
	})
	return polls
}

// No test of the package polls a log, Stats or a loop's state for what a
// loop does: it waits for the loop's turn (waitTurns, testsignals.go); a
// poll of what the clock alone changes says so ("poll:").
func TestNoTestPollsALogOrStatsForWhatALoopDoes(t *testing.T) {
	assert.Empty(t, pollsIn(t, "."), "Eventually polls of a log, Stats or a loop's state: wait on the loop's test signal instead (waitTurns)")
}

// The check of TestNoTestPollsALogOrStatsForWhatALoopDoes finds the polls
// of logs, Stats, Healthy, CheckLease and atomic state, also through a
// closure the condition calls, and leaves alone
// the polls of a database, those that only mention a log in their message
// and those marked "poll:".
func TestPollsInFindsPollsOfLogsAndStats(t *testing.T) {
	assert.Equal(t, []string{"x_test.go:38", "x_test.go:39", "x_test.go:40", "x_test.go:41", "x_test.go:63", "x_test.go:71"}, pollsIn(t, "testdata/testwaits"))
}

// Test files are named after the behaviour they test (issue 23): not after
// the review, the issue or the round that found something (the files once
// named review2 and hole22 were renamed).
func TestTestFilesAreNamedAfterBehaviours(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	occasion := regexp.MustCompile(`(?i)(^|_)(review|hole|issue|round|finding|fix|misc)\d*(_|$)`)
	for _, f := range files {
		assert.False(t, occasion.MatchString(strings.TrimSuffix(f, "_test.go")), "%s is named after an occasion, not a behaviour", f)
	}
	for _, bad := range []string{"review2", "hole22", "selfcheck_review", "issue21_fix"} {
		assert.True(t, occasion.MatchString(bad), "the check takes %s for an occasion", bad)
	}
}
