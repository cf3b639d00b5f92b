package pgcore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// checkSchema compares the resetter's options with the PostgreSQL catalogue
// and returns an error wrapping ErrSchema for each mismatch (joined), naming
// the object at fault:
//
//   - the table exists (in the WithSchema schema, else on the connection's
//     search_path);
//   - the ID column exists and is bigint, integer or smallint;
//   - the status column exists and is text, varchar, char or an enum; for
//     an enum, the in-progress, queued and terminal (WithMaxRecoveries)
//     statuses are labels of it;
//   - the owner column (WithOwnerColumn), if any, exists and is text,
//     varchar or char;
//   - the recovery-count column (WithRecoveryCountColumn), if any, exists
//     and is an integer type;
//   - the current role may SELECT every column the reset reads and UPDATE
//     every column it writes;
//   - without an owner column, the reset ledger's table exists and the
//     role may SELECT, INSERT and DELETE in it (see WithResetLedger).
//
// It reads only the catalogue, inside a transaction (a savepoint when the
// handle is a transaction) that it rolls back; names and statuses are query
// parameters. Other errors (the database unreachable) are returned as they
// are. Check runs it, which Worker.Start calls with the schema check on unless
// WithoutSchemaCheck.
func (r *Resetter) checkSchema(ctx context.Context) (err error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = tx.Rollback(rbCtx) // read only: nothing to keep
		cancel()
	}()
	t, err := r.lookUpTable(ctx, tx)
	if err != nil {
		return err
	}
	var found []error
	for _, check := range r.schemaChecks() {
		err := check(ctx, tx, t)
		if err != nil && !errors.Is(err, ErrSchema) {
			return err // could not look: not a finding
		}
		found = append(found, unjoin(err)...)
	}
	return errors.Join(found...)
}

// A schemaCheck is one thing checkSchema verifies. It returns an error
// wrapping ErrSchema for a mismatch, any other error when it could not
// look. It gets the transaction, so a check of another table is one more
// entry of schemaChecks.
type schemaCheck func(ctx context.Context, tx Tx, t *pgTable) error

// schemaChecks lists what checkSchema verifies once the table is found.
func (r *Resetter) schemaChecks() []schemaCheck {
	return []schemaCheck{
		r.checkIDColumn,
		r.checkStatusColumn,
		r.checkStatusLabels,
		r.checkOwnerColumn,
		r.checkCountColumn,
		r.checkPrivileges,
		r.checkLedger,
	}
}

// pgTable is what the catalogue says about the configured table.
type pgTable struct {
	name string // schema.table, as found
	role string // current_user
	cols map[string]pgColumn
}

// pgColumn is what the catalogue says about one configured column.
type pgColumn struct {
	typ       string   // as format_type shows it
	base      string   // typname of the type, or of a domain's base type
	enum      bool     // the (base) type is an enum
	labels    []string // the enum's labels, in order
	canSelect bool
	canUpdate bool
}

// column names the column col of t for a message: schema.table.column.
func (t *pgTable) column(col string) string { return t.name + "." + col }

