package pgcore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Resetter is the PostgreSQL resetter both pgxreset.Resetter and
// sqlreset.Resetter wrap: its statements and flows, run over a DB
// (db.go). It resets rows with a guarded UPDATE, in effect:
//
//	UPDATE <table> SET <status> = $queued
//	WHERE <id> = ANY($1::bigint[]) AND <status> = $inprog
//
// The rows are locked first in ascending ID order with SKIP LOCKED: a reset
// never waits for a row another session holds locked (a transaction left
// open on a host that vanished holds its locks until the server notices,
// hours later), it reports the row as not reset (RowState.Locked) and the
// next attempt tries it again. Rows are reset in chunks, each committed in
// a transaction of its own when every row is fenced on its own (by owner,
// by the reset ledger or by row version: chunks.go), so each try keeps
// what it did and the next resumes from what is left; else in one
// transaction, which a failure leaves whole for the next attempt. The
// chunk size adapts to the reset's deadline and the session's
// statement_timeout (chunkSizer). The parent batch is never touched. Identifiers come from options
// and are quoted; values are parameters. Statements are sent without named
// prepared statements (pgx.QueryExecModeExec in pgxreset), so the resetter works
// through PgBouncer in transaction pooling mode.
//
// With WithOwnerColumn the reset also requires <owner> = the dead instance
// and clears it; with WithRecoveryCountColumn and WithMaxRecoveries it
// counts resets and quarantines rows that keep killing their workers.
//
// It never closes the handle it was given.
type Resetter struct {
	conn         DB
	kind         string // "pgxreset.Resetter" or "sqlreset.Resetter", for messages and Info
	o            Settings
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
	gone         string // the IDs among $1 no row has (goneIDs)

	ledgerCleaned atomic.Int64 // unix nanoseconds of the last ledger clean-up
	chunks        chunkSizer   // the size of the next chunk of a reset
}

// New returns the resetter over conn, or an error wrapping
// ErrInvalidConfig that names the bad option. handle is the caller's
// database handle behind conn, refused when nil; kind names the resetter
// in messages and in Info ("pgxreset.Resetter"). It applies opts over
// Defaults, checks them and builds the statements. It does not contact
// the database.
func New(handle any, conn DB, kind string, opts []Option) (*Resetter, error) {
	r := &Resetter{}
	if err := r.init(handle, conn, kind, opts); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Resetter) init(handle any, conn DB, kind string, opts []Option) error {
	if isNil(handle) {
		return fmt.Errorf("%w: database handle is nil", ErrInvalidConfig)
	}
	o := Defaults()
	for _, opt := range opts {
		if opt.Apply == nil {
			return fmt.Errorf("%w: nil resetter option", ErrInvalidConfig)
		}
		opt.Apply(&o)
	}
	if err := o.validate(); err != nil {
		return err
	}
	r.conn, r.kind, r.o = conn, kind, o
	r.chunks.init(o.ChunkSize)
	r.byIDs, r.rest = o.resetQuery(resetShape{}), o.restQuery(false)
	r.gone = fmt.Sprintf("SELECT u.x FROM unnest($1::bigint[]) AS u(x) WHERE NOT EXISTS (SELECT 1 FROM %s g WHERE g.%s = u.x) ORDER BY u.x",
		o.tableIdent(), ident(o.IDColumn))
	if o.usesLedger() {
		r.logged = o.resetQuery(resetShape{ledger: true})
	}
	if o.OwnerColumn == "" {
		r.byVersion, r.versionRest, r.inProgress = o.versionsQuery(), o.versionRestQuery(), o.inProgressQuery()
	}
	if o.OwnerColumn != "" {
		r.unowned = o.resetQuery(resetShape{unowned: true})
		r.unownedLog = o.resetQuery(resetShape{unowned: true, ledger: true})
		r.restUnowned = o.restQuery(true)
		r.byOwner = o.resetQuery(resetShape{byOwner: true})
		r.byOwnerAfter = o.resetQuery(resetShape{byOwner: true, keyset: true})
		r.ownedRest = o.ownedRestQuery()
		// As text: a char(n) owner comes back without its blank padding,
		// which an instance ID never has, so the sweep can use it.
		r.owners = fmt.Sprintf("SELECT DISTINCT %s::text FROM %s WHERE %s = $1 AND %s IS NOT NULL",
			ident(o.OwnerColumn), o.tableIdent(), ident(o.StatusColumn), ident(o.OwnerColumn))
	}
	return nil
}

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, which could make two options name one column.
const maxIdentifierLen = 63

