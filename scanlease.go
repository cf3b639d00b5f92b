package recovery

import (
	"context"
	"time"

	"github.com/alya/recovery/internal/keys"
	"github.com/alya/recovery/internal/scripts"
)

// takeScanLease reports whether this worker should scan now. With the scan
// lease on (the default), one worker of the fleet scans per recovery
// interval: the first whose tick finds <prefix>_SCAN_LEASE free takes it
// for scanLeaseTTL, so the fleet's scan load stays that of one worker
// instead of growing with the square of its size. The lease holds the
// instance ID, so a retry after a lost reply finds this worker holding it
// (TakeLease) instead of skipping the scan. If Redis cannot be asked, the
// worker scans anyway: the scan reports the outage.
func (w *Worker) takeScanLease(ctx context.Context) bool {
	if !w.opts.scanLease {
		return true
	}
	opCtx, cancel := w.opContext(ctx)
	defer cancel()
	held, err := scripts.TakeLease.Run(opCtx, w.rdb, []string{keys.ScanLease(w.opts.keyPrefix)},
		w.opts.instanceID, w.scanLeaseTTL().Milliseconds()).Int()
	return held == 1 || err != nil
}

// scanLeaseTTL is 0.8 × the recovery interval, so the holder's own next
// tick (at least 0.9 × the interval later) finds the lease free, but never
// more than the heartbeat TTL, so a holder that dies right after taking the
// lease has released it by the time its own heartbeat expires.
//
// The lease adds to the detection bound. Let the holder scan at t0 while a
// peer V is alive, and V's heartbeat expire just after. If the holder
// lives, its next tick scans by t0 + 1.1 × interval (+ its scan): within
// TTL + 1.1 × interval of V's last heartbeat. If the holder dies at once,
// nobody scans until the lease ends at t0 + L; a worker whose tick came
// just before that skipped it, and its next tick comes up to 1.1 ×
// interval later. So the worst case from V's last heartbeat to its rows
// queued is TTL + 1.1 × interval + L (+ one scan), L = min(0.8 × interval,
// TTL): 60 + 66 + 48 = 174 s by default, and that is the bound README and
// docs state. A shorter lease would shrink the term but let a large fleet
// scan every L instead of every interval; the lease cannot be dropped from
// the bound without rescheduling skipped ticks to the lease's end
// (TestScanLeaseOfAHolderThatDiesAfterScanningDelaysRecoveryByAtMostTheLease).
func (w *Worker) scanLeaseTTL() time.Duration { return w.opts.scanLeaseTTL() }
