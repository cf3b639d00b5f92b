package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The identifier check: the Markdown files (docs/plans/ and testdata left
// out) may cite only identifiers that exist.
//
//   - A qualified name, `recovery.X`, `ops.X`, `postgres.X`, `pgxreset.X` or
//     `sqlreset.X`, must be an exported constant, variable, function or
//     type of that package (citedPackages maps each name to its
//     directory); `recovery.T.M` must also name a method, field or
//     interface method of T, found through aliases (`type ResetRequest =
//     contract.ResetRequest`), defined types and embedded fields within
//     the module. A type from outside the module ends the search and the
//     member is taken on trust.
//   - An unqualified `T.M`, where T is an exported type of one of those
//     packages, must name a member of T in one of the packages that
//     define T (pgxreset.Resetter and the root's Resetter share a name).
//   - Retired names: the first column of the tables in the old-names
//     regions of docs/migrating.md lists the names v2 took out of the root
//     (`recovery.WithHeartbeatTTL`, `recovery.Worker.RecoverNow`), save
//     those the root defines again (definedAgain). Outside
//     such regions no Markdown file may cite them: neither qualified, nor
//     as `T.M`, nor (for a top-level name) bare inside a code span or a
//     fenced block, unless the replacement keeps the bare name
//     (`recovery.WithTable` became `postgres.WithTable`, so `WithTable`
//     still names something).
//
// An old-names region runs from a line holding <!-- doccheck:old-names -->
// to one holding <!-- doccheck:end -->. Within it, a table row's first cell
// (the "before" column) is not checked and the other cells are; any other
// line is not checked at all (a "before" code block). Regions may appear
// in any Markdown file; only docs/migrating.md's define retired names.

// citedPackages maps the package names docs qualify identifiers with to
// their directories, relative to the module root.
var citedPackages = map[string]string{
	"recovery": ".",
	"ops":      "ops",
	"postgres": "postgres",
	"pgxreset": "postgres/pgxreset",
	"sqlreset": "postgres/sqlreset",
}

// migrationDoc is the file whose old-names regions define retired names.
const migrationDoc = "docs/migrating.md"

const (
	regionStart = "<!-- doccheck:old-names -->"
	regionEnd   = "<!-- doccheck:end -->"
)

var (
	// qualifiedName is pkg.X or pkg.X.Y, not part of a path or a longer
	// selector.
	qualifiedName = regexp.MustCompile(`(^|[^A-Za-z0-9_./-])(recovery|ops|postgres|pgxreset|sqlreset)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)
	// memberName is an unqualified T.M.
	memberName = regexp.MustCompile(`(^|[^A-Za-z0-9_./-])([A-Z][A-Za-z0-9_]*)\.([A-Z][A-Za-z0-9_]*)`)
	// bareName is an identifier not preceded by a selector's dot.
	bareName = regexp.MustCompile(`(^|[^A-Za-z0-9_.])([A-Z][A-Za-z0-9_]*)`)
	// selectorRe is the .M that may follow a name.
	selectorRe = regexp.MustCompile(`^\.([A-Z][A-Za-z0-9_]*)`)
	// codeSpanRe is an inline Markdown code span on one line.
	codeSpanRe = regexp.MustCompile("`[^`\n]+`")
	// retiredRe is a root name in the "before" column.
	retiredRe = regexp.MustCompile(`^recovery\.([A-Z][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)?)$`)
	// firstIdent finds the last identifier of the first name in a
	// replacement cell's first code span (`pgxreset.New` gives New).
	firstIdent = regexp.MustCompile(`^(?:[a-z][A-Za-z0-9_]*\.)?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)?)`)
)

// retired is a name v2 took out of the root: Name is X or T.M.
type retired struct {
	name        string
	replacement string // the "after" cell, for the message
	keepsBare   bool   // the replacement has the same last identifier
}

// pkgInfo is what a package exports, as go/ast sees it.
type pkgInfo struct {
	exists bool
	names  map[string]bool
	types  map[string]*typeInfo
}

// typeInfo is one type's members, and where the search goes on.
type typeInfo struct {
	members map[string]bool
	next    []typeRef // alias target, underlying named type, embedded types
}

// typeRef names a type: its package's directory relative to the module
// root, or "" for a package outside the module.
type typeRef struct {
	dir, name string
}

// packages loads and caches packages by directory.
type packages struct {
	root, module string
	byDir        map[string]*pkgInfo
}

func newPackages(root string) (*packages, error) {
	// Without a go.mod (a tree in a test), only the package's own types
	// are followed.
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read go.mod: %w", err)
	}
	module := "\x00" // matches no import path
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			module = f[1]
		}
	}
	return &packages{root: root, module: module, byDir: map[string]*pkgInfo{}}, nil
}

