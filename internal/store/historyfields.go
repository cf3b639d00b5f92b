package store

// The history stream's wire format: the field names of an entry and the
// kinds it may hold. The root's writer and package ops's reader share
// these definitions. Like the key names, they are a wire protocol: workers
// and readers of other releases parse them, so they never change.

// Field names of a history entry.
const (
	HistoryFieldKind        = "kind"
	HistoryFieldTime        = "time" // RFC 3339 with nanoseconds, UTC
	HistoryFieldInstance    = "instance"
	HistoryFieldPeer        = "peer"
	HistoryFieldFoundBy     = "found_by"
	HistoryFieldRows        = "rows"
	HistoryFieldRowsReset   = "rows_reset"
	HistoryFieldQuarantined = "rows_quarantined"
	HistoryFieldNotReset    = "rows_not_reset"
	HistoryFieldDurationMs  = "duration_ms" // a decimal number of milliseconds
	HistoryFieldError       = "error"
	// HistoryFieldUID is the entry's random ID. An XADD whose reply was
	// lost is sent again and may append the entry twice: readers keep the
	// first of each uid. Entries of older versions have none.
	HistoryFieldUID = "uid"
)

// The rows of an entry: added after the fields above, so entries of older
// versions have none, and older readers skip them.
const (
	// HistoryFieldRowIDs lists the entry's rows (reset, quarantined or
	// found untracked): decimal IDs, ascending, comma-separated, at most
	// HistoryRowIDsMax of them (the lowest).
	HistoryFieldRowIDs = "row_ids"
	// HistoryFieldRowIDsTotal is how many rows the entry has IDs of: more
	// than HistoryFieldRowIDs lists when it exceeds HistoryRowIDsMax.
	HistoryFieldRowIDsTotal = "row_ids_total"
	// HistoryRowIDsMax bounds the IDs one entry lists: about 2 KB of
	// 20-digit IDs, so a mass recovery cannot bloat the capped stream.
	HistoryRowIDsMax = 100
)

// Kinds of history entries, as the stream holds them.
const (
	// HistoryKindPeerDead is written when a worker claims the recovery of
	// a dead peer. The name is historical: readers show it as
	// "peer_claimed".
	HistoryKindPeerDead        = "peer_dead"
	HistoryKindRowsRecovered   = "rows_recovered"
	HistoryKindRowsQuarantined = "rows_quarantined"
	HistoryKindRecoveryFailed  = "recovery_failed"
	HistoryKindLeaseLost       = "lease_lost"
	HistoryKindLeaseRegained   = "lease_regained"
	HistoryKindRowsNotReset    = "rows_not_reset"
	HistoryKindStrayRowsReset  = "stray_rows_reset"
	HistoryKindUntrackedRows   = "untracked_rows"
	HistoryKindEndedLifeReset  = "ended_life_rows_reset"
)
