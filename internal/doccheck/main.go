// Command doccheck fails when the repository's prose cites a test or an
// identifier that does not exist: a renamed or removed test or API name
// leaves docs that send a reader (or a reviewer checking a claim) to
// nothing.
//
// It collects every top-level Test, Benchmark, Example and Fuzz function of
// every _test.go file under the root, whatever its build tags (sim,
// simmutants, faults, containers: files are parsed, not built), and checks
// what cites them:
//
//   - Markdown files, the Makefile, shell scripts and .ci/ files, and the
//     comments of Go files.
//   - A name as such (`TestWorkerStarts`) must be a test's exact name;
//     `TestFoo/sub` is checked for TestFoo.
//   - A name followed by "..." or "…" abbreviates: some test's name must
//     start with it.
//   - A test file (`fleet_test.go`, `internal/faults/scenarios_test.go`,
//     `sim_*_test.go`) must exist: a path matches a file at that path or
//     ending in it, a bare name a file of that name in any directory, and
//     a * matches as in path.Match.
//   - The pattern after -run, -bench or -fuzz (`-run 'TestA|TestB' ./pkg/`)
//     is checked as go test reads it: each alternative of its first level
//     must match some test (a Benchmark for -bench, a Fuzz target for
//     -fuzz), among the tests of the package path that follows it on the
//     same line when there is one. Alternatives that match the empty string
//     ('^$': run nothing) and shell variables are left alone, and so is an
//     unquoted pattern of lower-case letters only (prose: "-run or -bench").
//
// It also checks the Go identifiers the Markdown files cite
// (`recovery.New`, `ops.Inspect`, `recovery.Worker.Start`, `Stats.OwnerMode`)
// against the packages' sources, and that no Markdown file but the
// migration notes cites a name v2 took out of the root: names.go says how,
// and how docs/migrating.md marks its "before" column (<!--
// doccheck:old-names --> regions).
//
// Usage: go run ./internal/doccheck [root] (root defaults to "."). It prints
// one line per bad citation, file:line first, and exits 1 if there is any.
// make lint runs it; its own test runs it on the repository under make test.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"go/ast"
	"go/parser"
	"go/token"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "doccheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "doccheck: %d bad citation(s) of tests or identifiers\n", len(problems))
		os.Exit(1)
	}
}

// problem is one bad citation.
type problem struct {
	file string // relative to the root, slash-separated
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.msg) }

// tree is what citations may name: the test functions, and the paths of
// the _test.go files (relative to the root, slash-separated).
type tree struct {
	funcs []testFunc
	files []string
}

// testFunc is one test function: its name and the directory of its file,
// relative to the root.
type testFunc struct {
	name string
	dir  string
}

// source is a text that may cite tests: a file's contents, or a Go comment
// with the line it starts on.
type source struct {
	file string
	line int
	text string
}

