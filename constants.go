package recovery

import "time"

// Timing defaults, from the design. Their relations are checked by New:
// HeartbeatInterval < HeartbeatTTL, and RowsTTL > HeartbeatTTL + RecoveryInterval.
const (
	// DefaultHeartbeatTTL is the detection window: a worker whose heartbeat
	// key has not been refreshed for this long is presumed dead.
	DefaultHeartbeatTTL = 60 * time.Second

	// DefaultHeartbeatInterval is how often the heartbeat is refreshed. Half
	// the TTL, so one lost refresh does not cost a live worker its key.
	DefaultHeartbeatInterval = 30 * time.Second

	// DefaultRecoveryInterval is how often each worker scans for dead peers.
	// Worst-case recovery is DefaultHeartbeatTTL + DefaultRecoveryInterval
	// (120 s): the key must expire, then the next scan must run.
	DefaultRecoveryInterval = 60 * time.Second

	// DefaultRowsTTL is three heartbeat TTLs. It must exceed the detection
	// plus recovery window (120 s) so a dead worker's rows set is still there
	// when a peer comes to recover it, and it bounds how long an orphaned set
	// can stay in Redis when no peer ever does.
	DefaultRowsTTL = 180 * time.Second

	// DefaultKeyPrefix is the first part of every Redis key, as in the design.
	DefaultKeyPrefix = "ALYA"

	// DefaultOperationTimeout bounds each Redis call the background loops
	// make. It is lowered to half the heartbeat interval when that is shorter,
	// so a hung call never costs a whole refresh.
	DefaultOperationTimeout = 5 * time.Second

	// DefaultResetTimeout bounds one ResetRows call made by recovery. A
	// recoverer holds its claim on a dead peer for ResetTimeout plus three
	// operation timeouts, so a reset that hangs is cancelled before another
	// worker may take over the peer.
	DefaultResetTimeout = 30 * time.Second
)

// Defaults of the PgxResetter, from the design's schema.
const (
	// DefaultTable is the table that holds the rows.
	DefaultTable = "batchrows"
	// DefaultIDColumn is the bigint primary key of DefaultTable.
	DefaultIDColumn = "rowid"
	// DefaultStatusColumn holds the row's processing state.
	DefaultStatusColumn = "status"
	// DefaultInProgressStatus marks a row a worker has taken.
	DefaultInProgressStatus = "inprog"
	// DefaultQueuedStatus marks a row any worker may fetch.
	DefaultQueuedStatus = "queued"
	// DefaultDoneStatus marks a row a worker has finished.
	DefaultDoneStatus = "done"
	// DefaultResetChunkSize is how many IDs one UPDATE statement carries.
	// Large enough that 100,000 rows take 20 statements, small enough that
	// one statement's array parameter stays well under a megabyte.
	DefaultResetChunkSize = 5000
)

// DefaultTerminalStatus is the status WithMaxRecoveries gives a row that
// reached its recovery limit, when no other is named.
const DefaultTerminalStatus = "failed"