// dirOf maps an import path to its directory in the module, or "".
func (ps *packages) dirOf(path string) string {
	if path == ps.module {
		return "."
	}
	if rest, ok := strings.CutPrefix(path, ps.module+"/"); ok {
		return rest
	}
	return ""
}

// load parses the non-test Go files of dir (every build tag: parsed, not
// built).
func (ps *packages) load(dir string) (*pkgInfo, error) {
	if p, ok := ps.byDir[dir]; ok {
		return p, nil
	}
	p := &pkgInfo{names: map[string]bool{}, types: map[string]*typeInfo{}}
	ps.byDir[dir] = p
	entries, err := os.ReadDir(filepath.Join(ps.root, filepath.FromSlash(dir)))
	if os.IsNotExist(err) {
		return p, nil
	}
	if err != nil {
		return nil, err
	}
	typ := func(name string) *typeInfo {
		t := p.types[name]
		if t == nil {
			t = &typeInfo{members: map[string]bool{}}
			p.types[name] = t
		}
		return t
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(ps.root, filepath.FromSlash(dir), name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s/%s: %w", dir, name, err)
		}
		if f.Name.Name == "main" {
			continue
		}
		p.exists = true
		imports := map[string]string{} // local name → directory in the module, or ""
		for _, im := range f.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			local := path[strings.LastIndex(path, "/")+1:]
			if im.Name != nil {
				local = im.Name.Name
			}
			imports[local] = ps.dirOf(path)
		}
		ref := func(e ast.Expr) (typeRef, bool) {
			for {
				switch x := e.(type) {
				case *ast.StarExpr:
					e = x.X
					continue
				case *ast.IndexExpr:
					e = x.X
					continue
				case *ast.IndexListExpr:
					e = x.X
					continue
				case *ast.Ident:
					return typeRef{dir: dir, name: x.Name}, true
				case *ast.SelectorExpr:
					if id, ok := x.X.(*ast.Ident); ok {
						return typeRef{dir: imports[id.Name], name: x.Sel.Name}, true
					}
				}
				return typeRef{}, false
			}
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					p.names[d.Name.Name] = true
					continue
				}
				if r, ok := ref(d.Recv.List[0].Type); ok {
					typ(r.name).members[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							p.names[n.Name] = true
						}
					case *ast.TypeSpec:
						p.names[s.Name.Name] = true
						t := typ(s.Name.Name)
						switch u := s.Type.(type) {
						case *ast.StructType:
							for _, fl := range u.Fields.List {
								for _, n := range fl.Names {
									t.members[n.Name] = true
								}
								if len(fl.Names) == 0 {
									if r, ok := ref(fl.Type); ok {
										t.members[r.name] = true
										t.next = append(t.next, r)
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range u.Methods.List {
								for _, n := range m.Names {
									t.members[n.Name] = true
								}
								if len(m.Names) == 0 {
									if r, ok := ref(m.Type); ok {
										t.next = append(t.next, r)
									}
								}
							}
						default:
							// An alias or a defined type: its members
							// are (for a defined type, the fields of)
							// the named type's.
							if r, ok := ref(s.Type); ok {
								t.next = append(t.next, r)
							}
						}
					}
				}
			}
		}
	}
	return p, nil
}

// memberState is what a member search found.
type memberState int

const (
	memberMissing memberState = iota
	memberFound
	memberUnknown // the search left the module
)

