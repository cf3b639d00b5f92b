package main

import (
	"fmt"
	"go/ast"
	"go/token"
	"sort"
)

// The Worker keeps lifecycle and wiring (issue 23):
// at most workerFieldLimit fields and workerMethodLimit methods, and no
// other type of the root holds a *Worker (TestWorkerIsLifecycleAndWiring).
// rootLimit is the most exported identifiers the root package may have
// (79 after v2; then the block handle, Block with
// Worker.Begin, its six methods and ErrBlockClosed, and ErrRowsRefused,
// each asked for by users' reports: 90; then the resetter's four
// operations, +6: Resetter.Reset and ResetRequest replaced by
// Resetter.ResetRows, ResetOwner, ResetVersions and PlanReset and the
// types RowsReset, OwnerReset, VersionsReset and PlanRequest; then
// WithLivenessWitness, the option issue 34 asks for: 97). A name added to
// the root has to replace one.
const rootLimit = 97

const (
	workerFieldLimit  = 12
	workerMethodLimit = 20
)

// shape is what one struct type of a package is made of, as go/ast sees
// it in the non-test files the default build includes: its fields (an
// embedded field counts as one), its methods (any receiver name, pointer
// or not, exported or not), and the other types of the package that hold
// a pointer to it in a field (back-pointers).
type shape struct {
	fields  []string
	methods []string // Name (file.go)
	holders []string // Type.field of the types holding a *T
	longest string   // the longest function or method of the package: name (lines)
}

// shapeOf describes the struct type name of the package in dir.
func shapeOf(dir, name string) (shape, error) {
	var s shape
	fset, files, err := parseDir(dir)
	if err != nil {
		return s, err
	}
	found := false
	longest := 0
	for _, f := range files {
		fn := f.name
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
				what := d.Name.Name
				if d.Recv != nil {
					what = receiverType(d.Recv.List[0].Type) + "." + what
				}
				if lines > longest {
					longest, s.longest = lines, fmt.Sprintf("%s (%d lines)", what, lines)
				}
				if d.Recv != nil && receiverType(d.Recv.List[0].Type) == name {
					s.methods = append(s.methods, d.Name.Name+" ("+fn+")")
				}
			case *ast.GenDecl:
				if d.Tok != token.TYPE {
					continue
				}
				for _, spec := range d.Specs {
					ts := spec.(*ast.TypeSpec)
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fl := range st.Fields.List {
						names := []string{}
						for _, n := range fl.Names {
							names = append(names, n.Name)
						}
						if len(names) == 0 { // embedded
							names = append(names, receiverType(fl.Type))
						}
						if ts.Name.Name == name {
							found = true
							s.fields = append(s.fields, names...)
							continue
						}
						if star, ok := fl.Type.(*ast.StarExpr); ok {
							if id, ok := star.X.(*ast.Ident); ok && id.Name == name {
								for _, n := range names {
									s.holders = append(s.holders, ts.Name.Name+"."+n)
								}
							}
						}
					}
				}
			}
		}
	}
	if !found {
		return s, fmt.Errorf("no struct type %s in %s", name, dir)
	}
	sort.Strings(s.methods)
	sort.Strings(s.holders)
	return s, nil
}
