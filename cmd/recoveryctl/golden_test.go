package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/ops"
)

// The output of every command, for one fixed fleet, against the files in
// testdata. After a deliberate change of the output, rewrite them with
//
//	go test -run TestGolden -update ./cmd/recoveryctl
//
// and read the diff.
var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	assert.Equal(t, string(want), got, "output differs from %s (run with -update after a deliberate change)", path)
}

// goldenFleet is a fleet with one instance in every state: heartbeating,
// late (its key's TTL has run down 16.2s of the 20s it announced), killed
// and being recovered, dead after a failed recovery, and one whose TTL
// left does not fit the library's default TTL (it announced none). Two announced different heartbeat TTLs in the
// fleet record (a rolling change of timings).
func goldenFleet() ops.FleetState {
	return ops.FleetState{
		Registry: "ALYA_WORKER_REGISTRY",
		Instances: []ops.InstanceState{
			{InstanceID: "alive-1", Registered: true, HeartbeatPresent: true, HeartbeatTTL: 55200 * time.Millisecond,
				RowsPresent: true, Rows: 2, RowsTTL: 179 * time.Second, Incarnation: "i1", Claim: ops.ClaimNone,
				AnnouncedTTL: time.Minute, Mode: "owner",
				OldestRowKnown: true, HoldsRows: true, OldestRowAge: 2*time.Hour + 3*time.Minute + 4*time.Second},
			{InstanceID: "dead-1", Registered: true, RowsPresent: true, Rows: 3, RowsTTL: 3 * time.Hour,
				Incarnation: "i2", Claim: ops.ClaimFailed},
			{InstanceID: "held-1", Registered: true, RowsPresent: true, Rows: 1, RowsTTL: 170 * time.Second,
				Incarnation: "i3", Claim: ops.ClaimHeld},
			{InstanceID: "late-1", Registered: true, HeartbeatPresent: true, HeartbeatTTL: 3800 * time.Millisecond,
				RowsPresent: true, Rows: 10, RowsTTL: 130 * time.Second, Incarnation: "i4", Claim: ops.ClaimNone,
				AnnouncedTTL: 20 * time.Second, Mode: "rows-set",
				OldestRowKnown: true, HoldsRows: true, OldestRowAge: 12345 * time.Millisecond},
			{InstanceID: "odd-1", Registered: true, HeartbeatPresent: true, HeartbeatTTL: 90 * time.Second,
				Claim: ops.ClaimNone, OldestRowKnown: true},
		},
		InvalidMembers: []string{"not valid"},
		Serves:         "database=app schema=public table=batchrows",
	}
}

func goldenOptions() *options {
	return &options{prefix: "ALYA", timeout: 30 * time.Second, last: 10,
		heartbeatTTL: defaultHeartbeatTTL, heartbeatInterval: defaultHeartbeatInterval}
}

func TestGoldenWorkers(t *testing.T) {
	o := goldenOptions()
	var out, errOut bytes.Buffer
	require.NoError(t, printWorkers(&out, &errOut, o, goldenFleet()))
	golden(t, "workers.txt", out.String())
	assert.Empty(t, errOut.String())

	o.json = true
	out.Reset()
	require.NoError(t, printWorkers(&out, &errOut, o, goldenFleet()))
	golden(t, "workers.json", out.String())

	// An empty registry: a line on stderr, ending its line, then the
	// count on stdout.
	o.json = false
	out.Reset()
	require.NoError(t, printWorkers(&out, &errOut, o, ops.FleetState{Registry: "ALYA_WORKER_REGISTRY"}))
	golden(t, "workers-empty.txt", "stdout:\n"+out.String()+"stderr:\n"+errOut.String())
}

func TestGoldenRows(t *testing.T) {
	o := goldenOptions()
	fleet := goldenFleet()
	tracked := ops.TrackedRows{Incarnation: "i4", RowIDs: []int64{7, 8, 30}, InvalidMembers: []string{"junk"}}
	var out bytes.Buffer
	require.NoError(t, printRows(&out, o, fleet.Instances[3], tracked))
	require.NoError(t, printRows(&out, o, fleet.Instances[1], ops.TrackedRows{RowIDs: []int64{1, 2, 3}}))
	golden(t, "rows.txt", out.String())
	o.json = true
	out.Reset()
	require.NoError(t, printRows(&out, o, fleet.Instances[3], tracked))
	golden(t, "rows.json", out.String())
}

