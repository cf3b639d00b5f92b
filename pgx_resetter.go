package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgxExecer is what a PgxResetter calls on its database handle: Begin for
// every reset (in a transaction), Query for reads outside one (the owners
// of rows in progress, the self-check's row states) and Exec for
// CreateLedger. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it. Given a
// pgx.Tx, the resetter works inside a savepoint of that transaction.
//
// Give a Worker a *pgxpool.Pool: its recovery loop, ops.RecoverNow and Release
// may reset concurrently, which a *pgx.Conn or a pgx.Tx does not allow, and
// recovery deletes a dead peer's rows set once ResetRows returns, which
// with a pgx.Tx is before the caller's transaction commits. A Conn or Tx
// suits a PgxResetter used on its own, by one goroutine.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PgxResetter resets rows in PostgreSQL with a guarded UPDATE, in effect:
//
//	UPDATE <table> SET <status> = $queued
//	WHERE <id> = ANY($1::bigint[]) AND <status> = $inprog
//
// The rows are locked first in ascending ID order with SKIP LOCKED: a reset
// never waits for a row another session holds locked (a transaction left
// open on a host that vanished holds its locks until the server notices,
// hours later), it reports the row as not reset (RowState.Locked) and the
// next attempt tries it again. Rows are reset in chunks inside one
// transaction: a failure resets none of them, and the next attempt starts
// clean. The parent batch is never touched. Identifiers come from options
// and are quoted; values are parameters. Statements are sent without named
// prepared statements (pgx.QueryExecModeExec), so the resetter works
// through PgBouncer in transaction pooling mode.
//
// With WithOwnerColumn the reset also requires <owner> = the dead instance
// and clears it; with WithRecoveryCountColumn and WithMaxRecoveries it
// counts resets and quarantines rows that keep killing their workers.
//
// It never closes the handle it was given.
type PgxResetter struct {
	pgResetter
	db PgxExecer
}

// pgResetter is the PostgreSQL resetter both PgxResetter and SQLResetter
// are: its statements and flows, run over a pgDB (pg_db.go).
type pgResetter struct {
	conn         pgDB
	kind         string // "PgxResetter" or "SQLResetter", for messages
	o            resetterOptions
	byIDs        query  // reset the rows among $ids
	logged       query  // byIDs, recording in the ledger and skipping what it holds
	unowned      query  // byIDs with an owner column, also the rows without owner (unownedReset)
	unownedLog   query  // unowned, recording in the ledger
	rest         query  // the rows among $ids not settled after a reset (restQuery)
	restUnowned  query  // rest after unowned or unownedLog
	byOwner      query  // reset the first chunk of rows of one owner (owner mode, sweep)
	byOwnerAfter query  // the next chunks, above the last ID of the previous one
	ownedRest    query  // the rows of one owner a reset by owner left (ownedRestQuery)
	owners       string // list the owners of rows in progress
	byVersion    query  // reset rows still at the version the sweep saw (no owner column)
	versionRest  query  // the rows byVersion skipped, locked by another session (versionRestQuery)
	inProgress   string // list the rows in progress with their versions

	ledgerCleaned atomic.Int64 // unix nanoseconds of the last ledger clean-up
}

type resetterOptions struct {
	schema, table, idColumn, statusColumn string
	ownerColumn, countColumn              string
	inprog, queued, terminal              string
	done                                  []string
	maxRecoveries                         int
	chunkSize                             int
	ledgerTable                           string
	noLedger                              bool
	ledgerRetention                       time.Duration
	// fromEnv holds the values PgxConfig.Options took from the
	// environment, by variable: an error about such a value names the
	// variable, which is what the operator set, not the option.
	fromEnv map[string]string
}

// named is how errors name the setting of value: the environment variable
// env when the value came from it (PgxConfigFromEnv), else option.
func (o *resetterOptions) named(env, option, value string) string {
	if v, ok := o.fromEnv[env]; ok && v == value {
		return env
	}
	return option
}

// withEnv records that the values in vars (variable → value) came from
// the environment, for named.
func withEnv(vars map[string]string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) {
		if o.fromEnv == nil {
			o.fromEnv = map[string]string{}
		}
		maps.Copy(o.fromEnv, vars)
	})
}

// A ResetterOption configures a PgxResetter.
type ResetterOption interface {
	applyResetter(*resetterOptions)
}

