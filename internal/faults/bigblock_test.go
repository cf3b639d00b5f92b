//go:build faults

package faults

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/pgcore"
	"github.com/alya/recovery/internal/pgtest"
)

// Big blocks: a dead worker's block whose reset does not fit one reset
// timeout (an audit trigger on the table) or one statement_timeout (set by
// a DBA for the recoverers' sessions). Resets commit chunk by chunk, each
// chunk sized to fit both, so each try keeps what it reset and the block
// comes back in a few scans.

// bigBlock is one such scenario: a victim that fetches one block of rows
// (every row of the table), an audit trigger doing triggerWork
// (pgtest.AuditTrigger) added once the block is fetched, the victim
// SIGKILLed, and three survivors whose sessions set the run-time
// parameters survivorParams recovering its rows. Once they are back, the
// audit must show each reset exactly once; the trigger is then dropped,
// so that the survivors process the rows within the drain bound.
type bigBlock struct {
	scenario       string
	rows           int
	ownerMode      bool
	triggerWork    int
	survivorParams map[string]string
	// tries is how many failed tries of the reset the bound allows, a
	// scan and a reset timeout each: about one per 1,000 rows (on the
	// loaded 2-core machine, with race-instrumented workers processing
	// rows meanwhile, a 2 s try reset 1,600 to 2,600 rows).
	tries int
}

func (s bigBlock) run(t *testing.T) {
	e := newEnv(t, s.scenario, envConfig{rows: s.rows, ownerMode: s.ownerMode, work: 2 * time.Millisecond})
	victim := e.spawn("bb-victim", nil, e.workerArgs("bb-victim", "-block", "1000000")...)
	victim.waitLog(t, "faultworker started", 20*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for len(e.inprogOf(victim.id)) < s.rows*9/10 {
		require.True(t, time.Now().Before(deadline), "the victim never fetched its block")
		time.Sleep(20 * time.Millisecond) // pace: polling the table for the victim's fetch
	}
	pgtest.AuditTrigger(t, e.pool, s.triggerWork)
	killedAt := time.Now()
	victim.kill(t)
	stranded := e.inprogOf(victim.id)
	require.Greater(t, len(stranded), s.rows/2)
	if st, ok := s.survivorParams["statement_timeout"]; ok {
		s.requireAStatementOfOneChunkOutruns(t, e, st, stranded)
	}

	u, err := url.Parse(e.dbURL)
	require.NoError(t, err)
	q := u.Query()
	for k, v := range s.survivorParams {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	env := map[string]string{"DATABASE_URL": u.String()}
	var survivors []*proc
	for _, id := range []string{"bb-w1", "bb-w2", "bb-w3"} {
		survivors = append(survivors, e.spawn(id, env, e.workerArgs(id, "-block", "100")...))
	}
	for _, p := range survivors {
		p.waitLog(t, "faultworker started", 20*time.Second)
	}
	bound := detectionBound + time.Duration(s.tries)*(recoveryInterval*11/10+resetTimeout)
	e.res.Detection = e.waitReset(victim.id, stranded, killedAt, bound)
	e.res.Bound = bound
	e.res.note("stranded=%d trigger_work=%d params=%v", len(stranded), s.triggerWork, s.survivorParams)
	var twice, resets int
	require.NoError(t, e.query(&resets, `SELECT count(*) FROM batchrows_audit WHERE old_status = 'inprog' AND new_status = 'queued' AND rowid = ANY($1)`, stranded))
	require.NoError(t, e.query(&twice, `SELECT count(*) FROM (SELECT rowid FROM batchrows_audit WHERE old_status = 'inprog' AND new_status = 'queued' AND rowid = ANY($1) GROUP BY rowid HAVING count(*) > 1) d`, stranded))
	assert.Equal(t, len(stranded), resets, "every stranded row reset once")
	assert.Zero(t, twice, "stranded rows reset twice")
	_, err = e.pool.Exec(context.Background(), `DROP TRIGGER batchrows_audit ON batchrows`)
	require.NoError(t, err)
	e.finish(true)
}

// requireAStatementOfOneChunkOutruns makes sure the scenario tests what it
// names: one reset statement of pgcore.DefaultChunkSize stranded rows, as
// the reset before chunked commits ran them (one transaction, statements
// of that size), is cancelled at statement_timeout st. Otherwise that
// reset would have brought the block back too, and the scenario proves
// nothing. The statement runs in a transaction rolled back whatever
// happens.
func (s bigBlock) requireAStatementOfOneChunkOutruns(t *testing.T, e *env, st string, stranded []int64) {
	t.Helper()
	ids := stranded[:min(len(stranded), pgcore.DefaultChunkSize)]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, st)
	require.NoError(t, err)
	began := time.Now()
	_, err = tx.Exec(ctx, `UPDATE `+e.table+` SET status = 'queued' WHERE rowid = ANY($1)`, ids)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "57014",
		"a %d-row statement was not cancelled at statement_timeout %s ms (took %v, error %v): the scenario proves nothing", len(ids), st, time.Since(began), err)
}

// Scenario K1: owner mode, a 5,000-row block on a table whose audit
// trigger makes one row's reset cost a millisecond or more: 5 s of reset
// at least against a 2 s reset timeout (with a third of that work, one
// transaction still fitted: measured 3.55 s from the kill). Every try commits what it reset; the
// block is back within a few scans, every row done exactly once. In one
// transaction every try rolled back whole, for good.
func TestScenarioK1OwnerModeBlockLongerThanTheResetTimeout(t *testing.T) {
	bigBlock{scenario: "K1 owner mode: 5,000-row block, slow audit trigger, reset timeout 2 s",
		rows: 5000, ownerMode: true, triggerWork: 10000, tries: 10}.run(t)
}

// Scenario K2: rows-set mode (owner column, reset ledger), a 20,000-row
// block under an audit trigger doing four times the work of
// TestResetSizesItsChunksToFitTheStatementTimeout's (600: at 150 a
// 5,000-row statement took 70 ms in a full suite's run), the recoverers'
// sessions at statement_timeout = 100 ms. The scenario first makes sure
// one 5,000-row statement, as the reset before chunked commits ran them
// in one transaction, is cancelled at 100 ms: that reset rolled back whole
// at every try. Chunks sized to fit half the statement_timeout bring the
// block back.
func TestScenarioK2StatementTimeoutOf100msOnA20000RowBlock(t *testing.T) {
	bigBlock{scenario: "K2 rows-set mode: 20,000-row block, audit trigger, statement_timeout 100 ms",
		rows: 20000, triggerWork: 600, survivorParams: map[string]string{"statement_timeout": "100"}, tries: 20}.run(t)
}
