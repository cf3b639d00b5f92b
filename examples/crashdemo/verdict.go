package main

import (
	"fmt"
	"strings"
	"time"
)

// outcome is what the demo observed; verdict judges it.
type outcome struct {
	rows      int // rows in the batch
	done      int // rows with status done
	failed    int // rows with status failed (quarantined or failed work)
	ledger    int // completions recorded in the ledger
	twice     int // rows with more than one ledger entry
	recovered int // rows whose recoveries counter is above 0

	killed        bool
	killedAt      time.Time
	recoveredAt   time.Time // when a survivor reported recovering the victim; zero if never
	rowsReset     int64     // rows that recovery reset
	stranded      int       // rows the victim left in progress when killed
	lostByLive    int       // completions a live worker had to discard
	workerFailure string    // a survivor that exited with an error, and why
	timedOut      bool

	ttl, recoveryInterval time.Duration
}

// recoveryBound is the promise: a dead worker's rows are queued again at
// most heartbeat TTL + recovery interval after its last heartbeat, the
// interval jittered by up to 10%. Measured from the kill, which comes after
// the last heartbeat, the same bound holds.
func (o outcome) recoveryBound() time.Duration {
	return o.ttl + o.recoveryInterval*11/10
}

// measurementSlack covers what the bound leaves out and the measurement
// adds: the scan itself (its Redis round trips and the reset's PostgreSQL
// transaction, which the design counts on top of the bound) and the log
// line's way to this process, on a machine that may be busy.
const measurementSlack = 500 * time.Millisecond

// killToRecovery is the time from the kill to the survivor's report.
func (o outcome) killToRecovery() time.Duration {
	if !o.killed || o.recoveredAt.IsZero() {
		return 0
	}
	return o.recoveredAt.Sub(o.killedAt)
}

// verdict lists the broken promises (none means PASS) and the report's
// lines.
func (o outcome) verdict() (broken []string, lines []string) {
	add := func(ok bool, label, value, note string) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
		}
		lines = append(lines, strings.TrimRight(fmt.Sprintf("  %s  %-32s %-10s %s", mark, label, value, note), " "))
	}

	finished := o.done + o.failed
	add(finished == o.rows, "rows processed", fmt.Sprintf("%d/%d", finished, o.rows), failedNote(o.failed))
	if finished != o.rows {
		broken = append(broken, fmt.Sprintf("%d rows were never finished", o.rows-finished))
	}
	add(o.twice == 0, "rows processed twice", fmt.Sprint(o.twice), fmt.Sprintf("(ledger: %d completions)", o.ledger))
	if o.twice > 0 {
		broken = append(broken, fmt.Sprintf("%d rows were processed twice", o.twice))
	}
	add(o.lostByLive == 0, "rows taken from a live worker", fmt.Sprint(o.lostByLive), "")
	if o.lostByLive > 0 {
		broken = append(broken, fmt.Sprintf("%d rows were recovered from a worker that was alive", o.lostByLive))
	}

	bound := o.recoveryBound()
	boundNote := fmt.Sprintf("bound %v = TTL %v + recovery %v (+10%% jitter)", round(bound), o.ttl, o.recoveryInterval)
	switch {
	case !o.killed:
		add(false, "kill → rows queued again", "-", "no worker was killed")
		broken = append(broken, "no worker was killed (use more -rows, or a smaller -kill-block)")
	case o.recoveredAt.IsZero():
		add(false, "kill → rows queued again", "never", boundNote)
		broken = append(broken, "the killed worker's rows were never recovered")
	default:
		d := o.killToRecovery()
		ok := d <= bound+measurementSlack
		add(ok, "kill → rows queued again", round(d).String(), boundNote)
		if !ok {
			broken = append(broken, fmt.Sprintf("recovery took %v, over the bound %v", round(d), round(bound)))
		}
		add(o.rowsReset >= int64(min(o.stranded, 1)), "rows reset by recovery", fmt.Sprint(o.rowsReset),
			fmt.Sprintf("(%d left in progress by the kill)", o.stranded))
		if o.rowsReset < int64(min(o.stranded, 1)) {
			broken = append(broken, "the killed worker left rows in progress and none was reset")
		}
	}
	if o.workerFailure != "" {
		add(false, "survivors exited cleanly", "no", o.workerFailure)
		broken = append(broken, "a surviving worker failed: "+o.workerFailure)
	}
	if o.timedOut {
		broken = append(broken, "the demo did not finish within -timeout")
	}
	return broken, lines
}

// summary is the one-line verdict.
func (o outcome) summary(broken []string) string {
	if len(broken) > 0 {
		return "verdict: FAIL: " + strings.Join(broken, "; ")
	}
	return fmt.Sprintf("verdict: PASS: %d/%d rows processed, processed twice: 0, rows queued again %v after the kill (bound %v)",
		o.done+o.failed, o.rows, round(o.killToRecovery()), round(o.recoveryBound()))
}

func failedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("(%d failed)", n)
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
