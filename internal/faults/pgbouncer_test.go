//go:build faults

package faults

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/testutil"
)

// bouncer puts a PgBouncer in transaction pooling mode (Debian's
// pgbouncer; servers.StartPgBouncer: three server connections handed out
// round robin, named prepared statements not tracked) in front of the
// scenario's PostgreSQL, for a role of the scenario's own, and returns
// the database URLs the workers connect to through it: the host's,
// configured as docs/integration.md says for a host's own statements
// (pgx: default_query_exec_mode=exec), and the resetter's, in pgx's
// default mode (it caches named prepared statements): pgxreset.Resetter must
// send its statements unnamed whatever the pool's mode.
//
// PgBouncer passes no search_path and no idle_in_transaction_session_timeout
// from the client's startup packet, so the role carries them, as a
// deployment behind a pooler sets them (ALTER ROLE ... SET).
func (e *env) bouncer() (b *servers.PgBouncer, role, hostURL, resetURL string) {
	t := e.t
	t.Helper()
	if _, err := servers.PgBouncerBinary(); err != nil {
		testutil.Unavailable(t, "PgBouncer: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role = e.schema + "_pgb"
	id := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		"CREATE ROLE " + id + " LOGIN",
		"GRANT USAGE ON SCHEMA " + e.schema + " TO " + id,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + e.schema + " TO " + id,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + e.schema + " TO " + id,
		"ALTER ROLE " + id + " SET search_path = " + e.schema,
		"ALTER ROLE " + id + " SET idle_in_transaction_session_timeout = '60s'",
	} {
		_, err := e.pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() { // after PgBouncer stopped (registered below)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = e.pool.Exec(ctx, "DROP OWNED BY "+id)
		_, _ = e.pool.Exec(ctx, "DROP ROLE "+id)
	})

	u, err := url.Parse(e.dbURL)
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(u.Host)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	b, err = servers.StartPgBouncer(ctx, host, p, role)
	require.NoError(t, err, "start pgbouncer")
	t.Cleanup(b.Stop)

	pw, _ := u.User.Password() // trust: ignored, but never printed either
	u.User = url.UserPassword(role, pw)
	u.Host = b.Addr
	resetURL = u.String()
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return b, role, u.String(), resetURL
}

// Scenario PB1 (issue 20): the workers reach PostgreSQL only through
// PgBouncer in transaction pooling mode, hosts and resetters alike (the
// resetter on a pool of its own in pgx's default mode): every transaction
// may run on another of three server connections, and a named prepared
// statement of one is gone in the next. One of three is
// SIGKILLed mid-block: its rows come back within the detection bound, the
// two others finish the batch, nothing is done twice, and no worker logs
// a prepared-statement error. It runs with rows sets and in owner mode.
func TestScenarioPB1PgBouncerTransactionPooling(t *testing.T) {
	for _, v := range []struct {
		name      string
		ownerMode bool
	}{
		{"PB1 PgBouncer (transaction pooling): SIGKILL one of three mid-block", false},
		{"PB1 owner mode, PgBouncer (transaction pooling): SIGKILL one of three mid-block", true},
	} {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, v.name, envConfig{rows: 300, ownerMode: v.ownerMode})
			b, role, hostURL, resetURL := e.bouncer()
			ws := e.spawnStarted([]string{"pb1-w1", "pb1-w2", "pb1-w3"},
				map[string]string{"DATABASE_URL": hostURL, "RESET_DATABASE_URL": resetURL})
			victim := ws[0]
			e.waitMidBlock(victim)
			var backends int
			require.NoError(t, e.query(&backends, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role))
			assert.Positive(t, backends, "the workers' sessions come through PgBouncer")
			assert.LessOrEqual(t, backends, 3, "three workers share PgBouncer's three server connections")

			killedAt := time.Now()
			victim.kill(t)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded, "killed mid-block")
			e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
			e.res.Bound = detectionBound
			e.waitGone(victim.id, e.goneWithin())
			e.finish(true)
			for _, p := range ws {
				assert.NotContains(t, p.out.String(), "prepared statement", "worker %s", p.id)
			}
			e.res.note("pgbouncer %s, %d server connections for 3 workers; stranded=%d", b.Version, backends, len(stranded))
		})
	}
}
