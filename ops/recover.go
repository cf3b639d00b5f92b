package ops

import (
	"context"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/bridge"
)

// RecoverNow runs one recovery scan of w now, bounded by ctx: it finds the
// registered peers whose heartbeat has expired and, for each, resets the
// rows in its rows set, then deletes the set and removes the peer from the
// registry. w may be a Worker that is never started (an operator tool that
// never heartbeats can use it), and the scan may run concurrently with
// the background scans of the fleet: a claim in Redis makes sure one dead
// peer is recovered by one worker.
//
// Before Start it first reads the timings the fleet's members announce
// (the fleet record), which a started Worker learns from its heartbeats,
// so that verdicts after a Redis restart wait for the fleet's longest TTL,
// not w's.
//
// The error is nil when every dead peer was handled; otherwise it joins a
// *PeerError for each peer that failed, or reports why the scan itself
// failed. The report describes what was done either way. After w's
// Shutdown it returns recovery.ErrShutdown.
func RecoverNow(ctx context.Context, w *recovery.Worker) (RecoveryReport, error) {
	return bridge.RecoverNow(ctx, w)
}

// PlanRecovery says what RecoverNow(ctx, w) would do now, changing
// nothing: it finds the dead peers as a scan does (registry, heartbeats,
// the age of the Redis node), reads each one's claim, incarnation and rows
// set as a recovery does, and asks w's resetter, in a dry run, which rows
// a reset would actually change (PlanUnknown when the resetter cannot do a
// dry run). It takes no claim, so a recovery running meanwhile may change
// the answer. Like RecoverNow it may be given a Worker that is never
// started; after w's Shutdown it returns recovery.ErrShutdown.
func PlanRecovery(ctx context.Context, w *recovery.Worker) (RecoveryPlan, error) {
	return bridge.PlanRecovery(ctx, w)
}