// member looks for m on the type r, through aliases and embedding.
func (ps *packages) member(r typeRef, m string, depth int) (memberState, error) {
	if r.dir == "" || depth > 8 {
		return memberUnknown, nil
	}
	p, err := ps.load(r.dir)
	if err != nil {
		return memberMissing, err
	}
	t := p.types[r.name]
	if t == nil {
		if !p.exists {
			return memberMissing, nil
		}
		// Predeclared (error, int64...) or not found: nothing to say.
		return memberUnknown, nil
	}
	if t.members[m] {
		return memberFound, nil
	}
	state := memberMissing
	for _, n := range t.next {
		s, err := ps.member(n, m, depth+1)
		if err != nil {
			return memberMissing, err
		}
		if s == memberFound {
			return memberFound, nil
		}
		if s == memberUnknown {
			state = memberUnknown
		}
	}
	return state, nil
}

// maskOldNames returns text with the parts of old-names regions that are
// not checked replaced by spaces (newlines kept, so offsets and lines stay
// right), and the retired names the regions' table rows list.
func maskOldNames(text string) (string, []retired) {
	b := []byte(text)
	var names []retired
	in := false
	off := 0
	for _, line := range strings.SplitAfter(text, "\n") {
		start := off
		off += len(line)
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.Contains(line, regionStart):
			in = true
			continue
		case strings.Contains(line, regionEnd):
			in = false
			continue
		case !in:
			continue
		}
		end := len(strings.TrimRight(line, "\n"))
		if !strings.HasPrefix(trimmed, "|") {
			blank(b[start : start+end])
			continue
		}
		// A table row: blank its first cell.
		lead := strings.Index(line, "|")
		cells := strings.Split(strings.TrimRight(line[lead+1:], "\n"), "|")
		first := cells[0]
		blank(b[start+lead+1 : start+lead+1+len(first)])
		after := ""
		if len(cells) > 1 {
			after = strings.TrimSpace(cells[1])
		}
		for _, span := range codeSpanRe.FindAllString(first, -1) {
			m := retiredRe.FindStringSubmatch(strings.Trim(span, "`"))
			if m == nil {
				continue
			}
			r := retired{name: m[1], replacement: after}
			if s := codeSpanRe.FindString(after); s != "" {
				if fm := firstIdent.FindStringSubmatch(strings.Trim(s, "`")); fm != nil {
					r.keepsBare = lastPart(fm[1]) == lastPart(m[1])
				}
			}
			names = append(names, r)
		}
	}
	return string(b), names
}

func blank(b []byte) {
	for i := range b {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
}

func lastPart(name string) string { return name[strings.LastIndex(name, ".")+1:] }

// codeSpans returns the spans of text that are code: fenced blocks and
// inline code spans.
func codeSpans(text string) [][2]int {
	var spans [][2]int
	fenced := false
	off := 0
	for _, line := range strings.SplitAfter(text, "\n") {
		start := off
		off += len(line)
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			spans = append(spans, [2]int{start, off})
			continue
		}
		for _, m := range codeSpanRe.FindAllStringIndex(line, -1) {
			spans = append(spans, [2]int{start + m[0], start + m[1]})
		}
	}
	return spans
}

// nameChecker checks identifier citations in Markdown files.
type nameChecker struct {
	pkgs    *packages
	retired map[string]retired
	typeDir map[string][]string // exported type name → directories of the cited packages defining it
}

func newNameChecker(root string, docs []source) (*nameChecker, error) {
	ps, err := newPackages(root)
	if err != nil {
		return nil, err
	}
	nc := &nameChecker{pkgs: ps, retired: map[string]retired{}, typeDir: map[string][]string{}}
	for _, dir := range sortedDirs() {
		p, err := ps.load(dir)
		if err != nil {
			return nil, err
		}
		for name := range p.types {
			if p.names[name] && ast.IsExported(name) {
				nc.typeDir[name] = append(nc.typeDir[name], dir)
			}
		}
	}
	for _, d := range docs {
		if d.file != migrationDoc {
			continue
		}
		_, names := maskOldNames(d.text)
		for _, r := range names {
			again, err := nc.definedAgain(r.name)
			if err != nil {
				return nil, err
			}
			if !again {
				nc.retired[r.name] = r
			}
		}
	}
	return nc, nil
}

