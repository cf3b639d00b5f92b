package recovery

// Owner mode. When the resetter fences by owner and lists the owners of
// rows in progress (ResetterInfo's OwnerFencing and ListsInProgress: a
// pgxreset.Resetter with postgres.WithOwnerColumn), PostgreSQL knows which rows each worker
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
// WithRowsSets keeps the design's rows sets instead, as releases before
// owner mode did.

// ownerModeOf reports whether a Worker whose resetter says info, with
// options o, runs in owner mode: the resetter fences by owner (it resets
// by owner) and lists the owners of rows in progress, and WithRowsSets is
// not set.
func ownerModeOf(info ResetterInfo, o options) bool {
	return !o.rowsSets && info.OwnerFencing && info.ListsInProgress
}
