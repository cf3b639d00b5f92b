package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The docs are a reference a user reads to act: the README stays at most
// readmeWords, and the README with docs/ at most docsWords (words as
// wc -w counts them). A doc that grows past its budget trims elsewhere.
const (
	readmeWords = 1500
	docsWords   = 25000
)

// TestDocsStayWithinTheirWordBudgets counts the README's words and those
// of every Markdown file under docs/.
func TestDocsStayWithinTheirWordBudgets(t *testing.T) {
	root := filepath.Join("..", "..")
	words := func(path string) int {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return len(strings.Fields(string(b)))
	}
	readme := words(filepath.Join(root, "README.md"))
	total := readme
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			n := words(path)
			t.Logf("%s: %d words", path, n)
			total += n
		}
		return err
	})
	require.NoError(t, err)
	t.Logf("README.md: %d words; with docs/: %d", readme, total)
	assert.LessOrEqual(t, readme, readmeWords, "README.md's words")
	assert.LessOrEqual(t, total, docsWords, "README.md and docs/ together")
}
