package recovery

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
	"github.com/alya/recovery/postgres/pgxreset"
)

// TestStressRandomCrashesKeepEveryInvariant runs a fleet of in-process
// workers that process a batch as a host would (fetch with SKIP LOCKED,
// owner set, Track, commit done with an owner guard plus a ledger row,
// Untrack) while workers are crashed at random and replaced. At the end:
// every row is done, the ledger holds each row exactly once (no row done
// twice), and no ResetRows ever named a worker that had not crashed (no
// row reset while its owner is live).
//
// It runs in rows-set mode (the resetter wrapped so that only ResetRows is
// seen) and in owner mode (the resetter is an owner-fencing pgxreset.Resetter, so
// the workers reset by owner and keep no rows sets).
func TestStressRandomCrashesKeepEveryInvariant(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stress test")
	}
	for _, mode := range []string{"rows-set", "owner"} {
		t.Run(mode, func(t *testing.T) { stressFleet(t, mode == "owner") })
	}
}

// ownerSpy is an owner-fencing pgxreset.Resetter that calls before with the
// owner of every reset that changed rows, and counts them.
type ownerSpy struct {
	*pgxreset.Resetter
	before func(peer string)
	resets atomic.Int64
}

func (s *ownerSpy) ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error) {
	res, err := s.Resetter.ResetOwner(ctx, req)
	if res.Changed > 0 {
		s.before(req.Owner)
		s.resets.Add(res.Changed)
	}
	return res, err
}

func stressFleet(t *testing.T, ownerMode bool) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	const rows = 300
	testutil.CreateBatch(t, db, rows)
	ctx := context.Background()
	_, err := db.Exec(ctx, `CREATE TABLE ledger (rowid bigint NOT NULL, instance text NOT NULL)`)
	require.NoError(t, err)
	prefix := testutil.Name("ST")

	var crashedMu sync.Mutex
	crashed := map[string]bool{}
	checkDead := func(peer string) {
		crashedMu.Lock()
		defer crashedMu.Unlock()
		if !crashed[peer] {
			t.Errorf("rows of live worker %s reset", peer)
		}
	}
	var (
		r         Resetter
		recovered func() int
	)
	if ownerMode {
		spy := &ownerSpy{Resetter: fencedResetter(t, db), before: checkDead}
		r, recovered = spy, func() int { return int(spy.resets.Load()) }
	} else {
		fake := &fakeResetter{inner: fencedResetter(t, db), before: checkDead}
		r, recovered = fake, func() int { return len(fake.perRow()) }
	}
	opts := []Option{WithKeyPrefix(prefix),
		WithTimings(Timings{
			HeartbeatTTL:      time.Second,
			HeartbeatInterval: 200 * time.Millisecond,
			RecoveryInterval:  300 * time.Millisecond,
			RowsTTL:           3 * time.Second,
		})}

	type member struct {
		w    *Worker
		dead atomic.Bool
		done chan struct{}
	}
	var (
		fleetMu sync.Mutex
		fleet   []*member
		spawned int
	)
	spawn := func() {
		fleetMu.Lock()
		defer fleetMu.Unlock()
		spawned++
		w, _ := startWorker(t, rdb, r, testutil.Name("st"), opts...)
		if w.Stats().OwnerMode != ownerMode {
			t.Errorf("owner mode %v, want %v", w.Stats().OwnerMode, ownerMode)
		}
		m := &member{w: w, done: make(chan struct{})}
		fleet = append(fleet, m)
		go func() {
			defer close(m.done)
			hostLoop(t, db, w, &m.dead)
		}()
	}
	t.Cleanup(func() { // stop every host loop, also when the test fails
		fleetMu.Lock()
		members := fleet
		fleetMu.Unlock()
		for _, m := range members {
			m.dead.Store(true)
			<-m.done
		}
	})
	for range 4 {
		spawn()
	}

	// Crash a random live worker every 250ms, six times, replacing each.
	for range 6 {
		time.Sleep(250 * time.Millisecond) // pace: the crashes come 250 ms apart; nothing is awaited
		fleetMu.Lock()
		var live []*member
		for _, m := range fleet {
			if !m.dead.Load() {
				live = append(live, m)
			}
		}
		victim := live[rand.N(len(live))]
		fleetMu.Unlock()
		crashedMu.Lock()
		crashed[victim.w.InstanceID()] = true
		crashedMu.Unlock()
		victim.dead.Store(true) // the process is gone: it commits nothing more
		victim.w.crash()
		spawn()
	}

	assert.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM batchrows WHERE status = 'done'`).Scan(&n))
		return n == rows
	}, 30*time.Second, 50*time.Millisecond, "every row done: none lost")
	if t.Failed() {
		rows, _ := db.Query(ctx, `SELECT rowid, status, coalesce(owner, '') FROM batchrows WHERE status <> 'done'`)
		for rows.Next() {
			var id int64
			var st, owner string
			_ = rows.Scan(&id, &st, &owner)
			crashedMu.Lock()
			t.Logf("row %d %s owner %s crashed=%v", id, st, owner, crashed[owner])
			crashedMu.Unlock()
		}
		return
	}

	fleetMu.Lock()
	for _, m := range fleet {
		m.dead.Store(true)
	}
	members := fleet
	fleetMu.Unlock()
	for _, m := range members {
		<-m.done
	}

	var total, distinct int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*), count(DISTINCT rowid) FROM ledger`).Scan(&total, &distinct))
	assert.Equal(t, rows, distinct)
	assert.Equal(t, rows, total, "no row done twice")
	t.Logf("workers spawned %d, crashed 6, rows reset by recovery %d", spawned, recovered())
	assert.NotZero(t, recovered(), "crashes mid-block must have left rows to recover")
}

