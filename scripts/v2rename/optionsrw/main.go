// Command optionsrw rewrites the calls of v0.1's root options that sed
// cannot (their arguments may hold parentheses), for scripts/v2rename/options.sh:
//
//	WithHeartbeatTTL(x)            -> WithTimings(Timings{HeartbeatTTL: x}) (and the 6 other timing options)
//	WithExpiryNotifications(true)  -> WithExpiryNotifications(), WithExpiryConfigSet()
//	WithExpiryNotifications(false) -> WithExpiryNotifications()
//	WithBackstopSweep()            -> WithBackstopSweep(true)
//	WithoutBackstopSweep()         -> WithBackstopSweep(false)
//	WithScanLease                  -> WithScanTurn
//	ObserverFunc(f)                -> f; the type ObserverFunc -> func(Event)
//	WithObserver(o)                -> WithObserver(o.Observe) when o is not a function
//	DefaultHeartbeatTTL etc.       -> unexported in package recovery, the value elsewhere
//
// Each call keeps its package qualifier (recovery.WithHeartbeatTTL(x) becomes
// recovery.WithTimings(recovery.Timings{HeartbeatTTL: x})). Every rewrite
// leaves nothing it would rewrite again, so running it twice changes
// nothing. It prints each file it changed and, on stderr, the calls it
// left for a person (a WithExpiryNotifications argument that is not a
// literal). Usage: optionsrw file.go...
package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"sort"
	"strings"
)

// timingFields maps each v0.1 timing option to its Timings field.
var timingFields = map[string]string{
	"WithHeartbeatTTL":      "HeartbeatTTL",
	"WithHeartbeatInterval": "HeartbeatInterval",
	"WithRecoveryInterval":  "RecoveryInterval",
	"WithRowsTTL":           "RowsTTL",
	"WithOperationTimeout":  "OperationTimeout",
	"WithResetTimeout":      "ResetTimeout",
	"WithSelfCheckWindow":   "SelfCheckWindow",
}

// unexported maps each constant v0.2 unexports to its value, written out
// where the root package is imported.
var unexported = map[string]string{
	"DefaultHeartbeatTTL":      "60 * time.Second",
	"DefaultHeartbeatInterval": "30 * time.Second",
	"DefaultRecoveryInterval":  "60 * time.Second",
	"DefaultRowsTTL":           "180 * time.Second",
	"DefaultOperationTimeout":  "5 * time.Second",
	"DefaultResetTimeout":      "30 * time.Second",
	"DefaultSelfCheckWindow":   "500 * time.Millisecond",
	"DefaultHistoryLength":     "10_000",
	"MinDuration":              "time.Millisecond",
	"MaxDuration":              "7 * 24 * time.Hour",
}

// rootImportPath is the root package; rootName its package name.
const (
	rootImportPath = "github.com/alya/recovery"
	rootName       = "recovery"
)

type edit struct {
	start, end int
	text       string
}

func main() {
	failed := false
	for _, path := range os.Args[1:] {
		changed, err := rewriteFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "optionsrw: %s: %v\n", path, err)
			failed = true
			continue
		}
		if changed {
			fmt.Println(path)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// rewriteFile applies rewrite until it finds nothing more: an edit inside
// another one (a timing option whose argument is a default constant) is
// made in the next round.
func rewriteFile(path string) (bool, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	orig := src
	for round := 0; round < 10; round++ {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return false, err
		}
		edits := rewrite(fset, f, src, path, round == 0)
		if len(edits) == 0 {
			break
		}
		src = apply(src, edits)
	}
	if bytes.Equal(src, orig) {
		return false, nil
	}
	out, err := format.Source(src)
	if err != nil {
		return false, fmt.Errorf("gofmt after the rewrite: %w", err)
	}
	return true, os.WriteFile(path, out, 0o644)
}

// rootQualifier returns the name under which f imports the root package,
// "" when f is in the root package itself, and ok false when f neither is
// nor imports it.
func rootQualifier(f *ast.File) (string, bool) {
	if f.Name.Name == rootName {
		return "", true
	}
	for _, imp := range f.Imports {
		if strings.Trim(imp.Path.Value, `"`) != rootImportPath {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name, imp.Name.Name != "_"
		}
		return rootName, true
	}
	return "", false
}