func TestGoldenRecover(t *testing.T) {
	n := int64(2)
	dry := recoverJSON{DryRun: true, PeersChecked: 6, DeadPeers: 5, RowsReset: 3, RowsNotReset: 2, Peers: []peerJSON{
		{InstanceID: "dead-1", Action: "reset", RowIDs: []int64{1, 2, 3, 4}, RowsFound: 4, RowsToReset: []int64{1, 2},
			InvalidMembers: []string{"junk"}},
		{InstanceID: "dead-2", Action: "keep", RowIDs: []int64{5, 6, 7}, RowsFound: 3, RowsToReset: []int64{7},
			RowsNotReset: []rowJSON{{RowID: 5, Status: "runing"}, {RowID: 6, Status: "runing"}}},
		{InstanceID: "dead-3", Action: "deregister"},
		{InstanceID: "dead-4", Action: "lost"},
		{InstanceID: "dead-5", Action: "skip", Claim: "held"},
	}, InvalidMembers: []string{"not valid"}}
	var out bytes.Buffer
	printRecover(&out, dry)
	golden(t, "recover-dry-run.txt", out.String())

	done := recoverJSON{PeersChecked: 4, DeadPeers: 3, RowsReset: 2, RowsNotReset: 2, Peers: []peerJSON{
		{InstanceID: "dead-1", Action: "recovered", RowsFound: 2, RowsReset: &n, Quarantined: []int64{9}},
		{InstanceID: "dead-5", Action: "skipped"},
		{InstanceID: "dead-2", Action: "failed", RowsFound: 3, RowsReset: new(int64),
			RowsNotReset: []rowJSON{{RowID: 5, Status: "runing"}, {RowID: 6, Status: "runing"}},
			Error:        "recovery: rows neither reset nor settled: 2 of 3 rows of dead-2 (first: row 5 has status \"runing\")"},
	}}
	out.Reset()
	printRecover(&out, done)
	golden(t, "recover.txt", out.String())
}

func TestGoldenWatchFrame(t *testing.T) {
	o := goldenOptions()
	now := time.Date(2026, 11, 26, 11, 0, 0, 0, time.UTC)
	f := frame{now: now, fleet: goldenFleet(),
		scan: store.Turn{Holder: "alive-1", TTL: 50 * time.Second},
		history: []ops.HistoryEntry{
			{Kind: ops.HistoryPeerClaimed, Time: now.Add(-3 * time.Second), InstanceID: "alive-1", PeerID: "held-1",
				FoundBy: "registry", Duration: 2 * time.Millisecond},
			{Kind: ops.HistoryRecoveryFailed, Time: now.Add(-2 * time.Second), InstanceID: "alive-1", PeerID: "dead-1",
				Error: "reset 3 rows of dead-1: connection refused"},
		}}
	name := "Redis at redis://127.0.0.1:6379"
	var all bytes.Buffer
	write := func(title string, lines []string) {
		all.WriteString("== " + title + "\n")
		for _, l := range lines {
			all.WriteString(l + "\n")
		}
	}
	write("no owner column: no sweep turn", f.lines(o, name))
	o.pgx.OwnerColumn = "owner"
	write("an owner column: the sweep turn, free", f.lines(o, name))
	o.pgx.OwnerColumn = ""
	f.sweep = store.Turn{Holder: "token", TTL: 100 * time.Second}
	write("no owner column configured, but a sweep turn held", f.lines(o, name))
	empty := frame{now: now, fleet: ops.FleetState{Registry: "ALYA_WORKER_REGISTRY"}}
	write("an empty fleet", empty.lines(o, name))
	broken := frame{now: now, fleetErr: errors.New("dial tcp 127.0.0.1:6379: connection refused")}
	write("Redis down", broken.lines(o, name))
	golden(t, "watch.txt", all.String())
}
