package recovery

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestContractAliasesListEveryField: go doc shows an alias's comment but
// not the fields of the type it names, so each contract type's comment in
// the root lists every field (a field added to internal/contract without a
// line here fails).
func TestContractAliasesListEveryField(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "resetter.go", nil, parser.ParseComments)
	require.NoError(t, err)
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			if ts := s.(*ast.TypeSpec); ts.Assign.IsValid() && g.Doc != nil {
				docs[ts.Name.Name] = g.Doc.Text()
			}
		}
	}
	for _, v := range []any{ResetterInfo{}, RowsReset{}, OwnerReset{}, VersionsReset{}, PlanRequest{}, ResetResult{}, RowState{}} {
		typ := reflect.TypeOf(v)
		doc, ok := docs[typ.Name()]
		require.True(t, ok, "resetter.go documents the alias %s", typ.Name())
		for i := range typ.NumField() {
			name := typ.Field(i).Name
			assert.Regexp(t, regexp.MustCompile(`(?m)^\s*- (?:\w+, )*`+name+`\b`), doc,
				"the comment of %s lists its field %s", typ.Name(), name)
		}
	}
}
