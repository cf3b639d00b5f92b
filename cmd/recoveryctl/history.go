package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/ops"
)

// historyJSON is one entry of the fleet's history in JSON output.
type historyJSON struct {
	ID              string   `json:"id"`
	Added           string   `json:"added"`
	Time            string   `json:"time"`
	Kind            string   `json:"kind"`
	InstanceID      string   `json:"instance_id"`
	PeerID          string   `json:"peer_id,omitempty"`
	FoundBy         string   `json:"found_by,omitempty"`
	Rows            *int     `json:"rows,omitempty"`
	RowsReset       *int64   `json:"rows_reset,omitempty"`
	RowsQuarantined *int     `json:"rows_quarantined,omitempty"`
	DurationMs      *float64 `json:"duration_ms,omitempty"`
	Error           string   `json:"error,omitempty"`
	// RowIDs are the entry's rows (at most ops.HistoryRowIDsMax);
	// RowIDsTotal how many it had in all.
	RowIDs      []int64 `json:"row_ids,omitempty"`
	RowIDsTotal *int    `json:"row_ids_total,omitempty"`
}

func historyToJSON(e ops.HistoryEntry) historyJSON {
	j := historyJSON{ID: clean(e.ID), Added: e.Added.UTC().Format(time.RFC3339Nano), Time: e.Time.UTC().Format(time.RFC3339Nano),
		Kind: clean(e.Kind), InstanceID: clean(e.InstanceID), PeerID: clean(e.PeerID), FoundBy: clean(e.FoundBy), Error: clean(e.Error)}
	switch e.Kind {
	case ops.HistoryRowsRecovered, ops.HistoryStrayRowsReset, ops.HistoryEndedLifeRowsReset:
		j.Rows, j.RowsReset, j.RowsQuarantined = &e.Rows, &e.RowsReset, &e.RowsQuarantined
	case ops.HistoryRowsQuarantined:
		j.RowsQuarantined = &e.RowsQuarantined
	case ops.HistoryUntrackedRows:
		j.Rows = &e.Rows
	}
	if e.RowIDsTotal > 0 {
		j.RowIDs, j.RowIDsTotal = e.RowIDs, &e.RowIDsTotal
	}
	if e.Duration > 0 {
		ms := float64(e.Duration) / float64(time.Millisecond)
		j.DurationMs = &ms
	}
	return j
}

// cmdHistory prints the fleet's history: the entries appended since
// --since ago (all kept, without it), at most the newest --last.
func cmdHistory(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	q := ops.HistoryQuery{Last: o.last}
	if o.since > 0 {
		q.Since = time.Now().Add(-o.since)
	}
	entries, err := ops.ReadHistory(ctx, rdb, o.prefix, q)
	if err != nil {
		return usageIfConfig(err)
	}
	if len(entries) == 0 {
		what := "is empty or absent"
		if o.since > 0 {
			what = "holds nothing from the last " + o.since.String()
		}
		fmt.Fprintf(stderr, "no history under prefix %q: %s %s (workers before the history, or WithHistory(0), write none)\n",
			o.prefix, store.HistoryKey(o.prefix), what)
	}
	if o.json {
		out := struct {
			Prefix  string        `json:"prefix"`
			Stream  string        `json:"stream"`
			Entries []historyJSON `json:"entries"`
		}{Prefix: o.prefix, Stream: store.HistoryKey(o.prefix), Entries: []historyJSON{}}
		for _, e := range entries {
			out.Entries = append(out.Entries, historyToJSON(e))
		}
		return writeJSON(stdout, out)
	}
	writeHistory(stdout, entries, "2006-01-02T15:04:05.000Z", o.rows)
	return nil
}

// writeHistory prints entries as a table, their times in layout (UTC);
// with rows, a last column lists each entry's row IDs.
func writeHistory(w io.Writer, entries []ops.HistoryEntry, layout string, rows bool) {
	if len(entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "TIME\tEVENT\tPEER\tBY\tDETAILS"
	if rows {
		head += "\tROWS"
	}
	fmt.Fprintln(tw, head)
	for _, e := range entries {
		peer := clean(e.PeerID)
		if peer == "" {
			peer = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", e.Time.UTC().Format(layout), clean(e.Kind), peer,
			clean(e.InstanceID), historyDetails(e))
		if rows {
			fmt.Fprintf(tw, "\t%s", historyRows(e))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// historyRows lists an entry's row IDs, "-" when it has none, and how many
// more it had than it lists.
func historyRows(e ops.HistoryEntry) string {
	if len(e.RowIDs) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, id := range e.RowIDs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	if more := e.RowIDsTotal - len(e.RowIDs); more > 0 {
		fmt.Fprintf(&b, " (+%d more)", more)
	}
	return b.String()
}

// historyDetails says what an entry means, in a few words.
func historyDetails(e ops.HistoryEntry) string {
	var d string
	switch e.Kind {
	case ops.HistoryPeerClaimed:
		d = fmt.Sprintf("found by %s, claimed %s later", clean(e.FoundBy), roundDuration(e.Duration))
	case ops.HistoryRowsRecovered:
		d = fmt.Sprintf("%d rows: %d reset, %d quarantined, %s after found", e.Rows, e.RowsReset,
			e.RowsQuarantined, roundDuration(e.Duration))
	case ops.HistoryRowsQuarantined:
		d = fmt.Sprintf("%d rows reached their recovery limit", e.RowsQuarantined)
	case ops.HistoryRecoveryFailed:
		d = "failed: " + clean(e.Error)
	case ops.HistoryLeaseLost:
		d = fmt.Sprintf("no heartbeat for %s: peers may recover its rows", roundDuration(e.Duration))
	case ops.HistoryLeaseRegained:
		d = "heartbeat back"
	case ops.HistoryStrayRowsReset:
		d = fmt.Sprintf("sweep: %d of %d stray rows reset, %d quarantined, held by no rows set for %s", e.RowsReset, e.Rows,
			e.RowsQuarantined, roundDuration(e.Duration))
	case ops.HistoryEndedLifeRowsReset:
		d = fmt.Sprintf("sweep: %d rows of an ended life reset, %d quarantined (the worker lives on)", e.RowsReset, e.RowsQuarantined)
	case ops.HistoryUntrackedRows:
		d = fmt.Sprintf("sweep: %d rows in progress that no worker tracked: %s", e.Rows, clean(e.Error))
	case ops.HistoryRowsNotReset:
		d = fmt.Sprintf("%d of %d rows neither reset nor settled (%d reset)", e.RowsNotReset, e.Rows, e.RowsReset)
	default:
		d = clean(e.Error)
	}
	return d
}

// roundDuration shows a duration to the millisecond (the microsecond
// below one), or to 0.1 s past a second.
func roundDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// clean makes an untrusted string from Redis safe to print
// (redact.Shown): control characters become spaces, and it is clipped.
func clean(s string) string { return redact.Shown(s, 0) }
