package recovery

import "time"

// Timing defaults, from the design. Their relations are checked by New:
// HeartbeatInterval < HeartbeatTTL, and RowsTTL > HeartbeatTTL + 1.1 ×
// RecoveryInterval + the scan lease.
const (
	// DefaultHeartbeatTTL is the detection window: a worker whose heartbeat
	// key has not been refreshed for this long is presumed dead.
	DefaultHeartbeatTTL = 60 * time.Second

	// DefaultHeartbeatInterval is how often the heartbeat is refreshed. Half
	// the TTL, so one lost refresh does not cost a live worker its key.
	DefaultHeartbeatInterval = 30 * time.Second

	// DefaultRecoveryInterval is how often each worker scans for dead peers
	// (jittered ±10%). Worst-case recovery is DefaultHeartbeatTTL + 1.1 ×
	// DefaultRecoveryInterval + the scan lease (0.8 × the interval): 174 s.
	// The key must expire, then the next scan must run, and a scan-lease
	// holder that dies right after scanning holds that scan back by up to
	// its lease; 126 s while the holder lives.
	DefaultRecoveryInterval = 60 * time.Second

	// DefaultRowsTTL is three heartbeat TTLs. It must exceed the longest
	// wait for the first recovery scan (174 s: TTL + 1.1 × recovery
	// interval + the scan lease) so a dead worker's rows set is still there
	// when a peer first comes to recover it (every attempt renews it), and
	// it bounds how long an orphaned set can stay in Redis when no peer
	// ever does.
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

	// DefaultSelfCheckWindow is how long a row the worker tracks may stay
	// not in progress (finished, failed or queued again, before the host's
	// Untrack) before the self-check takes it for a misconfiguration. Long
	// enough for a host to untrack a row it just completed, short enough
	// that the first block of about a second is judged (0.55 s after its
	// COMMIT).
	DefaultSelfCheckWindow = 500 * time.Millisecond
)

// Bounds of every timing option (heartbeat TTL and interval, recovery
// interval, rows TTL, operation and reset timeouts). New refuses a value
// outside them with an ErrInvalidConfig error that names it.
const (
	// MinDuration is the shortest timing New accepts: Redis expiries have
	// millisecond resolution, so a shorter TTL, lease or claim cannot be
	// expressed.
	MinDuration = time.Millisecond

	// MaxDuration is the longest timing New accepts: a week. It is longer
	// than any useful detection window, scan period or reset, and it keeps
	// every duration derived from the options (the largest, the recovery
	// claim's TTL, is at most 4 × MaxDuration) more than three orders of
	// magnitude away from what a time.Duration holds (292 years) and from
	// the expiry times Redis accepts, so none can overflow. There is
	// deliberately no "no limit" reset timeout: the claim a recoverer holds
	// during a reset must expire, or a recoverer that dies holding it
	// blocks the dead peer's recovery forever.
	MaxDuration = 7 * 24 * time.Hour
)

// EnvKeyPrefix is the environment variable of the key prefix
// (WithKeyPrefix), which cmd/recoveryctl reads too.
const EnvKeyPrefix = "RECOVERY_KEY_PREFIX"
