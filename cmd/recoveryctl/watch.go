package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/ops"
)

// ANSI sequences watch uses on a terminal.
const (
	ansiHome       = "\x1b[H"    // cursor to the top left corner
	ansiClear      = "\x1b[2J"   // clear the screen
	ansiClearLine  = "\x1b[K"    // clear to the end of the line
	ansiClearBelow = "\x1b[J"    // clear to the end of the screen
	ansiHideCursor = "\x1b[?25l" // no cursor blinking over the table
	ansiShowCursor = "\x1b[?25h"
)

// cmdWatch shows the fleet every --interval until interrupted (or --count
// frames): on a terminal each frame redraws the screen in place; piped,
// frames are plain lines, one block after another. A frame that cannot be
// read (Redis down) says why, and the next one tries again.
func cmdWatch(ctx context.Context, o *options, stdout io.Writer) error {
	connectCtx, cancel := context.WithTimeout(ctx, o.timeout)
	rdb, name, err := connectRedis(connectCtx, o)
	cancel()
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := store.ValidateName(o.prefix); err != nil {
		return &usageError{fmt.Sprintf("key prefix %q %v", o.prefix, err)}
	}
	ansi := !o.plain && isTerminal(stdout)
	if ansi {
		fmt.Fprint(stdout, ansiHideCursor+ansiClear)
		defer fmt.Fprint(stdout, ansiShowCursor)
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for n := 0; o.count == 0 || n < o.count; n++ {
		select {
		case <-ctx.Done():
			return nil // interrupted: the normal end of a watch
		case <-t.C:
		}
		started := time.Now()
		lines := watchFrame(ctx, rdb, o, name)
		if ctx.Err() != nil {
			return nil
		}
		var b strings.Builder
		if ansi {
			b.WriteString(ansiHome)
			for _, l := range lines {
				b.WriteString(l + ansiClearLine + "\n")
			}
			b.WriteString(ansiClearBelow)
		} else {
			b.WriteString(strings.Join(lines, "\n") + "\n\n")
		}
		if _, err := io.WriteString(stdout, b.String()); err != nil {
			return err // the reader went away
		}
		t.Reset(max(0, o.interval-time.Since(started)))
	}
	return nil
}

// watchFrame reads the fleet once and returns the lines of one frame.
func watchFrame(ctx context.Context, rdb redis.UniversalClient, o *options, name string) []string {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	f := frame{now: time.Now()}
	f.fleet, f.fleetErr = ops.Inspect(ctx, rdb, o.prefix)
	f.fleet = cleanFleet(f.fleet)
	if f.fleetErr == nil {
		f.scan, f.sweep, f.turnsErr = store.NewRedis(rdb, o.prefix, o.timeout).Turns(ctx)
		f.history, f.historyErr = ops.ReadHistory(ctx, rdb, o.prefix, ops.HistoryQuery{Last: o.last})
	}
	return f.lines(o, name)
}

// frame is what one frame of watch read.
type frame struct {
	now                            time.Time
	fleet                          ops.FleetState
	fleetErr, turnsErr, historyErr error
	scan, sweep                    store.Turn
	history                        []ops.HistoryEntry
}

// lines shows a frame. The sweep turn shows only for a fleet that can
// sweep (an owner column: --owner-column or RECOVERY_OWNER_COLUMN), or
// when someone holds it.
func (f frame) lines(o *options, name string) []string {
	lines := []string{fmt.Sprintf("recovery fleet %s on %s, %s", o.prefix, name,
		f.now.UTC().Format("2006-01-02 15:04:05 UTC"))}
	if f.fleetErr != nil {
		return append(lines, "", "cannot read the fleet: "+clean(f.fleetErr.Error()))
	}
	turns := "scan turn: " + turnText(f.scan, true)
	if o.pgx.OwnerColumn != "" || f.sweep.Holder != "" {
		turns += ", sweep turn: " + turnText(f.sweep, false)
	}
	if f.turnsErr != nil {
		turns = "turns unknown: " + clean(f.turnsErr.Error())
	}
	alive, late, dead := o.fleetCounts(f.fleet.Instances)
	lines = append(lines, fmt.Sprintf("%d workers: %s; %s", len(f.fleet.Instances), countsText(alive, late, dead), turns), "")

	var buf bytes.Buffer
	if len(f.fleet.Instances) > 0 {
		o.writeWorkers(&buf, f.fleet.Instances)
		for _, l := range o.beatLegend(f.fleet.Instances) {
			fmt.Fprintln(&buf, l)
		}
	} else {
		fmt.Fprintf(&buf, "no worker registered in %s\n", f.fleet.Registry)
	}
	if len(f.fleet.InvalidMembers) > 0 {
		fmt.Fprintf(&buf, "ignored %d registry members that are not valid instance IDs\n", len(f.fleet.InvalidMembers))
	}
	if f.fleet.Serves != "" {
		fmt.Fprintf(&buf, "serves %s%s\n", f.fleet.Serves, onServer(f.fleet.Server))
	}
	if ttls := announcedTTLs(f.fleet.Instances); ttls != "" {
		fmt.Fprintf(&buf, "heartbeat TTLs announced: %s\n", ttls)
	}
	buf.WriteString("\n")

	switch {
	case f.historyErr != nil:
		fmt.Fprintf(&buf, "cannot read the history: %s\n", clean(f.historyErr.Error()))
	case len(f.history) == 0:
		fmt.Fprintf(&buf, "no history yet in %s\n", store.HistoryKey(o.prefix))
	default:
		fmt.Fprintf(&buf, "last %d of the history (%s):\n", len(f.history), store.HistoryKey(o.prefix))
		writeHistory(&buf, f.history, "2006-01-02 15:04:05.000", false)
	}
	return append(lines, strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")...)
}

// turnText shows who holds a turn, and whether it is a stranger (no live
// worker: store.Turn.Stranger): the scan turn's holder is an instance
// ID, the sweep turn's a token, so only whether it is held shows.
func turnText(t store.Turn, showHolder bool) string {
	left := ttlText(true, t.TTL) + " left"
	if t.Stranger != "" {
		// A stranger's value is shown whatever the turn: it is no token.
		showHolder = true
		left += ", held by no live worker: " + t.Stranger + "; a worker's next take replaces it"
	}
	switch {
	case t.Holder == "":
		return "free"
	case showHolder:
		return fmt.Sprintf("%s (%s)", clean(t.Holder), left)
	default:
		return fmt.Sprintf("held (%s)", left)
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
