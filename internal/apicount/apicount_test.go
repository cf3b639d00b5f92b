package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCountsEachKindOfExportedIdentifierOnce counts a package with one of
// everything: what the total includes, what it leaves out (unexported
// names, methods of unexported types, test files, files another build tag
// selects) and the fields reported apart.
func TestCountsEachKindOfExportedIdentifierOnce(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"a.go": `package p

const (
	A, B = 1, 2
	c    = 3
)

var V, w int

func F()  {}
func g()  {}

type T struct {
	Field, other int
	Embedded
	*E2
}

type Embedded struct{}
type E2 struct{}
type hidden struct{ X int }

func (T) M()         {}
func (*T) N()        {}
func (T) n()         {}
func (hidden) Y()    {}
func (G[X]) Z()      {}

type G[X any] struct{}

type I interface {
	Do()
	undo()
	Embedded2
}

type Embedded2 interface{ Other() }
`,
		"a_test.go":   "package p\n\nfunc TestX() {}\n\nconst InTest = 1\n",
		"tagged.go":   "//go:build simmutants\n\npackage p\n\nconst Tagged = 1\n",
		"untagged.go": "//go:build !simmutants\n\npackage p\n\nconst Untagged = 1\n",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	c, err := countDir(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"A", "B", "Untagged"}, c.consts)
	assert.Equal(t, []string{"V"}, c.vars)
	assert.Equal(t, []string{"F"}, c.funcs)
	assert.Equal(t, []string{"E2", "Embedded", "Embedded2", "G", "I", "T"}, c.types)
	assert.Equal(t, []string{"Embedded2.Other", "G.Z", "I.Do", "T.M", "T.N"}, c.methods)
	assert.Equal(t, []string{"T.E2", "T.Embedded", "T.Field"}, c.fields)
	assert.Equal(t, 3+1+1+6+5, c.total())
}

// handles are the exported types a host holds for a while that hold the
// *Worker they came from, as database/sql's Tx holds its DB: a host's
// handle on the Worker, not one of its parts wired to another.
var handles = map[string]bool{"Block.w": true}

// TestRootPackageCount asserts that the root package exports at most
// rootLimit identifiers, and logs its figures.
func TestRootPackageCount(t *testing.T) {
	c, err := countDir(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.NotEmpty(t, c.types)
	t.Logf("root package: constants %d, variables %d, functions %d, types %d, methods %d: %d; fields apart %d",
		len(c.consts), len(c.vars), len(c.funcs), len(c.types), len(c.methods), c.total(), len(c.fields))
	assert.LessOrEqual(t, c.total(), rootLimit,
		"the root package exports %d identifiers, more than %d: move, merge or unexport one (go run ./internal/apicount -v .)",
		c.total(), rootLimit)
}

// TestWorkerIsLifecycleAndWiring asserts the Worker's limits, and logs its
// figures.
func TestWorkerIsLifecycleAndWiring(t *testing.T) {
	s, err := shapeOf(filepath.Join("..", ".."), "Worker")
	require.NoError(t, err)
	require.NotEmpty(t, s.methods)
	t.Logf("Worker: %d fields (%s), %d methods; longest function %s",
		len(s.fields), strings.Join(s.fields, ", "), len(s.methods), s.longest)
	assert.LessOrEqual(t, len(s.fields), workerFieldLimit, "Worker fields: %v", s.fields)
	assert.LessOrEqual(t, len(s.methods), workerMethodLimit, "Worker methods: %v", s.methods)
	var parts []string
	for _, h := range s.holders {
		if !handles[h] {
			parts = append(parts, h)
		}
	}
	assert.Empty(t, parts, "types that hold a *Worker: build them with what they use")
}

// shapeOf counts what it is asked to: a made-up package.
func TestShapeOfCountsFieldsMethodsAndHolders(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.go"), []byte(`package a

type W struct {
	a, b int
	embedded
	c *W
}

type embedded struct{}

type loop struct{ w *W }

func (w *W) One() {}
func (w W) two()  {}
func (l *loop) run() {
	_ = 1
	_ = 2
}
`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a_test.go"), []byte("package a\n\nfunc (w *W) three() {}\n"), 0o644))
	s, err := shapeOf(dir, "W")
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "embedded", "c"}, s.fields)
	assert.Equal(t, []string{"One (a.go)", "two (a.go)"}, s.methods)
	assert.Equal(t, []string{"loop.w"}, s.holders)
	assert.Equal(t, "loop.run (4 lines)", s.longest)
	_, err = shapeOf(dir, "Missing")
	assert.Error(t, err)
}
