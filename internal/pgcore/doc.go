// Package pgcore is the PostgreSQL resetter both postgres/pgxreset and
// postgres/sqlreset wrap, written against a small database handle so that
// it links no driver.
package pgcore
