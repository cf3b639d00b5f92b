package recovery

import (
	"context"
	"errors"

	"github.com/alya/recovery/postgres"
)

// resetRows resets rowIDs of deadInstanceID through r's Reset, and returns
// how many rows it changed: what the removed Resetter.ResetRows did.
func resetRows(r Resetter, ctx context.Context, deadInstanceID string, rowIDs []int64) (int64, error) {
	res, err := r.ResetRows(ctx, RowsReset{InstanceID: deadInstanceID, RowIDs: rowIDs})
	return res.Changed, err
}

// sqlState returns the SQLSTATE code PostgreSQL sent with err, or "" when
// err carries none.
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// userEnumTable is the schema of issue 11: a user's own table with an enum
// status and none of the default names.
const userEnumTable = `
CREATE TYPE job_state AS ENUM ('pending', 'running', 'done');
CREATE TABLE items (item_id bigint PRIMARY KEY, state job_state NOT NULL DEFAULT 'pending', worker text, retries int NOT NULL DEFAULT 0);`

// userEnumOptions configures a resetter for userEnumTable in schema s.
func userEnumOptions(s string, extra ...postgres.Option) []postgres.Option {
	return append([]postgres.Option{postgres.WithSchema(s), postgres.WithTable("items"), postgres.WithIDColumn("item_id"),
		postgres.WithStatusColumn("state"), postgres.WithOwnerColumn("worker")}, extra...)
}
