package recovery

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// make test (scripts/test.sh) runs this package's tests as two shards: the
// tests named in scripts/root-shard1.txt, and every other test. A name in
// the list that matches no test of the package (renamed, removed, or only
// under a build tag make test does not set) would leave that shard's
// length to chance, so the list names each test exactly once, as a Go
// identifier (the script anchors the names in one regular expression),
// and each is a Test function of the package's default build.
func TestTheFirstShardListNamesOnlyTestsThatExist(t *testing.T) {
	b, err := os.ReadFile("scripts/root-shard1.txt")
	require.NoError(t, err)
	script, err := os.ReadFile("scripts/test.sh")
	require.NoError(t, err)
	assert.Contains(t, string(script), "scripts/root-shard1.txt", "the script reads the list")

	pkg, err := build.Default.ImportDir(".", 0)
	require.NoError(t, err)
	tests := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range pkg.TestGoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") && fn.Name.Name != "TestMain" {
				tests[fn.Name.Name] = true
			}
		}
	}
	require.NotEmpty(t, tests)

	ident := regexp.MustCompile(`^Test[A-Za-z0-9_]*$`)
	seen := map[string]bool{}
	for i, line := range strings.Split(string(b), "\n") {
		name, _, _ := strings.Cut(line, "#")
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		at := "scripts/root-shard1.txt:" + strconv.Itoa(i+1)
		assert.Regexp(t, ident, name, "%s: one test name a line", at)
		assert.True(t, tests[name], "%s: %s is no test of the package (make test's default build)", at, name)
		assert.False(t, seen[name], "%s: %s listed twice", at, name)
		seen[name] = true
	}
	assert.NotEmpty(t, seen, "the first shard has tests")
}