// rewrite returns the outermost edits for one round.
func rewrite(fset *token.FileSet, f *ast.File, src []byte, path string, warn bool) []edit {
	q, ok := rootQualifier(f)
	if !ok {
		return nil
	}
	inRoot := q == ""
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	text := func(n ast.Node) string { return string(src[off(n.Pos()):off(n.End())]) }
	// name returns the root identifier n names (X or q.X), "" otherwise.
	name := func(n ast.Expr) string {
		switch n := n.(type) {
		case *ast.Ident:
			if inRoot {
				return n.Name
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && !inRoot && x.Name == q {
				return n.Sel.Name
			}
		}
		return ""
	}
	pfx := ""
	if !inRoot {
		pfx = q + "."
	}
	var edits []edit
	add := func(n ast.Node, s string) { edits = append(edits, edit{off(n.Pos()), off(n.End()), s}) }

	var visit func(n, parent ast.Node) bool
	visit = func(n, parent ast.Node) bool {
		var list []ast.Expr
		switch n := n.(type) {
		case *ast.CallExpr:
			list = n.Args
		case *ast.CompositeLit:
			list = n.Elts
		}
		for _, run := range timingRuns(list, name, f.Comments) {
			var fields []string
			for _, c := range run {
				kv := c.(*ast.CallExpr).Args[0].(*ast.CompositeLit).Elts[0].(*ast.KeyValueExpr)
				fields = append(fields, text(kv.Key)+": "+text(kv.Value))
			}
			edits = append(edits, edit{off(run[0].Pos()), off(run[len(run)-1].End()),
				fmt.Sprintf("%sWithTimings(%sTimings{%s})", pfx, pfx, strings.Join(fields, ", "))})
		}
		switch n := n.(type) {
		case *ast.TypeSpec:
			return n.Name.Name != "ObserverFunc" // v0.1's declaration, if still there
		case *ast.FuncDecl:
			if n.Recv != nil && len(n.Recv.List) == 1 && isFuncType(n.Recv.List[0].Type) {
				return false // ObserverFunc.Observe
			}
		case *ast.CallExpr:
			fn := name(n.Fun)
			if lit, ok := oneLineTimings(n, name, fset); ok {
				// Three fields or more: one a line, as gofmt aligns them.
				var b strings.Builder
				b.WriteString(text(lit.Type) + "{\n")
				for _, e := range lit.Elts {
					b.WriteString(text(e) + ",\n")
				}
				b.WriteString("}")
				add(lit, b.String())
				return false
			}
			if field, ok := timingFields[fn]; ok && len(n.Args) == 1 {
				add(n, fmt.Sprintf("%sWithTimings(%sTimings{%s: %s})", pfx, pfx, field, text(n.Args[0])))
				return false
			}
			switch {
			case fn == "WithExpiryNotifications" && len(n.Args) == 1:
				arg := text(n.Args[0])
				fun := text(n.Fun)
				switch {
				case arg == "false":
					add(n, fun+"()")
				case arg == "true" && inList(parent, n):
					add(n, fun+"(), "+pfx+"WithExpiryConfigSet()")
				case warn:
					fmt.Fprintf(os.Stderr, "optionsrw: %s: by hand: %s (WithExpiryNotifications() turns it on; add WithExpiryConfigSet() where the argument was true)\n",
						fset.Position(n.Pos()), text(n))
				}
				return false
			case fn == "WithBackstopSweep" && len(n.Args) == 0:
				add(n, text(n.Fun)+"(true)")
				return false
			case fn == "WithoutBackstopSweep" && len(n.Args) == 0:
				add(n, pfx+"WithBackstopSweep(false)")
				return false
			case fn == "ObserverFunc" && len(n.Args) == 1:
				add(n, text(n.Args[0]))
				return false
			case fn == "WithObserver" && len(n.Args) == 1 && isObserverValue(n.Args[0]):
				add(n.Args[0], text(n.Args[0])+".Observe")
				return false
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && n.Sel.Name == "Observe" && declaredAsFunc(x) {
				add(n, x.Name) // f.Observe(e) of an ObserverFunc f: f(e)
				return false
			}
			switch fn := name(n); {
			case fn == "WithScanLease":
				add(n, pfx+"WithScanTurn")
				return false
			case fn == "ObserverFunc":
				add(n, "func("+pfx+"Event)")
				return false
			case unexported[fn] != "":
				v := unexported[fn]
				if needsParens(parent) && strings.Contains(v, " ") {
					v = "(" + v + ")"
				}
				add(n, v)
				return false
			}
			return true
		case *ast.Ident:
			if !inRoot {
				return false
			}
			switch {
			case n.Name == "WithScanLease":
				add(n, "WithScanTurn")
			case n.Name == "ObserverFunc":
				add(n, "func(Event)")
			case unexported[n.Name] != "":
				add(n, strings.ToLower(n.Name[:1])+n.Name[1:])
			}
			return false
		}
		return true
	}
	var stack []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return false
		}
		var parent ast.Node
		if len(stack) > 0 {
			parent = stack[len(stack)-1]
		}
		if !visit(n, parent) {
			return false
		}
		stack = append(stack, n)
		return true
	})
	return edits
}

