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