func (o *Settings) validate() error {
	type named struct{ role, v string }
	idents := []named{{"table", o.Table}, {"ID column", o.IDColumn}, {"status column", o.StatusColumn}}
	for _, opt := range []named{{"schema", o.Schema}, {"owner column", o.OwnerColumn}, {"recovery count column", o.CountColumn}} {
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
	if o.InProg == "" || o.Queued == "" {
		return fmt.Errorf("%w: statuses must not be empty (in progress %q, queued %q)", ErrInvalidConfig, o.InProg, o.Queued)
	}
	if o.InProg == o.Queued {
		return fmt.Errorf("%w: in-progress and queued statuses are both %q", ErrInvalidConfig, o.InProg)
	}
	for _, d := range o.Done {
		if d == "" || d == o.InProg {
			return fmt.Errorf("%w: done status %q must not be empty nor the in-progress status", ErrInvalidConfig, d)
		}
	}
	if !o.NoLedger { // with an owner column too: rows without an owner (unownedReset)
		switch {
		case o.LedgerTable == "" || strings.ContainsRune(o.LedgerTable, 0):
			return fmt.Errorf("%w: reset ledger table name %q is empty or contains a NUL byte", ErrInvalidConfig, clip(o.LedgerTable))
		case len(o.LedgerTable)+len("_reset_at") > maxIdentifierLen:
			return fmt.Errorf("%w: reset ledger table name %q is longer than %d bytes", ErrInvalidConfig, clip(o.LedgerTable), maxIdentifierLen-len("_reset_at"))
		case o.LedgerRetention < time.Hour:
			return fmt.Errorf("%w: reset ledger retention %v must be at least an hour", ErrInvalidConfig, o.LedgerRetention)
		}
	}
	if o.ChunkSize <= 0 {
		return fmt.Errorf("%w: chunk size %d must be positive", ErrInvalidConfig, o.ChunkSize)
	}
	if o.Terminal != "" || o.MaxRecoveries != 0 {
		switch {
		case o.MaxRecoveries < 1:
			return fmt.Errorf("%w: max recoveries %d must be at least 1", ErrInvalidConfig, o.MaxRecoveries)
		case o.CountColumn == "":
			count := "WithRecoveryCountColumn"
			if len(o.FromEnv) > 0 {
				count += " or " + EnvRecoveryCountColumn
			}
			return fmt.Errorf("%w: max recoveries %d (%s) needs a recovery count column (%s)", ErrInvalidConfig,
				o.MaxRecoveries, o.Named(EnvMaxRecoveries, "WithMaxRecoveries", strconv.Itoa(o.MaxRecoveries)), count)
		case o.Terminal == o.InProg || o.Terminal == o.Queued:
			return fmt.Errorf("%w: terminal status %q must differ from the in-progress and queued statuses", ErrInvalidConfig, o.Terminal)
		}
	}
	return nil
}

// ident quotes name as one SQL identifier: in double quotes, a double
// quote doubled, NUL bytes dropped (as pgx.Identifier.Sanitize does).
func ident(name string) string { return quoteIdent(name) }

// quoteIdent quotes each of parts as ident does and joins them with ".".
func quoteIdent(parts ...string) string {
	quoted := make([]string, len(parts))
	for i, p := range parts {
		p = strings.ReplaceAll(p, "\x00", "")
		quoted[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(quoted, ".")
}

func (o *Settings) tableIdent() string {
	if o.Schema != "" {
		return quoteIdent(o.Schema, o.Table)
	}
	return ident(o.Table)
}

// isNil reports whether v is nil or a typed nil.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// fencesByOwner reports whether resets are guarded by owner
// (WithOwnerColumn): Info's OwnerFencing.
func (r *Resetter) fencesByOwner() bool { return r.owners != "" }

// resetAttempts is how often a reset that hit a deadlock or a serialization
// failure is tried in all.
const resetAttempts = 4

// rollbackTimeout bounds the rollback after a failed reset, which runs even
// when the reset's context has ended.
const rollbackTimeout = 5 * time.Second

// resetIncarnation resets the rows of req in chunks in ascending ID order,
// each chunk committed on its own when commitsByChunk allows it, else all
// in one transaction; a deadlock or serialization failure is retried with
// backoff. With the reset ledger (no owner column) it skips the rows a
// committed reset of the same instance and incarnation already changed,
// and records the ones it changes, in the same transaction. It serves
// ResetRows.
func (r *Resetter) resetIncarnation(ctx context.Context, req RowsReset) (ResetResult, error) {
	if len(req.RowIDs) == 0 {
		return ResetResult{}, nil
	}
	ids := slices.Clone(req.RowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var (
		res ResetResult
		err error
	)
	if r.commitsByChunk(req) {
		res, err = r.resetIDsByChunk(ctx, req, ids)
	} else {
		res, err = r.withRetry(ctx, func(tx Tx) (ResetResult, error) {
			return r.resetInTx(ctx, tx, req, ids, true)
		})
		if err != nil && outOfTime(ctx, err) {
			r.chunks.failed(r.chunks.next(ctx))
		}
	}
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows of %s: %w", req.InstanceID, r.explainResetError(r.explainLedgerError(err)))
	}
	return res, nil
}

// resetInTx runs the reset of ids (sorted, without duplicates) for req in
// tx: resetIncarnation commits it, planReset rolls it back. clean lets it
// delete expired ledger entries (a plan does not, so as not to postpone
// the real clean-up).
func (r *Resetter) resetInTx(ctx context.Context, tx Tx, req RowsReset, ids []int64, clean bool) (ResetResult, error) {
	reset, rest, ledger := r.byIDs, r.rest, r.ledgerFor(req)
	if ledger {
		reset = r.logged
	}
	if r.o.OwnerColumn != "" && req.FromRowsSet {
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
	for chunk := range slices.Chunk(ids, r.chunks.statement()) {
		v := resetValues{ids: chunk, owner: req.InstanceID, incarnation: req.Incarnation}
		res, refused, err := r.run(ctx, tx, reset, v)
		if err != nil {
			return ResetResult{}, err
		}
		notReset, err := r.unsettled(ctx, tx, rest, v, refused)
		if err != nil {
			return ResetResult{}, err
		}
		if res.Gone, err = r.goneIDs(ctx, tx, chunk, res.ChangedIDs, notReset); err != nil {
			return ResetResult{}, err
		}
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.ChangedIDs = append(total.ChangedIDs, res.ChangedIDs...)
		total.NotReset = append(total.NotReset, notReset...)
		total.Gone = append(total.Gone, res.Gone...)
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
func (r *Resetter) ledgerFor(req RowsReset) bool {
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
func (r *Resetter) unownedReset(ctx context.Context, tx Tx, req RowsReset, ids []int64) (reset, rest query, ledger bool, err error) {
	var found bool
	err = queryRow(ctx, tx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s = ANY($1::bigint[]) AND %s = $2 AND %s IS NULL)",
		r.o.tableIdent(), ident(r.o.IDColumn), ident(r.o.StatusColumn), ident(r.o.OwnerColumn)), []any{ids, r.o.InProg}, &found)
	switch {
	case err != nil:
		return query{}, query{}, false, fmt.Errorf("look for rows without an owner: %w", err)
	case !found:
		return r.byIDs, r.rest, false, nil
	case r.o.NoLedger || req.Incarnation == "":
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

// withoutRecorded returns ids (sorted) without the rows among them the
// ledger holds for req's instance and incarnation.
func (r *Resetter) withoutRecorded(ctx context.Context, tx Tx, req RowsReset, ids []int64) ([]int64, error) {
	recorded, err := collect(ctx, tx, fmt.Sprintf("SELECT row_id FROM %s WHERE instance_id = $1 AND incarnation = $2 AND row_id = ANY($3::bigint[]) ORDER BY row_id",
		r.o.ledgerIdent()), []any{req.InstanceID, req.Incarnation, ids}, scanOne[int64])
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

// unsettled runs q (restQuery, ownedRestQuery or versionRestQuery) in
// tx. A row that still matches the reset was either passed over because
// another session held it locked (Locked) or locked by the reset and
// refused by the database (Refused: among refused, which the reset
// statement returned).
func (r *Resetter) unsettled(ctx context.Context, tx Querier, q query, v resetValues, refused []int64) ([]RowState, error) {
	return collect(ctx, tx, q.sql, r.bind(q, v), func(row Rows) (RowState, error) {
		var s RowState
		err := row.Scan(&s.ID, &s.Status, &s.Locked, &s.Owner)
		if s.Locked && slices.Contains(refused, s.ID) {
			s.Locked, s.Refused = false, true
		}
		return s, err
	})
}

// goneMax is the most IDs goneIDs asks about: a reset whose rows are
// mostly gone (a rows set of a million IDs deleted long ago) is not made
// twice as long by a report.
const goneMax = 1000

// goneIDs returns, among ids (sorted) that a reset statement neither
// changed nor left unsettled (still in progress: locked, refused), those
// no row has any more: deleted since they were taken. The others moved on
// (finished, taken by another owner). It asks only when at most goneMax
// are left to tell apart, which is the common case of none; past that it
// returns nil (ResetResult.Gone: the resetter cannot tell).
func (r *Resetter) goneIDs(ctx context.Context, tx Querier, ids, changed []int64, unsettled []RowState) ([]int64, error) {
	if len(ids) == len(changed) {
		return nil, nil
	}
	left := make(map[int64]bool, len(changed)+len(unsettled))
	for _, id := range changed {
		left[id] = true
	}
	for _, s := range unsettled {
		left[s.ID] = true
	}
	var ask []int64
	for _, id := range ids {
		if !left[id] {
			if ask = append(ask, id); len(ask) > goneMax {
				return nil, nil
			}
		}
	}
	if len(ask) == 0 {
		return nil, nil
	}
	gone, err := collect(ctx, tx, r.gone, []any{ask}, scanOne[int64])
	if err != nil {
		return nil, fmt.Errorf("read which rows are gone: %w", err)
	}
	return gone, nil
}

// InProgressOwners returns the distinct owners of rows in progress. It
// needs WithOwnerColumn.
func (r *Resetter) InProgressOwners(ctx context.Context) ([]string, error) {
	if err := r.needOwnerColumn("listing in-progress owners"); err != nil {
		return nil, err
	}
	owners, err := collect(ctx, r.conn, r.owners, []any{r.o.InProg}, scanOne[string])
	if err != nil {
		return nil, fmt.Errorf("list owners of rows in progress: %w", err)
	}
	return owners, nil
}

// InProgressRows returns every row in progress with its version, the
// row's xmin: it changes whenever the row is written. Each row's Status is
// the in-progress status. It implements Resetter. It needs a resetter
// without WithOwnerColumn (with one, the backstop sweep goes by owner).
func (r *Resetter) InProgressRows(ctx context.Context) ([]RowState, error) {
	if r.inProgress == "" {
		return nil, fmt.Errorf("%w: a %s WithOwnerColumn sweeps by owner, not by row version", ErrInvalidConfig, r.kind)
	}
	rows, err := collect(ctx, r.conn, r.inProgress, []any{r.o.InProg}, func(row Rows) (RowState, error) {
		v := RowState{Status: r.o.InProg}
		err := row.Scan(&v.ID, &v.Version)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("list rows in progress: %w", err)
	}
	return rows, nil
}

// resetRowVersions returns the rows of rows that are still in progress at
// the version given to the queue (or quarantine), chunk by chunk in ID
// order, each chunk committed on its own (resetVersionsByChunk). A row written since its
// version was read is left alone and not reported: it is not stuck. A row
// still at its version that another session held locked is skipped (SKIP
// LOCKED) and listed in NotReset (Locked), for the sweep to try again. The
// ledger is not used: the version guard alone makes a second reset of the
// same row version impossible.
func (r *Resetter) resetRowVersions(ctx context.Context, rows []RowState) (ResetResult, error) {
	if r.inProgress == "" {
		return ResetResult{}, fmt.Errorf("%w: a %s WithOwnerColumn sweeps by owner, not by row version", ErrInvalidConfig, r.kind)
	}
	if len(rows) == 0 {
		return ResetResult{}, nil
	}
	res, err := r.resetVersionsByChunk(ctx, sortedVersions(rows))
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset %d stray rows: %w", len(rows), r.explainResetError(err))
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
// resetRowVersions commits it, a dry run rolls it back.
func (r *Resetter) resetVersionsInTx(ctx context.Context, tx Tx, sorted []RowState) (ResetResult, error) {
	var total ResetResult
	for chunk := range slices.Chunk(sorted, r.chunks.statement()) {
		v := resetValues{ids: make([]int64, len(chunk)), versions: make([]string, len(chunk))}
		for i, rv := range chunk {
			v.ids[i], v.versions[i] = rv.ID, rv.Version
		}
		res, refused, err := r.run(ctx, tx, r.byVersion, v)
		if err != nil {
			return ResetResult{}, err
		}
		locked, err := r.unsettled(ctx, tx, r.versionRest, v, refused)
		if err != nil {
			return ResetResult{}, err
		}
		if res.Gone, err = r.goneIDs(ctx, tx, v.ids, res.ChangedIDs, locked); err != nil {
			return ResetResult{}, err
		}
		total.Changed += res.Changed
		total.Quarantined = append(total.Quarantined, res.Quarantined...)
		total.ChangedIDs = append(total.ChangedIDs, res.ChangedIDs...)
		total.NotReset = append(total.NotReset, locked...)
		total.Gone = append(total.Gone, res.Gone...)
	}
	return total, nil
}

// resetOwnerRows returns every row still in progress and owned by owner to
// the queue (or quarantine), chunk by chunk in ID order, each chunk
// committed on its own (resetOwnedByChunk), and lists in NotReset (Locked) the rows it
// skipped because another session held them locked. It needs
// WithOwnerColumn. On a large table give
// it the partial index the migration in docs/integration.md creates,
// (owner, id) WHERE status = in progress: each statement then seeks to the
// rows it changes.
func (r *Resetter) resetOwnerRows(ctx context.Context, owner string) (ResetResult, error) {
	if err := r.needOwnerColumn("resetting by owner"); err != nil {
		return ResetResult{}, err
	}
	res, err := r.resetOwnedByChunk(ctx, owner)
	if err != nil {
		return ResetResult{}, fmt.Errorf("reset rows owned by %s: %w", owner, r.explainResetError(err))
	}
	return res, nil
}

// resetOwnedInTx resets the rows of owner chunk after chunk, in ID order,
// in tx (planOwnerReset's dry run; a reset commits chunk by chunk,
// resetOwnedByChunk): locks are taken in the order every reset takes them, and no
// statement locks an unbounded number of rows at once.
func (r *Resetter) resetOwnedInTx(ctx context.Context, tx Tx, owner string) (ResetResult, error) {
	var (
		all     ResetResult
		refused []int64
	)
	v := resetValues{owner: owner}
	q := r.byOwner
	for {
		var (
			res    ResetResult
			locked int
			refuse []int64
		)
		err := queryRow(ctx, tx, q.sql, r.bind(q, v), &res.Changed, &res.Quarantined, &res.ChangedIDs, &refuse, &locked, &v.after)
		q = r.byOwnerAfter
		if err != nil {
			return ResetResult{}, err
		}
		all.Changed += res.Changed
		all.Quarantined = append(all.Quarantined, res.Quarantined...)
		all.ChangedIDs = append(all.ChangedIDs, res.ChangedIDs...)
		refused = append(refused, refuse...)
		if locked < r.o.ChunkSize {
			break
		}
	}
	// SKIP LOCKED passed over the rows another session holds: a short
	// chunk means no unlocked row is left, not that no row is.
	skipped, err := r.unsettled(ctx, tx, r.ownedRest, resetValues{owner: owner}, refused)
	if err != nil {
		return ResetResult{}, err
	}
	all.NotReset = skipped
	return all, nil
}

// run runs the reset statement q (by IDs or versions) in tx: what it
// changed, the rows gone, and the rows it locked and could not change
// (refused by the database).
func (r *Resetter) run(ctx context.Context, tx Tx, q query, v resetValues) (ResetResult, []int64, error) {
	var (
		res     ResetResult
		refused []int64
	)
	if err := queryRow(ctx, tx, q.sql, r.bind(q, v), &res.Changed, &res.Quarantined, &res.ChangedIDs, &refused); err != nil {
		return ResetResult{}, nil, err
	}
	return res, refused, nil
}

// withRetry runs f in a transaction, again after a deadlock or a
// serialization failure, up to resetAttempts times.
func (r *Resetter) withRetry(ctx context.Context, f func(Tx) (ResetResult, error)) (ResetResult, error) {
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

func (r *Resetter) inTx(ctx context.Context, f func(Tx) (ResetResult, error)) (res ResetResult, err error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return ResetResult{}, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rbCtx) // the transaction is void either way
			cancel()
		}
	}()
	if err = r.setLockTimeout(ctx, tx); err != nil {
		return ResetResult{}, err
	}
	if res, err = f(tx); err != nil {
		return ResetResult{}, err
	}
	if err := tx.Commit(ctx); err != nil {
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
//
// The same statement reads the session's statement_timeout, which sizes
// the chunks (chunkSizer).
func (r *Resetter) setLockTimeout(ctx context.Context, tx Tx) error {
	deadline, ok := ctx.Deadline()
	if !ok || tx.Nested() {
		return nil
	}
	left := time.Until(deadline).Milliseconds()
	lock := max(int64(float64(left)*lockTimeoutShare), 1)
	var set1, set2 string
	var stmt int64
	if err := queryRow(ctx, tx, `SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true),
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'), 0)`,
		[]any{strconv.FormatInt(lock, 10), strconv.FormatInt(max(left, 1), 10)}, &set1, &set2, &stmt); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	r.chunks.stmtTimeout.Store(stmt)
	return nil
}

// explainResetError names what a reset that failed waited for or was
// refused by: a lock (lock_timeout, 55P03: ErrRowsLocked), the
// statement_timeout (57014), a session that cannot write (25006, or a
// standby refusing lib/pq's BEGIN READ WRITE: ErrReadOnly), or the
// database refusing the UPDATE (a constraint, class 23; a trigger raising
// an error, P0001; a rule, which a data-modifying WITH or UPDATE ...
// RETURNING refuses, 0A000: ErrRowsRefused). Other errors are returned as
// they are.
func (r *Resetter) explainResetError(err error) error {
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
		if strings.Contains(serverMessage(err), "rules are not supported") {
			return fmt.Errorf("%w: a rule on %s rewrites the reset's UPDATE: %w", ErrRowsRefused, r.o.tableIdent(), err)
		}
		// "cannot perform UPDATE RETURNING on relation": the table has
		// an ON UPDATE rule that is conditional (DO INSTEAD NOTHING for
		// some rows, say) or a DO INSTEAD without RETURNING. Matched on
		// "UPDATE RETURNING", which translations keep.
		if strings.Contains(serverMessage(err), "UPDATE RETURNING") {
			return fmt.Errorf("%w: a rule on %s likely blocks the reset's UPDATE ... RETURNING (an ON UPDATE rule that is conditional, or DO INSTEAD without RETURNING; see pg_rules): %w",
				ErrRowsRefused, r.o.tableIdent(), err)
		}
	case "P0001":
		return fmt.Errorf("%w: a trigger on %s raised an error at the reset's UPDATE: %w", ErrRowsRefused, r.o.tableIdent(), err)
	}
	if strings.HasPrefix(sqlState(err), "23") {
		return fmt.Errorf("%w: the reset's UPDATE of %s broke a constraint: %w", ErrRowsRefused, r.o.tableIdent(), err)
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
func (r *Resetter) needOwnerColumn(what string) error {
	if r.owners == "" {
		return fmt.Errorf("%w: %s needs a %s WithOwnerColumn", ErrInvalidConfig, what, r.kind)
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
