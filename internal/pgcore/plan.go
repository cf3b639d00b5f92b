package pgcore

import (
	"context"
	"fmt"
	"slices"
)

// resetPlan says what a reset would change, found by running it and
// rolling it back.
type resetPlan struct {
	// Reset lists, in ascending order, the rows the reset would change:
	// queued again, or quarantined.
	Reset []int64
	// Quarantined lists the rows among Reset that would reach their
	// recovery limit and get the terminal status (WithMaxRecoveries).
	Quarantined []int64
	// NotReset lists the rows the reset would neither change nor find
	// settled (see ResetResult.NotReset): a recovery would keep the
	// peer's rows set and fail with ErrRowsNotReset.
	NotReset []RowState
}

// planReset runs the very statements resetIncarnation runs for req, ledger
// included, in a transaction that is always rolled back, and returns what
// they changed: the rows a reset would change now, and the rows it could
// neither reset nor show settled. Nothing is committed. While it runs it
// locks the rows it changes, as a reset does; triggers on the table fire
// and are rolled back with it (what they do outside the transaction, such
// as taking sequence values, is not).
func (r *Resetter) planReset(ctx context.Context, req RowsReset) (plan resetPlan, err error) {
	if len(req.RowIDs) == 0 {
		return resetPlan{}, nil
	}
	ids := slices.Clone(req.RowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of %s: begin: %w", req.InstanceID, err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rbErr := tx.Rollback(rbCtx); rbErr != nil && err == nil {
			plan, err = resetPlan{}, fmt.Errorf("plan reset of %s: roll back: %w", req.InstanceID, rbErr)
		}
	}()
	before, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, err)
	}
	res, err := r.resetInTx(ctx, tx, req, ids, false)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, r.explainLedgerError(err))
	}
	after, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, err)
	}
	// The reset changes the status of every row it changes (from the
	// in-progress status), and of no other row.
	for _, id := range ids {
		if a, ok := after[id]; ok && a != before[id] {
			plan.Reset = append(plan.Reset, id)
		}
	}
	if int64(len(plan.Reset)) != res.Changed {
		return resetPlan{}, fmt.Errorf("plan reset of %s: the reset reports %d rows changed, their statuses show %d",
			req.InstanceID, res.Changed, len(plan.Reset))
	}
	plan.Quarantined = slices.Sorted(slices.Values(res.Quarantined))
	plan.NotReset = res.NotReset
	return plan, nil
}

// statuses returns the status, as text, of the rows among ids that exist.
func (r *Resetter) statuses(ctx context.Context, tx Tx, ids []int64) (map[int64]string, error) {
	sql := fmt.Sprintf("SELECT %[1]s, coalesce(%[2]s::text, '') FROM %[3]s WHERE %[1]s = ANY($1::bigint[])",
		ident(r.o.IDColumn), ident(r.o.StatusColumn), r.o.tableIdent())
	rows, err := collect(ctx, tx, sql, []any{ids}, func(row Rows) (RowState, error) {
		var s RowState
		err := row.Scan(&s.ID, &s.Status)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read row statuses: %w", err)
	}
	out := make(map[int64]string, len(rows))
	for _, s := range rows {
		out[s.ID] = s.Status
	}
	return out, nil
}

// planOwnerReset runs the statements resetOwnerRows runs for owner in a
// transaction that is always rolled back, and returns the rows they would
// change (in ascending order) and quarantine, and those they would skip
// because another session holds them locked (NotReset). It serves
// PlanReset for an owner.
func (r *Resetter) planOwnerReset(ctx context.Context, owner string) (plan resetPlan, err error) {
	if err := r.needOwnerColumn("planning a reset by owner"); err != nil {
		return resetPlan{}, err
	}
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of rows owned by %s: begin: %w", owner, err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rbErr := tx.Rollback(rbCtx); rbErr != nil && err == nil {
			plan, err = resetPlan{}, fmt.Errorf("plan reset of rows owned by %s: roll back: %w", owner, rbErr)
		}
	}()
	sql := fmt.Sprintf("SELECT %[1]s FROM %[2]s WHERE %[3]s = $1::text AND %[4]s = $2 ORDER BY %[1]s",
		ident(r.o.IDColumn), r.o.tableIdent(), ident(r.o.OwnerColumn), ident(r.o.StatusColumn))
	ids, err := collect(ctx, tx, sql, []any{owner, r.o.InProg}, func(row Rows) (int64, error) {
		var id int64
		err := row.Scan(&id)
		return id, err
	})
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %w", owner, err)
	}
	res, err := r.resetOwnedInTx(ctx, tx, owner)
	if err != nil {
		return resetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %w", owner, err)
	}
	locked := make(map[int64]bool, len(res.NotReset))
	for _, s := range res.NotReset {
		locked[s.ID] = true
	}
	ids = slices.DeleteFunc(ids, func(id int64) bool { return locked[id] })
	if int64(len(ids)) != res.Changed {
		return resetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %d rows in progress and not locked, the reset reports %d changed", owner, len(ids), res.Changed)
	}
	plan.Reset = ids
	plan.Quarantined = slices.Sorted(slices.Values(res.Quarantined))
	plan.NotReset = res.NotReset
	return plan, nil
}
