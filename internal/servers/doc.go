// Package servers starts throwaway servers from local binaries for the
// module's tests and its demo: a PostgreSQL cluster in a temporary folder
// on a free loopback port, and a redis-server without persistence. It
// does not depend on package testing; the test helpers in
// internal/testutil build on it.
package servers
