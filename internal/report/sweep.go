package report

import "time"

// SweepReport says what a backstop sweep by row version run on demand
// found and did (ops.SweepNow).
type SweepReport struct {
	// Swept is false when the Worker cannot sweep (a resetter that cannot
	// list the rows in progress, or the sweep turned off); Why then says
	// why, and nothing was read.
	Swept bool
	Why   string
	// ByOwner is set for the sweep by owner (an owner column). It reports
	// owners, not rows: Owners lists, sorted, the owners of rows in
	// progress without a heartbeat at the first look, and StuckOwners
	// those still so at the end, their rows not reset (not yet judged,
	// or their recovery failed). Stray, Stuck and RowsInProgress stay
	// empty; Gap is the fleet's heartbeat TTL.
	ByOwner             bool
	Owners, StuckOwners []string
	// NodeHeld is set when a Redis master had been up for less than a
	// heartbeat TTL, or evicted keys: live workers may not have written
	// their rows sets back yet, so no row was judged.
	NodeHeld bool
	// RowsInProgress is how many rows the database had in progress at the
	// first look.
	RowsInProgress int
	// Stray lists, sorted, the rows in progress that no rows set held at
	// the first look.
	Stray []int64
	// Gap is how long after the first look the sweep may reset them: the
	// longest rows or heartbeat TTL of the fleet, by which time every live
	// worker has written each row it holds back into its set.
	Gap time.Duration
	// Waited is set when a second look was taken a Gap after the first.
	Waited bool
	// RowsReset rows were reset to queued at the second look;
	// Quarantined of them reached their recovery limit instead.
	RowsReset   int64
	Quarantined int
	// Stuck lists, sorted, the rows in progress that no rows set held at
	// the last look and that are still in progress: without Waited, all
	// of Stray; after the second look, those another session held locked,
	// those the database refused (Refused) and those first seen unheld
	// then.
	Stuck []int64
	// Locked is how many rows due at the second look another session
	// held locked.
	Locked int
	// Refused lists, sorted, the rows due at the second look that the
	// database refused to change (a BEFORE UPDATE trigger returning NULL:
	// RowState.Refused); they are in Stuck too.
	Refused []int64
}
