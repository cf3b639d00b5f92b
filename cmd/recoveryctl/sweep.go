package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/ops"
)

// sweepJSON is what recover found in PostgreSQL: the rows in progress
// that no live worker's rows set holds, and what the backstop sweep's
// looks did with them (ops.SweepNow). Absent with an owner column: the
// scan then resets a dead instance's rows by owner.
type sweepJSON struct {
	RowsInProgress int `json:"rows_in_progress"`
	// RowsUnheld are the rows in progress no rows set held at the first
	// look; RowsStuck those still so at the end, not reset.
	RowsUnheld []int64 `json:"rows_unheld"`
	RowsStuck  []int64 `json:"rows_stuck"`
	// GapMs is how long after the first look the sweep's second look may
	// reset them; Waited says whether recover waited for it.
	GapMs       int64 `json:"gap_ms"`
	Waited      bool  `json:"waited"`
	RowsReset   int64 `json:"rows_reset"`
	Quarantined int   `json:"quarantined"`
	Locked      int   `json:"locked"`
	// RowsRefused are the rows of RowsStuck the database refused to
	// change at the second look (a BEFORE UPDATE trigger returning NULL).
	RowsRefused []int64 `json:"rows_refused,omitempty"`
	// RedisTooYoung: a Redis master was up for less than a heartbeat TTL
	// (or evicted keys), so no row could be judged.
	RedisTooYoung bool `json:"redis_too_young,omitempty"`
	// Kept are dead instances left registered because they left no rows
	// set while rows no worker holds are stuck, or could not be told;
	// cleaned (clean), as every string from Redis. In a dry run, those
	// recover would keep.
	Kept []string `json:"kept,omitempty"`
	// PastTimeout, in a dry run: the sweep's second look would come past
	// --timeout, so recover would not reset the stuck rows or owners.
	PastTimeout bool `json:"past_timeout,omitempty"`
	// Error says why the rows in progress could not be judged.
	Error string `json:"error,omitempty"`
	// With an owner column the sweep judges owners, not rows: Owners
	// had rows in progress and no heartbeat at the first look,
	// OwnersStuck still so at the end, their rows not reset.
	ByOwner     bool     `json:"by_owner,omitempty"`
	Owners      []string `json:"owners_without_heartbeat,omitempty"`
	OwnersStuck []string `json:"owners_stuck,omitempty"`
}

func toSweepJSON(r ops.SweepReport) *sweepJSON {
	return &sweepJSON{RowsInProgress: r.RowsInProgress, RowsUnheld: nonNil(r.Stray), RowsStuck: nonNil(r.Stuck),
		GapMs: r.Gap.Milliseconds(), Waited: r.Waited, RowsReset: r.RowsReset, Quarantined: r.Quarantined,
		Locked: r.Locked, RowsRefused: r.Refused, RedisTooYoung: r.NodeHeld, ByOwner: r.ByOwner, Owners: cleanAll(r.Owners), OwnersStuck: cleanAll(r.StuckOwners)}
}

func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}

// sweepNow looks in PostgreSQL for the rows in progress that no live
// worker holds, and resets them as the backstop sweep does, waiting for
// its second look when --timeout allows (ops.SweepNow). It returns the
// dead instances the scan must keep: while such rows stay stuck, a dead
// instance that left no rows set may have held them, and deregistering
// it would hide it from the operator.
func sweepNow(ctx context.Context, rdb redis.UniversalClient, w *recovery.Worker, o *options, out *recoverJSON) ([]string, error) {
	rep, err := ops.SweepNow(ctx, w, false)
	if !rep.Swept {
		return nil, err
	}
	out.Sweep = toSweepJSON(rep)
	out.RowsReset += rep.RowsReset
	if err != nil {
		out.Sweep.Error = clean(redact.String(err.Error(), o.databaseURL, o.redisURL))
	}
	if rep.ByOwner || (err == nil && len(rep.Stuck) == 0 && !rep.NodeHeld) {
		// By owner, the scan resets a dead instance's rows by owner,
		// rows set or not: nothing to keep.
		return nil, err
	}
	keep, kerr := keepers(ctx, rdb, o)
	out.Sweep.Kept = cleanAll(keep)
	return keep, errors.Join(err, kerr)
}