// check walks root and returns every bad citation, in file and line order.
func check(root string) ([]problem, error) {
	var tests tree
	var sources, docs []source // docs: the Markdown files
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "vendor", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		switch {
		case strings.HasSuffix(name, ".go"):
			// This package's own comments show bad citations on purpose.
			ownFile := strings.HasPrefix(rel, "internal/doccheck/")
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return fmt.Errorf("parse %s: %w", rel, err)
			}
			if strings.HasSuffix(name, "_test.go") {
				tests.files = append(tests.files, rel)
				for _, decl := range f.Decls {
					fn, ok := decl.(*ast.FuncDecl)
					if ok && fn.Recv == nil && kindOf(fn.Name.Name) != "" {
						tests.funcs = append(tests.funcs, testFunc{name: fn.Name.Name, dir: filepath.ToSlash(filepath.Dir(rel))})
					}
				}
			}
			for _, cg := range f.Comments {
				if ownFile {
					break
				}
				sources = append(sources, source{file: rel, line: fset.Position(cg.Pos()).Line, text: commentText(cg)})
			}
		case strings.HasPrefix(rel, "docs/plans/"):
			// Plans of work not built yet name the tests it will add.
		case strings.HasSuffix(name, ".md"), name == "Makefile", strings.HasSuffix(name, ".sh"),
			strings.HasPrefix(rel, ".ci/"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			src := source{file: rel, line: 1, text: string(b)}
			sources = append(sources, src)
			if strings.HasSuffix(name, ".md") {
				docs = append(docs, src)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var problems []problem
	for _, s := range sources {
		problems = append(problems, checkSource(s, tests)...)
	}
	names, err := newNameChecker(root, docs)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		ps, err := names.check(d)
		if err != nil {
			return nil, err
		}
		problems = append(problems, ps...)
	}
	sort.SliceStable(problems, func(i, j int) bool {
		if problems[i].file != problems[j].file {
			return problems[i].file < problems[j].file
		}
		return problems[i].line < problems[j].line
	})
	return problems, nil
}

// commentText is a comment group's text with its markers removed but its
// lines kept, so that line numbers stay right (CommentGroup.Text drops
// blank lines and directives).
func commentText(cg *ast.CommentGroup) string {
	var b strings.Builder
	for i, c := range cg.List {
		if i > 0 {
			b.WriteByte('\n')
		}
		t := c.Text
		switch {
		case strings.HasPrefix(t, "//"):
			t = t[2:]
		case strings.HasPrefix(t, "/*"):
			t = strings.TrimSuffix(t[2:], "*/")
		}
		b.WriteString(t)
	}
	return b.String()
}

// kindOf returns the prefix that makes name a test function for go test
// (Test, Benchmark, Example, Fuzz: the prefix alone, or followed by
// anything but a lower-case letter), or "".
func kindOf(name string) string {
	for _, k := range []string{"Test", "Benchmark", "Example", "Fuzz"} {
		rest, ok := strings.CutPrefix(name, k)
		if !ok {
			continue
		}
		if rest == "" || !(rest[0] >= 'a' && rest[0] <= 'z') {
			return k
		}
	}
	return ""
}

var (
	// citation is a test name in prose: a Test, Benchmark, Example or Fuzz
	// prefix followed by an upper-case letter, a digit or an underscore,
	// not part of a longer or qualified identifier, with what follows it
	// ("..." or "…" for a prefix).
	citation = regexp.MustCompile(`(^|[^A-Za-z0-9_.])((?:Test|Benchmark|Example|Fuzz)[A-Z0-9_][A-Za-z0-9_]*)(\.\.\.|…)?`)
	// runFlag is go test's -run, -bench or -fuzz flag and its pattern
	// (quoted or a bare word), possibly on the next line.
	runFlag = regexp.MustCompile(`(?:^|[\s(` + "`" + `])-(?:test\.)?(run|bench|fuzz)(?:=|\s+)('[^']*'|"[^"]*"|[^\s'"` + "`" + `]+)`)
	// pkgPath is a package path argument of go test.
	pkgPath = regexp.MustCompile(`(?:^|\s)(\.(?:/[A-Za-z0-9_./-]*)?)(?:\s|$)`)
	// testFile is a _test.go file's name or path; * is a wildcard.
	testFile = regexp.MustCompile(`(^|[^A-Za-z0-9_./*-])((?:\./)?([A-Za-z0-9_.*-]+/)*[A-Za-z0-9*][A-Za-z0-9_.*-]*_test\.go)`)
	// lowerWord is an unquoted word of lower-case letters: prose after a
	// flag's name, not a pattern.
	lowerWord = regexp.MustCompile(`^[a-z]+$`)
	// shellVar is a shell or make variable in a pattern.
	shellVar = regexp.MustCompile(`\$[({A-Za-z_]`)
)

// checkSource returns the bad citations in one source.
func checkSource(s source, tests tree) []problem {
	var problems []problem
	lineAt := func(off int) int { return s.line + strings.Count(s.text[:off], "\n") }
	add := func(off int, format string, args ...any) {
		problems = append(problems, problem{file: s.file, line: lineAt(off), msg: fmt.Sprintf(format, args...)})
	}

	// Patterns of -run, -bench, -fuzz: checked as patterns, and their
	// spans left out of the name check below.
	var patternSpans [][2]int
	for _, m := range runFlag.FindAllStringSubmatchIndex(s.text, -1) {
		flag := s.text[m[2]:m[3]]
		raw := s.text[m[4]:m[5]]
		if lowerWord.MatchString(raw) {
			continue
		}
		pattern := strings.Trim(raw, `'"`)
		patternSpans = append(patternSpans, [2]int{m[4], m[5]})
		// The package path, if any, follows on the same line, before the
		// end of a Markdown code span.
		rest := s.text[m[5]:]
		if i := strings.IndexAny(rest, "\n`"); i >= 0 {
			rest = rest[:i]
		}
		dir := ""
		if pm := pkgPath.FindStringSubmatch(rest); pm != nil {
			dir = pm[1]
		}
		for _, msg := range checkPattern(flag, pattern, dir, tests.funcs) {
			add(m[4], "%s", msg)
		}
	}
	inPattern := func(off int) bool {
		for _, sp := range patternSpans {
			if off >= sp[0] && off < sp[1] {
				return true
			}
		}
		return false
	}

	for _, m := range citation.FindAllStringSubmatchIndex(s.text, -1) {
		if inPattern(m[4]) {
			continue
		}
		name := s.text[m[4]:m[5]]
		if m[6] >= 0 {
			if !anyTest(tests.funcs, func(t testFunc) bool { return strings.HasPrefix(t.name, name) }) {
				add(m[4], "%s...: no test's name starts with %s", name, name)
			}
			continue
		}
		if !anyTest(tests.funcs, func(t testFunc) bool { return t.name == name }) {
			add(m[4], "%s: no test of that name in any _test.go file", name)
		}
	}

	for _, m := range testFile.FindAllStringSubmatchIndex(s.text, -1) {
		cited := s.text[m[4]:m[5]]
		if !fileExists(tests.files, strings.TrimPrefix(cited, "./")) {
			add(m[4], "%s: no such test file", cited)
		}
	}
	return problems
}

// fileExists reports whether cited (a path pattern) matches one of files,
// or the end of one after a slash.
func fileExists(files []string, cited string) bool {
	for _, f := range files {
		for {
			if ok, _ := path.Match(cited, f); ok {
				return true
			}
			i := strings.IndexByte(f, '/')
			if i < 0 {
				break
			}
			f = f[i+1:]
		}
	}
	return false
}

// checkPattern checks the pattern of go test's -run, -bench or -fuzz flag
// against the tests of dir ("" or a path ending in "..." for every test
// under it), and returns what is wrong.
func checkPattern(flag, pattern, dir string, tests []testFunc) []string {
	if shellVar.MatchString(pattern) {
		return nil
	}
	top, _, _ := strings.Cut(pattern, "/")
	want := map[string][]string{"run": {"Test", "Example", "Fuzz"}, "bench": {"Benchmark"}, "fuzz": {"Fuzz"}}[flag]
	under := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(dir, "..."), "./"), "/")
	if under == "" || under == "." {
		under = "."
	}
	recursive := dir == "" || strings.HasSuffix(dir, "...")
	var candidates []string
	for _, t := range tests {
		if !contains(want, kindOf(t.name)) {
			continue
		}
		if t.dir == under || (recursive && (under == "." || strings.HasPrefix(t.dir, under+"/"))) {
			candidates = append(candidates, t.name)
		}
	}
	where := "any package"
	if dir != "" {
		where = dir
	}
	var msgs []string
	for _, alt := range strings.Split(top, "|") {
		re, err := regexp.Compile(alt)
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("-%s %q: %v", flag, pattern, err))
			continue
		}
		if re.MatchString("") {
			continue
		}
		matched := false
		for _, c := range candidates {
			if re.MatchString(c) {
				matched = true
				break
			}
		}
		if !matched {
			msgs = append(msgs, fmt.Sprintf("-%s %q: %q matches no %s in %s", flag, pattern, alt, strings.Join(want, "/"), where))
		}
	}
	return msgs
}

func anyTest(tests []testFunc, f func(testFunc) bool) bool {
	for _, t := range tests {
		if f(t) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
