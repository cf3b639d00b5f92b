// Package recovery gives batch workers crash recovery through Redis
// heartbeats.
//
// A worker fetches a block of rows from PostgreSQL, marks them in progress
// and processes them. If it is killed mid-block, its rows would stay in
// progress forever. With a Worker, every process of the fleet keeps a
// heartbeat key in Redis, registers in a shared registry set, and records
// the row IDs it is processing in a rows set. Every worker periodically
// looks for registered peers whose heartbeat expired and returns their rows
// to the queue through a Resetter, so a dead worker's rows are queued
// again within heartbeat TTL + 1.1 × recovery interval (the scans' jitter)
// + the scan turn: 174 s at worst by default, when the worker holding the
// scan turn dies right after scanning; 126 s while it lives. The bound
// assumes Redis answers within the operation timeout, the resetter gets a
// free connection, and the Redis server's clock does not jump
// (docs/safety.md, "What every bound assumes"). WithTimings
// changes the durations (Timings states the defaults and the bounds).
//
// The PostgreSQL resetters are in postgres/pgxreset (pgx) and
// postgres/sqlreset (database/sql), configured with the options of
// package postgres; operator reads and actions (inspecting a fleet, its
// history, recovering now) are in package ops.
//
// # Owner mode
//
// When the resetter fences by owner (pgxreset.New with
// postgres.WithOwnerColumn), the fetch's owner column already tells
// PostgreSQL which rows each worker holds (the host writes
// Worker.OwnerValue into it), and the Worker runs in owner mode
// (Stats.OwnerMode): no rows set,
// Track and Untrack send nothing to Redis, a dead peer's rows are reset by
// owner, and the owners of rows in progress are part of what recovery looks
// at. WithRowsSets keeps the rows sets of the design instead; a resetter
// without an owner column always uses them.
//
// # Redis keys
//
// With the default prefix "ALYA" and an instance ID id:
//
//	ALYA_{id}_HEARTBEAT   string "alive:<token>", TTL heartbeat TTL (60s)
//	ALYA_{id}_ROWS        set of decimal row IDs, TTL rows TTL (180s); none in owner mode
//	ALYA_{id}_INCARNATION the rows set's life, for the reset ledger
//	ALYA_{id}_RECOVERY    claim of the worker recovering id (while it does)
//	ALYA_WORKER_REGISTRY  set of instance IDs, no TTL
//	ALYA_SCAN_LEASE       the scan turn: the worker scanning this interval (WithScanTurn)
//	ALYA_SWEEP_LEASE      the sweep turn: the backstop sweeper (owner mode; rows-set mode without an owner column unless WithBackstopSweep(false); WithBackstopSweep(true) with one)
//	ALYA_HISTORY          stream of the fleet's recoveries and lease losses (WithHistory)
//	ALYA_FLEET            what the fleet serves, and the timings each member announces
//
// The braces are a Redis Cluster hash tag; no SCAN or KEYS is used, and no
// script or transaction spans two slots, so the same code runs on a single
// Redis and on Redis Cluster. The _LEASE suffixes are historical: the
// keys hold turns, and "lease" in this package means only the heartbeat's
// self-fencing (CheckLease).
//
// # Lifecycle
//
//	w, err := recovery.New(rdb, resetter, opts...) // validates, no I/O
//	err = w.Start(ctx)                             // schema check, first heartbeat, loops start
//	for {                                          // the host's batch loop, one block per turn:
//		b, err := w.Begin()                        // fails while the lease is lost
//		defer b.Close()                            // gives back what is not Done (error, panic, lost lease)
//		tx := begin()
//		ids := FetchBlockOfRows(tx, b.OwnerValue()) // marks them inprog
//		b.Track(ctx, ids...)                       // before the COMMIT of the fetch
//		tx.Commit()
//		for each row { b.Check(); process; commit; b.Done(id) }
//	}
//	err = w.Shutdown(ctx)                          // after the last block
//
// A Block is the host's part in one handle (Track, Untrack, Release and the
// lease check are the calls it makes, there for hosts that need them).
//
// Track goes inside the transaction that marks the rows in progress, before
// its COMMIT: in rows-set mode a crash after the commit then always finds
// the rows tracked, and a crash before it leaves them queued; tracking
// after the commit leaves a moment in which a crash strands them. In owner
// mode the order does not matter for recovery.
//
// Start first checks the resetter against the database (Resetter.Check: a
// missing table or column, a status that is not a label of an enum status
// column; WithoutSchemaCheck skips it), so a wrong
// configuration stops the process at start instead of surfacing when a
// peer dies. It refuses (ErrFleetMismatch) a worker whose resetter serves
// another table than the fleet already under the key prefix, and
// (ErrInstanceIDInUse) an instance ID another live process heartbeats, and recovers the rows a dead predecessor left under
// the ID before taking it. It writes the first heartbeat before it returns and then runs the
// heartbeat loop and the recovery loop (plus one subscriber per master with
// WithExpiryNotifications, a flusher with WithDeferredUntrack, the sweeper
// in owner mode and, unless WithBackstopSweep(false), without an owner
// column, and the self-check; events reach the
// WithObserver function on a goroutine of their own). None uses the context
// given to Start: cancelling the processing context on SIGTERM does
// not stop the heartbeat, so the worker can finish its block while peers
// still see it alive. Only Shutdown stops them; it waits for all, deletes
// the heartbeat key and the registry entry (it stays registered while rows
// are still tracked, so peers recover them), and leaves the rows set for
// peers. No goroutine of the Worker outlives a Shutdown that returned nil.
//
// The Worker never closes the Redis client or the database handle it is
// given.
package recovery
