package postgres

import "github.com/alya/recovery/internal/pgcore"

// Defaults of the resetters, from the design's schema.
const (
	// DefaultTable is the table that holds the rows.
	DefaultTable = pgcore.DefaultTable
	// DefaultIDColumn is the bigint primary key of DefaultTable.
	DefaultIDColumn = pgcore.DefaultIDColumn
	// DefaultStatusColumn holds the row's processing state.
	DefaultStatusColumn = pgcore.DefaultStatusColumn
	// DefaultInProgressStatus marks a row a worker has taken.
	DefaultInProgressStatus = pgcore.DefaultInProgressStatus
	// DefaultQueuedStatus marks a row any worker may fetch.
	DefaultQueuedStatus = pgcore.DefaultQueuedStatus
	// DefaultDoneStatus marks a row a worker has finished.
	DefaultDoneStatus = pgcore.DefaultDoneStatus
	// DefaultChunkSize is how many IDs one UPDATE statement carries
	// (WithChunkSize). Large enough that 100,000 rows take 20 statements,
	// small enough that one statement's array parameter stays well under a
	// megabyte.
	DefaultChunkSize = pgcore.DefaultChunkSize
	// DefaultTerminalStatus is the status WithMaxRecoveries gives a row
	// that reached its recovery limit, when no other is named.
	DefaultTerminalStatus = pgcore.DefaultTerminalStatus
	// DefaultLedgerTable is the table of the reset ledger, in the schema
	// of the rows table (WithSchema).
	DefaultLedgerTable = pgcore.DefaultLedgerTable
	// DefaultLedgerRetention is how long ledger entries are kept. A
	// recovery that keeps failing is retried for as long as it fails, so
	// an entry must outlive the longest outage the fleet should ride out:
	// a week.
	DefaultLedgerRetention = pgcore.DefaultLedgerRetention
)

// ErrNoLedger is wrapped by the error of a reset that needs the reset
// ledger (no owner column) when its table does not exist.
var ErrNoLedger = pgcore.ErrNoLedger

// ErrPoolExhausted is wrapped by the error of a reset, a recovery or
// Start's check whose resetter waited past its deadline for a connection
// from its pool, every connection being in use (the host's transactions,
// typically, in a pool it shares with the resetter). The message says how
// long it waited and how many connections were in use. Give the resetter
// a pool of its own (docs/operations.md, "The resetter's connections").
var ErrPoolExhausted = pgcore.ErrPoolExhausted
