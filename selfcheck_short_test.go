package recovery

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Blocks whose rows leave the in-progress status within about 0.55 s (the
// self-check window and a tenth) are judged from their first block whose
// read inside the fetch answered in time: swapped statuses at the first look
// after the fetch's COMMIT (the fetch took a row the resetter calls in
// progress and left it the status it calls queued), a misspelt one when
// the block's rows are untracked (the fetch's status was changed again
// before Untrack). Through both resetters, text and enum statuses.
func TestSelfCheckCatchesMisconfiguredStatusesOnTheFirstBlockOf50ms(t *testing.T) {
	cases := []struct {
		name           string
		enum           bool
		inprog, queued string
		want           string
	}{
		{"statuses swapped", false, "pending", "running", `statuses swapped?`},
		{"in-progress status misspelt", false, "in_progress", "pending", `misspelt?`},
		{"enum statuses swapped", true, "pending", "running", `statuses swapped?`},
	}
	for _, impl := range resetterImpls {
		for _, c := range cases {
			if impl.Name != "pgx" && c.enum {
				continue
			}
			t.Run(impl.Name+"/"+c.name, func(t *testing.T) {
				db, w, logs, alarms := jobsWorld(t, impl, c.enum, c.inprog, c.queued, "SS")

				// Track's read of the rows being fetched is bounded at 50 ms
				// (it is on the host's path), and a read that does not answer
				// in time judges nothing: on a loaded machine the first blocks
				// may go unjudged. The first block whose read answered is
				// caught, and caught within a second of its COMMIT.
				pre := &signals(w).preread
				var latency time.Duration
				found, judged, unread := -1, -1, 0
				for block := range 20 {
					ids := []int64{int64(10*block + 1), int64(10*block + 2), int64(10*block + 3)}
					pre.Clear()
					committed := fetchJobs(t, db, w, 0, "", ids...)
					if judged < 0 {
						// Track ran the read inside the fetch, so its signal is
						// waiting now if the read was made.
						if ok, made := pre.Take(); made && ok {
							judged = block
						} else if made {
							unread++
						}
					}
					select {
					case <-alarms: // during the block's processing
						latency = time.Since(committed)
						found = block
					case <-time.After(50 * time.Millisecond):
					}
					finishJobs(t, db, w, "finished", ids...)
					untracked := time.Now() // after Untrack: a look begun later judges its rows
					if found < 0 {
						waitUntrackLook(t, w, untracked)
						if errors.Is(w.Healthy(), ErrMisconfigured) {
							latency = time.Since(committed)
							found = block
						}
					}
					if found >= 0 || (judged >= 0 && block >= judged+2) {
						break
					}
				}
				require.GreaterOrEqual(t, judged, 0, "no read of the rows being fetched answered within its bound in 20 blocks")
				// The block's later reads (the look after its Untrack) are
				// bounded too, and may miss on a loaded machine: caught on
				// that block, or one of the next two.
				require.GreaterOrEqual(t, found, judged, "caught no earlier than its read answered")
				require.LessOrEqual(t, found, judged+2, "the first block whose read answered is caught, or one of the next two (%d blocks before it were not read in time)", unread)
				t.Logf("ErrMisconfigured %v after the COMMIT of block %d", latency.Round(time.Millisecond), found)
				assert.Less(t, latency, time.Second)
				requireMisconfigured(t, w, logs, c.want)
			})
		}
	}
}

// What a correct configuration does with short blocks must raise no alarm
// at the look at their fetch: fetches rolled back after Track, rows
// finished inside the fetch ('finished', 'error', or queued again) and
// untracked up to 50 ms later, and then blocks of 50 ms whose rows are
// finished or failed right before Untrack. Through both resetters, text
// and enum statuses.
func TestSelfCheckRaisesNoAlarmForBlocksOf50msOfACorrectConfiguration(t *testing.T) {
	for _, impl := range resetterImpls {
		for _, enum := range []bool{false, true} {
			if enum && impl.Name != "pgx" {
				continue
			}
			t.Run(fmt.Sprintf("%s/enum=%v", impl.Name, enum), func(t *testing.T) {
				db, w, _, alarms := jobsWorld(t, impl, enum, "running", "pending", "SC")

				// Fetches rolled back after Track: the rows stay pending.
				for block := range 5 {
					ids := []int64{int64(3*block + 1), int64(3*block + 2), int64(3*block + 3)}
					rollbackJobs(t, db, w, ids...)
					time.Sleep(rand.N(50 * time.Millisecond)) // pace: the host untracks a little after its rollback
					require.NoError(t, w.Untrack(ids...))
				}
				// Rows processed inside the fetch, untracked a little later.
				outcomes := []string{"finished", "error", "pending"}
				for block := range 15 {
					ids := []int64{int64(100 + 3*block + 1), int64(100 + 3*block + 2), int64(100 + 3*block + 3)}
					fetchJobs(t, db, w, 0, outcomes[block%3], ids...)
					time.Sleep(rand.N(50 * time.Millisecond)) // pace: the host untracks a little after its COMMIT
					require.NoError(t, w.Untrack(ids...))
				}
				assert.Equal(t, int32(0), w.checker.verdict.Load(), "no row was ever seen in progress")
				// Blocks of 50 ms.
				for block := range 10 {
					ids := []int64{int64(200 + 3*block + 1), int64(200 + 3*block + 2), int64(200 + 3*block + 3)}
					fetchJobs(t, db, w, 0, "", ids...)
					time.Sleep(50 * time.Millisecond) // pace: a block of 50 ms of the host's work
					finishJobs(t, db, w, outcomes[block%2], ids...)
				}
				waitLookAfter(t, w, time.Now()) // the look at the last Untrack
				select {
				case e := <-alarms:
					t.Fatalf("false alarm: %v", e.Err)
				default:
				}
				require.NoError(t, w.Healthy())
				assert.Equal(t, int32(1), w.checker.verdict.Load(), "blocks of 50 ms verify the configuration")
			})
		}
	}
}

// rollbackJobs is a fetch that marks ids running, tracks them and rolls
// back.
func rollbackJobs(t *testing.T, db *pgxpool.Pool, w *Worker, ids ...int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE jobs SET state = 'running' WHERE id = ANY($1)`, ids)
	require.NoError(t, err)
	require.NoError(t, w.Track(ctx, ids...))
	require.NoError(t, tx.Rollback(ctx))
}
