package pgcore

import (
	"context"
	"database/sql"
	"math"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
)

// Arrays cross database/sql in PostgreSQL's text form both ways: what
// formatTextArray sends, the server parses back to the same elements, and
// what the server sends, parseArray reads, through each driver.
func TestSQLArraysRoundTripThroughTheServer(t *testing.T) {
	texts := []string{"plain", "", "with space", `quote"d`, `back\slash`, "com,ma", "{braces}", "NULL", "null", " padded ", "ünï"}
	ints := []int64{0, -1, 42, math.MaxInt64, math.MinInt64}
	for name, handle := range map[string]func(*testing.T, *pgxpool.Pool) *sql.DB{
		"libpq":  func(t *testing.T, db *pgxpool.Pool) *sql.DB { return pgtest.LibpqDB(t, db, nil) },
		"stdlib": func(t *testing.T, db *pgxpool.Pool) *sql.DB { return pgtest.StdlibDB(t, db) },
	} {
		t.Run(name, func(t *testing.T) {
			db := testutil.Postgres(t)
			conn := sqlDB{handle(t, db)}
			ctx := context.Background()

			var gotTexts []string
			var gotInts, none []int64
			var n int
			require.NoError(t, queryRow(ctx, conn, `SELECT $1::text[], cardinality($1::text[]), $2::bigint[], NULL::bigint[]`,
				[]any{texts, ints}, &gotTexts, &n, &gotInts, &none))
			assert.Equal(t, texts, gotTexts)
			assert.Equal(t, len(texts), n, "one element per string: the server parsed what was sent")
			assert.Equal(t, ints, gotInts)
			assert.Nil(t, none)

			var empty []int64
			require.NoError(t, queryRow(ctx, conn, `SELECT '{}'::bigint[]`, nil, &empty))
			assert.Equal(t, []int64{}, empty)

			var withNull []string
			err := queryRow(ctx, conn, `SELECT ARRAY['a', NULL]`, nil, &withNull)
			assert.ErrorIs(t, err, errNullElement)
		})
	}
}

func TestParseArrayRefusesWhatIsNotAOneDimensionalArray(t *testing.T) {
	for _, bad := range []string{"", "1,2", "{1,2", `{"a}`, "{{1,2},{3,4}}", `{"a"b}`, "{1,,2}x"} {
		_, err := parseArray(bad)
		assert.Error(t, err, "%q", bad)
	}
	got, err := parseArray("[0:1]={7,8}")
	require.NoError(t, err)
	assert.Equal(t, []string{"7", "8"}, got)
}

// quoteIdent quotes as pgx.Identifier.Sanitize does, byte for byte.
func TestQuoteIdentQuotesAsPgxDoes(t *testing.T) {
	for _, parts := range [][]string{
		{"plain"}, {`we"ird`}, {`""`}, {""}, {"with\x00nul"}, {"ünï", "Mixed Case"}, {"s", "t.u"}, {`a"`, `"b`},
	} {
		assert.Equal(t, pgx.Identifier(parts).Sanitize(), quoteIdent(parts...), "%q", parts)
	}
	assert.Equal(t, pgx.Identifier{"x"}.Sanitize(), ident("x"))
}
