package recovery

import "time"

// Timing defaults, from the design, taken by a zero Timings field (the
// Timings docs state them). Their relations are checked by New:
// heartbeat interval < heartbeat TTL, and rows TTL > heartbeat TTL + 1.1 ×
// recovery interval + the scan turn.
const (
	// defaultHeartbeatTTL is the detection window: a worker whose heartbeat
	// key has not been refreshed for this long is presumed dead.
	defaultHeartbeatTTL = 60 * time.Second

	// defaultHeartbeatInterval is how often the heartbeat is refreshed. Half
	// the TTL, so one lost refresh does not cost a live worker its key.
	// New derives it from the TTL; this is what it gives for the default.
	defaultHeartbeatInterval = 30 * time.Second

	// defaultRecoveryInterval is how often each worker scans for dead peers
	// (jittered ±10%). Worst-case recovery is defaultHeartbeatTTL + 1.1 ×
	// defaultRecoveryInterval + the scan turn (0.8 × the interval): 174 s.
	// The key must expire, then the next scan must run, and a scan-turn
	// holder that dies right after scanning holds that scan back by up to
	// its turn; 126 s while the holder lives.
	defaultRecoveryInterval = 60 * time.Second

	// defaultRowsTTL is three heartbeat TTLs. It must exceed the longest
	// wait for the first recovery scan (174 s: TTL + 1.1 × recovery
	// interval + the scan turn) so a dead worker's rows set is still there
	// when a peer first comes to recover it (every attempt renews it), and
	// it bounds how long an orphaned set can stay in Redis when no peer
	// ever does. New derives it; this is what it gives for the defaults.
	defaultRowsTTL = 180 * time.Second

	// defaultOperationTimeout bounds each Redis call the background loops
	// make. It is lowered to half the heartbeat interval when that is shorter,
	// so a hung call never costs a whole refresh.
	defaultOperationTimeout = 5 * time.Second

	// defaultResetTimeout bounds one reset made by recovery. A recoverer
	// holds its claim on a dead peer for the reset timeout plus three
	// operation timeouts, so a reset that hangs is cancelled before another
	// worker may take over the peer.
	defaultResetTimeout = 30 * time.Second

	// defaultSelfCheckWindow is how long a row the worker tracks may stay
	// not in progress (finished, failed or queued again, before the host's
	// Untrack) before the self-check takes it for a misconfiguration. Long
	// enough for a host to untrack a row it just completed, short enough
	// that the first block of about a second is judged (0.55 s after its
	// COMMIT).
	defaultSelfCheckWindow = 500 * time.Millisecond

	// defaultHistoryLength is about how many entries the history stream
	// keeps (XADD MAXLEN ~). Entries are written only when a peer dies, a
	// recovery fails or a lease is lost, two per recovery: 10,000 are the
	// last 5,000 recoveries, 50 days of a fleet that loses 100 workers a
	// day, in about 2 MB of one key (measured on redis-server 7.0.15:
	// 10,022 entries, 1.97 MB). On by default: the history helps only if
	// it was on before the bad night.
	defaultHistoryLength = 10_000
)

// defaultKeyPrefix is the first part of every Redis key, as in the design
// (ops.DefaultKeyPrefix says the same to operators' tools).
const defaultKeyPrefix = "ALYA"

// Bounds of every timing (the Timings fields). New refuses a value outside
// them with an ErrInvalidConfig error that names the field and the bound.
const (
	// minDuration is the shortest timing New accepts: Redis expiries have
	// millisecond resolution, so a shorter TTL, turn or claim cannot be
	// expressed.
	minDuration = time.Millisecond

	// maxDuration is the longest timing New accepts: a week. It is longer
	// than any useful detection window, scan period or reset, and it keeps
	// every duration derived from the options (the largest, the recovery
	// claim's TTL, is at most 4 × maxDuration) more than three orders of
	// magnitude away from what a time.Duration holds (292 years) and from
	// the expiry times Redis accepts, so none can overflow. There is
	// deliberately no "no limit" reset timeout: the claim a recoverer holds
	// during a reset must expire, or a recoverer that dies holding it
	// blocks the dead peer's recovery forever.
	maxDuration = 7 * 24 * time.Hour
)