// hostLoop is a host batch loop: fetch a block of 5 rows, track them,
// process each (10-20 ms) and commit it with the owner guard, untrack.
func hostLoop(t *testing.T, db *pgxpool.Pool, w *Worker, dead *atomic.Bool) {
	ctx := context.Background()
	me := w.InstanceID()
	for !dead.Load() {
		ids, err := fetchBlock(ctx, db, w, 5, true)
		switch {
		case errors.Is(err, ErrShutdown):
			return
		case errors.Is(err, ErrLeaseLost):
			time.Sleep(20 * time.Millisecond) // pace: a host's back-off before it asks again
			continue
		case err != nil:
			t.Errorf("fetch: %v", err)
			return
		case len(ids) == 0:
			time.Sleep(20 * time.Millisecond) // pace: a host's back-off before it asks again
			continue
		}
		for _, id := range ids {
			if dead.Load() {
				return
			}
			time.Sleep(time.Duration(10+rand.N(10)) * time.Millisecond) // pace: the host's work on the row
			if err := completeRow(ctx, db, me, id, true); err != nil {
				t.Errorf("complete row %d: %v", id, err)
				return
			}
			_ = w.Untrack(id)
		}
	}
}

// fetchBlock is FetchBlockOfRows with the order that leaves no gap: rows
// are tracked before the transaction that marks them in progress commits.
// A crash before the commit leaves them queued (and a tracked ID whose row
// is not ours is harmless under owner fencing); a crash after it finds them
// tracked. Tracking after the commit would leave a window in which a crash
// strands them in progress. Without setOwner it is the fetch of a host
// written before the owner column: the owner is left as it is (NULL).
func fetchBlock(ctx context.Context, db *pgxpool.Pool, w *Worker, n int, setOwner bool) ([]int64, error) {
	var ids []int64
	me := w.InstanceID()
	mark := `UPDATE batchrows SET status = 'inprog', owner = $2 WHERE rowid = ANY($1)`
	if !setOwner {
		mark = `UPDATE batchrows SET status = 'inprog' WHERE rowid = ANY($1)`
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT rowid FROM batchrows WHERE status = 'queued' ORDER BY rowid LIMIT $1 FOR UPDATE SKIP LOCKED`, n)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(ids) == 0 {
			return err
		}
		args := []any{ids, me}
		if !setOwner {
			args = args[:1]
		}
		if _, err = tx.Exec(ctx, mark, args...); err != nil {
			return err
		}
		if err := w.Track(ctx, ids...); errors.Is(err, ErrShutdown) || errors.Is(err, ErrLeaseLost) {
			return err // roll back: the rows stay queued
		}
		return nil // a failed Redis write is retried by the heartbeat
	})
	return ids, err
}

// completeRow marks the row done only if this worker still owns it, and
// writes the ledger in the same transaction. Without byOwner it is the
// completion of a host written before the owner column: the status guard
// alone.
func completeRow(ctx context.Context, db *pgxpool.Pool, me string, id int64, byOwner bool) error {
	done, args := `UPDATE batchrows SET status = 'done' WHERE rowid = $1 AND owner = $2 AND status = 'inprog'`, []any{id, me}
	if !byOwner {
		done, args = `UPDATE batchrows SET status = 'done' WHERE rowid = $1 AND status = 'inprog'`, args[:1]
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, done, args...)
		if err != nil || tag.RowsAffected() == 0 {
			return err // not ours any more: someone else will do it
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger (rowid, instance) VALUES ($1, $2)`, id, me)
		return err
	})
}
