package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRepositoryCitesOnlyTestsThatExist runs the check on the repository:
// make test (and so CI) fails on a doc that cites a renamed or removed test,
// as make lint does.
func TestRepositoryCitesOnlyTestsThatExist(t *testing.T) {
	problems, err := check(filepath.Join("..", ".."))
	require.NoError(t, err)
	for _, p := range problems {
		t.Error(p)
	}
}

// writeTree writes files (slash-separated path to contents) under a new
// directory and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for path, text := range files {
		full := filepath.Join(root, filepath.FromSlash(path))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(text), 0o644))
	}
	return root
}

// TestCheckNamesEachCitationOfATestThatDoesNotExist plants bad citations of
// every kind next to good ones and expects exactly the bad ones, each with
// its file and line.
func TestCheckNamesEachCitationOfATestThatDoesNotExist(t *testing.T) {
	root := writeTree(t, map[string]string{
		// Tests behind build tags count: the files are parsed, not built.
		"a_test.go": "//go:build sim\n\npackage a\n\nimport \"testing\"\n\n" +
			"func TestAlpha(t *testing.T) {}\nfunc TestAlphaBeta(t *testing.T) {}\n" +
			"func BenchmarkGamma(b *testing.B) {}\nfunc FuzzDelta(f *testing.F) {}\nfunc ExampleEpsilon() {}\n" +
			"func Testimony() {}\n" + // not a test: a lower-case letter follows Test
			"type s struct{}\n\nfunc (s) TestMethod(t *testing.T) {}\n", // not a test: a method
		"sub/b_test.go": "//go:build faults\n\npackage sub\n\nimport \"testing\"\n\nfunc TestSub(t *testing.T) {}\n",
		"docs/x.md": "# Tests\n" +
			"`TestAlpha` and `ExampleEpsilon` exist; `TestMissing` does not.\n" + // line 2
			"`TestAlp...` abbreviates; `TestZed…` matches nothing.\n" + // line 3
			"Subtest `TestAlpha/case_one`; River's `rescuer.TestSignals`; Testimony.\n" + // line 4
			"`go test -run 'TestAlpha|TestNope' ./sub/` and\n" + // line 5
			"`go test -tags faults -run\n'TestSub' ./sub/`; `-run TestAlphaBeta .`\n" + // lines 6, 7
			"`-bench Gamma`, `-bench TestAlpha`, `-fuzz FuzzDelta`, `-run '^$'`, `-run Alpha/x`.\n" + // line 8
			"Prose: use -run or -bench.\n" +
			"`TestMethod`\n" + // line 10
			"Files: `a_test.go`, `./sub/b_test.go`, `b_test.go`, `*_test.go`, `a_*_test.go`,\n" + // line 11
			"`sub/a_test.go`, `gone_test.go`.\n", // line 12
		"Makefile": "sim:\n\tgo test -run 'TestAlpha$$' -seeds $(SEEDS) .\n\tgo test -run 'TestGone$$' .\n" +
			"\tgo test -run $(RUN) .\n",
		"scripts/x.sh": "go test -run TestSub ./sub/...\n",
		"c.go":         "package a\n\n// Covered by TestAlpha; see TestGoneToo.\nfunc f() {}\n\n/*\nTestGoneThree\n*/\n",
		// Nothing under testdata is read, nor plans of work not built yet.
		"testdata/d.md":   "`TestInTestdata`\n",
		"docs/plans/v.md": "`TestToBeWritten`\n",
	})
	problems, err := check(root)
	require.NoError(t, err)
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	assert.Equal(t, []string{
		"Makefile:3: -run \"TestGone$$\": \"TestGone$$\" matches no Test/Example/Fuzz in .",
		"c.go:3: TestGoneToo: no test of that name in any _test.go file",
		"c.go:7: TestGoneThree: no test of that name in any _test.go file",
		"docs/x.md:2: TestMissing: no test of that name in any _test.go file",
		"docs/x.md:3: TestZed...: no test's name starts with TestZed",
		"docs/x.md:5: -run \"TestAlpha|TestNope\": \"TestAlpha\" matches no Test/Example/Fuzz in ./sub/",
		"docs/x.md:5: -run \"TestAlpha|TestNope\": \"TestNope\" matches no Test/Example/Fuzz in ./sub/",
		"docs/x.md:8: -bench \"TestAlpha\": \"TestAlpha\" matches no Benchmark in any package",
		"docs/x.md:10: TestMethod: no test of that name in any _test.go file",
		"docs/x.md:11: a_*_test.go: no such test file",
		"docs/x.md:12: sub/a_test.go: no such test file",
		"docs/x.md:12: gone_test.go: no such test file",
	}, got)
}

