package recovery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// Every owner column type the schema check accepts works end to end
// (issue 20, item 6): a worker dies holding rows, Redis forgets everything,
// and the sweep of a newcomer finds its rows by owner in PostgreSQL and
// resets them. char(n) pads the owner with blanks; read as text, the pad is
// gone, so the owner is the dead worker's instance ID again. A type the
// check refuses fails Start.
func TestEveryOwnerColumnTypeTheSchemaCheckAcceptsIsSwept(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, ddl string
		refused   bool
	}{
		{"text", `ALTER TABLE batchrows ALTER COLUMN owner TYPE text`, false},
		{"varchar", `ALTER TABLE batchrows ALTER COLUMN owner TYPE varchar(64)`, false},
		{"char(60)", `ALTER TABLE batchrows ALTER COLUMN owner TYPE char(60)`, false},
		{"domain over char(60)", `CREATE DOMAIN owner_id AS char(60); ALTER TABLE batchrows ALTER COLUMN owner TYPE owner_id`, false},
		{"uuid", `ALTER TABLE batchrows ALTER COLUMN owner TYPE uuid USING NULL`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := testutil.StartRedis(t)
			rdb := srv.Client(t)
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 3)
			ctx := context.Background()
			_, err := db.Exec(ctx, c.ddl)
			require.NoError(t, err)
			r := fencedResetter(t, db)
			prefix := testutil.Name("O")
			// Five subtests, each with a Redis of its own, run at once:
			// Redis gets 200 ms per command (a 50 ms default here failed
			// Start on a loaded machine).
			opts := []Option{WithKeyPrefix(prefix), WithTimings(Timings{
				HeartbeatTTL:      time.Second,
				HeartbeatInterval: 200 * time.Millisecond,
				RecoveryInterval:  200 * time.Millisecond,
				OperationTimeout:  200 * time.Millisecond,
			})}

			a, _ := newWorker(t, rdb, r, "worker-a", opts...)
			err = a.Start(ctx)
			if c.refused {
				require.ErrorIs(t, err, ErrSchema)
				assert.Contains(t, err.Error(), "it must be text, varchar or char")
				return
			}
			require.NoError(t, err)
			fetchedAs := a.OwnerValue() // worker-a{<life>}: 42 characters
			take(t, db, fetchedAs, 1, 2)
			require.NoError(t, a.TrackAs(ctx, fetchedAs, 1, 2))
			a.crash()
			require.NoError(t, rdb.FlushAll(ctx).Err(), "Redis forgets the dead worker")

			b, logs := startWorker(t, rdb, r, "worker-b", opts...)
			require.Eventually(t, func() bool {
				st := statuses(t, db)
				return st[1] == "queued" && st[2] == "queued"
			}, 10*time.Second, 20*time.Millisecond, "the sweep finds worker-a's rows by owner")
			waitTurns(t, &signals(b).sweep, 5*time.Second, func() bool { return b.Stats().PeersRecovered == 1 }) // counted after the finish
			assert.NotContains(t, logs.String(), "not a valid instance ID")
			var owner *string
			require.NoError(t, db.QueryRow(ctx, `SELECT owner::text FROM batchrows WHERE rowid = 1`).Scan(&owner))
			assert.Nil(t, owner, "owner cleared")
		})
	}
}

// An owner the sweep cannot use as an instance ID (here one with a space,
// written by other means than the library) is logged at Warn, once per
// value however many sweeps see it, and its rows are left alone.
func TestSweepWarnsOnceAboutAnOwnerThatIsNoInstanceID(t *testing.T) {
	t.Parallel()
	rdb := testutil.Redis(t)
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	take(t, db, "batch job 7", 1)
	take(t, db, "{tagged}", 2)
	r := fencedResetter(t, db)
	w, logs := newWorker(t, rdb, r, "sweeper", WithKeyPrefix(testutil.Name("S")), WithRowsSets(), WithBackstopSweep(true))
	ctx := context.Background()
	for range 3 {
		rep, err := w.sweeper.runOnce(ctx)
		require.NoError(t, err)
		require.True(t, rep.turnHeld)
		assert.ElementsMatch(t, []string{"batch job 7", "{tagged}"}, rep.invalidOwners)
	}
	const msg = `"level":"WARN","msg":"rows in progress have an owner that is not a valid instance ID`
	assert.Equal(t, 2, logs.Count(msg), logs.String())
	assert.Equal(t, 1, logs.Count(`"owner":"batch job 7"`), logs.String())
	assert.Equal(t, "inprog", statuses(t, db)[1], "left alone")
}

// An owner column too narrow for the worker's owner value (char(n) or
// varchar(n), or a domain over one) is refused at Start with ErrSchema
// naming both lengths: the host's fetch could not write the value, and a
// shorter owner would never match it. In owner mode the value is the
// instance ID and its life (34 characters more); in rows-set mode the ID.
func TestStartRefusesAnOwnerColumnNarrowerThanTheInstanceID(t *testing.T) {
	t.Parallel()
	for _, ddl := range []string{
		`ALTER TABLE batchrows ALTER COLUMN owner TYPE char(8)`,
		`ALTER TABLE batchrows ALTER COLUMN owner TYPE varchar(8)`,
		`CREATE DOMAIN short_owner AS varchar(8); ALTER TABLE batchrows ALTER COLUMN owner TYPE short_owner`,
	} {
		t.Run(ddl[strings.LastIndex(ddl, " ")+1:], func(t *testing.T) {
			rdb := testutil.Redis(t)
			db := testutil.Postgres(t)
			testutil.CreateBatch(t, db, 1)
			_, err := db.Exec(context.Background(), ddl)
			require.NoError(t, err)
			prefix := testutil.Name("O")
			w, _ := newWorker(t, rdb, fencedResetter(t, db), "a-worker-id-of-21-chr", WithKeyPrefix(prefix), WithRowsSets())
			err = w.Start(context.Background())
			require.ErrorIs(t, err, ErrSchema)
			assert.Contains(t, err.Error(), "holds at most 8 characters and this worker's instance ID \"a-worker-id-of-21-chr\" has 21")
			assert.False(t, registered(t, rdb, prefix, "a-worker-id-of-21-chr"))

			lives, _ := newWorker(t, rdb, fencedResetter(t, db), "w-8chars", WithKeyPrefix(prefix))
			err = lives.Start(context.Background())
			require.ErrorIs(t, err, ErrSchema, "owner mode writes <id>{<life>}: 8 + 34 characters")
			assert.Contains(t, err.Error(), "holds at most 8 characters and this worker's owner value (the instance ID and its life, 34 characters more")
			assert.Contains(t, err.Error(), "has 42")
			assert.False(t, registered(t, rdb, prefix, "w-8chars"))

			ok, _ := newWorker(t, rdb, fencedResetter(t, db), "w-8chars", WithKeyPrefix(prefix), WithRowsSets())
			require.NoError(t, ok.Start(context.Background()), "an ID that fits, in rows-set mode (bare IDs)")
		})
	}
}
