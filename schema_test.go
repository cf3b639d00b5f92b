package recovery

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
	"github.com/alya/recovery/postgres/pgxreset"
)

// checkingResetter is a fakeResetter whose schema check fails while bad is
// set, and counts the schema checks.
type checkingResetter struct {
	fakeResetter
	bad    atomic.Bool
	checks atomic.Int32
}

func (c *checkingResetter) Check(ctx context.Context, schema bool) (ResetterInfo, error) {
	info, err := c.fakeResetter.Check(ctx, schema)
	if !schema || err != nil {
		return info, err
	}
	c.checks.Add(1)
	if c.bad.Load() {
		return info, fmt.Errorf("check schema: %w: column t.c does not exist", ErrSchema)
	}
	return info, nil
}

func TestStartRunsTheSchemaCheckBeforeWritingAnything(t *testing.T) {
	mr, rdb := newMini(t)
	r := &checkingResetter{}
	r.bad.Store(true)
	w, _ := newWorker(t, rdb, r, "w-1")

	err := w.Start(context.Background())
	require.ErrorIs(t, err, ErrSchema)
	assert.Contains(t, err.Error(), "start w-1: check schema: recovery: table does not match the configuration: column t.c does not exist")
	assert.Empty(t, mr.Keys(), "a failed check writes nothing to Redis")
	assert.ErrorIs(t, w.Track(context.Background(), 1), ErrNotStarted, "nothing started")

	// Fixed, Start can be called again.
	r.bad.Store(false)
	require.NoError(t, w.Start(context.Background()))
	assert.EqualValues(t, 2, r.checks.Load())
	assert.True(t, mr.Exists(keysOf("w-1").Heartbeat))
}

func TestWithoutSchemaCheckSkipsTheCheck(t *testing.T) {
	mr, rdb := newMini(t)
	r := &checkingResetter{}
	r.bad.Store(true)
	startWorker(t, rdb, r, "w-1", WithoutSchemaCheck())
	assert.Zero(t, r.checks.Load(), "CheckSchema never called")
	assert.True(t, mr.Exists(keysOf("w-1").Heartbeat))
}

func TestStartRefusesAnEnumTableWithoutTheConfiguredStatuses(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	ctx := context.Background()
	_, err := db.Exec(ctx, userEnumTable) // state job_state ('pending', 'running', 'done')
	require.NoError(t, err)
	s := pgtest.CurrentSchema(t, db)
	r, err := pgxreset.New(db, userEnumOptions(s)...) // statuses left at inprog/queued
	require.NoError(t, err)
	prefix := testutil.Name("S")

	w, _ := newWorker(t, rdb, r, "w-1", WithKeyPrefix(prefix))
	err = w.Start(ctx)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrSchema), "wraps ErrSchema: %v", err)
	assert.Contains(t, err.Error(), `in-progress status "inprog" (WithStatuses) is not a label of enum job_state of status column `+s+`.items.state; its labels: pending, running, done`)
	keys, _, err := rdb.Scan(ctx, 0, prefix+"*", 1000).Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "nothing written to Redis")

	// Rows-set mode: in owner mode Start resets the rows a predecessor left
	// under its ID, which the wrong statuses would make fail.
	skipping, _ := newWorker(t, rdb, r, "w-2", WithKeyPrefix(prefix), WithoutSchemaCheck(), WithRowsSets())
	require.NoError(t, skipping.Start(ctx), "the check is skipped")

	right, err := pgxreset.New(db, userEnumOptions(s, postgres.WithStatuses("running", "pending"))...)
	require.NoError(t, err)
	startWorker(t, rdb, right, "w-3", WithKeyPrefix(prefix))
}
