package pgcore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// PostgreSQL's text form of one-dimensional arrays, for database/sql
// (sqlreset.Resetter): parameters are sent as text and cast by the statement
// ($1::bigint[]), and array columns are read from the text the server
// sends, which lib/pq and pgx's stdlib both hand over as it is.

// formatInt64Array returns the text form of ids: {1,2,3}.
func formatInt64Array(ids []int64) string {
	return formatArray(len(ids), func(b *strings.Builder, i int) { b.WriteString(strconv.FormatInt(ids[i], 10)) })
}

// formatTextArray returns the text form of ss, every element quoted:
// {"a","b \"c\""}.
func formatTextArray(ss []string) string {
	return formatArray(len(ss), func(b *strings.Builder, i int) {
		b.WriteByte('"')
		for _, c := range []byte(ss[i]) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	})
}

// formatArray writes n elements, each by elem, between braces.
func formatArray(n int, elem func(b *strings.Builder, i int)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		elem(&b, i)
	}
	b.WriteByte('}')
	return b.String()
}

// errNullElement is parseArray's error for an array holding NULL, which
// none of the resetter's arrays can.
var errNullElement = errors.New("array element is NULL")

// parseArray splits the text form of a one-dimensional array into its
// elements, unquoted: quoted elements may hold any character, with \ as
// the escape; unquoted ones end at a comma or the closing brace, and the
// unquoted NULL is refused.
func parseArray(s string) ([]string, error) {
	if i := strings.IndexByte(s, '='); i >= 0 && strings.HasPrefix(s, "[") {
		s = s[i+1:] // dimension decoration: [0:2]={...}
	}
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, fmt.Errorf("array %q is not {...}", clip(s))
	}
	body := s[1 : len(s)-1]
	elems := []string{}
	if strings.TrimSpace(body) == "" {
		return elems, nil
	}
	for i := 0; ; {
		for i < len(body) && body[i] == ' ' {
			i++
		}
		var (
			e      strings.Builder
			quoted bool
		)
		if i < len(body) && body[i] == '"' {
			quoted = true
			i++
			for ; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
					if i == len(body) {
						break
					}
				}
				e.WriteByte(body[i])
			}
			if i == len(body) {
				return nil, fmt.Errorf("array %q: unterminated quote", clip(s))
			}
			i++ // the closing quote
			for i < len(body) && body[i] == ' ' {
				i++
			}
		} else {
			j := strings.IndexByte(body[i:], ',')
			if j < 0 {
				j = len(body) - i
			}
			raw := strings.TrimSpace(body[i : i+j])
			if strings.ContainsAny(raw, `{}"\`) {
				return nil, fmt.Errorf("array %q: not one-dimensional or badly quoted", clip(s))
			}
			e.WriteString(raw)
			i += j
		}
		if !quoted && strings.EqualFold(e.String(), "NULL") {
			return nil, errNullElement
		}
		elems = append(elems, e.String())
		if i == len(body) {
			return elems, nil
		}
		if body[i] != ',' {
			return nil, fmt.Errorf("array %q: expected a comma at %d", clip(s), i+1)
		}
		i++
	}
}

// arrayElems returns the elements of an array column as database/sql
// gives it: []byte (lib/pq) or string (pgx's stdlib) in the text form, or
// nil for NULL.
func arrayElems(src any) (elems []string, null bool, err error) {
	var text string
	switch v := src.(type) {
	case nil:
		return nil, true, nil
	case []byte:
		text = string(v)
	case string:
		text = v
	default:
		return nil, false, fmt.Errorf("array column of Go type %T: want its text form", src)
	}
	elems, err = parseArray(text)
	return elems, false, err
}

// int64Array scans a bigint[] column into dst; NULL gives nil.
type int64Array struct{ dst *[]int64 }

// Scan implements sql.Scanner.
func (a int64Array) Scan(src any) error {
	*a.dst = nil
	elems, null, err := arrayElems(src)
	if err != nil || null {
		return err
	}
	out := make([]int64, len(elems))
	for i, e := range elems {
		if out[i], err = strconv.ParseInt(e, 10, 64); err != nil {
			return fmt.Errorf("array element %d: %w", i+1, err)
		}
	}
	*a.dst = out
	return nil
}

// textArray scans a text[] column into dst; NULL gives nil.
type textArray struct{ dst *[]string }

// Scan implements sql.Scanner.
func (a textArray) Scan(src any) error {
	elems, _, err := arrayElems(src)
	*a.dst = elems
	return err
}
