package recovery

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// TestRecoveryTellsLockedRefusedAndGoneRowsApart: on real PostgreSQL, a
// dead peer's six rows: row 2 refused by a BEFORE UPDATE trigger that
// returns NULL, row 3 locked by another session's open transaction, row 4
// deleted. Recovery resets the other three and reports each left row as
// what it is: row 2 Refused (not Locked), row 3 Locked, row 4 gone (rows
// sets: Gone; not in NotReset in either mode); the error wraps
// ErrRowsRefused and ErrRowsLocked; the log line is the refusal's, at
// Error, not the lock's; Stats and the events count one locked and one
// refused row, and one gone row (Stats.RowsGone, Event.RowsGone, once
// per attempt). Once the trigger and the lock are gone, the next scan
// resets both.
func TestRecoveryTellsLockedRefusedAndGoneRowsApart(t *testing.T) {
	for _, mode := range bothModes {
		t.Run(mode.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			ctx := context.Background()
			prefix := testutil.DeadPeer(t, rdb, db, "dead", 6)
			_, err := db.Exec(ctx, `CREATE FUNCTION refuse_two() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF OLD.rowid = 2 THEN RETURN NULL; END IF; RETURN NEW; END $$;
CREATE TRIGGER refuse_two BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION refuse_two();
DELETE FROM batchrows WHERE rowid = 4`)
			require.NoError(t, err)
			release := holdRowLock(t, db, 3)
			events := &recorder{}
			w, logs := newWorker(t, rdb, fencedResetter(t, db), "rec",
				append([]Option{WithKeyPrefix(prefix), WithObserver(events.Observe)}, mode.opts...)...)

			rep, err := w.recoverNow(ctx)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrRowsNotReset)
			assert.ErrorIs(t, err, ErrRowsRefused)
			assert.ErrorIs(t, err, ErrRowsLocked)
			assert.Contains(t, err.Error(), "1 of 6 rows of dead (first: row 2) were refused by the database")
			assert.Contains(t, err.Error(), "1 more held by a transaction still open")
			require.Len(t, rep.Failed, 1)
			pr := rep.Failed[0]
			assert.Equal(t, int64(3), pr.RowsReset)
			require.Len(t, pr.NotReset, 2)
			assert.Equal(t, RowState{ID: 2, Status: "inprog", Owner: "dead", Refused: true}, pr.NotReset[0])
			assert.Equal(t, RowState{ID: 3, Status: "inprog", Owner: "dead", Locked: true}, pr.NotReset[1])
			if mode.opts != nil {
				assert.Equal(t, []int64{4}, pr.Gone, "the rows set named a row that no longer exists")
			}
			assert.Equal(t, map[int64]string{1: "queued", 2: "inprog", 3: "inprog", 5: "queued", 6: "queued"}, statuses(t, db))
			assert.True(t, registered(t, rdb, prefix, "dead"), "kept for the next scan")

			const gone = 1 // row 4: the planted rows set names it in both modes
			s := w.Stats()
			assert.EqualValues(t, 1, s.RowsLocked)
			assert.EqualValues(t, 1, s.RowsRefused)
			assert.EqualValues(t, gone, s.RowsGone)
			assert.EqualValues(t, 1, s.RowsNotReset, "the refused row; a lock is no misconfiguration")
			w.peers.rlog.peerFailed("dead", err)
			assert.Contains(t, logs.String(), `"level":"ERROR","msg":"recovery of dead peer left rows the database refused to change`)
			assert.NotContains(t, logs.String(), "holds locked")

			release() // before the DROP, which waits for the session's table lock
			_, err = db.Exec(ctx, `DROP TRIGGER refuse_two ON batchrows`)
			require.NoError(t, err)
			rep, err = w.recoverNow(ctx)
			require.NoError(t, err)
			require.Len(t, rep.Recovered, 1)
			assert.Equal(t, int64(2), rep.Recovered[0].RowsReset)
			assertRequeued(t, db, 1, 2, 3, 5, 6)

			require.NoError(t, w.Shutdown(ctx)) // delivers the queued events
			if notReset := events.of(EventRowsNotReset); assert.Len(t, notReset, 1) {
				assert.Equal(t, 1, notReset[0].RowsLocked)
				assert.Equal(t, 1, notReset[0].RowsRefused)
				assert.Equal(t, 1, notReset[0].RowsNotReset)
				assert.Equal(t, gone, notReset[0].RowsGone)
			}
			if failed := events.of(EventRecoveryFailed); assert.Len(t, failed, 1) {
				assert.Equal(t, gone, failed[0].RowsGone)
			}
			if recovered := events.of(EventRowsRecovered); assert.Len(t, recovered, 1) {
				assert.Equal(t, gone, recovered[0].RowsGone, "the rows set still names row 4 at the next scan")
			}
			assert.EqualValues(t, 2*gone, w.Stats().RowsGone, "once per attempt")
		})
	}
}