// oneLineTimings returns the Timings literal of call when call is
// WithTimings(Timings{...}) with three fields or more on one line.
func oneLineTimings(call *ast.CallExpr, name func(ast.Expr) string, fset *token.FileSet) (*ast.CompositeLit, bool) {
	if name(call.Fun) != "WithTimings" || len(call.Args) != 1 {
		return nil, false
	}
	lit, ok := call.Args[0].(*ast.CompositeLit)
	if !ok || lit.Type == nil || name(lit.Type) != "Timings" || len(lit.Elts) < 3 {
		return nil, false
	}
	return lit, fset.Position(lit.Lbrace).Line == fset.Position(lit.Rbrace).Line
}

// timingRuns returns the runs of two or more neighbouring elements of list
// that are each WithTimings(Timings{Field: v}) with one field, the fields
// all different and no comment between them: what the rewrite of
// neighbouring timing options made, and what one WithTimings says alike
// (it merges the fields set). Calls setting several fields are never
// merged.
func timingRuns(list []ast.Expr, name func(ast.Expr) string, comments []*ast.CommentGroup) [][]ast.Expr {
	single := func(x ast.Expr) (string, bool) {
		c, ok := x.(*ast.CallExpr)
		if !ok || name(c.Fun) != "WithTimings" || len(c.Args) != 1 || c.Ellipsis.IsValid() {
			return "", false
		}
		lit, ok := c.Args[0].(*ast.CompositeLit)
		if !ok || lit.Type == nil || name(lit.Type) != "Timings" || len(lit.Elts) != 1 {
			return "", false
		}
		kv, ok := lit.Elts[0].(*ast.KeyValueExpr)
		if !ok {
			return "", false
		}
		k, ok := kv.Key.(*ast.Ident)
		if !ok {
			return "", false
		}
		return k.Name, true
	}
	commentBetween := func(a, b token.Pos) bool {
		for _, c := range comments {
			if c.Pos() > a && c.Pos() < b {
				return true
			}
		}
		return false
	}
	var runs [][]ast.Expr
	var run []ast.Expr
	seen := map[string]bool{}
	flush := func() {
		if len(run) >= 2 {
			runs = append(runs, run)
		}
		run, seen = nil, map[string]bool{}
	}
	for _, x := range list {
		k, ok := single(x)
		if !ok {
			flush()
			continue
		}
		if seen[k] || (len(run) > 0 && commentBetween(run[len(run)-1].End(), x.Pos())) {
			flush()
		}
		run = append(run, x)
		seen[k] = true
	}
	flush()
	return runs
}

// inList reports whether call is an element of a list that takes more: an
// argument of a call or an element of a composite literal.
func inList(parent ast.Node, call *ast.CallExpr) bool {
	switch p := parent.(type) {
	case *ast.CallExpr:
		for _, a := range p.Args {
			if a == call {
				return true
			}
		}
	case *ast.CompositeLit:
		for _, e := range p.Elts {
			if e == call {
				return true
			}
		}
	}
	return false
}

