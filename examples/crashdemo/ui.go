package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ANSI sequences, standard library only.
const (
	csi        = "\x1b["
	hideCursor = csi + "?25l"
	showCursor = csi + "?25h"
	clearDown  = csi + "J"
	reset      = csi + "0m"
	bold       = csi + "1m"
	dim        = csi + "2m"
	red        = csi + "31m"
	green      = csi + "32m"
	yellow     = csi + "33m"
	cyan       = csi + "36m"
)

// ui prints the demo. On a terminal it keeps a table at the bottom, redrawn
// in place, with event lines scrolling above it; otherwise it prints plain
// event lines and a progress line now and then.
type ui struct {
	w     io.Writer
	tty   bool
	color bool
	start time.Time

	table     []string // last table drawn
	drawn     int      // lines of it on screen
	lastPlain string   // last plain progress line
	lastAt    time.Time
}

// newUI returns a ui for w: live if w is a terminal (and TERM is not dumb),
// in color unless NO_COLOR is set. plain forces plain output.
func newUI(w io.Writer, plain bool, getenv func(string) string) *ui {
	u := &ui{w: w, start: time.Now()}
	if f, ok := w.(*os.File); ok && !plain && getenv("TERM") != "dumb" {
		u.tty = isTerminal(f)
	}
	u.color = u.tty && getenv("NO_COLOR") == ""
	if u.tty {
		fmt.Fprint(w, hideCursor)
	}
	return u
}

// isTerminal reports whether f is a character device: a terminal, not a
// pipe or a file.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// paint wraps s in a color on color terminals.
func (u *ui) paint(color, s string) string {
	if !u.color || s == "" {
		return s
	}
	return color + s + reset
}

// elapsed is the time since the demo started, as "+1.23s".
func (u *ui) elapsed(at time.Time) string {
	return fmt.Sprintf("%+7.2fs", at.Sub(u.start).Seconds())
}

// say prints a line as is (headers, the verdict), above the table.
func (u *ui) say(format string, args ...any) {
	u.lines([]string{fmt.Sprintf(format, args...)})
}

// event prints a timestamped event line.
func (u *ui) event(at time.Time, format string, args ...any) {
	u.lines([]string{u.paint(dim, u.elapsed(at)) + "  " + fmt.Sprintf(format, args...)})
}

// lines prints lines above the table, then redraws the table.
func (u *ui) lines(ls []string) {
	var b strings.Builder
	u.erase(&b)
	for _, l := range ls {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	u.draw(&b)
	io.WriteString(u.w, b.String())
}

// update replaces the table. In plain mode, progress (if not empty) is
// printed when it changed and at most once a second.
func (u *ui) update(table []string, progress string, now time.Time) {
	u.table = table
	if u.tty {
		var b strings.Builder
		u.erase(&b)
		u.draw(&b)
		io.WriteString(u.w, b.String())
		return
	}
	if progress != "" && progress != u.lastPlain && now.Sub(u.lastAt) >= time.Second {
		u.lastPlain, u.lastAt = progress, now
		fmt.Fprintf(u.w, "%s  %s\n", u.elapsed(now), progress)
	}
}

// erase moves the cursor to the first line of the table and clears from
// there down.
func (u *ui) erase(b *strings.Builder) {
	if u.tty && u.drawn > 0 {
		fmt.Fprintf(b, "%s%dF%s", csi, u.drawn, clearDown)
		u.drawn = 0
	}
}

func (u *ui) draw(b *strings.Builder) {
	if !u.tty {
		return
	}
	for _, l := range u.table {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	u.drawn = len(u.table)
}

// freeze prints the table one last time as ordinary lines and stops
// redrawing it, so what follows (the verdict) comes after it.
func (u *ui) freeze() {
	if !u.tty {
		return
	}
	var b strings.Builder
	u.erase(&b)
	u.draw(&b)
	io.WriteString(u.w, b.String())
	u.table, u.drawn = nil, 0
}

// close leaves the last table on screen and gives the cursor back.
func (u *ui) close() {
	if u.tty {
		fmt.Fprint(u.w, showCursor)
	}
}

// bar is a progress bar of width cells: done, then in progress, then the
// rest.
func (u *ui) bar(done, inprog, total, width int) string {
	if total <= 0 {
		return strings.Repeat(" ", width)
	}
	d := done * width / total
	p := min((done+inprog)*width/total-d, width-d)
	if inprog > 0 && p == 0 && d < width {
		p = 1
	}
	full, part, empty := "█", "▒", "░"
	if !u.tty {
		full, part, empty = "#", "+", "."
	}
	return u.paint(green, strings.Repeat(full, d)) + u.paint(yellow, strings.Repeat(part, p)) +
		u.paint(dim, strings.Repeat(empty, width-d-p))
}
