package ops

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/store"
)

// The fleet's history: every worker appends what an operator wants to read
// after a bad night (which peer died, who recovered it, how many rows, how
// long it took, what failed, who lost its lease) to one capped Redis stream
// per prefix, <prefix>_HISTORY (recovery.WithHistory). ReadHistory reads
// it, as do `recoveryctl history` and `recoveryctl watch`.

// Kinds of history entries (HistoryEntry.Kind).
const (
	// HistoryPeerClaimed: PeerID was found dead (FoundBy) and InstanceID
	// claimed its recovery; Duration from the death being noticed to the
	// claim. Only the claimer writes it, so a death is one entry however
	// many workers noticed it. The stream holds it as "peer_dead", the
	// name of earlier releases, which ReadHistory maps to this kind.
	HistoryPeerClaimed = "peer_claimed"
	// HistoryRowsRecovered: InstanceID reset the rows of dead PeerID:
	// Rows found, RowsReset reset (RowIDs), RowsQuarantined quarantined,
	// Duration from the death being noticed to the end of the recovery.
	HistoryRowsRecovered = store.HistoryKindRowsRecovered
	// HistoryRowsQuarantined: that recovery quarantined RowsQuarantined
	// rows (RowIDs: they reached their recovery limit); written beside
	// HistoryRowsRecovered so it stands out.
	HistoryRowsQuarantined = store.HistoryKindRowsQuarantined
	// HistoryRecoveryFailed: InstanceID's recovery of PeerID failed
	// (Error); a later scan tries again. A worker writes a recovery that
	// keeps failing for the same cause once (with its HistoryPeerClaimed),
	// not at every attempt, until it succeeds or the cause changes.
	HistoryRecoveryFailed = store.HistoryKindRecoveryFailed
	// HistoryLeaseLost: InstanceID's heartbeat lease ran out (Duration
	// since its last successful heartbeat): its peers may recover its
	// rows. Error is the last heartbeat's failure.
	HistoryLeaseLost = store.HistoryKindLeaseLost
	// HistoryLeaseRegained: InstanceID's heartbeat succeeded again after
	// its lease was lost.
	HistoryLeaseRegained = store.HistoryKindLeaseRegained
	// HistoryRowsNotReset: InstanceID's recovery of PeerID found
	// RowsNotReset of its Rows rows neither reset nor settled (RowsReset
	// were reset), usually a status misconfigured; the recovery_failed
	// entry that follows says why. Written once while the recovery keeps
	// failing, like peer_claimed.
	HistoryRowsNotReset = store.HistoryKindRowsNotReset
	// HistoryStrayRowsReset: InstanceID's backstop sweep (no owner column)
	// reset RowsReset of Rows rows in progress (RowIDs) that no rows set
	// had held for Duration, RowsQuarantined of them quarantined; PeerID
	// is empty.
	HistoryStrayRowsReset = store.HistoryKindStrayRowsReset
	// HistoryUntrackedRows: InstanceID's backstop sweep found Rows rows
	// (RowIDs) committed in progress that no worker had tracked (Error).
	HistoryUntrackedRows = store.HistoryKindUntrackedRows
	// HistoryEndedLifeRowsReset: InstanceID's backstop sweep (owner
	// column) reset RowsReset rows (RowIDs), RowsQuarantined of them
	// quarantined, in progress under an ended life of PeerID, a live
	// worker: committed after that life ended, or left by its host.
	HistoryEndedLifeRowsReset = store.HistoryKindEndedLifeReset
)

// A HistoryEntry is one entry of the fleet's history. Only the fields its
// Kind documents are set.
type HistoryEntry struct {
	// ID is the stream entry's ID; Added is when Redis appended it (its
	// server clock).
	ID    string
	Added time.Time
	// Kind is one of the History* kinds; entries of kinds a later version
	// writes come through with the fields this version knows.
	Kind string
	// Time is when it happened, by the reporting worker's clock.
	Time time.Time
	// InstanceID is the reporting worker.
	InstanceID string
	// PeerID is the dead peer, for recoveries.
	PeerID string
	// FoundBy says how the death was found: "registry" (a scan),
	// "expiry", "sweep" or "restart" (a worker restarted under the dead
	// one's ID).
	FoundBy string
	// Rows, RowsReset and RowsQuarantined count a recovery's rows: found,
	// reset (quarantined included), quarantined.
	Rows            int
	RowsReset       int64
	RowsQuarantined int
	// RowsNotReset counts the rows a recovery could neither reset nor
	// show settled (HistoryRowsNotReset).
	RowsNotReset int
	// Duration is the entry's length; see each kind.
	Duration time.Duration
	// Error is the failure's message.
	Error string

	// RowIDs are the entry's rows, ascending: those reset
	// (HistoryRowsRecovered, HistoryStrayRowsReset: quarantined ones
	// included), quarantined (HistoryRowsQuarantined) or found
	// (HistoryUntrackedRows); at most HistoryRowIDsMax, the lowest.
	// RowIDsTotal is how many rows the writer had IDs of, more than
	// RowIDs holds when it listed a sample. Both are zero in entries of
	// releases before them, and when the resetter does not list the rows
	// it resets (recovery.ResetResult.ChangedIDs).
	RowIDs      []int64
	RowIDsTotal int
}

