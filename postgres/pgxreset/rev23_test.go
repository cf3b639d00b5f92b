package pgxreset_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// TestRev23ErrorsNameTheOptionsWithTheirPackage: docs/migrating.md §1a
// says "Error messages name the options with their package
// (postgres.WithSchema, postgres.WithOwnerColumn)", and §4 repeats it for
// recoveryctl. On v2 they name them bare ("WithMaxRecoveries"), as v0.1
// did, which a v0.2 reader looks for in package recovery and does not
// find there.
func TestRev23ErrorsNameTheOptionsWithTheirPackage(t *testing.T) {
	db := struct{ pgxreset.Execer }{} // never called: New does not contact the database
	_, err := pgxreset.New(db, postgres.WithMaxRecoveries(3, ""))
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "(postgres.WithMaxRecoveries)")
	assert.Contains(t, err.Error(), "(postgres.WithRecoveryCountColumn)")

	r, err := pgxreset.New(db)
	require.NoError(t, err)
	_, err = r.Reset(context.Background(), contract.ResetRequest{Owner: "w1"})
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "postgres.WithOwnerColumn")
}