type resetterOptionFunc func(*resetterOptions)

func (f resetterOptionFunc) applyResetter(o *resetterOptions) { f(o) }

// WithTable sets the table that holds the rows; it is quoted as one
// identifier (use WithSchema for a schema). Default: DefaultTable ("batchrows").
func WithTable(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.table = name })
}

// WithSchema sets the schema of the table. Default: none, the connection's
// search_path decides.
func WithSchema(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.schema = name })
}

// WithIDColumn sets the bigint row ID column. Default: DefaultIDColumn ("rowid").
func WithIDColumn(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.idColumn = name })
}

// WithStatusColumn sets the status column. Default: DefaultStatusColumn ("status").
func WithStatusColumn(name string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.statusColumn = name })
}

// WithStatuses sets the status values of a row in progress and of a queued
// row; they must differ and not be empty. Defaults: DefaultInProgressStatus
// ("inprog") and DefaultQueuedStatus ("queued").
func WithStatuses(inprog, queued string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.inprog, o.queued = inprog, queued })
}

// WithDoneStatuses lists every status a finished row can have. Recovery
// uses it to tell a row a dead worker finished (left alone, as it should
// be) from a row it could not reset because a status is misconfigured
// (kept and reported, see ResetResult.NotReset). Each must differ from the
// in-progress status. Default: DefaultDoneStatus ("done").
func WithDoneStatuses(statuses ...string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.done = slices.Clone(statuses) })
}

// WithChunkSize sets how many row IDs one UPDATE carries; it must be
// positive. Default: DefaultResetChunkSize (5000).
func WithChunkSize(n int) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.chunkSize = n })
}

// WithOwnerColumn turns on owner fencing: the text column col holds the
// instance ID of the worker that took the row (FetchBlockOfRows sets it
// when it marks rows in progress). A reset then only changes rows that the
// dead instance still owns, and clears the owner:
//
//	... SET <status> = $queued, <owner> = NULL
//	WHERE <id> = ANY($1) AND <status> = $inprog AND <owner> = $dead
//
// so a row another worker has taken since is never reset under it. It also
// makes the resetter an OwnerSweeper. Default: off. Recommended; see
// docs/safety.md for the host side.
func WithOwnerColumn(col string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.ownerColumn = col })
}

// WithRecoveryCountColumn names an integer column (NOT NULL DEFAULT 0) that
// every reset increments in the same UPDATE. Default: off.
func WithRecoveryCountColumn(col string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.countColumn = col })
}

// WithMaxRecoveries quarantines poison rows: a reset that brings a row's
// recovery count to n sets it to terminalStatus ("" means
// DefaultTerminalStatus, "failed") instead of queued, so a row that kills
// every worker that takes it stops crash-looping the fleet. It needs
// WithRecoveryCountColumn; n must be at least 1. Default: off.
func WithMaxRecoveries(n int, terminalStatus string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) {
		o.maxRecoveries = n
		o.terminal = terminalStatus
		if o.terminal == "" {
			o.terminal = DefaultTerminalStatus
		}
	})
}

// NewPgxResetter returns a PgxResetter over db, or an error wrapping
// ErrInvalidConfig that names the bad option. It does not contact the
// database.
func NewPgxResetter(db PgxExecer, opts ...ResetterOption) (*PgxResetter, error) {
	r := &PgxResetter{db: db}
	if err := r.init(db, pgxDB{db}, "PgxResetter", opts); err != nil {
		return nil, err
	}
	return r, nil
}