// HistoryRowIDsMax bounds the row IDs one history entry lists
// (HistoryEntry.RowIDs): a recovery of more rows lists the lowest
// HistoryRowIDsMax and their total.
const HistoryRowIDsMax = store.HistoryRowIDsMax

// historyEntry reads an entry the Worker wrote. Fields it cannot parse are
// left zero: the history is for reading, not for failing.
func historyEntry(r store.HistoryRecord) HistoryEntry {
	f := r.Fields
	e := HistoryEntry{ID: r.ID, Added: r.Added, Kind: f[store.HistoryFieldKind], InstanceID: f[store.HistoryFieldInstance],
		PeerID: f[store.HistoryFieldPeer], FoundBy: f[store.HistoryFieldFoundBy], Error: f[store.HistoryFieldError]}
	if e.Kind == store.HistoryKindPeerDead {
		e.Kind = HistoryPeerClaimed
	}
	e.Time, _ = time.Parse(time.RFC3339Nano, f[store.HistoryFieldTime])
	e.Rows, _ = strconv.Atoi(f[store.HistoryFieldRows])
	e.RowsReset, _ = strconv.ParseInt(f[store.HistoryFieldRowsReset], 10, 64)
	e.RowsQuarantined, _ = strconv.Atoi(f[store.HistoryFieldQuarantined])
	e.RowsNotReset, _ = strconv.Atoi(f[store.HistoryFieldNotReset])
	if ms, err := strconv.ParseFloat(f[store.HistoryFieldDurationMs], 64); err == nil {
		e.Duration = time.Duration(ms * float64(time.Millisecond))
	}
	e.RowIDs = parseRowIDs(f[store.HistoryFieldRowIDs])
	e.RowIDsTotal, _ = strconv.Atoi(f[store.HistoryFieldRowIDsTotal])
	e.RowIDsTotal = max(e.RowIDsTotal, len(e.RowIDs))
	return e
}

// parseRowIDs reads an entry's row IDs, at most HistoryRowIDsMax of them;
// what is not a decimal ID is skipped.
func parseRowIDs(s string) []int64 {
	var out []int64
	for s != "" && len(out) < HistoryRowIDsMax {
		var part string
		part, s, _ = strings.Cut(s, ",")
		if id, err := strconv.ParseInt(part, 10, 64); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// HistoryQuery says which entries ReadHistory returns.
type HistoryQuery struct {
	// Since keeps the entries Redis appended at or after it (by the
	// server's clock). Zero: from the oldest kept.
	Since time.Time
	// Last keeps only the newest Last of those. 0: all.
	Last int
}

// ReadHistory reads the history of the fleet under prefix
// (recovery.WithKeyPrefix), oldest first, changing nothing. An entry a
// retried append wrote twice comes back once. It is bounded by ctx and the
// Worker's default operation timeout (5 s). A fleet without history (every
// worker recovery.WithHistory(0), or older than the history) has no
// entries. A bad prefix or a negative Last is an error wrapping
// recovery.ErrInvalidConfig.
func ReadHistory(ctx context.Context, rdb redis.UniversalClient, prefix string, q HistoryQuery) ([]HistoryEntry, error) {
	s, err := fleetStore(rdb, prefix)
	if err != nil {
		return nil, err
	}
	if q.Last < 0 {
		return nil, fmt.Errorf("%w: history query Last %d is negative", recovery.ErrInvalidConfig, q.Last)
	}
	ctx, cancel := context.WithTimeout(ctx, operationTimeout)
	defer cancel()
	// Twice Last: room for the duplicates a retried append leaves, which
	// are dropped below.
	recs, err := s.ReadHistory(ctx, store.HistoryQuery{Since: q.Since, Count: 2 * int64(q.Last), Newest: q.Last > 0})
	if err != nil {
		return nil, err
	}
	out := make([]HistoryEntry, 0, len(recs))
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		if uid := r.Fields[store.HistoryFieldUID]; uid != "" { // entries of older versions have none
			if seen[uid] {
				continue
			}
			seen[uid] = true
		}
		out = append(out, historyEntry(r))
	}
	if q.Last > 0 && len(out) > q.Last {
		out = out[len(out)-q.Last:]
	}
	return out, nil
}
