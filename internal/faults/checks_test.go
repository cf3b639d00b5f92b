//go:build faults

package faults

import (
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// TestRecoveredTwiceTellsAReleaseFromASecondRecovery runs the check of C1,
// C3 and F2 on a made-up table, without workers: a row reset by a release
// and by a recovery passes (the CI failure of C1: recoveries = 2 with
// nothing processed twice), a row two recoveries reset is caught, with or
// without a release of it besides.
func TestRecoveredTwiceTellsAReleaseFromASecondRecovery(t *testing.T) {
	if sharedPG == nil {
		testutil.Unavailable(t, "cannot start PostgreSQL: %v", pgErr)
	}
	e := &env{t: t, cfg: envConfig{rows: 6, table: "batchrows"}, table: pgx.Identifier{"batchrows"}.Sanitize()}
	e.setupDatabase(sharedPG.URL)

	// Row 3, through the faultworker's resetter (owner fencing, the
	// recoveries column): w1 takes it and, its lease lost, releases it
	// (Release's request: its own ID and incarnation); w2 takes it and
	// dies, and a peer recovers it (the rows-set recovery's request).
	// Both are the same reset, and both count.
	r, err := pgxreset.New(e.pool, postgres.WithTable("batchrows"), postgres.WithRecoveryCountColumn("recoveries"), postgres.WithOwnerColumn("owner"))
	require.NoError(t, err)
	for _, req := range []recovery.RowsReset{
		{InstanceID: "w1", Incarnation: "i1", RowIDs: []int64{3}},
		{InstanceID: "w2", Incarnation: "i2", RowIDs: []int64{3}, FromRowsSet: true},
	} {
		_, err := e.pool.Exec(t.Context(), `UPDATE `+e.table+` SET status = 'inprog', owner = $1 WHERE rowid = 3`, req.InstanceID)
		require.NoError(t, err)
		res, err := r.ResetRows(t.Context(), req)
		require.NoError(t, err)
		require.EqualValues(t, 1, res.Changed, "reset of row 3 for %s", req.InstanceID)
	}
	require.Equal(t, 1, e.count(`rowid = 3 AND recoveries = 2 AND status = 'queued'`), "row 3: a release and a recovery, recoveries = 2")

	// The other rows' histories, made up.
	recoveries := map[int64]int{
		1: 0, // done at the first try
		2: 1, // recovered once
		4: 2, // recovered twice: the failure the check is for
		5: 3, // released by w1, then recovered twice
		6: 2, // released twice: by w1, then by w2
	}
	for id, n := range recoveries {
		_, err := e.pool.Exec(t.Context(), `UPDATE `+e.table+` SET recoveries = $2 WHERE rowid = $1`, id, n)
		require.NoError(t, err)
	}
	e.procs = []*proc{
		fakeWorker("w1", []int64{3, 5, 6}),
		fakeWorker("w2", []int64{6}),
		fakeWorker("w3", nil),
	}
	assert.Equal(t, map[int64]int{3: 1, 5: 1, 6: 2}, handedBack(e.procs))
	assert.Equal(t, 4, e.count(`recoveries > 1`), "the former check: every row reset twice, releases included")
	assert.Equal(t, 2, e.recoveredTwice(), "rows 4 and 5: two recoveries each")
	assert.Zero(t, e.count(`rowid IN (4, 5) AND recoveries < 2`), "the rows caught are 4 and 5")

	e.procs = nil
	assert.Equal(t, 4, e.recoveredTwice(), "no release recorded: every row reset twice is counted")
}

// fakeWorker returns a proc that never ran, whose output holds the record
// the faultworker writes before it releases rows (host.go, giveBack), in
// its log format, for the rows released (none: no record).
func fakeWorker(id string, released []int64) *proc {
	p := &proc{id: id, out: &testutil.LogBuffer{}, done: make(chan struct{})}
	log := slog.New(slog.NewJSONHandler(p.out, nil)).With("instance_id", id)
	log.Info("faultworker started")
	if len(released) > 0 {
		log.Info(handingBackMsg, "rows", len(released), "row_ids", released)
	}
	return p
}
