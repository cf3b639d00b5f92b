// Package faults is the fault-injection suite of the module: Jepsen-style
// tests that run real worker processes (internal/faultworker) against real
// redis-server processes (standalone and a 3-master Cluster) and a real
// PostgreSQL, inject faults (SIGKILL, SIGTERM, SIGSTOP, a Redis restart, a
// network partition, a PostgreSQL outage, bad input) and check after each
// scenario that no row was lost, none was done twice (an exactly-once
// ledger written in the completion transaction), and that a dead worker's
// rows were back in the queue within heartbeat TTL + recovery interval +
// a stated slack.
//
// The scenarios are tests behind the build tag faults:
//
//	make test-faults
//	go test -tags faults -count=1 -v ./internal/faults/
//
// They print one line per scenario (RESULT ...). docs/reliability.md has
// the scenario table with the figures of the latest run. Without the tag
// only the package's helpers (the cuttable TCP Proxy) and their unit tests
// are built.
package faults