// definedAgain reports whether the root defines name (X or T.M) again: a
// name a later version brought back, with the meaning its doc comment
// gives now, is cited like any other.
func (nc *nameChecker) definedAgain(name string) (bool, error) {
	p, err := nc.pkgs.load(".")
	if err != nil {
		return false, err
	}
	t, m, member := strings.Cut(name, ".")
	if !member {
		return p.names[t], nil
	}
	if !p.names[t] || p.types[t] == nil {
		return false, nil
	}
	state, err := nc.pkgs.member(typeRef{dir: ".", name: t}, m, 0)
	return state == memberFound, err
}

// sortedDirs is the cited packages' directories in a fixed order.
func sortedDirs() []string {
	return []string{".", "ops", "postgres", "postgres/pgxreset", "postgres/sqlreset"}
}

// check returns the bad identifier citations of one Markdown file.
func (nc *nameChecker) check(s source) ([]problem, error) {
	text, _ := maskOldNames(s.text)
	var problems []problem
	add := func(off int, format string, args ...any) {
		problems = append(problems, problem{file: s.file, line: s.line + strings.Count(text[:off], "\n"), msg: fmt.Sprintf(format, args...)})
	}
	retiredMsg := func(off int, cited string, r retired) {
		add(off, "%s: not in the v2 root (%s: %s)", cited, migrationDoc, r.replacement)
	}

	for _, m := range qualifiedName.FindAllStringSubmatchIndex(text, -1) {
		pkg, x := text[m[4]:m[5]], text[m[6]:m[7]]
		y := ""
		if m[8] >= 0 {
			y = text[m[8]:m[9]]
		}
		cited := pkg + "." + x
		if pkg == "recovery" {
			if r, ok := nc.retired[x+"."+y]; ok && y != "" {
				retiredMsg(m[4], cited+"."+y, r)
				continue
			}
			if r, ok := nc.retired[x]; ok {
				retiredMsg(m[4], cited, r)
				continue
			}
		}
		dir := citedPackages[pkg]
		p, err := nc.pkgs.load(dir)
		if err != nil {
			return nil, err
		}
		if !p.names[x] {
			add(m[4], "%s: package %s (%s) has no exported %s", cited, pkg, dir, x)
			continue
		}
		if y == "" || p.types[x] == nil {
			continue
		}
		state, err := nc.pkgs.member(typeRef{dir: dir, name: x}, y, 0)
		if err != nil {
			return nil, err
		}
		if state == memberMissing {
			add(m[8], "%s.%s: %s has no method or field %s", cited, y, cited, y)
		}
	}

	for _, m := range memberName.FindAllStringSubmatchIndex(text, -1) {
		t, y := text[m[4]:m[5]], text[m[6]:m[7]]
		if r, ok := nc.retired[t+"."+y]; ok {
			retiredMsg(m[4], t+"."+y, r)
			continue
		}
		dirs := nc.typeDir[t]
		if len(dirs) == 0 {
			continue
		}
		found := false
		for _, dir := range dirs {
			state, err := nc.pkgs.member(typeRef{dir: dir, name: t}, y, 0)
			if err != nil {
				return nil, err
			}
			if state != memberMissing {
				found = true
				break
			}
		}
		if !found {
			add(m[4], "%s.%s: no type %s (in %s) has a method or field %s", t, y, t, strings.Join(dirs, ", "), y)
		}
	}

	for _, sp := range codeSpans(text) {
		code := text[sp[0]:sp[1]]
		for _, m := range bareName.FindAllStringSubmatchIndex(code, -1) {
			name := code[m[4]:m[5]]
			r, ok := nc.retired[name]
			if !ok || r.keepsBare {
				continue
			}
			// A retired T.M was reported above as such.
			if mm := selectorRe.FindStringSubmatch(code[m[5]:]); mm != nil {
				if _, member := nc.retired[name+"."+mm[1]]; member {
					continue
				}
			}
			retiredMsg(sp[0]+m[4], name, r)
		}
	}
	return problems, nil
}