// keepers are the dead instances that left no rows set: while rows in
// progress that no worker holds stay stuck, one of them may have held
// them. As Redis holds them, for the scan.
func keepers(ctx context.Context, rdb redis.UniversalClient, o *options) ([]string, error) {
	fleet, err := ops.Inspect(ctx, rdb, o.prefix)
	if err != nil {
		return nil, fmt.Errorf("read the registry: %w", err)
	}
	var keep []string
	for _, i := range fleet.Instances {
		if !i.Alive() && !i.RowsPresent && i.Incarnation == "" {
			keep = append(keep, i.InstanceID)
		}
	}
	return keep, nil
}

// sweepPlan is sweepNow's dry run: the first look only. It fails where
// the real run with the same --timeout would leave rows stuck, and then
// shows as kept the dead instances the real run would keep (the plan
// says it would deregister them).
func sweepPlan(ctx context.Context, rdb redis.UniversalClient, w *recovery.Worker, o *options, out *recoverJSON) error {
	rep, err := ops.SweepNow(ctx, w, true)
	if !rep.Swept || err != nil {
		return err
	}
	out.Sweep = toSweepJSON(rep)
	if len(rep.Stuck)+len(rep.StuckOwners) == 0 {
		return nil
	}
	if !rep.NodeHeld && rep.Gap+rep.Gap/10 < o.timeout {
		out.RowsReset += int64(len(rep.Stuck)) // the real run waits for the second look and resets them
		return nil
	}
	out.Sweep.PastTimeout = !rep.NodeHeld
	var kerr error
	if !rep.ByOwner {
		var keep []string
		keep, kerr = keepers(ctx, rdb, o)
		out.Sweep.Kept = cleanAll(keep)
		kept := map[string]bool{}
		for _, id := range out.Sweep.Kept {
			kept[id] = true
		}
		for n, p := range out.Peers {
			if kept[p.InstanceID] {
				out.Peers[n].Action = "kept"
			}
		}
	}
	return errors.Join(stuckErr(out.Sweep), kerr)
}

// stuckErr is the failure of rows left stuck, naming them.
func stuckErr(s *sweepJSON) error {
	switch {
	case s == nil:
		return nil
	case s.RedisTooYoung:
		return fmt.Errorf("%w: a Redis master has been up for less than a heartbeat TTL (or evicted keys): live workers may not have written their rows sets back yet, so the rows in progress that no worker holds cannot be told; run recover again in a heartbeat TTL",
			ops.ErrRowsStuck)
	case len(s.OwnersStuck) > 0 && !s.Waited:
		gap := time.Duration(s.GapMs) * time.Millisecond
		return fmt.Errorf("%w: the rows of %d owners without a heartbeat (%s) were not reset: the backstop sweep resets them at a second look %s after the first, past --timeout; run recover again with --timeout %s, or start a worker, whose backstop sweep resets them",
			ops.ErrRowsStuck, len(s.OwnersStuck), quoteAll(s.OwnersStuck), durText(gap), durText(2*gap+30*time.Second))
	case len(s.OwnersStuck) > 0:
		return fmt.Errorf("%w: the rows of %d owners without a heartbeat (%s) are still in progress after the backstop sweep's second look (their recovery failed, or another worker holds its claim); run recover again",
			ops.ErrRowsStuck, len(s.OwnersStuck), quoteAll(s.OwnersStuck))
	case len(s.RowsStuck) == 0:
		return nil
	case !s.Waited:
		gap := time.Duration(s.GapMs) * time.Millisecond
		return fmt.Errorf("%w: %d rows (%s) were not reset: the backstop sweep resets them at a second look %s after the first, past --timeout; run recover again with --timeout %s, or start a worker, whose backstop sweep resets them",
			ops.ErrRowsStuck, len(s.RowsStuck), idList(s.RowsStuck), durText(gap), durText(2*gap+30*time.Second))
	}
	if len(s.RowsRefused) > 0 {
		return fmt.Errorf("%w: %d rows (%s) are still in progress after the backstop sweep's second look (%d refused by the database (%s): a BEFORE UPDATE trigger returned NULL, so the reset changed nothing; %d held locked by another session, the others first seen unheld then); fix the trigger, then run recover again",
			ops.ErrRowsStuck, len(s.RowsStuck), idList(s.RowsStuck), len(s.RowsRefused), idList(s.RowsRefused), s.Locked)
	}
	return fmt.Errorf("%w: %d rows (%s) are still in progress after the backstop sweep's second look (%d held locked by another session, the others first seen unheld then); run recover again",
		ops.ErrRowsStuck, len(s.RowsStuck), idList(s.RowsStuck), s.Locked)
}