// init checks that the caller's handle is not nil, applies opts over the
// defaults, checks them and builds the statements, run over conn.
func (r *pgResetter) init(handle any, conn pgDB, kind string, opts []ResetterOption) error {
	if isNil(handle) {
		return fmt.Errorf("%w: database handle is nil", ErrInvalidConfig)
	}
	o := resetterOptions{
		table:        DefaultTable,
		idColumn:     DefaultIDColumn,
		statusColumn: DefaultStatusColumn,
		inprog:       DefaultInProgressStatus,
		queued:       DefaultQueuedStatus,
		done:         []string{DefaultDoneStatus},
		chunkSize:    DefaultResetChunkSize,

		ledgerTable:     DefaultLedgerTable,
		ledgerRetention: DefaultLedgerRetention,
	}
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("%w: nil resetter option", ErrInvalidConfig)
		}
		opt.applyResetter(&o)
	}
	if err := o.validate(); err != nil {
		return err
	}
	r.conn, r.kind, r.o = conn, kind, o
	r.byIDs, r.rest = o.resetQuery(resetShape{}), o.restQuery(false)
	if o.usesLedger() {
		r.logged = o.resetQuery(resetShape{ledger: true})
	}
	if o.ownerColumn == "" {
		r.byVersion, r.versionRest, r.inProgress = o.versionsQuery(), o.versionRestQuery(), o.inProgressQuery()
	}
	if o.ownerColumn != "" {
		r.unowned = o.resetQuery(resetShape{unowned: true})
		r.unownedLog = o.resetQuery(resetShape{unowned: true, ledger: true})
		r.restUnowned = o.restQuery(true)
		r.byOwner = o.resetQuery(resetShape{byOwner: true})
		r.byOwnerAfter = o.resetQuery(resetShape{byOwner: true, keyset: true})
		r.ownedRest = o.ownedRestQuery()
		// As text: a char(n) owner comes back without its blank padding,
		// which an instance ID never has, so the sweep can use it.
		r.owners = fmt.Sprintf("SELECT DISTINCT %s::text FROM %s WHERE %s = $1 AND %s IS NOT NULL",
			ident(o.ownerColumn), o.tableIdent(), ident(o.statusColumn), ident(o.ownerColumn))
	}
	return nil
}

// pgxDB is pgDB over pgx.
type pgxDB struct{ db PgxExecer }

func (d pgxDB) begin(ctx context.Context) (pgTx, error) {
	tx, err := d.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	_, nested := d.db.(pgx.Tx)
	return pgxTx{tx: tx, inTx: nested}, nil
}

func (d pgxDB) query(ctx context.Context, sql string, args ...any) (pgRows, error) {
	return pgxQuery(ctx, d.db, sql, args)
}

func (d pgxDB) exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.db.Exec(ctx, sql, execMode(args)...)
	return err
}

// pgxTx is pgTx over a pgx.Tx (a savepoint when the handle was a pgx.Tx).
type pgxTx struct {
	tx   pgx.Tx
	inTx bool // a savepoint of the caller's transaction
}

func (t pgxTx) nested() bool { return t.inTx }

func (t pgxTx) query(ctx context.Context, sql string, args ...any) (pgRows, error) {
	return pgxQuery(ctx, t.tx, sql, args)
}

func (t pgxTx) exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, execMode(args)...)
	return err
}

