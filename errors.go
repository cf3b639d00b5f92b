package recovery

import "errors"

// Sentinel errors. Errors returned by this package wrap them, so test with
// errors.Is.
var (
	// ErrShutdown is returned by Start, Track, RecoverNow, CheckLease and
	// Healthy after Shutdown was called (and by Release without owner
	// fencing).
	ErrShutdown = errors.New("recovery: shut down")

	// ErrNotStarted is returned by Track and CheckLease before Start has
	// succeeded: rows tracked by a worker without a heartbeat would never be
	// recovered.
	ErrNotStarted = errors.New("recovery: not started")

	// ErrAlreadyStarted is returned by a second call to Start.
	ErrAlreadyStarted = errors.New("recovery: already started")

	// ErrLeaseLost is returned by Track and CheckLease while the worker has
	// not refreshed its heartbeat for long enough that peers may already
	// consider it dead and recover its rows.
	ErrLeaseLost = errors.New("recovery: heartbeat lease lost")

	// ErrRowsNotReset is wrapped by the error of a recovery that found rows
	// it could neither reset nor show to be settled (see
	// ResetResult.NotReset): usually a status misconfigured. The peer's rows
	// set is kept and recovery tries again at every scan.
	ErrRowsNotReset = errors.New("recovery: rows neither reset nor settled")

	// ErrRowsSetLost is wrapped by the error of a recovery that found a
	// dead peer's rows set gone after an earlier recovery of it had
	// failed: the rows it held may stay in progress. The backstop sweep
	// (with an owner column) recovers them.
	ErrRowsSetLost = errors.New("recovery: rows set of a dead peer lost before its rows were reset")

	// ErrRegistryWrongType is wrapped by the error of a recovery scan that
	// could not read the fleet's registry because its key holds something
	// other than a set (someone wrote it by hand). Until the key is deleted
	// no scan can find a dead peer; expiry notifications and the backstop
	// sweep still do.
	ErrRegistryWrongType = errors.New("recovery: worker registry key is not a set")

	// ErrInstanceIDInUse is wrapped by the error Start returns when another
	// live process heartbeats the same instance ID (two Workers given one
	// WithInstanceID, a pod started while its predecessor still runs): the
	// other process refreshed the heartbeat while Start watched it. A
	// running Worker whose heartbeat finds another process's value (it was
	// paused past its TTL and a process with its ID started meanwhile)
	// reports it too, with ErrLeaseLost, from CheckLease, Healthy and
	// Track, for good: that Worker must be shut down.
	ErrInstanceIDInUse = errors.New("recovery: instance ID in use by another live process")

	// ErrInvalidConfig is wrapped by every error New and NewPgxResetter
	// return for a bad option or argument.
	ErrInvalidConfig = errors.New("recovery: invalid configuration")

	// ErrSchema is wrapped by every error of a SchemaChecker that found the
	// database different from what the resetter was configured for: a
	// missing table or column, a column of an unusable type, a status that
	// is not a label of the status column's enum, a missing privilege.
	// Start returns it, before writing anything to Redis.
	ErrSchema = errors.New("recovery: table does not match the configuration")

	// ErrRedisAuth is wrapped by the error Start returns when Redis
	// refuses the client before anything is written: a password is
	// required and none was given (NOAUTH), the user or password is wrong
	// (WRONGPASS), or the user may not run the commands recovery needs
	// (NOPERM). The message names the address and Redis's reply, never
	// the password.
	ErrRedisAuth = errors.New("recovery: redis refused this client")

	// ErrFleetMismatch is wrapped by the error Start returns when the key
	// prefix already serves another fleet: the fleet record under it names
	// another database, schema or table than this worker's resetter. Two
	// applications under one prefix would recover each other's dead
	// workers into the wrong table. The error names both; give each
	// application its own prefix (WithKeyPrefix).
	ErrFleetMismatch = errors.New("recovery: key prefix serves another fleet")
)
