package pgcore

import (
	"context"
	"fmt"
)

// What the resetter serves, for the fleet record (recovery.ResetterInfo's
// Serves and Server, filled by Check).

// serverIdentity returns "system_identifier=<n>" from pg_control_system():
// the identifier initdb gave the cluster, the same on its physical
// replicas (they serve the same rows) and through any pooler, another on
// every other server. It returns "" when the server will not tell (a
// role that may not call the function, a server or proxy without it):
// the fleet is then checked by names only, as before the field.
func (r *Resetter) serverIdentity(ctx context.Context) (string, error) {
	var id string
	err := queryRow(ctx, r.conn, `SELECT system_identifier::text FROM pg_control_system()`, nil, &id)
	switch sqlState(err) {
	case "":
	case "42501", "42883", "0A000": // insufficient_privilege, undefined_function, feature_not_supported
		return "", nil
	default:
		return "", fmt.Errorf("read the server's system identifier: %w", err)
	}
	if err != nil {
		return "", fmt.Errorf("read the server's system identifier: %w", err)
	}
	return "system_identifier=" + id, nil
}

// fleetIdentity returns "database=<db> schema=<schema> table=<table>" for
// the configured table, as the server resolves it (the schema from the
// search_path when WithSchema is not set), or as configured when the
// table cannot be found (the schema check reports that).
func (r *Resetter) fleetIdentity(ctx context.Context) (string, error) {
	var db, schema, table string
	err := queryRow(ctx, r.conn, `
SELECT current_database()::text,
       COALESCE((SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = to_regclass($1)), $2::text),
       COALESCE((SELECT c.relname::text FROM pg_class c WHERE c.oid = to_regclass($1)), $3::text)`,
		[]any{r.o.tableIdent(), r.o.Schema, r.o.Table}, &db, &schema, &table)
	if err != nil {
		return "", fmt.Errorf("read the database and table served: %w", err)
	}
	return fmt.Sprintf("database=%s schema=%s table=%s", db, schema, table), nil
}