func (t pgxTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

func pgxQuery(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args []any) (pgRows, error) {
	rows, err := q.Query(ctx, sql, execMode(args)...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// execMode returns args behind pgx.QueryExecModeExec, which pgx reads as
// the mode of this one call: the statement goes out unnamed, parsed and
// run in one round trip, whatever the pool's DefaultQueryExecMode. pgx's
// default mode prepares named statements and caches them per connection,
// which PgBouncer in transaction pooling mode breaks: the next
// transaction may run on another server connection, where the statement
// does not exist. A statement without arguments goes out in the simple
// protocol either way.
func execMode(args []any) []any {
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, which could make two options name one column.
const maxIdentifierLen = 63

func (o *resetterOptions) validate() error {
	type named struct{ role, v string }
	idents := []named{{"table", o.table}, {"ID column", o.idColumn}, {"status column", o.statusColumn}}
	for _, opt := range []named{{"schema", o.schema}, {"owner column", o.ownerColumn}, {"recovery count column", o.countColumn}} {
		if opt.v != "" {
			idents = append(idents, opt)
		}
	}
	seen := map[string]string{}
	for _, id := range idents {
		switch {
		case id.v == "":
			return fmt.Errorf("%w: %s name is empty", ErrInvalidConfig, id.role)
		case len(id.v) > maxIdentifierLen:
			return fmt.Errorf("%w: %s name %q is longer than %d bytes", ErrInvalidConfig, id.role, clip(id.v), maxIdentifierLen)
		case strings.ContainsRune(id.v, 0):
			return fmt.Errorf("%w: %s name contains a NUL byte", ErrInvalidConfig, id.role)
		}
		if id.role == "table" || id.role == "schema" {
			continue
		}
		if other, dup := seen[id.v]; dup {
			return fmt.Errorf("%w: %s and %s are both %q", ErrInvalidConfig, other, id.role, id.v)
		}
		seen[id.v] = id.role
	}
	if o.inprog == "" || o.queued == "" {
		return fmt.Errorf("%w: statuses must not be empty (in progress %q, queued %q)", ErrInvalidConfig, o.inprog, o.queued)
	}
	if o.inprog == o.queued {
		return fmt.Errorf("%w: in-progress and queued statuses are both %q", ErrInvalidConfig, o.inprog)
	}
	for _, d := range o.done {
		if d == "" || d == o.inprog {
			return fmt.Errorf("%w: done status %q must not be empty nor the in-progress status", ErrInvalidConfig, d)
		}
	}
	if !o.noLedger { // with an owner column too: rows without an owner (unownedReset)
		switch {
		case o.ledgerTable == "" || strings.ContainsRune(o.ledgerTable, 0):
			return fmt.Errorf("%w: reset ledger table name %q is empty or contains a NUL byte", ErrInvalidConfig, clip(o.ledgerTable))
		case len(o.ledgerTable)+len("_reset_at") > maxIdentifierLen:
			return fmt.Errorf("%w: reset ledger table name %q is longer than %d bytes", ErrInvalidConfig, clip(o.ledgerTable), maxIdentifierLen-len("_reset_at"))
		case o.ledgerRetention < time.Hour:
			return fmt.Errorf("%w: reset ledger retention %v must be at least an hour", ErrInvalidConfig, o.ledgerRetention)
		}
	}
	if o.chunkSize <= 0 {
		return fmt.Errorf("%w: chunk size %d must be positive", ErrInvalidConfig, o.chunkSize)
	}
	if o.terminal != "" || o.maxRecoveries != 0 {
		switch {
		case o.maxRecoveries < 1:
			return fmt.Errorf("%w: max recoveries %d must be at least 1", ErrInvalidConfig, o.maxRecoveries)
		case o.countColumn == "":
			count := "WithRecoveryCountColumn"
			if len(o.fromEnv) > 0 {
				count += " or " + EnvRecoveryCountColumn
			}
			return fmt.Errorf("%w: max recoveries %d (%s) needs a recovery count column (%s)", ErrInvalidConfig,
				o.maxRecoveries, o.named(EnvMaxRecoveries, "WithMaxRecoveries", strconv.Itoa(o.maxRecoveries)), count)
		case o.terminal == o.inprog || o.terminal == o.queued:
			return fmt.Errorf("%w: terminal status %q must differ from the in-progress and queued statuses", ErrInvalidConfig, o.terminal)
		}
	}
	return nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func (o *resetterOptions) tableIdent() string {
	if o.schema != "" {
		return pgx.Identifier{o.schema, o.table}.Sanitize()
	}
	return ident(o.table)
}

// FencesByOwner reports whether resets are guarded by owner
// (WithOwnerColumn). It implements OwnerFencer.
func (r *pgResetter) FencesByOwner() bool { return r.owners != "" }

// resetAttempts is how often a reset that hit a deadlock or a serialization
// failure is tried in all.
const resetAttempts = 4

// rollbackTimeout bounds the rollback after a failed reset, which runs even
// when the reset's context has ended.
const rollbackTimeout = 5 * time.Second

// ResetRows sets the rows among rowIDs that are still in progress (and,
// with WithOwnerColumn, still owned by deadInstanceID) back to queued, and
// returns how many it changed, quarantined rows included.
func (r *pgResetter) ResetRows(ctx context.Context, deadInstanceID string, rowIDs []int64) (int64, error) {
	res, err := r.ResetRowsReport(ctx, deadInstanceID, rowIDs)
	return res.Changed, err
}

// ResetRowsReport is ResetRows that also returns the rows quarantined by
// WithMaxRecoveries and the rows it could not reset. With the reset
// ledger, the resets are recorded under an unknown ("") incarnation.
func (r *pgResetter) ResetRowsReport(ctx context.Context, deadInstanceID string, rowIDs []int64) (ResetResult, error) {
	return r.ResetIncarnation(ctx, ResetRequest{InstanceID: deadInstanceID, RowIDs: rowIDs})
}

// ResetIncarnation resets the rows of req in one transaction, in chunks in
// ascending ID order; a deadlock or serialization failure is retried with
// backoff. With the reset ledger (no owner column) it skips the rows a
// committed reset of the same instance and incarnation already changed,
// and records the ones it changes, in the same transaction. It implements
// IncarnationResetter.
func (r *pgResetter) ResetIncarnation(ctx context.Context, req ResetRequest) (ResetResult, error) {
	if len(req.RowIDs) == 0 {
		return ResetResult{}, nil
	}
	ids := slices.Clone(req.RowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	res, err := r.withRetry(ctx, func(tx pgTx) (ResetResult, error) {
		return r.resetInTx(ctx, tx, req, ids, true)
	})
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows of %s: %w", req.InstanceID, r.explainResetError(r.explainLedgerError(err)))
	}
	return res, nil
}

// resetInTx runs the reset of ids (sorted, without duplicates) for req in
// tx: ResetIncarnation commits it, PlanReset rolls it back. clean lets it
// delete expired ledger entries (a plan does not, so as not to postpone
// the real clean-up).
func (r *pgResetter) resetInTx(ctx context.Context, tx pgTx, req ResetRequest, ids []int64, clean bool) (ResetResult, error) {
	reset, rest, ledger := r.byIDs, r.rest, r.ledgerFor(req)
	if ledger {
		reset = r.logged
	}
	if r.o.ownerColumn != "" && req.FromRowsSet {
		var err error
		if reset, rest, ledger, err = r.unownedReset(ctx, tx, req, ids); err != nil {
			return ResetResult{}, err
		}
	}
	if ledger {
		if err := r.lockIncarnation(ctx, tx, req.InstanceID, req.Incarnation); err != nil {
			return ResetResult{}, err
		}
		// Rows a committed reset of this incarnation already handled are
		// settled: neither reset again nor reported. Read once, under the
		// lock that serializes this incarnation's resets.
		var err error
		if ids, err = r.withoutRecorded(ctx, tx, req, ids); err != nil {
			return ResetResult{}, err
		}
	}
	var total ResetResult
	for chunk := range slices.Chunk(ids, r.o.chunkSize) {
		v := resetValues{ids: chunk, owner: req.InstanceID, incarnation: req.Incarnation}
		res, err := r.run(ctx, tx, reset, v)
		if err != nil {
			return ResetResult{}, err
		}
		notReset, err := r.unsettled(ctx, tx, rest, v)
		if err != nil {
			return ResetResult{}, err
		}
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.NotReset = append(total.NotReset, notReset...)
	}
	if clean && ledger {
		if err := r.cleanLedger(ctx, tx); err != nil {
			return ResetResult{}, err
		}
	}
	return total, nil
}

// ledgerFor reports whether the reset of req is recorded in the ledger: it
// needs the ledger on and a known incarnation. Under an unknown one ("": a
// worker of the first protocol version, or a host calling ResetRows
// itself) a record would make every later reset of the same instance ID
// skip the row, also in that ID's next life.
func (r *pgResetter) ledgerFor(req ResetRequest) bool {
	return r.o.usesLedger() && req.Incarnation != ""
}

// unownedReset chooses, with an owner column, the reset of rows read from
// a dead peer's rows set (req.FromRowsSet), the query that reads what it
// left, and whether it uses the ledger. Rows among them in progress with no owner were taken by a worker
// that does not set the owner column (a rows-set worker of the release
// before the column, during the rollout): the rows set says they are the
// dead peer's, and they are reset as a rows-set recovery resets them,
// under the claim, the status guard and, for a known incarnation, the
// reset ledger, which is what keeps a reset whose outcome was lost from
// being applied again to a row a live worker of that kind took since
// (docs/safety.md §2, "Rows without an owner"). Without the ledger table
// they are left alone and reported in NotReset, with no owner. A worker
// that sets the column never holds a row without an owner: its fetch sets
// both in one UPDATE.
func (r *pgResetter) unownedReset(ctx context.Context, tx pgTx, req ResetRequest, ids []int64) (reset, rest query, ledger bool, err error) {
	var found bool
	err = queryRow(ctx, tx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s = ANY($1::bigint[]) AND %s = $2 AND %s IS NULL)",
		r.o.tableIdent(), ident(r.o.idColumn), ident(r.o.statusColumn), ident(r.o.ownerColumn)), []any{ids, r.o.inprog}, &found)
	switch {
	case err != nil:
		return query{}, query{}, false, fmt.Errorf("look for rows without an owner: %w", err)
	case !found:
		return r.byIDs, r.rest, false, nil
	case r.o.noLedger || req.Incarnation == "":
		return r.unowned, r.restUnowned, false, nil // as a rows-set recovery without the ledger
	}
	if err := queryRow(ctx, tx, "SELECT to_regclass($1) IS NOT NULL", []any{r.o.ledgerIdent()}, &found); err != nil {
		return query{}, query{}, false, fmt.Errorf("look up reset ledger %s: %w", r.o.ledgerIdent(), err)
	}
	if !found {
		return r.byIDs, r.rest, false, nil
	}
	return r.unownedLog, r.restUnowned, true, nil
}

// withoutRecorded returns ids (sorted) without the rows the ledger holds
// for req's instance and incarnation.
func (r *pgResetter) withoutRecorded(ctx context.Context, tx pgTx, req ResetRequest, ids []int64) ([]int64, error) {
	recorded, err := collect(ctx, tx, fmt.Sprintf("SELECT row_id FROM %s WHERE instance_id = $1 AND incarnation = $2 ORDER BY row_id",
		r.o.ledgerIdent()), []any{req.InstanceID, req.Incarnation}, scanOne[int64])
	if err != nil || len(recorded) == 0 {
		return ids, err
	}
	out := make([]int64, 0, len(ids))
	j := 0
	for _, id := range ids {
		for j < len(recorded) && recorded[j] < id {
			j++
		}
		if j < len(recorded) && recorded[j] == id {
			continue
		}
		out = append(out, id)
	}
	return out, nil
}

// unsettled runs q (restQuery or ownedRestQuery) in tx.
func (r *pgResetter) unsettled(ctx context.Context, tx pgTx, q query, v resetValues) ([]RowState, error) {
	return collect(ctx, tx, q.sql, r.bind(q, v), func(row pgRows) (RowState, error) {
		var s RowState
		err := row.Scan(&s.ID, &s.Status, &s.Locked, &s.Owner)
		return s, err
	})
}

// InProgressOwners returns the distinct owners of rows in progress. It
// needs WithOwnerColumn.
func (r *pgResetter) InProgressOwners(ctx context.Context) ([]string, error) {
	if err := r.needOwnerColumn("listing in-progress owners"); err != nil {
		return nil, err
	}
	owners, err := collect(ctx, r.conn, r.owners, []any{r.o.inprog}, scanOne[string])
	if err != nil {
		return nil, fmt.Errorf("list owners of rows in progress: %w", err)
	}
	return owners, nil
}

// InProgressRows returns every row in progress with its version, the
// row's xmin: it changes whenever the row is written. Each row's Status is
// the in-progress status. It implements Resetter. It needs a resetter
// without WithOwnerColumn (with one, the backstop sweep goes by owner).
func (r *pgResetter) InProgressRows(ctx context.Context) ([]RowState, error) {
	if r.inProgress == "" {
		return nil, fmt.Errorf("%w: a %s WithOwnerColumn sweeps by owner, not by row version", ErrInvalidConfig, r.kind)
	}
	rows, err := collect(ctx, r.conn, r.inProgress, []any{r.o.inprog}, func(row pgRows) (RowState, error) {
		v := RowState{Status: r.o.inprog}
		err := row.Scan(&v.ID, &v.Version)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("list rows in progress: %w", err)
	}
	return rows, nil
}

// ResetRowVersions returns the rows of rows that are still in progress at
// the version given to the queue (or quarantine), in one transaction,
// WithChunkSize rows per statement in ID order. A row written since its
// version was read is left alone and not reported: it is not stuck. A row
// still at its version that another session held locked is skipped (SKIP
// LOCKED) and listed in NotReset (Locked), for the sweep to try again. The
// ledger is not used: the version guard alone makes a second reset of the
// same row version impossible.
func (r *pgResetter) ResetRowVersions(ctx context.Context, rows []RowState) (ResetResult, error) {
	if r.inProgress == "" {
		return ResetResult{}, fmt.Errorf("%w: a %s WithOwnerColumn sweeps by owner, not by row version", ErrInvalidConfig, r.kind)
	}
	if len(rows) == 0 {
		return ResetResult{}, nil
	}
	sorted := sortedVersions(rows)
	res, err := r.withRetry(ctx, func(tx pgTx) (ResetResult, error) {
		return r.resetVersionsInTx(ctx, tx, sorted)
	})
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset %d stray rows: %w", len(rows), err)
	}
	return res, nil
}

// sortedVersions returns a copy of rows in ascending ID order.
func sortedVersions(rows []RowState) []RowState {
	sorted := slices.Clone(rows)
	slices.SortFunc(sorted, func(a, b RowState) int { return cmp.Compare(a.ID, b.ID) })
	return sorted
}

// resetVersionsInTx resets the rows of sorted (in ascending ID order) that
// are still in progress at their version, chunk after chunk, in tx:
// ResetRowVersions commits it, a dry run rolls it back.
func (r *pgResetter) resetVersionsInTx(ctx context.Context, tx pgTx, sorted []RowState) (ResetResult, error) {
	var total ResetResult
	for chunk := range slices.Chunk(sorted, r.o.chunkSize) {
		v := resetValues{ids: make([]int64, len(chunk)), versions: make([]string, len(chunk))}
		for i, rv := range chunk {
			v.ids[i], v.versions[i] = rv.ID, rv.Version
		}
		res, err := r.run(ctx, tx, r.byVersion, v)
		if err != nil {
			return ResetResult{}, err
		}
		locked, err := r.unsettled(ctx, tx, r.versionRest, v)
		if err != nil {
			return ResetResult{}, err
		}
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.NotReset = append(total.NotReset, locked...)
	}
	return total, nil
}

// ResetOwnerRows returns every row still in progress and owned by owner to
// the queue (or quarantine), in one transaction, WithChunkSize rows per
// statement in ID order, and lists in NotReset (Locked) the rows it
// skipped because another session held them locked. It needs
// WithOwnerColumn. On a large table give
// it the partial index the migration in docs/integration.md creates,
// (owner, id) WHERE status = in progress: each statement then seeks to the
// rows it changes.
func (r *pgResetter) ResetOwnerRows(ctx context.Context, owner string) (ResetResult, error) {
	if err := r.needOwnerColumn("resetting by owner"); err != nil {
		return ResetResult{}, err
	}
	res, err := r.withRetry(ctx, func(tx pgTx) (ResetResult, error) {
		return r.resetOwnedInTx(ctx, tx, owner)
	})
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows owned by %s: %w", owner, r.explainResetError(err))
	}
	return res, nil
}

// resetOwnedInTx resets the rows of owner chunk after chunk, in ID order,
// in tx: locks are taken in the order every reset takes them, and no
// statement locks an unbounded number of rows at once.
func (r *pgResetter) resetOwnedInTx(ctx context.Context, tx pgTx, owner string) (ResetResult, error) {
	var all ResetResult
	v := resetValues{owner: owner}
	q := r.byOwner
	for {
		var (
			res    ResetResult
			locked int
		)
		err := queryRow(ctx, tx, q.sql, r.bind(q, v), &res.Changed, &res.Quarantined, &locked, &v.after)
		q = r.byOwnerAfter
		if err != nil {
			return ResetResult{}, err
		}
		all.Changed += res.Changed
		all.Quarantined = append(all.Quarantined, res.Quarantined...)
		if locked < r.o.chunkSize {
			break
		}
	}
	// SKIP LOCKED passed over the rows another session holds: a short
	// chunk means no unlocked row is left, not that no row is.
	skipped, err := r.unsettled(ctx, tx, r.ownedRest, resetValues{owner: owner})
	if err != nil {
		return ResetResult{}, err
	}
	all.NotReset = skipped
	return all, nil
}

func (r *pgResetter) run(ctx context.Context, tx pgTx, q query, v resetValues) (ResetResult, error) {
	var res ResetResult
	if err := queryRow(ctx, tx, q.sql, r.bind(q, v), &res.Changed, &res.Quarantined); err != nil {
		return ResetResult{}, err
	}
	return res, nil
}

// withRetry runs f in a transaction, again after a deadlock or a
// serialization failure, up to resetAttempts times.
func (r *pgResetter) withRetry(ctx context.Context, f func(pgTx) (ResetResult, error)) (ResetResult, error) {
	for attempt := 1; ; attempt++ {
		res, err := r.inTx(ctx, f)
		if err == nil {
			return res, nil
		}
		if attempt == resetAttempts || !retryable(err) {
			return ResetResult{}, err
		}
		backoff := time.Duration(attempt*attempt) * 20 * time.Millisecond
		backoff += rand.N(backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ResetResult{}, errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

func (r *pgResetter) inTx(ctx context.Context, f func(pgTx) (ResetResult, error)) (res ResetResult, err error) {
	tx, err := r.conn.begin(ctx)
	if err != nil {
		return ResetResult{}, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.rollback(rbCtx) // the transaction is void either way
			cancel()
		}
	}()
	if err = setLockTimeout(ctx, tx); err != nil {
		return ResetResult{}, err
	}
	if res, err = f(tx); err != nil {
		return ResetResult{}, err
	}
	if err := tx.commit(ctx); err != nil {
		return ResetResult{}, fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

// lockTimeoutShare is the share of the time left to a reset that its
// statements may wait for a lock (lock_timeout): the server then cancels
// the wait and says so, before the context's deadline cuts the connection
// with nothing more than "context deadline exceeded".
const lockTimeoutShare = 0.8

// setLockTimeout sets lock_timeout for the rest of tx to lockTimeoutShare
// of the time ctx leaves, when ctx has a deadline and tx is a transaction
// of the resetter's own (in a savepoint of the caller's transaction the
// setting would outlive the savepoint). Row locks are skipped (SKIP
// LOCKED); what a reset may still wait for is a table lock (an ALTER TABLE
// or LOCK TABLE in an open transaction).
//
// It also sets idle_in_transaction_session_timeout to the whole time ctx
// leaves: a recoverer whose host vanishes mid-reset leaves its session
// open on the server (until TCP keepalive gives up, hours later), and
// with it the locks on every row it reset so far and the ledger's
// advisory lock; every later reset would skip those rows. The server ends
// such a session by itself once it has idled past the reset's deadline,
// which the live client never lets happen.
func setLockTimeout(ctx context.Context, tx pgTx) error {
	deadline, ok := ctx.Deadline()
	if !ok || tx.nested() {
		return nil
	}
	left := time.Until(deadline).Milliseconds()
	lock := max(int64(float64(left)*lockTimeoutShare), 1)
	if err := tx.exec(ctx, "SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)",
		strconv.FormatInt(lock, 10), strconv.FormatInt(max(left, 1), 10)); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	return nil
}

// explainResetError names what a reset that failed waited for or was
// refused by: a lock (lock_timeout, 55P03: ErrRowsLocked), the
// statement_timeout (57014), or a session that cannot write (25006, or a
// standby refusing lib/pq's BEGIN READ WRITE: ErrReadOnly). Other errors
// are returned as they are.
func (r *pgResetter) explainResetError(err error) error {
	switch sqlState(err) {
	case "55P03":
		return fmt.Errorf("%w: waited for a lock another session holds on %s until lock_timeout (a transaction left open, an ALTER TABLE or LOCK TABLE): %w",
			ErrRowsLocked, r.o.tableIdent(), err)
	case "57014":
		if strings.Contains(serverMessage(err), "statement timeout") {
			return fmt.Errorf("a statement ran past the session's statement_timeout (waiting for a lock, or too slow): %w", err)
		}
	case "25006":
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	case "0A000":
		// lib/pq begins READ WRITE, which a standby refuses.
		if strings.Contains(serverMessage(err), "during recovery") {
			return fmt.Errorf("%w: the server is a standby in recovery: %w", ErrReadOnly, err)
		}
	}
	return err
}

// retryable reports whether err is a PostgreSQL deadlock (40P01) or
// serialization failure (40001), which succeed when tried again.
func retryable(err error) bool {
	code := sqlState(err)
	return code == "40P01" || code == "40001"
}

// needOwnerColumn returns an error wrapping ErrInvalidConfig, saying that
// what needs WithOwnerColumn, when the resetter has none.
func (r *pgResetter) needOwnerColumn(what string) error {
	if r.owners == "" {
		return fmt.Errorf("%w: %s needs a %s WithOwnerColumn", ErrInvalidConfig, what, r.kind)
	}
	return nil
}