// TestRecoveryReportsARowLockedAloneAsLocked: a row another session holds
// locked, with no trigger, is Locked and not Refused: the refusal needs
// the reset to have locked the row itself.
func TestRecoveryReportsARowLockedAloneAsLocked(t *testing.T) {
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	prefix := testutil.DeadPeer(t, rdb, db, "dead", 3)
	release := holdRowLock(t, db, 2)
	defer release()
	w, _ := newWorker(t, rdb, fencedResetter(t, db), "rec", WithKeyPrefix(prefix), WithRowsSets())
	rep, err := w.recoverNow(context.Background())
	require.ErrorIs(t, err, ErrRowsLocked)
	assert.NotErrorIs(t, err, ErrRowsRefused)
	require.Len(t, rep.Failed, 1)
	assert.Equal(t, []RowState{{ID: 2, Status: "inprog", Owner: "dead", Locked: true}}, rep.Failed[0].NotReset)
	assert.Empty(t, rep.Failed[0].Gone)
	assert.EqualValues(t, 0, w.Stats().RowsRefused)
}

// TestResetRefusedByAConstraintOrARaisingTriggerSaysSo: on real
// PostgreSQL, a reset whose UPDATE breaks a CHECK constraint, meets a
// trigger that raises an error, or meets a rule that rewrites it (a
// conditional DO INSTEAD NOTHING, a DO INSTEAD without RETURNING), fails
// whole with an error wrapping
// ErrRowsRefused that names the cause, logged at Error as a refusal; the
// rows stay in progress and the peer registered.
func TestResetRefusedByAConstraintOrARaisingTriggerSaysSo(t *testing.T) {
	for _, c := range []struct{ name, ddl, says string }{
		{"check constraint", `ALTER TABLE batchrows ADD CONSTRAINT never_queued_two CHECK (rowid <> 2 OR status <> 'queued')`,
			"broke a constraint"},
		{"raising trigger", `CREATE FUNCTION raise_two() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF OLD.rowid = 2 THEN RAISE EXCEPTION 'row 2 stays'; END IF; RETURN NEW; END $$;
CREATE TRIGGER raise_two BEFORE UPDATE ON batchrows FOR EACH ROW EXECUTE FUNCTION raise_two()`, "a trigger"},
		// PostgreSQL refuses UPDATE ... RETURNING on a table with a
		// conditional DO INSTEAD rule, or one without RETURNING (0A000).
		{"conditional DO INSTEAD NOTHING rule", `CREATE RULE keep_two AS ON UPDATE TO batchrows WHERE OLD.rowid = 2 DO INSTEAD NOTHING`,
			"a rule on"},
		{"DO INSTEAD rule without RETURNING", `CREATE RULE log_instead AS ON UPDATE TO batchrows DO INSTEAD UPDATE batches SET status = NEW.status WHERE batchid = OLD.batchid`,
			"a rule on"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			ctx := context.Background()
			prefix := testutil.DeadPeer(t, rdb, db, "dead", 3)
			_, err := db.Exec(ctx, c.ddl)
			require.NoError(t, err)
			w, logs := newWorker(t, rdb, fencedResetter(t, db), "rec", WithKeyPrefix(prefix), WithRowsSets())
			_, err = w.recoverNow(ctx)
			require.ErrorIs(t, err, ErrRowsRefused)
			assert.NotErrorIs(t, err, ErrRowsLocked)
			assert.Contains(t, err.Error(), c.says)
			assert.Equal(t, map[int64]string{1: "inprog", 2: "inprog", 3: "inprog"}, statuses(t, db))
			assert.True(t, registered(t, rdb, prefix, "dead"))
			w.peers.rlog.peerFailed("dead", err)
			assert.Contains(t, logs.String(), `"level":"ERROR","msg":"recovery of dead peer left rows the database refused to change`)
		})
	}
}
