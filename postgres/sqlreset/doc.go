// Package sqlreset is the recovery.Resetter for PostgreSQL through
// database/sql (lib/pq, pgx's stdlib driver, ...). It never links pgx.
package sqlreset
