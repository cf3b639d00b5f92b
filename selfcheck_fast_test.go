package recovery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgtest"
	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres"
)

// publicJobsTable is the user's table of issue 21 in the pool's own schema: its own names, statuses
// 'pending'/'running'/'finished'/'error', no owner column; type is the
// status column's type (text, or the enum job_state).
func publicJobsTable(t *testing.T, db *pgxpool.Pool, enum bool) {
	t.Helper()
	ddl := `CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL DEFAULT 'pending');`
	if enum {
		ddl = `CREATE TYPE job_state AS ENUM ('pending', 'running', 'finished', 'error');
			CREATE TABLE jobs (id bigint PRIMARY KEY, state job_state NOT NULL DEFAULT 'pending');`
	}
	_, err := db.Exec(context.Background(), ddl+`INSERT INTO jobs (id) SELECT g FROM generate_series(1, 1000) g;`)
	require.NoError(t, err)
}

// jobsResetter is a resetter of impl for publicJobsTable with statuses inprog
// and queued, its reset ledger created.
func jobsResetter(t *testing.T, impl resetterImpl, db *pgxpool.Pool, inprog, queued string) pgResetterAPI {
	t.Helper()
	r := impl.Must(t, db, postgres.WithSchema(pgtest.CurrentSchema(t, db)), postgres.WithTable("jobs"), postgres.WithIDColumn("id"),
		postgres.WithStatusColumn("state"), postgres.WithStatuses(inprog, queued))
	require.NoError(t, r.CreateLedger(context.Background()))
	return r
}

// slowBeats makes the heartbeat's own look (the check of the first
// version) come every 2 s: too seldom for blocks of a second.
func slowBeats(prefix string) []Option {
	return []Option{WithKeyPrefix(prefix), WithTimings(Timings{
		HeartbeatTTL:      6 * time.Second,
		HeartbeatInterval: 2 * time.Second,
		RecoveryInterval:  2 * time.Second,
		RowsTTL:           20 * time.Second,
	})}
}

// fetchJobs takes ids as a host's fetch does: in one transaction, the
// UPDATE to 'running', then Track, then (after openFor) the COMMIT,
// returned. Rows finished inside the fetch (finish non-empty) get that
// status before the COMMIT, as a host that processes in its fetch's
// transaction leaves them.
func fetchJobs(t *testing.T, db *pgxpool.Pool, w *Worker, openFor time.Duration, finish string, ids ...int64) time.Time {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id = ANY($1)`, ids)
	require.NoError(t, err)
	require.NoError(t, w.Track(ctx, ids...))
	if finish != "" {
		_, err = tx.Exec(ctx, `UPDATE jobs SET state = $1 WHERE id = ANY($2)`, finish, ids)
		require.NoError(t, err)
	}
	time.Sleep(openFor) // pace: the host's fetch transaction stays open this long
	require.NoError(t, tx.Commit(ctx))
	return time.Now()
}

// finishJobs marks ids with status and untracks them, as a host does once
// a block is processed.
func finishJobs(t *testing.T, db *pgxpool.Pool, w *Worker, status string, ids ...int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE jobs SET state = $1 WHERE id = ANY($2)`, status, ids)
	require.NoError(t, err)
	require.NoError(t, w.Untrack(ids...))
}

// jobsWorld starts worker "w" on publicJobsTable (enum statuses or text)
// with a resetter of impl for statuses inprog and queued, with slowBeats
// under a fresh prefix named after tag; alarms signals its self-check's
// alarm.
func jobsWorld(t *testing.T, impl resetterImpl, enum bool, inprog, queued, tag string, opts ...Option) (*pgxpool.Pool, *Worker, *testutil.LogBuffer, <-chan Event) {
	t.Helper()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	publicJobsTable(t, db, enum)
	r := jobsResetter(t, impl, db, inprog, queued)
	obs, alarms := misconfiguredSignal()
	w, logs := startWorker(t, rdb, r, "w", append(append(slowBeats(testutil.Name(tag)), obs), opts...)...)
	return db, w, logs, alarms
}

// requireMisconfigured checks that w's Healthy fails with ErrMisconfigured
// saying want, and that the alarm was logged once.
func requireMisconfigured(t *testing.T, w *Worker, logs *testutil.LogBuffer, want string) {
	t.Helper()
	err := w.Healthy()
	require.ErrorIs(t, err, ErrMisconfigured)
	assert.Contains(t, err.Error(), want)
	assert.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"self-check: the rows this worker tracks do not look like its rows in progress`))
}

// misconfiguredSignal returns an observer that signals the self-check's
// alarm.
func misconfiguredSignal() (Option, <-chan Event) {
	ch := make(chan Event, 1)
	return WithObserver(func(e Event) {
		if e.Kind == EventMisconfigured {
			select {
			case ch <- e:
			default:
			}
		}
	}), ch
}

