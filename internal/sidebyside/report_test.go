package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestEventLinesRoundTripAndOtherLinesAreIgnored(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	e, ok := parseEvent(formatEvent("start", at, "17", "2"))
	if !ok || e.kind != "start" || !e.at.Equal(at) || len(e.fields) != 2 || e.fields[0] != "17" || e.fields[1] != "2" {
		t.Fatalf("round trip: got %+v, %v", e, ok)
	}
	for _, line := range []string{
		"", "SBS", "SBS start", "SBS start notanumber 17", "SBS start -5 17",
		"time=... level=INFO msg=\"River client started\"", "XSBS start 1 2",
	} {
		if e, ok := parseEvent(line); ok {
			t.Errorf("parseEvent(%q) = %+v, want not an event", line, e)
		}
	}
}

func TestSummarizeGivesMedianNearestRankP95AndMax(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Millisecond
		}
		return d
	}
	for _, tc := range []struct {
		in                []time.Duration
		median, p95, maxd time.Duration
	}{
		{nil, 0, 0, 0},
		{ms(7), 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond},
		{ms(40, 10, 30, 20), 25 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond},
		{ms(5, 1, 3), 3 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond},
		// 20 values 1..20: p95's nearest rank is the 19th.
		{ms(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1),
			10500 * time.Microsecond, 19 * time.Millisecond, 20 * time.Millisecond},
	} {
		in := append([]time.Duration(nil), tc.in...)
		m, p, x := summarize(tc.in)
		if m != tc.median || p != tc.p95 || x != tc.maxd {
			t.Errorf("summarize(%v) = %v, %v, %v; want %v, %v, %v", in, m, p, x, tc.median, tc.p95, tc.maxd)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Fatalf("summarize reordered its argument: %v", tc.in)
			}
		}
	}
}

func TestTableCountsMissedKillsAndShowsFailures(t *testing.T) {
	out := table([]summary{
		{system: "River", config: "tuned", kills: 5, missed: 1, median: 12100 * time.Millisecond,
			p95: 20 * time.Second, max: 21 * time.Second, twice: 3},
		{system: "asynq", config: "defaults", note: "setup failed: boom"},
		{system: "recovery", config: "defaults", kills: 2, failed: 1, median: time.Second, p95: time.Second, max: time.Second},
	})
	for _, want := range []string{
		"| recovery | defaults (1 rounds failed, not counted: see the log) | 2 | 1.00 | 1.00 | 1.00 | 0 of 2 | 0 |",
		"| River | tuned | 6 | 12.10 | 20.00 | 21.00 | 3 of 6 | 1 |",
		"| asynq | defaults | 0 | setup failed: boom |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestCompletionsCountsEachJobAndWaitsForRunningSurvivorJobs(t *testing.T) {
	at := time.Now()
	ev := func(kind, from string, fields ...string) event {
		return event{kind: kind, from: from, at: at, fields: fields}
	}
	events := make(chan event, 8)
	// The picked-up start is passed as seen; a second start of the same
	// job (a rescue while it ran) and both completions follow.
	seen := []event{ev("start", "survivor", "7", "2")}
	events <- ev("start", "survivor", "7", "3")
	events <- ev("done", "survivor", "7")
	events <- ev("start", "victim", "8") // a victim's start is not the survivor's work
	events <- ev("done", "survivor", "7")
	done := completions(context.Background(), events, 20*time.Millisecond, 10*time.Second, seen)
	if done["7"] != 2 || len(done) != 1 {
		t.Fatalf("completions = %v, want job 7 twice", done)
	}

	// A block of rows: the start names them all; every row must be done
	// before the survivor counts as idle.
	events = make(chan event, 8)
	events <- ev("start", "survivor", "1,2,3", "owner")
	go func() {
		for _, id := range []string{"1", "2", "3"} {
			time.Sleep(30 * time.Millisecond) // pace: longer than the quiet period, so only the running count keeps it waiting
			events <- ev("done", "survivor", id)
		}
	}()
	done = completions(context.Background(), events, 20*time.Millisecond, 10*time.Second, nil)
	if done["1"] != 1 || done["2"] != 1 || done["3"] != 1 {
		t.Fatalf("completions = %v, want rows 1, 2, 3 once each", done)
	}
}
