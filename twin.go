package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/alya/recovery/internal/store"
)

// Telling a live twin from a dead predecessor (issue 10, F3).
//
// Two processes may heartbeat one instance ID: two Workers given the same
// WithInstanceID, or a pod of a StatefulSet restarted under its name while
// the crashed process's heartbeat still lives. Every Worker writes a token
// of its own into its heartbeat (store.HeartbeatOf), and only ever writes
// over an absent key or its own value (store.Beat). Before its first
// heartbeat, Start looks at the key:
//
//   - absent, or our own value (a retried Start): go on;
//   - another value: watch it. A live process refreshes it within one
//     heartbeat interval + operation timeout (its PTTL jumps up, or the
//     value changes): that is a twin, and Start returns ErrInstanceIDInUse
//     having written nothing. A predecessor that died (or is stalled)
//     stops refreshing it: Start waits for the key to expire, watching for
//     a refresh all along, which ends the predecessor's lease;
//   - then, if the ID still has a rows set or an incarnation, they are the
//     predecessor's: Start recovers them as any peer would (recoverDead,
//     the one recovery path: claim, reset under the predecessor's
//     incarnation, finish) before its own first heartbeat, so they are
//     never kept alive, nor taken for this incarnation's.

// twin is Start's claim on the instance ID (claimInstanceID), and what
// the heartbeat does when another process took it (noteOusted).
type twin struct {
	store  store.Store
	log    *slog.Logger
	opts   *options // read-only after New
	lease  *lease
	rows   *inflight
	stats  *counters
	events *dispatcher
	// nodes tells whether the server's evictions hold the recovery of a
	// predecessor whose heartbeat an EXISTS found absent (predecessorHeld,
	// eviction.go); peers is the one recovery path every peer runs
	// (recoverDead, deadpeer.go).
	nodes *nodeWatch
	// ownedRows: the table may name this instance ID the owner of rows
	// in progress (owner mode, or the backstop sweep by owner), so Start
	// recovers a predecessor of a fixed ID even when Redis remembers
	// nothing of it.
	ownedRows bool
	peers     *peerRecoverer
}

// errOusted is what a Worker whose instance ID another process took over
// reports, for good: its lease is lost and the ID in use.
var errOusted = fmt.Errorf("%w: %w", ErrLeaseLost, ErrInstanceIDInUse)

// readOwn reads the heartbeat, its TTL and whether a rows set or an
// incarnation exists, in one transaction on the instance's slot.
func (tw *twin) readOwn(ctx context.Context) (store.Own, error) {
	opCtx, cancel := tw.opts.opContext(ctx)
	defer cancel()
	k, err := tw.store.ReadOwn(opCtx, tw.opts.instanceID)
	if err != nil {
		return k, &readError{err}
	}
	return k, nil
}

// readError is a failure to read the instance's keys at Start: Start
// explains it as it explains a failed first heartbeat (the address, the
// cause).
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// twinWatch is how long a live process can leave its heartbeat without a
// refresh: one interval from send to send, plus the operation timeout for
// the write to land, plus a tenth of the interval for timers and
// scheduling. It assumes the process runs with this Worker's timings, as a
// fleet sharing one configuration does. It is shorter than the TTL
// (interval + operation timeout < 0.9 × TTL).
func (tw *twin) twinWatch() time.Duration {
	return satAdd(satAdd(tw.opts.heartbeatInterval, tw.opts.opTimeout), tw.opts.heartbeatInterval/10)
}

// lockedRowsPoll is how often Start tries again to reset rows its
// predecessor left locked by another session.
const lockedRowsPoll = 250 * time.Millisecond

// twinPoll is how often Start looks at a foreign heartbeat.
func (tw *twin) twinPoll() time.Duration {
	return min(max(tw.opts.heartbeatInterval/20, time.Millisecond), 500*time.Millisecond)
}

// claimInstanceID runs in Start before the first heartbeat: it returns an
// error wrapping ErrInstanceIDInUse if another live process heartbeats this
// instance ID; it waits out a dead predecessor's heartbeat and recovers
// the rows it left. It writes nothing to Redis but the recovery's own keys.
//
// In owner mode a fixed ID's predecessor (WithInstanceID; the default ID
// is new with every Worker) is recovered even when Redis holds no record of
// it (its keys may have expired long ago while PostgreSQL still names the
// ID as the owner of rows in progress): nobody else would recover those
// rows while this process heartbeats the ID. It goes through the
// claim like every recovery, so a peer's sweep recovering the same ID at
// that moment is waited for, not raced.
func (tw *twin) claimInstanceID(ctx context.Context) error {
	recovered, warnedLocked := false, false
	for {
		sent := time.Now()
		k, err := tw.readOwn(ctx)
		if err != nil {
			return err
		}
		switch {
		case k.Value == tw.opts.beatValue:
			return nil // written by an earlier try of this Start
		case k.Value != "":
			if err := tw.awaitPredecessor(ctx, k); err != nil {
				return err
			}
		case k.Record || (tw.ownedRows && tw.opts.instanceIDSet && !recovered):
			if tw.nodes.predecessorHeld(ctx, sent) {
				// The server evicts keys: the absent heartbeat may be a
				// live twin's (eviction.go). Look again after a poll.
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait for the Redis server's evictions to stop before recovering this instance ID's previous process: %w", ctx.Err())
				case <-time.After(tw.twinPoll()):
				}
				continue
			}
			if recovered, err = tw.recoverPredecessor(ctx, &warnedLocked); err != nil {
				// A twin may have taken the ID meanwhile (its recovery
				// waited for ours, ours outlived its claim): say so.
				if k, rerr := tw.readOwn(ctx); rerr == nil && k.Value != "" && k.Value != tw.opts.beatValue {
					return fmt.Errorf("%w: another process took it while this one recovered its predecessor (%v)", ErrInstanceIDInUse, err)
				}
				return err
			}
		default:
			return nil
		}
	}
}

