// Package contract holds the data types and error values of the contract
// between a recovery.Worker and its Resetter. The root package aliases
// each of them, and users name them there (recovery.RowsReset,
// recovery.ErrSchema, ...). They live here so that the PostgreSQL
// resetters (internal/pgcore and the packages under postgres/) can build
// and return them without importing the root package.
package contract

import (
	"errors"
	"fmt"
	"time"
)

// Error values a resetter wraps. Their messages are part of what users
// see and must not change.
var (
	// ErrInvalidConfig: see recovery.ErrInvalidConfig.
	ErrInvalidConfig = errors.New("recovery: invalid configuration")
	// ErrSchema: see recovery.ErrSchema.
	ErrSchema = errors.New("recovery: table does not match the configuration")
	// ErrReadOnly: see recovery.ErrReadOnly.
	ErrReadOnly = errors.New("recovery: database session is read-only")
	// ErrRowsLocked: see recovery.ErrRowsLocked.
	ErrRowsLocked = errors.New("recovery: rows locked by another session")
	// ErrPoolExhausted: see postgres.ErrPoolExhausted.
	ErrPoolExhausted = errors.New("recovery: no free connection in the resetter's pool")
	// ErrRowsRefused: see recovery.ErrRowsRefused.
	ErrRowsRefused = errors.New("recovery: rows refused by the database")
)

// RowsReset asks a resetter to return rows named by ID to the queue: the
// rows of a dead instance's rows set (rows-set recovery) or the rows a
// worker gives back (Release).
type RowsReset struct {
	// InstanceID is the instance the rows belong to: a dead peer, or the
	// worker itself for Release. An owner-mode Release of rows fetched
	// under a per-life owner value (<id>{<life>}) passes that value, with
	// no Incarnation: a resetter that fences by owner matches it as the
	// owner, whole.
	InstanceID string
	// Incarnation names the life of the instance's rows set; "" when it is
	// not known (a worker of an older version). A resetter with a ledger
	// records its resets under InstanceID and Incarnation, and never
	// resets a row twice for the same pair.
	Incarnation string
	// RowIDs are the rows to reset.
	RowIDs []int64
	// FromRowsSet is set by recovery when RowIDs were read from the dead
	// instance's rows set under a recovery claim; Release leaves it
	// unset. A resetter that fences by owner then also resets the rows
	// among them that are in progress with no owner (a rows-set worker of
	// a release from before the owner column), under the guards it uses.
	// Without it such rows are reported as not reset, never counted as
	// settled.
	FromRowsSet bool
}

// OwnerReset asks a resetter that fences by owner
// (ResetterInfo.OwnerFencing) to return every row still in progress and
// owned by Owner to the queue, whole: owner mode's recovery, the backstop
// sweep by owner, a Worker's own predecessor at Start.
type OwnerReset struct {
	// Owner is the owner column's value: an instance ID, or a per-life
	// owner value (<id>{<life>}). It is never empty.
	Owner string
}

// VersionsReset asks a resetter without owner fencing to return the rows
// still in progress at the version given, and no other, to the queue: the
// backstop sweep without an owner column. Rows that moved on are left
// alone and not reported; rows still at their version that another
// session held locked may be listed in NotReset (Locked). Resetting the
// same versions again changes nothing.
type VersionsReset struct {
	// Versions are the rows to reset, by ID, each with the version
	// (RowState.Version) it must still have, as InProgressRows returned
	// them.
	Versions []RowState
}

// PlanRequest asks a resetter what one reset would change, changing
// nothing (ResetterInfo.DryRun): it runs the very statements of the reset
// in a transaction it always rolls back and fills ResetResult's ChangedIDs
// with the rows the reset would change. Exactly one of its fields is set;
// a plan with none or several is refused with an error wrapping
// ErrInvalidConfig.
type PlanRequest struct {
	// Rows plans a reset of rows by ID (RowsReset).
	Rows *RowsReset
	// Owner plans a reset by owner (OwnerReset).
	Owner *OwnerReset
	// Versions plans a reset by row version (VersionsReset).
	Versions *VersionsReset
}

// CheckPlan returns nil when exactly one of p's fields is set, and an
// error wrapping ErrInvalidConfig otherwise.
func CheckPlan(p PlanRequest) error {
	n := 0
	for _, set := range []bool{p.Rows != nil, p.Owner != nil, p.Versions != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: a reset plan names one of Rows, Owner and Versions, this one %d", ErrInvalidConfig, n)
	}
	return nil
}