// lookUpTable finds the table and the configured columns, or returns an
// error wrapping ErrSchema that says which of schema and table is missing.
func (r *Resetter) lookUpTable(ctx context.Context, tx Tx) (*pgTable, error) {
	t := &pgTable{cols: make(map[string]pgColumn)}
	var kind string
	err := queryRow(ctx, tx, `
SELECT n.nspname || '.' || c.relname, c.relkind::text, current_user
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`, []any{r.o.tableIdent()}, &t.name, &kind, &t.role)
	switch {
	case sqlState(err) == "42501": // no USAGE on the schema
		return nil, fmt.Errorf("%w: table %s: %s", ErrSchema, r.o.tableIdent(), serverMessage(err))
	case errors.Is(err, errNoRow):
		return nil, r.missingTable(ctx, tx)
	case err != nil:
		return nil, fmt.Errorf("look up table %s: %w", r.o.tableIdent(), err)
	}
	switch kind {
	case "r", "p", "v", "f": // table, partitioned table, view, foreign table
	default:
		return nil, fmt.Errorf("%w: %s (%s) is not a table", ErrSchema, t.name, r.o.Named(EnvTable, "WithTable", r.o.Table))
	}
	rows, err := tx.Query(ctx, `
SELECT a.attname, format_type(a.atttypid, a.atttypmod), b.typname, b.typtype = 'e',
       CASE WHEN b.typtype = 'e' THEN
            ARRAY(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = b.oid ORDER BY e.enumsortorder)
       END,
       has_column_privilege(a.attrelid, a.attnum, 'SELECT'),
       has_column_privilege(a.attrelid, a.attnum, 'UPDATE')
FROM pg_attribute a
JOIN pg_type d ON d.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN d.typtype = 'd' THEN d.typbasetype ELSE d.oid END
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY($2::text[])`,
		r.o.tableIdent(), r.o.columns())
	if err != nil {
		return nil, fmt.Errorf("look up columns of %s: %w", t.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name string
			c    pgColumn
		)
		if err := rows.Scan(&name, &c.typ, &c.base, &c.enum, &c.labels, &c.canSelect, &c.canUpdate); err != nil {
			return nil, fmt.Errorf("look up columns of %s: %w", t.name, err)
		}
		t.cols[name] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up columns of %s: %w", t.name, err)
	}
	return t, nil
}

// missingTable says what is missing: the schema, or the table in the schema
// or on the search_path.
func (r *Resetter) missingTable(ctx context.Context, tx Tx) error {
	if r.o.Schema != "" {
		var exists bool
		if err := queryRow(ctx, tx, `SELECT to_regnamespace($1) IS NOT NULL`, []any{ident(r.o.Schema)}, &exists); err != nil {
			return fmt.Errorf("look up schema %s: %w", r.o.Schema, err)
		}
		if !exists {
			return fmt.Errorf("%w: schema %s (%s) does not exist", ErrSchema, r.o.Schema, r.o.Named(EnvSchema, "WithSchema", r.o.Schema))
		}
		return fmt.Errorf("%w: table %s.%s (%s) does not exist", ErrSchema, r.o.Schema, r.o.Table, r.o.Named(EnvTable, "WithTable", r.o.Table))
	}
	var path string
	if err := queryRow(ctx, tx, `SELECT current_setting('search_path')`, nil, &path); err != nil {
		return fmt.Errorf("read search_path: %w", err)
	}
	setSchema := "WithSchema"
	if len(r.o.FromEnv) > 0 {
		setSchema = EnvSchema
	}
	return fmt.Errorf("%w: table %s (%s) does not exist in any schema of the search_path (%s); set %s",
		ErrSchema, r.o.Table, r.o.Named(EnvTable, "WithTable", r.o.Table), path, setSchema)
}