// awaitPredecessor watches a heartbeat that holds another process's value
// until it expires. A refresh seen meanwhile means a live process holds
// the ID.
func (tw *twin) awaitPredecessor(ctx context.Context, first store.Own) error {
	start := time.Now()
	prev := first
	warned := false
	t := time.NewTimer(tw.twinPoll())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the heartbeat of a previous process with this instance ID to expire (%s left): %w",
				prev.PTTL.Round(time.Millisecond), ctx.Err())
		case <-t.C:
		}
		k, err := tw.readOwn(ctx)
		if err != nil {
			return err
		}
		switch {
		case k.Value == "":
			if warned {
				tw.log.Info("heartbeat of the previous process with this instance ID expired; recovering the rows it left",
					slog.Duration("waited", time.Since(start)))
			}
			return nil
		case k.Value != prev.Value || k.PTTL > prev.PTTL:
			return fmt.Errorf("%w: %s was refreshed by another process %s after Start found it",
				ErrInstanceIDInUse, tw.store.Keys(tw.opts.instanceID).Heartbeat, time.Since(start).Round(time.Millisecond))
		case k.PTTL < 0 && time.Since(start) > tw.twinWatch():
			return fmt.Errorf("%w: %s holds another process's value and has no TTL: delete it if no process runs as %s",
				ErrInstanceIDInUse, tw.store.Keys(tw.opts.instanceID).Heartbeat, tw.opts.instanceID)
		}
		if !warned && time.Since(start) > tw.twinWatch() {
			warned = true
			tw.log.Warn("a previous process with this instance ID stopped refreshing its heartbeat; waiting for it to expire before starting",
				slog.Duration("heartbeat_ttl_left", k.PTTL))
		}
		prev = k
		t.Reset(min(tw.twinPoll(), max(k.PTTL, time.Millisecond)))
	}
}

// recoverPredecessor recovers the rows set a previous process left under
// this instance ID, through the recovery every peer runs. While another
// worker holds the claim it waits and tries again.
//
// Rows of the predecessor another session holds locked (its host vanished
// with a transaction open, and its session lives on until the server ends
// it) are waited for, within ctx, trying again every lockedRowsPoll: the
// rows PostgreSQL names this ID the owner of must be reset before this
// process heartbeats under it. warnedLocked says whether that wait was
// logged already.
func (tw *twin) recoverPredecessor(ctx context.Context, warnedLocked *bool) (done bool, err error) {
	pr, claimed, err := tw.peers.recoverDead(ctx, tw.opts.instanceID, foundByRestart, time.Now())
	if err != nil && errors.Is(err, ErrRowsLocked) && ctx.Err() == nil {
		if !*warnedLocked {
			*warnedLocked = true
			tw.log.Warn("Start waits for rows a previous process left under this instance ID: another session holds them locked (its host vanished with a transaction open?); they are reset once that session ends (idle_in_transaction_session_timeout)",
				slog.Any("error", err))
		}
		tw.opts.sig.locked.Signal(struct{}{}) // test signal: a try at the locked rows ended
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("recover the rows a previous process left under this instance ID: %w (%w)", err, ctx.Err())
		case <-time.After(lockedRowsPoll):
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recover the rows a previous process left under this instance ID: %w", err)
	}
	if !claimed {
		// Another worker is recovering it, or a heartbeat appeared: look
		// again after a poll.
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("wait for a peer's recovery of this instance ID's previous process: %w", ctx.Err())
		case <-time.After(tw.twinPoll()):
		}
		return false, nil
	}
	if pr.RowsFound > 0 || pr.RowsReset > 0 {
		tw.log.Info("recovered rows a previous process left under this instance ID",
			slog.Int("rows_found", pr.RowsFound), slog.Int64("rows_reset", pr.RowsReset),
			slog.Int("rows_quarantined", len(pr.Quarantined)))
	}
	return true, nil
}

// noteOusted records, for good, that another process holds this Worker's
// instance ID, and says so once.
func (tw *twin) noteOusted() {
	if tw.lease.ousted.Swap(true) {
		return
	}
	if !tw.lease.lost.Swap(true) {
		tw.stats.leaseLosses.Add(1)
		tw.events.emit(Event{Kind: EventLeaseLost, Duration: tw.lease.sinceRefresh(), Err: errOusted})
	}
	tw.events.emit(Event{Kind: EventInstanceIDTaken, Err: errOusted})
	tw.log.Error("another process heartbeats this instance ID: it started while this worker could not refresh its heartbeat, and has taken over its rows; stop processing and shut this worker down",
		slog.Int("rows_tracked", tw.rows.len()))
}