// ResetResult says what a reset changed, or what a plan
// (PlanRequest) would change.
type ResetResult struct {
	// Changed is how many rows changed: queued again or quarantined.
	Changed int64
	// ChangedIDs lists the rows a plan would change. A reset lists the
	// rows it changed when it can (the PostgreSQL resetters do, ascending):
	// recovery records them in the fleet's history; a reset that leaves it
	// empty leaves the history with counts only.
	ChangedIDs []int64
	// Quarantined lists the rows that reached their recovery limit and were
	// set to the terminal status instead of queued.
	Quarantined []int64
	// NotReset lists the rows that were neither reset nor shown to be
	// settled: not queued, not done, not quarantined, not held by another
	// owner and not reset before under the same incarnation. A misspelled
	// status is the usual cause; a row another session held locked is one
	// too (RowState.Locked). Recovery keeps the rows set of a peer with
	// such rows, and tries again, instead of forgetting rows it could not
	// reset.
	NotReset []RowState
	// Gone lists the rows among those named by ID (or by version) that no longer
	// exist: deleted since they were taken. They are not stuck, and not
	// in NotReset; a resetter that cannot tell leaves it empty. The
	// PostgreSQL resetters tell when at most 1,000 rows of a chunk of the
	// reset were neither changed nor left in progress.
	Gone []int64
}

// RowState is a row as a resetter found it.
type RowState struct {
	// ID is the row's ID.
	ID int64
	// Status is the row's status, as text.
	Status string
	// Owner is the row's owner, when the resetter knows owners (and the
	// row has one).
	Owner string
	// Version changes whenever the row is written (PostgreSQL: xmin).
	// InProgressRows and RowStates fill it; a reset by Versions matches
	// it.
	Version string
	// Locked is set on a row another session held locked: a transaction
	// still open, perhaps on a host that vanished. A reset does not wait
	// for it and leaves it in progress; recovery tries it again later.
	Locked bool
	// Refused is set on a row the reset locked and the database would not
	// change: a BEFORE UPDATE trigger returned NULL for it. It stays in
	// progress until the trigger lets it go; recovery tries it again later.
	Refused bool
}

// ResetterInfo says what a resetter guarantees and how its rows read. A
// Worker asks for it once, in New (Info, no I/O), and again at Start
// (Check, which fills the fields read from the server).
type ResetterInfo struct {
	// Name names the resetter in messages, as "pgxreset.Resetter".
	Name string
	// OwnerFencing: the resetter resets a row only while the instance
	// named (RowsReset.InstanceID, OwnerReset.Owner) still owns it. Owner
	// mode needs it, and so does Release after a lost lease (or Ledger).
	OwnerFencing bool
	// Ledger: ResetRows records (InstanceID, Incarnation) with each row
	// it resets and never resets a row twice for the same pair.
	Ledger bool
	// DryRun: PlanReset works.
	DryRun bool
	// ListsInProgress: InProgressOwners (with OwnerFencing) or
	// InProgressRows (without) work, so the backstop sweep can run.
	ListsInProgress bool
	// InProgressStatus is the status of a row being processed, as
	// RowState.Status reads.
	InProgressStatus string
	// QueuedStatus is the status a reset writes, as RowState.Status reads.
	QueuedStatus string

	// Filled by Check only.

	// Serves names the table the resetter serves, as "schema.table on
	// database db", for the fleet record; "" when unknown.
	Serves string
	// Server names the database server ("system_identifier=<n>"); "" when
	// the session may not read it.
	Server string
	// OwnerWidth is the owner column's width in characters; 0 when it has
	// none (text) or there is no owner column.
	OwnerWidth int
	// IdleInTxTimeout is the session's idle_in_transaction_session_timeout;
	// 0 when it is off.
	IdleInTxTimeout time.Duration
	// PoolSize is the most connections the resetter's handle opens at
	// once (pgxpool's MaxConns, database/sql's SetMaxOpenConns); 0 when
	// it has no limit or is not a pool (a connection, a transaction).
	PoolSize int
	// PoolInUse is how many of the pool's connections were in use when
	// Check began, taken by the host or by the resetter.
	PoolInUse int
	// StatementTimeout is the session's statement_timeout; 0 when it is
	// off. The PostgreSQL resetters size their chunks to fit it.
	StatementTimeout time.Duration
	// LockTimeout is the session's lock_timeout; 0 when it is off. The
	// PostgreSQL resetters set their own in each reset's transaction.
	LockTimeout time.Duration
}
