//go:build faults

package faults

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// result is the outcome of one scenario, printed as one RESULT line.
type result struct {
	Scenario       string
	Rows           int
	DoneTwice      int // rows with more than one 'done' in the ledger
	ProcessedTwice int // rows whose work ran more than once (done or discarded)
	Discarded      int // completions refused by the guard
	Detection      time.Duration
	Bound          time.Duration // for Detection
	Drain          time.Duration // last fault to every row done
	Notes          []string
	began          time.Time
	recorded       bool
}

func (r *result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *result) line(verdict string) string {
	det := "n/a"
	if r.Detection > 0 {
		det = fmt.Sprintf("%.2fs(bound %.1fs)", r.Detection.Seconds(), r.Bound.Seconds())
	}
	s := fmt.Sprintf("%-4s %-52s rows=%-4d done_twice=%d processed_twice=%d discarded=%d detection=%s drain=%.1fs duration=%.1fs",
		verdict, r.Scenario, r.Rows, r.DoneTwice, r.ProcessedTwice, r.Discarded, det,
		r.Drain.Seconds(), time.Since(r.began).Seconds())
	if len(r.Notes) > 0 {
		s += " | " + strings.Join(r.Notes, "; ")
	}
	return s
}

var (
	resultsMu sync.Mutex
	results   []string
)

// record prints the result line once, when the scenario's test ends.
func (r *result) record(t *testing.T) {
	if r.recorded {
		return
	}
	r.recorded = true
	verdict := "PASS"
	switch {
	case t.Failed():
		verdict = "FAIL"
	case t.Skipped():
		verdict = "SKIP"
	}
	l := r.line(verdict)
	fmt.Println("RESULT " + l)
	resultsMu.Lock()
	results = append(results, l)
	resultsMu.Unlock()
}

// printResults prints every scenario's line again, in order, after the run.
func printResults(w io.Writer) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	if len(results) == 0 {
		return
	}
	sorted := append([]string(nil), results...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i][5:] < sorted[j][5:] })
	fmt.Fprintln(w, "\nfault-injection results:")
	for _, l := range sorted {
		fmt.Fprintln(w, "  "+l)
	}
}
