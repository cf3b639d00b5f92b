// Package pgxreset is the recovery.Resetter for PostgreSQL through pgx
// (a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx).
package pgxreset
