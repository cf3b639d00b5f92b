// Command apicount counts the exported identifiers of a Go package, as
// go/ast sees them: the root package is held to rootLimit or fewer, methods and
// constants included.
//
// It reads the package's non-test .go files that the default build
// includes (build tags as go build sees them without -tags, so
// mutants_on.go, built only under simmutants, is left out) and counts:
//
//   - top-level: exported constants, variables, functions and types, one
//     per name (a const block of five names counts five);
//   - methods: exported methods declared on exported types (a method of an
//     unexported type cannot be called from outside unless an exported
//     interface names it, and is not counted), and the exported methods
//     listed in exported interfaces;
//   - fields: exported fields of exported struct types (embedded fields
//     count as one field named after the type).
//
// The headline total is top-level + methods; fields are reported apart.
// Methods promoted through embedding are not counted (go/ast does not
// resolve them).
//
// Usage: go run ./internal/apicount [dir] (dir defaults to "."); -v lists
// every name. With -worker it describes the package's Worker type instead
// (worker.go): its fields and methods, which issue 23 limits to 12 and 20,
// the types that hold a *Worker (none: the loops are built with what they
// use), and the package's longest function.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// count is what apicount found in one package.
type count struct {
	consts, vars, funcs, types []string
	methods                    []string // Type.Method
	fields                     []string // Type.Field
}

// total is the headline figure: top-level names and methods.
func (c count) total() int {
	return len(c.consts) + len(c.vars) + len(c.funcs) + len(c.types) + len(c.methods)
}

func main() {
	verbose := flag.Bool("v", false, "list every name")
	worker := flag.Bool("worker", false, "describe the Worker type instead: fields, methods, back-pointers, the longest function")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	if *worker {
		s, err := shapeOf(dir, "Worker")
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(2)
		}
		fmt.Printf("Worker: %d fields, %d methods (limits %d and %d, asserted by TestWorkerIsLifecycleAndWiring); types holding a *Worker: %d; longest function: %s\n",
			len(s.fields), len(s.methods), workerFieldLimit, workerMethodLimit, len(s.holders), s.longest)
		if *verbose {
			fmt.Println("fields:", strings.Join(s.fields, ", "))
			for _, m := range s.methods {
				fmt.Println("method", m)
			}
			for _, h := range s.holders {
				fmt.Println("holder", h)
			}
		}
		return
	}
	c, err := countDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	fmt.Printf("constants %d, variables %d, functions %d, types %d, methods %d: %d exported identifiers (limit %d, asserted by TestRootPackageCount)\n",
		len(c.consts), len(c.vars), len(c.funcs), len(c.types), len(c.methods), c.total(), rootLimit)
	fmt.Printf("exported fields of exported structs, not in the total: %d\n", len(c.fields))
	if *verbose {
		for _, l := range []struct {
			kind  string
			names []string
		}{{"const", c.consts}, {"var", c.vars}, {"func", c.funcs}, {"type", c.types}, {"method", c.methods}, {"field", c.fields}} {
			for _, n := range l.names {
				fmt.Println(l.kind, n)
			}
		}
	}
}

// goFile is one parsed file of a package, with its name.
type goFile struct {
	name string
	*ast.File
}

// parseDir parses the package's non-test .go files in dir that the
// default build includes (build tags as go build sees them without -tags).
func parseDir(dir string) (*token.FileSet, []goFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	fset := token.NewFileSet()
	var files []goFile
	ctx := build.Default
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if ok, err := ctx.MatchFile(dir, name); err != nil {
			return nil, nil, fmt.Errorf("match %s: %w", name, err)
		} else if !ok {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, fmt.Errorf("parse %s: %w", name, err)
		}
		files = append(files, goFile{name, f})
	}
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("no Go files in %s", dir)
	}
	return fset, files, nil
}

// countDir counts the exported identifiers of the package in dir.
func countDir(dir string) (count, error) {
	var c count
	_, files, err := parseDir(dir)
	if err != nil {
		return c, err
	}

	exportedTypes := map[string]bool{}
	for _, f := range files {
		for _, decl := range f.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, spec := range gd.Specs {
					if ts := spec.(*ast.TypeSpec); ts.Name.IsExported() {
						exportedTypes[ts.Name.Name] = true
					}
				}
			}
		}
	}

	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					c.funcs = append(c.funcs, d.Name.Name)
					continue
				}
				if recv := receiverType(d.Recv.List[0].Type); exportedTypes[recv] {
					c.methods = append(c.methods, recv+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							if d.Tok == token.CONST {
								c.consts = append(c.consts, n.Name)
							} else {
								c.vars = append(c.vars, n.Name)
							}
						}
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						c.types = append(c.types, s.Name.Name)
						c.countMembers(s.Name.Name, s.Type)
					}
				}
			}
		}
	}
	for _, l := range []*[]string{&c.consts, &c.vars, &c.funcs, &c.types, &c.methods, &c.fields} {
		sort.Strings(*l)
	}
	return c, nil
}

// countMembers adds the exported fields of a struct type and the exported
// methods of an interface type named typ.
func (c *count) countMembers(typ string, expr ast.Expr) {
	switch t := expr.(type) {
	case *ast.StructType:
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				if n := receiverType(f.Type); ast.IsExported(n) {
					c.fields = append(c.fields, typ+"."+n)
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					c.fields = append(c.fields, typ+"."+n.Name)
				}
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			for _, n := range m.Names { // embedded interfaces have no names
				if n.IsExported() {
					c.methods = append(c.methods, typ+"."+n.Name)
				}
			}
		}
	}
}

// receiverType is the name of a receiver's (or embedded field's) type:
// T, *T, T[P], pkg.T.
func receiverType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverType(t.X)
	case *ast.IndexExpr:
		return receiverType(t.X)
	case *ast.IndexListExpr:
		return receiverType(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.Ident:
		return t.Name
	}
	return ""
}
