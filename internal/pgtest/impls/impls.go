// Package impls runs a PostgreSQL resetter test once per implementation:
// pgxreset, and sqlreset through lib/pq and through pgx's stdlib. It is
// apart from internal/pgtest because it imports pgxreset and sqlreset,
// which import internal/pgcore, whose in-package tests use pgtest.
package impls

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
	"github.com/alya/recovery/postgres/sqlreset"
)

// Resetter is what pgxreset.Resetter and sqlreset.Resetter both offer:
// the contract's 9 methods and the ledger's 2.
type Resetter interface {
	Info() contract.ResetterInfo
	Check(ctx context.Context, schema bool) (contract.ResetterInfo, error)
	ResetRows(ctx context.Context, req contract.RowsReset) (contract.ResetResult, error)
	ResetOwner(ctx context.Context, req contract.OwnerReset) (contract.ResetResult, error)
	ResetVersions(ctx context.Context, req contract.VersionsReset) (contract.ResetResult, error)
	PlanReset(ctx context.Context, plan contract.PlanRequest) (contract.ResetResult, error)
	InProgressOwners(ctx context.Context) ([]string, error)
	InProgressRows(ctx context.Context) ([]contract.RowState, error)
	RowStates(ctx context.Context, ids []int64) ([]contract.RowState, error)
	LedgerDDL() string
	CreateLedger(ctx context.Context) error
}

var (
	_ Resetter = (*pgxreset.Resetter)(nil)
	_ Resetter = (*sqlreset.Resetter)(nil)
)

// Impl builds a resetter of one implementation, through one Go database
// API, over the PostgreSQL schema of a test's pool.
type Impl struct {
	Name string
	// Handle returns a database/sql handle on db's schema (nil for pgx).
	Handle func(t *testing.T, db *pgxpool.Pool) *sql.DB
}

// Impls are the implementations every resetter test runs on: pgxreset,
// and sqlreset through lib/pq and through pgx's stdlib.
var Impls = []Impl{
	{Name: "pgx"},
	{Name: "libpq", Handle: func(t *testing.T, db *pgxpool.Pool) *sql.DB { return pgtest.LibpqDB(t, db, nil) }},
	{Name: "stdlib", Handle: func(t *testing.T, db *pgxpool.Pool) *sql.DB { return pgtest.StdlibDB(t, db) }},
}

// New returns a resetter of this implementation over db's schema.
func (impl Impl) New(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) (Resetter, error) {
	t.Helper()
	if impl.Handle == nil {
		r, err := pgxreset.New(db, opts...)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
	r, err := sqlreset.New(impl.Handle(t, db), opts...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Must is New that ends the test on an error.
func (impl Impl) Must(t *testing.T, db *pgxpool.Pool, opts ...postgres.Option) Resetter {
	t.Helper()
	r, err := impl.New(t, db, opts...)
	require.NoError(t, err)
	return r
}

// ForEachImpl runs test once per implementation, as a subtest.
func ForEachImpl(t *testing.T, test func(t *testing.T, impl Impl)) {
	t.Helper()
	for _, impl := range Impls {
		t.Run(impl.Name, func(t *testing.T) { test(t, impl) })
	}
}
