package recovery

// Owner mode. When the resetter fences by owner and can reset by owner (a
// PgxResetter WithOwnerColumn), PostgreSQL knows which rows each worker
// holds, atomically with the fetch that set the owner column: the worker
// mirrors nothing into Redis. Track and Untrack keep the worker's own view
// (Release, the lease, the self-check) and send nothing; the heartbeat
// writes no rows; a dead peer goes down the one dead-peer path as ever
// (claim, reset, finish, deregister), its reset being
//
//	UPDATE ... SET status = queued, owner = NULL WHERE owner = $dead AND status = inprog
//
// (chunked, lock-ordered, with the recovery count and quarantine), which is
// idempotent (a second one finds nothing the dead peer owns) and which no
// Redis expiry can undo. The backstop sweep is always on: the owners of rows
// in progress in PostgreSQL are part of what recovery looks at, so a Redis
// that forgets its registry cannot strand a row.
//
// ownerModeOf reports whether a Worker with resetter r and options o runs
// in owner mode: r fences by owner and can reset and list rows by owner.
func ownerModeOf(r RowResetter, o options) bool {
	if o.rowsSets || !fencesByOwner(r) {
		return false
	}
	_, ok := r.(OwnerSweeper)
	return ok
}