// Issue 21: a row had to stay tracked across two heartbeat intervals (60 s
// by default) to be checked, so blocks of a second were never checked. Now
// the first block of a second is judged within about a second of its
// COMMIT, with the heartbeat's look every 2 s, through both resetters, on
// text and enum statuses. A fetch that keeps its transaction open for a
// while after Track must not verify swapped statuses through its rows'
// old, queued, state.
func TestSelfCheckCatchesMisconfiguredStatusesOnTheFirstBlockOfASecond(t *testing.T) {
	cases := []struct {
		name           string
		enum           bool
		inprog, queued string
		open           time.Duration // the fetch's transaction stays open this long after Track
		want           string
	}{
		{"statuses swapped", false, "pending", "running", 0, `it has status "running" and owner "" (the resetter takes status "pending" for in progress, and "running" for queued: statuses swapped?)`},
		{"in-progress status misspelt", false, "in_progress", "pending", 0, `it has status "running" and owner "" (the resetter takes status "in_progress" for in progress: misspelt?)`},
		{"enum statuses swapped", true, "pending", "running", 0, `statuses swapped?`},
		{"statuses swapped, fetch committed 300 ms after Track", false, "pending", "running", 300 * time.Millisecond, `statuses swapped?`},
	}
	for _, impl := range resetterImpls {
		for _, c := range cases {
			if impl.Name != "pgx" && (c.enum || c.open > 0) {
				continue // the statement is the same; one driver is enough
			}
			t.Run(impl.Name+"/"+c.name, func(t *testing.T) {
				t.Parallel() // with each other only: the parent is sequential
				db, w, logs, alarms := jobsWorld(t, impl, c.enum, c.inprog, c.queued, "SF")

				var latency time.Duration
				found := -1
				for block := range 3 {
					ids := []int64{int64(10*block + 1), int64(10*block + 2)}
					committed := fetchJobs(t, db, w, c.open, "", ids...)
					select {
					case <-alarms:
						latency = time.Since(committed)
						found = block
					case <-time.After(time.Second): // the block's processing
					}
					finishJobs(t, db, w, "finished", ids...)
					if found >= 0 {
						break
					}
				}
				require.Equal(t, 0, found, "the first block of a second is caught (-1: not in 3 blocks)")
				t.Logf("ErrMisconfigured %v after the first block's COMMIT", latency.Round(time.Millisecond))
				assert.Less(t, latency, 1500*time.Millisecond)
				requireMisconfigured(t, w, logs, c.want)
			})
		}
	}
}

// Rows finished (done, or failed with 'error', or queued again for a retry)
// and untracked up to 0.4 window later are tracked and not in progress at
// the looks that the Tracks ask for: none of that is an alarm, over many
// blocks, through both resetters and on enum statuses. The host processes
// in its fetch's transaction, so no look ever sees a row in progress and
// the configuration stays unverified, looked at again and again. Blocks
// whose rows stay in progress for a while then verify it.
func TestSelfCheckRaisesNoAlarmForShortBlocksOfACorrectConfiguration(t *testing.T) {
	t.Parallel()
	for _, impl := range resetterImpls {
		for _, enum := range []bool{false, true} {
			if enum && impl.Name != "pgx" {
				continue
			}
			t.Run(fmt.Sprintf("%s/enum=%v", impl.Name, enum), func(t *testing.T) {
				t.Parallel()
				window := 500 * time.Millisecond
				db, w, _, alarms := jobsWorld(t, impl, enum, "running", "pending", "SN", WithTimings(Timings{SelfCheckWindow: window}))

				outcomes := []string{"finished", "error", "pending"}
				for block := range 30 {
					ids := []int64{int64(3*block + 1), int64(3*block + 2), int64(3*block + 3)}
					fetchJobs(t, db, w, 0, outcomes[block%3], ids...)
					time.Sleep(rand.N(window * 4 / 10)) // pace: the host finished the rows and has not untracked them yet
					require.NoError(t, w.Untrack(ids...))
				}
				assert.Equal(t, int32(0), w.checker.verdict.Load(), "no row was ever seen in progress")
				assert.GreaterOrEqual(t, w.checker.sightings.Load(), uint64(10), "looks saw rows finished and still tracked")
				t.Logf("%d looks, %d rows seen finished and still tracked", w.checker.checks.Load(), w.checker.sightings.Load())
				select {
				case e := <-alarms:
					t.Fatalf("false alarm: %v", e.Err)
				default:
				}
				require.NoError(t, w.Healthy())

				ids := []int64{900, 901}
				fetchJobs(t, db, w, 0, "", ids...)
				waitTurns(t, &signals(w).look, 2*time.Second, func() bool { return w.checker.verdict.Load() == 1 },
					"rows in progress verify the configuration")
				finishJobs(t, db, w, "finished", ids...)
				require.NoError(t, w.Healthy())
			})
		}
	}
}
