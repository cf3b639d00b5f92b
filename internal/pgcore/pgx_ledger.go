package pgcore

import (
	"context"
	"fmt"
	"strings"
	"time"
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

// ledgerCleanEvery is how often a resetter deletes expired ledger entries,
// inside one of its resets.
const ledgerCleanEvery = time.Hour

// usesLedger reports whether resets by ID are recorded in the ledger.
func (o *Settings) usesLedger() bool { return o.OwnerColumn == "" && !o.NoLedger }

func (o *Settings) ledgerIdent() string {
	if o.Schema != "" {
		return quoteIdent(o.Schema, o.LedgerTable)
	}
	return ident(o.LedgerTable)
}

// usesLedger reports whether this resetter records every reset by ID in
// the reset ledger: without WithOwnerColumn, unless WithoutResetLedger.
// With an owner column it records only the resets of rows without an
// owner, when the table exists (WithResetLedger).
func (r *Resetter) usesLedger() bool { return r.o.usesLedger() }

// LedgerDDL returns the statements that create the reset ledger's table and
// index, for a migration tool.
func (r *Resetter) LedgerDDL() string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	instance_id text        NOT NULL,
	incarnation text        NOT NULL,
	row_id      bigint      NOT NULL,
	reset_at    timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (instance_id, incarnation, row_id)
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (reset_at);`, r.o.ledgerIdent(), ident(r.o.LedgerTable+"_reset_at"))
}

// CreateLedger creates the reset ledger's table and index if they do not
// exist (LedgerDDL). It needs the privilege to create tables in the schema.
func (r *Resetter) CreateLedger(ctx context.Context) error {
	if err := r.conn.Exec(ctx, r.LedgerDDL()); err != nil {
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
func (r *Resetter) lockIncarnation(ctx context.Context, tx Tx, owner, incarnation string) error {
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
func (r *Resetter) cleanLedger(ctx context.Context, tx Tx) error {
	last := r.ledgerCleaned.Load()
	now := time.Now().UnixNano()
	if last != 0 && time.Duration(now-last) < ledgerCleanEvery {
		return nil
	}
	if !r.ledgerCleaned.CompareAndSwap(last, now) {
		return nil
	}
	return tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE reset_at < now() - make_interval(secs => $1)", r.o.ledgerIdent()),
		r.o.LedgerRetention.Seconds())
}

// explainLedgerError turns "relation does not exist" about the ledger into
// an error that says what to do.
func (r *Resetter) explainLedgerError(err error) error {
	if r.o.usesLedger() && sqlState(err) == "42P01" && strings.Contains(serverMessage(err), r.o.LedgerTable) {
		return fmt.Errorf("%w: %s (create it with CreateLedger or the migration in docs/integration.md, or use an owner column): %w",
			ErrNoLedger, r.o.ledgerIdent(), err)
	}
	return err
}