// needsParens reports whether a value written out as a product must be
// parenthesized where its parent puts it.
func needsParens(parent ast.Node) bool {
	switch parent.(type) {
	case *ast.BinaryExpr, *ast.UnaryExpr, *ast.SelectorExpr, *ast.StarExpr:
		return true
	}
	return false
}

// isObserverValue reports whether x, passed to WithObserver, is a value
// with an Observe method rather than a function. Without type information
// it decides from the file: nil, a function literal, a call (ObserverFunc
// or a constructor returning a func), a method value ending in Observe,
// and an identifier declared in the file as a function or a func-typed
// variable are functions; any other identifier or field (a collector, a
// recorder) is taken for an observer.
func isObserverValue(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		if x.Name == "nil" {
			return false
		}
		if x.Obj == nil {
			return true
		}
		switch d := x.Obj.Decl.(type) {
		case *ast.FuncDecl:
			return false
		case *ast.ValueSpec:
			if isFuncType(d.Type) {
				return false
			}
			for i, n := range d.Names {
				if n.Name == x.Name && i < len(d.Values) && isFuncExpr(d.Values[i]) {
					return false
				}
			}
		case *ast.AssignStmt:
			for i, l := range d.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Name == x.Name && i < len(d.Rhs) && isFuncExpr(d.Rhs[i]) {
					return false
				}
			}
		case *ast.Field:
			return !isFuncType(d.Type)
		}
		return true
	case *ast.SelectorExpr:
		return x.Sel.Name != "Observe"
	case *ast.UnaryExpr:
		return x.Op == token.AND
	}
	return false
}

// declaredAsFunc reports whether x is declared in its file as an
// ObserverFunc or a func: by its type, or by a value that is a function
// literal or an ObserverFunc conversion.
func declaredAsFunc(x *ast.Ident) bool {
	if x.Obj == nil {
		return false
	}
	lit := func(v ast.Expr) bool {
		switch v := v.(type) {
		case *ast.FuncLit:
			return true
		case *ast.CallExpr:
			return isFuncType(v.Fun)
		}
		return false
	}
	switch d := x.Obj.Decl.(type) {
	case *ast.ValueSpec:
		if d.Type != nil {
			return isFuncType(d.Type)
		}
		for i, n := range d.Names {
			if n.Name == x.Name && i < len(d.Values) {
				return lit(d.Values[i])
			}
		}
	case *ast.AssignStmt:
		for i, l := range d.Lhs {
			if id, ok := l.(*ast.Ident); ok && id.Name == x.Name && i < len(d.Rhs) {
				return lit(d.Rhs[i])
			}
		}
	}
	return false
}

func isFuncType(t ast.Expr) bool {
	switch t := t.(type) {
	case *ast.FuncType:
		return true
	case *ast.Ident:
		return t.Name == "ObserverFunc"
	case *ast.SelectorExpr:
		return t.Sel.Name == "ObserverFunc"
	}
	return false
}

func isFuncExpr(v ast.Expr) bool {
	switch v := v.(type) {
	case *ast.FuncLit:
		return true
	case *ast.CallExpr:
		return isFuncType(v.Fun) // ObserverFunc(f); a constructor returns an observer
	case *ast.SelectorExpr:
		return v.Sel.Name == "Observe"
	}
	return false
}

// apply makes the outermost of edits (an edit inside another waits for the
// next round), from the end so offsets stay valid.
func apply(src []byte, edits []edit) []byte {
	sort.Slice(edits, func(i, j int) bool {
		if edits[i].start != edits[j].start {
			return edits[i].start < edits[j].start
		}
		return edits[i].end > edits[j].end
	})
	var keep []edit
	end := -1
	for _, e := range edits {
		if e.start < end {
			continue
		}
		keep = append(keep, e)
		end = e.end
	}
	out := append([]byte(nil), src...)
	for i := len(keep) - 1; i >= 0; i-- {
		e := keep[i]
		out = append(out[:e.start:e.start], append([]byte(e.text), out[e.end:]...)...)
	}
	return out
}