// columns returns the names of the configured columns.
func (o *Settings) columns() []string {
	cols := []string{o.IDColumn, o.StatusColumn}
	for _, c := range []string{o.OwnerColumn, o.CountColumn} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

var (
	integerTypes = []string{"int8", "int4", "int2"}
	textTypes    = []string{"text", "varchar", "bpchar"}
)

// checkColumn reports a missing column, or one whose base type is not one
// of want (an enum passes when enumOK).
func checkColumn(t *pgTable, role, option, col string, want []string, enumOK bool, wantText string) error {
	c, ok := t.cols[col]
	switch {
	case !ok:
		return fmt.Errorf("%w: %s %s (%s) does not exist", ErrSchema, role, t.column(col), option)
	case slices.Contains(want, c.base), enumOK && c.enum:
		return nil
	}
	return fmt.Errorf("%w: %s %s (%s) is %s; it must be %s", ErrSchema, role, t.column(col), option, c.typ, wantText)
}

func (r *Resetter) checkIDColumn(_ context.Context, _ Tx, t *pgTable) error {
	return checkColumn(t, "ID column", r.o.Named(EnvIDColumn, "WithIDColumn", r.o.IDColumn), r.o.IDColumn, integerTypes, false, "bigint, integer or smallint")
}

func (r *Resetter) checkStatusColumn(_ context.Context, _ Tx, t *pgTable) error {
	return checkColumn(t, "status column", r.o.Named(EnvStatusColumn, "WithStatusColumn", r.o.StatusColumn), r.o.StatusColumn, textTypes, true, "text, varchar, char or an enum")
}

// checkStatusLabels checks that every status the reset writes or matches is
// a label of an enum status column. A text column takes any value: a
// misspelt status there cannot be seen in the catalogue.
func (r *Resetter) checkStatusLabels(_ context.Context, _ Tx, t *pgTable) error {
	c, ok := t.cols[r.o.StatusColumn]
	if !ok || !c.enum {
		return nil
	}
	type status struct{ role, v, option string }
	statuses := []status{{"in-progress status", r.o.InProg, r.o.Named(EnvInProgressStatus, "WithStatuses", r.o.InProg)},
		{"queued status", r.o.Queued, r.o.Named(EnvQueuedStatus, "WithStatuses", r.o.Queued)}}
	if r.o.MaxRecoveries > 0 {
		statuses = append(statuses, status{"terminal status", r.o.Terminal, r.o.Named(EnvTerminalStatus, "WithMaxRecoveries", r.o.Terminal)})
	}
	var errs []error
	for _, s := range statuses {
		if !slices.Contains(c.labels, s.v) {
			errs = append(errs, fmt.Errorf("%w: %s %q (%s) is not a label of enum %s of status column %s; its labels: %s",
				ErrSchema, s.role, s.v, s.option, c.typ, t.column(r.o.StatusColumn), strings.Join(c.labels, ", ")))
		}
	}
	return errors.Join(errs...)
}

func (r *Resetter) checkOwnerColumn(_ context.Context, _ Tx, t *pgTable) error {
	if r.o.OwnerColumn == "" {
		return nil
	}
	return checkColumn(t, "owner column", r.o.Named(EnvOwnerColumn, "WithOwnerColumn", r.o.OwnerColumn), r.o.OwnerColumn, textTypes, false, "text, varchar or char")
}

func (r *Resetter) checkCountColumn(_ context.Context, _ Tx, t *pgTable) error {
	if r.o.CountColumn == "" {
		return nil
	}
	return checkColumn(t, "recovery count column", r.o.Named(EnvRecoveryCountColumn, "WithRecoveryCountColumn", r.o.CountColumn), r.o.CountColumn, integerTypes, false, "bigint, integer or smallint")
}

// checkPrivileges checks that the role may read every column the reset
// reads and update every column it writes (a table-wide grant covers every
// column). Missing columns are reported by their own checks.
func (r *Resetter) checkPrivileges(_ context.Context, _ Tx, t *pgTable) error {
	var noSelect, noUpdate []string
	for _, col := range r.o.columns() {
		c, ok := t.cols[col]
		if !ok {
			continue
		}
		if !c.canSelect {
			noSelect = append(noSelect, t.column(col))
		}
		if col != r.o.IDColumn && !c.canUpdate {
			noUpdate = append(noUpdate, t.column(col))
		}
	}
	var errs []error
	if len(noSelect) > 0 {
		errs = append(errs, fmt.Errorf("%w: role %s may not SELECT %s (GRANT SELECT ON %s TO %s)",
			ErrSchema, t.role, strings.Join(noSelect, ", "), t.name, t.role))
	}
	if len(noUpdate) > 0 {
		errs = append(errs, fmt.Errorf("%w: role %s may not UPDATE %s (GRANT UPDATE ON %s TO %s)",
			ErrSchema, t.role, strings.Join(noUpdate, ", "), t.name, t.role))
	}
	return errors.Join(errs...)
}

// checkLedger checks the reset ledger, which resets without an owner column
// need (WithResetLedger).
func (r *Resetter) checkLedger(ctx context.Context, tx Tx, _ *pgTable) error {
	if !r.o.usesLedger() {
		return nil
	}
	var exists, canSelect, canInsert, canDelete bool
	err := queryRow(ctx, tx, `SELECT c.oid IS NOT NULL,
		coalesce(has_table_privilege(c.oid, 'SELECT'), false),
		coalesce(has_table_privilege(c.oid, 'INSERT'), false),
		coalesce(has_table_privilege(c.oid, 'DELETE'), false)
		FROM (SELECT to_regclass($1) AS oid) AS c`, []any{r.o.ledgerIdent()}, &exists, &canSelect, &canInsert, &canDelete)
	if err != nil {
		return fmt.Errorf("look up reset ledger %s: %w", r.o.ledgerIdent(), err)
	}
	if !exists {
		return fmt.Errorf("%w: reset ledger table %s (%s) does not exist: without an owner column every reset is recorded there; create it with CreateLedger or the migration in docs/integration.md, or use WithOwnerColumn",
			ErrSchema, r.o.ledgerIdent(), r.o.Named(EnvResetLedger, "WithResetLedger", r.o.LedgerTable))
	}
	if !canSelect || !canInsert || !canDelete {
		return fmt.Errorf("%w: the role may not SELECT, INSERT and DELETE in reset ledger %s (GRANT SELECT, INSERT, DELETE ON %s TO ...)",
			ErrSchema, r.o.ledgerIdent(), r.o.ledgerIdent())
	}
	return nil
}

// RowStates returns, in one statement and in ascending ID order, the
// committed status (as text), the owner (with WithOwnerColumn) and the
// version (xmin) of each of ids that exists, and whether another session
// held a lock on it then (Locked): FOR SHARE SKIP LOCKED, in a CTE, skips
// such a row instead of waiting for it, and the row is still read, with
// its last committed state (for a row a fetch is writing, its state before
// the fetch). Each share lock lasts the statement. It implements Resetter,
// for the worker's self-check.
func (r *Resetter) RowStates(ctx context.Context, ids []int64) ([]RowState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	owner := "NULL::text"
	if r.o.OwnerColumn != "" {
		owner = "t." + ident(r.o.OwnerColumn) + "::text"
	}
	id := ident(r.o.IDColumn)
	// A row not locked is read from its lock (FOR SHARE SKIP LOCKED), which
	// follows a fetch that committed after the statement's snapshot to the
	// version it committed; a locked row, from the snapshot. Reading every
	// row from the snapshot and only the lock from the lock would show a
	// fetch that committed meanwhile as an unlocked row in its state before
	// the fetch: the self-check would take a swapped "queued" status for a
	// row in progress, and call the configuration verified.
	sql := fmt.Sprintf(`WITH free AS (SELECT t.%[1]s AS id, t.%[3]s::text AS status, %[4]s AS owner, t.xmin::text AS version
	FROM %[2]s t WHERE t.%[1]s = ANY($1::bigint[]) FOR SHARE SKIP LOCKED)
SELECT t.%[1]s, coalesce(CASE WHEN f.id IS NULL THEN t.%[3]s::text ELSE f.status END, ''),
	coalesce(CASE WHEN f.id IS NULL THEN %[4]s ELSE f.owner END, ''),
	CASE WHEN f.id IS NULL THEN t.xmin::text ELSE f.version END, f.id IS NULL
FROM %[2]s t LEFT JOIN free f ON f.id = t.%[1]s WHERE t.%[1]s = ANY($1::bigint[]) ORDER BY 1`, id, r.o.tableIdent(), ident(r.o.StatusColumn), owner)
	out, err := collect(ctx, r.conn, sql, []any{ids}, func(row Rows) (RowState, error) {
		var s RowState
		err := row.Scan(&s.ID, &s.Status, &s.Owner, &s.Version, &s.Locked)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read row versions: %w", err)
	}
	return out, nil
}

// checkSession reads, in a transaction begun as a reset begins one (and
// rolled back), whether it can write, and the session's
// idle_in_transaction_session_timeout, statement_timeout (which then sizes
// the resets' chunks) and lock_timeout. A standby (pg_is_in_recovery) or a
// transaction that is read-only (default_transaction_read_only, set for the
// role, the database or the server: a replica or a read endpoint) cannot
// reset a row: an error wrapping ErrReadOnly names the cause. (lib/pq
// begins every transaction READ WRITE, which overrides the default; pgx
// does not.) Only settings are read, which needs no privilege.
func (r *Resetter) checkSession(ctx context.Context) (info sessionInfo, err error) {
	var (
		readOnly, standby bool
		source            string
		idleMillis        int64
		stmtMillis        int64
		lockMillis        int64
	)
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return sessionInfo{}, fmt.Errorf("begin: %w", r.explainResetError(err))
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = tx.Rollback(rbCtx) // read only: nothing to keep
		cancel()
	}()
	err = queryRow(ctx, tx, `SELECT current_setting('transaction_read_only') = 'on', pg_is_in_recovery(),
	coalesce((SELECT source FROM pg_settings WHERE name = 'default_transaction_read_only'), ''),
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'), 0),
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'), 0),
	coalesce((SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'), 0)`,
		nil, &readOnly, &standby, &source, &idleMillis, &stmtMillis, &lockMillis)
	if err != nil {
		return sessionInfo{}, fmt.Errorf("read session settings: %w", err)
	}
	switch {
	case standby:
		return sessionInfo{}, fmt.Errorf("%w: the server is a standby in recovery (pg_is_in_recovery() is true): give the %s a connection to the primary", ErrReadOnly, r.kind)
	case readOnly:
		return sessionInfo{}, fmt.Errorf("%w: transaction_read_only is on (default_transaction_read_only set by the %s: a replica or read endpoint, or ALTER ROLE or ALTER DATABASE ... SET default_transaction_read_only): give the %s a session that can write",
			ErrReadOnly, source, r.kind)
	}
	info = sessionInfo{
		idleInTxTimeout:  time.Duration(idleMillis) * time.Millisecond,
		statementTimeout: time.Duration(stmtMillis) * time.Millisecond,
		lockTimeout:      time.Duration(lockMillis) * time.Millisecond,
	}
	r.chunks.stmtTimeout.Store(stmtMillis)
	if r.o.OwnerColumn != "" {
		// The owner column's declared length (char(n), varchar(n), or a
		// domain over one): an instance ID longer than it cannot be
		// written. A missing table or column is checkSchema's to report.
		var width int
		err := queryRow(ctx, tx, `SELECT coalesce(nullif(a.atttypmod, -1), d.typtypmod) - 4
FROM pg_attribute a JOIN pg_type d ON d.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`,
			[]any{r.o.tableIdent(), r.o.OwnerColumn}, &width)
		if err == nil && width > 0 {
			info.ownerWidth = width
		}
	}
	return info, nil
}

// sessionInfo is what checkSession learns about the resetter's database
// session.
type sessionInfo struct {
	// idleInTxTimeout is idle_in_transaction_session_timeout; 0 is none.
	idleInTxTimeout time.Duration
	// statementTimeout and lockTimeout are statement_timeout and
	// lock_timeout; 0 is none.
	statementTimeout, lockTimeout time.Duration
	// ownerWidth is how many characters the owner column holds; 0 is no
	// limit (text, or no owner column).
	ownerWidth int
}

// unjoin returns the errors joined in err, or err alone.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