// printSweep shows what recover found in PostgreSQL.
func printSweep(w io.Writer, out recoverJSON) {
	s := out.Sweep
	if s == nil {
		return
	}
	gap := durText(time.Duration(s.GapMs) * time.Millisecond)
	if s.ByOwner {
		printOwners(w, out)
		return
	}
	switch {
	case s.Error != "":
		fmt.Fprintf(w, "PostgreSQL: the rows in progress that no live worker holds could not be told: %s\n", s.Error)
	case s.RedisTooYoung:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress; which of them no live worker holds cannot be told yet (a Redis master is too young)\n", s.RowsInProgress)
	case s.RowsInProgress == 0:
		fmt.Fprintln(w, "PostgreSQL: no rows in progress")
	case len(s.RowsUnheld) == 0:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress, every one in a live worker's rows set\n", s.RowsInProgress)
	case out.DryRun && s.PastTimeout:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress, %d of them in no rows set: no live worker holds them (%s); the dry run could not finish the backstop sweep's second look, %s after the first, within --timeout: recover would not reset them\n",
			s.RowsInProgress, len(s.RowsUnheld), idList(s.RowsUnheld), gap)
	case out.DryRun:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress, %d of them in no rows set: no live worker holds them (%s); recover would reset them at the backstop sweep's second look, %s after the first\n",
			s.RowsInProgress, len(s.RowsUnheld), idList(s.RowsUnheld), gap)
	case !s.Waited:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress, %d of them in no rows set: no live worker holds them (%s); not reset: the backstop sweep's second look comes %s after the first, past --timeout\n",
			s.RowsInProgress, len(s.RowsUnheld), idList(s.RowsUnheld), gap)
	default:
		fmt.Fprintf(w, "PostgreSQL: %d rows in progress, %d of them in no rows set (%s); at a second look %s later, %d were reset to queued, %d quarantined\n",
			s.RowsInProgress, len(s.RowsUnheld), idList(s.RowsUnheld), gap, s.RowsReset, s.Quarantined)
	}
	if s.Waited && len(s.RowsStuck) > 0 {
		fmt.Fprintf(w, "  still stuck: %d rows (%s), %d of them held locked by another session, %d refused by the database\n", len(s.RowsStuck), idList(s.RowsStuck), s.Locked, len(s.RowsRefused))
	}
	for _, id := range s.Kept {
		if out.DryRun {
			fmt.Fprintf(w, "would keep %s registered: it is dead and left no rows set, and rows in progress that no worker holds would stay stuck or could not be told\n", id)
			continue
		}
		fmt.Fprintf(w, "kept %s registered: it is dead and left no rows set, and rows in progress that no worker holds are stuck or could not be told\n", id)
	}
}

// printOwners is printSweep by owner.
func printOwners(w io.Writer, out recoverJSON) {
	s := out.Sweep
	gap := durText(time.Duration(s.GapMs) * time.Millisecond)
	switch {
	case s.Error != "":
		fmt.Fprintf(w, "PostgreSQL: the owners of rows in progress could not be judged: %s\n", s.Error)
	case len(s.Owners) == 0:
		fmt.Fprintln(w, "PostgreSQL: no row in progress whose owner has no heartbeat")
	case out.DryRun && s.PastTimeout:
		fmt.Fprintf(w, "PostgreSQL: rows in progress of %d owners without a heartbeat (%s); the dry run could not finish the backstop sweep's second look, %s after the first, within --timeout: recover would not reset them\n",
			len(s.Owners), quoteAll(s.Owners), gap)
	case out.DryRun:
		fmt.Fprintf(w, "PostgreSQL: rows in progress of %d owners without a heartbeat (%s); recover would reset them by owner at the backstop sweep's second look, %s after the first\n",
			len(s.Owners), quoteAll(s.Owners), gap)
	case !s.Waited:
		fmt.Fprintf(w, "PostgreSQL: rows in progress of %d owners without a heartbeat (%s); not reset: the backstop sweep's second look comes %s after the first, past --timeout\n",
			len(s.Owners), quoteAll(s.Owners), gap)
	default:
		fmt.Fprintf(w, "PostgreSQL: rows in progress of %d owners without a heartbeat (%s); at a second look %s later, %d rows were reset by owner, %d quarantined\n",
			len(s.Owners), quoteAll(s.Owners), gap, s.RowsReset, s.Quarantined)
	}
	if s.Waited && len(s.OwnersStuck) > 0 {
		fmt.Fprintf(w, "  still without a heartbeat, rows not reset: %s\n", quoteAll(s.OwnersStuck))
	}
}
