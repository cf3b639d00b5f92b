// Package postgres holds what the two PostgreSQL resetters share, without
// linking a driver: the resetter options (table, columns, statuses,
// ledger, quarantine), Config with its RECOVERY_* environment names, the
// table defaults and ErrNoLedger. Build a resetter with
// postgres/pgxreset (pgx) or postgres/sqlreset (database/sql).
package postgres
