package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// event is one line a worker process prints on stdout for the harness:
//
//	SBS <kind> <unix nanoseconds> [fields...]
//
// kinds: ready (the worker runs), start <job> (its handler began the job),
// done <job> (its handler finished the job and the finish counted),
// took <queue> (a River survivor serves the queue). The time is the
// worker's own clock reading, on the same machine as the harness.
type event struct {
	kind   string
	at     time.Time
	fields []string
	from   string // "victim" or "survivor", set by the reader
}

const eventTag = "SBS"

// formatEvent is the line for kind at time at.
func formatEvent(kind string, at time.Time, fields ...string) string {
	parts := append([]string{eventTag, kind, strconv.FormatInt(at.UnixNano(), 10)}, fields...)
	return strings.Join(parts, " ")
}

// parseEvent reads a line formatEvent wrote; ok is false for any other
// line (a library's log line on stdout, say).
func parseEvent(line string) (e event, ok bool) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != eventTag {
		return event{}, false
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || ns <= 0 {
		return event{}, false
	}
	return event{kind: f[1], at: time.Unix(0, ns), fields: f[3:]}, true
}

// summary is one configuration's row of the table.
type summary struct {
	system, config string
	kills          int           // kills measured
	median, p95    time.Duration // kill -> picked up
	max            time.Duration
	twice          int // kills after which some job completed twice
	missed         int // kills after which nothing picked the job up before the round's limit
	failed         int // rounds the harness could not finish (a worker did not start, say): not in the figures
	note           string
}

// summarize computes median, p95 (nearest rank) and max of the measured
// latencies. An empty slice gives zeros.
func summarize(latencies []time.Duration) (median, p95, maxd time.Duration) {
	if len(latencies) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(latencies)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		median = s[n/2]
	} else {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	rank := int(math.Ceil(0.95 * float64(n))) // nearest rank, 1-based
	return median, s[rank-1], s[n-1]
}

func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
}

// table renders the rows as a Markdown table.
func table(rows []summary) string {
	var b strings.Builder
	b.WriteString("| system | configuration | kills | median s | p95 s | max s | completed twice | not picked up |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.kills == 0 && r.missed == 0 {
			fmt.Fprintf(&b, "| %s | %s | 0 | %s | | | | |\n", r.system, r.config, r.note)
			continue
		}
		config := r.config
		if r.failed > 0 {
			config += fmt.Sprintf(" (%d rounds failed, not counted: see the log)", r.failed)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %d of %d | %d |\n",
			r.system, config, r.kills+r.missed, seconds(r.median), seconds(r.p95), seconds(r.max),
			r.twice, r.kills+r.missed, r.missed)
	}
	return b.String()
}
