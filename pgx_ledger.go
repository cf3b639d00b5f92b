package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The reset ledger makes a reset without owner fencing happen at most once
// per incarnation of a dead worker. Without an owner column, the status
// guard alone cannot tell the dead worker's rows from the same rows reset
// once and taken since by a live worker; and only PostgreSQL knows whether
// a reset committed (a recoverer may die, or lose the COMMIT's reply,
// before it can tell Redis). So the reset's own transaction records every
// row it changes in a small table the library owns, under the instance ID
// and the incarnation of its rows set, and every later reset for the same
// pair skips the rows recorded there. Resets by owner need no ledger: the
// owner guard already makes them idempotent.

// DefaultLedgerTable is the table of the reset ledger, in the schema of the
// rows table (WithSchema).
const DefaultLedgerTable = "recovery_ledger"

// DefaultLedgerRetention is how long ledger entries are kept. A recovery
// that keeps failing is retried for as long as it fails, so an entry must
// outlive the longest outage the fleet should ride out: a week.
const DefaultLedgerRetention = 7 * 24 * time.Hour

// ledgerCleanEvery is how often a resetter deletes expired ledger entries,
// inside one of its resets.
const ledgerCleanEvery = time.Hour

// WithResetLedger names the reset ledger's table (in the schema of
// WithSchema). Without WithOwnerColumn every reset by ID is recorded
// there; with it, only the reset of rows without an owner that a dead
// worker's rows set lists (a worker that does not set the column, during
// its rollout), and only when the table exists. Create it with
// CreateLedger or the migration in docs/integration.md. Default:
// DefaultLedgerTable ("recovery_ledger").
func WithResetLedger(table string) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.ledgerTable = table })
}

// WithoutResetLedger turns the reset ledger off: for a resetter without an
// owner column, and, with one, for the rows without an owner of a dead
// worker's rows set (reset then without it). Then a reset whose outcome
// Redis never learnt (the
// recoverer died, or lost the COMMIT's reply) is applied again by the next
// recoverer, and resets rows a live worker has taken since: use it only
// where rows are processed idempotently. Default: the ledger is on.
func WithoutResetLedger() ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.noLedger = true })
}

// WithLedgerRetention sets how long reset ledger entries are kept; it must
// be at least an hour. Default: DefaultLedgerRetention (7 days).
func WithLedgerRetention(d time.Duration) ResetterOption {
	return resetterOptionFunc(func(o *resetterOptions) { o.ledgerRetention = d })
}

// usesLedger reports whether resets by ID are recorded in the ledger.
func (o *resetterOptions) usesLedger() bool { return o.ownerColumn == "" && !o.noLedger }

func (o *resetterOptions) ledgerIdent() string {
	if o.schema != "" {
		return pgx.Identifier{o.schema, o.ledgerTable}.Sanitize()
	}
	return ident(o.ledgerTable)
}

// UsesLedger reports whether this resetter records every reset by ID in
// the reset ledger: without WithOwnerColumn, unless WithoutResetLedger.
// With an owner column it records only the resets of rows without an
// owner, when the table exists (WithResetLedger).
func (r *pgResetter) UsesLedger() bool { return r.o.usesLedger() }

// LedgerDDL returns the statements that create the reset ledger's table and
// index, for a migration tool.
func (r *pgResetter) LedgerDDL() string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	instance_id text        NOT NULL,
	incarnation text        NOT NULL,
	row_id      bigint      NOT NULL,
	reset_at    timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (instance_id, incarnation, row_id)
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (reset_at);`, r.o.ledgerIdent(), ident(r.o.ledgerTable+"_reset_at"))
}

// CreateLedger creates the reset ledger's table and index if they do not
// exist (LedgerDDL). It needs the privilege to create tables in the schema.
func (r *pgResetter) CreateLedger(ctx context.Context) error {
	if err := r.conn.exec(ctx, r.LedgerDDL()); err != nil {
		return fmt.Errorf("create reset ledger %s: %w", r.o.ledgerIdent(), err)
	}
	return nil
}

// lockIncarnation serializes the resets of one incarnation: a recoverer
// whose claim expired while its reset was still running (its COMMIT may
// land late) and the recoverer that took over never interleave, so the
// second always sees what the first recorded. It does not wait: the
// session holding the lock may be one whose host vanished with the
// transaction open, which the server ends only hours later. Another
// session holding it fails the reset with ErrRowsLocked, and recovery
// tries again at the next scan.
func (r *pgResetter) lockIncarnation(ctx context.Context, tx pgTx, owner, incarnation string) error {
	var got bool
	if err := queryRow(ctx, tx, "SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))",
		[]any{owner + "/" + incarnation}, &got); err != nil {
		return err
	}
	if !got {
		return fmt.Errorf("%w: another session is resetting the rows of incarnation %s (it holds the incarnation's advisory lock)",
			ErrRowsLocked, incarnation)
	}
	return nil
}

// cleanLedger deletes expired ledger entries, at most once per
// ledgerCleanEvery per resetter.
func (r *pgResetter) cleanLedger(ctx context.Context, tx pgTx) error {
	last := r.ledgerCleaned.Load()
	now := time.Now().UnixNano()
	if last != 0 && time.Duration(now-last) < ledgerCleanEvery {
		return nil
	}
	if !r.ledgerCleaned.CompareAndSwap(last, now) {
		return nil
	}
	return tx.exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE reset_at < now() - make_interval(secs => $1)", r.o.ledgerIdent()),
		r.o.ledgerRetention.Seconds())
}

// ErrNoLedger is wrapped by the error of a reset that needs the reset
// ledger (no owner column) when its table does not exist.
var ErrNoLedger = errors.New("recovery: reset ledger table missing")

// explainLedgerError turns "relation does not exist" about the ledger into
// an error that says what to do.
func (r *pgResetter) explainLedgerError(err error) error {
	if r.o.usesLedger() && sqlState(err) == "42P01" && strings.Contains(serverMessage(err), r.o.ledgerTable) {
		return fmt.Errorf("%w: %s (create it with CreateLedger or the migration in docs/integration.md, or use an owner column): %w",
			ErrNoLedger, r.o.ledgerIdent(), err)
	}
	return err
}