// TestCheckNamesEachCitationOfAnIdentifierThatDoesNotExist plants good and
// bad citations of identifiers, qualified and not, and retired names in
// and out of docs/migrating.md's old-names regions, and expects exactly
// the bad ones.
func TestCheckNamesEachCitationOfAnIdentifierThatDoesNotExist(t *testing.T) {
	root := writeTree(t, map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26\n",
		"a.go": "package recovery\n\nimport \"example.com/m/internal/contract\"\n\n" +
			"type Worker struct{ Name string }\n\nfunc (*Worker) Start() {}\nfunc New() *Worker { return nil }\n" +
			"type Info = contract.Info\ntype Stats struct{ contract.Base }\n" +
			"type Resetter interface{ Reset() }\nconst EventX = 1\nvar ErrX error\ntype Plan struct{}\n",
		// Files another build selects count: parsed, not built.
		"b.go":                   "//go:build sim\n\npackage recovery\n\nfunc Tagged() {}\n",
		"c_test.go":              "package recovery\n\nfunc InTest() {}\n",
		"internal/contract/c.go": "package contract\n\ntype Info struct{ Ledger bool }\ntype Base struct{ Count int }\n",
		"ops/o.go":               "package ops\n\nfunc Inspect() {}\nconst PlanReset = 1\n",
		"postgres/pgxreset/p.go": "package pgxreset\n\ntype Resetter struct{}\n\nfunc (*Resetter) LedgerDDL() string { return \"\" }\nfunc New() {}\n",
		"docs/migrating.md": "# Migrating\n" +
			"<!-- doccheck:old-names -->\n" + // line 2
			"```go\nw, _ := recovery.NewOld(recovery.WithGone())\n```\n" + // lines 3-5: not checked
			"| before | after |\n|---|---|\n" + // lines 6, 7
			"| `recovery.NewOld` | `pgxreset.New` |\n" + // line 8
			"| `ops.PlanReset` | `ops.PlanReset` |\n" + // line 9
			"| `recovery.Worker.Old` | `ops.Nope(ctx, w)` |\n" + // line 10: ops.Nope does not exist
			"| `recovery.Plan`, `recovery.Resetter.Reset` | `recovery.Worker` |\n" + // line 11: both defined again
			"<!-- doccheck:end -->\n" + // line 12
			"Use `pgxreset.New`, not `NewOld`.\n", // line 13: a retired name outside the region
		"docs/x.md": "# Names\n" +
			"`recovery.New`, `recovery.Worker.Start`, `recovery.Worker.Name`, `ops.Inspect`, `recovery.Tagged`.\n" + // line 2
			"`recovery.InTest`, `recovery.Worker.Stop`, `ops.Gone`, `sqlreset.New`.\n" + // line 3
			"`recovery.Info.Ledger`, `Info.Ledger`, `Stats.Count`, `Stats.Nope`, `Resetter.Reset`, `Resetter.LedgerDDL`, `Resetter.Nope`.\n" + // line 4
			"`recovery.ErrX.Error`, `Unknown.Thing`, github.com/x/recovery.Nope, `recovery.EventX`.\n" + // line 5
			"```go\nr := recovery.NewOld()\nNewOld(PlanReset)\nw.Old()\n```\n" + // lines 6-10
			"Prose: NewOld, `Worker.Old`, `recovery.Worker.Old`.\n" + // line 11: bare names are checked only in code
			"`recovery.Plan`, `Plan{}`, `Resetter.Reset`, `recovery.Resetter.Reset`.\n", // line 12: names defined again
		"docs/plans/p.md": "`recovery.Planned`, `NewOld`\n",
	})
	problems, err := check(root)
	require.NoError(t, err)
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	assert.Equal(t, []string{
		"docs/migrating.md:10: ops.Nope: package ops (ops) has no exported Nope",
		"docs/migrating.md:13: NewOld: not in the v2 root (docs/migrating.md: `pgxreset.New`)",
		"docs/x.md:3: recovery.InTest: package recovery (.) has no exported InTest",
		"docs/x.md:3: recovery.Worker.Stop: recovery.Worker has no method or field Stop",
		"docs/x.md:3: ops.Gone: package ops (ops) has no exported Gone",
		"docs/x.md:3: sqlreset.New: package sqlreset (postgres/sqlreset) has no exported New",
		"docs/x.md:4: Stats.Nope: no type Stats (in .) has a method or field Nope",
		"docs/x.md:4: Resetter.Nope: no type Resetter (in ., postgres/pgxreset) has a method or field Nope",
		"docs/x.md:7: recovery.NewOld: not in the v2 root (docs/migrating.md: `pgxreset.New`)",
		"docs/x.md:8: NewOld: not in the v2 root (docs/migrating.md: `pgxreset.New`)",
		"docs/x.md:11: recovery.Worker.Old: not in the v2 root (docs/migrating.md: `ops.Nope(ctx, w)`)",
		"docs/x.md:11: Worker.Old: not in the v2 root (docs/migrating.md: `ops.Nope(ctx, w)`)",
	}, got)
}
