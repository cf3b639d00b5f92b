package recovery

import (
	"context"
	"fmt"
	"slices"
)

// ResetPlan says what a reset would change, found by running it and
// rolling it back.
type ResetPlan struct {
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

// A ResetPlanner is a RowResetter that can say what a reset would change
// without changing anything. Worker.PlanRecovery uses it, so a dry run
// never promises a reset that would not happen. PgxResetter and SQLResetter implement it.
type ResetPlanner interface {
	RowResetter
	PlanReset(ctx context.Context, req ResetRequest) (ResetPlan, error)
}

// PlanReset runs the very statements ResetIncarnation runs for req, ledger
// included, in a transaction that is always rolled back, and returns what
// they changed: the rows a reset would change now, and the rows it could
// neither reset nor show settled. Nothing is committed. While it runs it
// locks the rows it changes, as a reset does; triggers on the table fire
// and are rolled back with it (what they do outside the transaction, such
// as taking sequence values, is not). It implements ResetPlanner.
func (r *pgResetter) PlanReset(ctx context.Context, req ResetRequest) (plan ResetPlan, err error) {
	if len(req.RowIDs) == 0 {
		return ResetPlan{}, nil
	}
	ids := slices.Clone(req.RowIDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	tx, err := r.conn.begin(ctx)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of %s: begin: %w", req.InstanceID, err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rbErr := tx.rollback(rbCtx); rbErr != nil && err == nil {
			plan, err = ResetPlan{}, fmt.Errorf("plan reset of %s: roll back: %w", req.InstanceID, rbErr)
		}
	}()
	before, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, err)
	}
	res, err := r.resetInTx(ctx, tx, req, ids, false)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, r.explainLedgerError(err))
	}
	after, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of %s: %w", req.InstanceID, err)
	}
	// The reset changes the status of every row it changes (from the
	// in-progress status), and of no other row.
	for _, id := range ids {
		if a, ok := after[id]; ok && a != before[id] {
			plan.Reset = append(plan.Reset, id)
		}
	}
	if int64(len(plan.Reset)) != res.Changed {
		return ResetPlan{}, fmt.Errorf("plan reset of %s: the reset reports %d rows changed, their statuses show %d",
			req.InstanceID, res.Changed, len(plan.Reset))
	}
	plan.Quarantined = slices.Sorted(slices.Values(res.Quarantined))
	plan.NotReset = res.NotReset
	return plan, nil
}

// statuses returns the status, as text, of the rows among ids that exist.
func (r *pgResetter) statuses(ctx context.Context, tx pgTx, ids []int64) (map[int64]string, error) {
	sql := fmt.Sprintf("SELECT %[1]s, coalesce(%[2]s::text, '') FROM %[3]s WHERE %[1]s = ANY($1::bigint[])",
		ident(r.o.idColumn), ident(r.o.statusColumn), r.o.tableIdent())
	rows, err := collect(ctx, tx, sql, []any{ids}, func(row pgRows) (RowState, error) {
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

// An OwnerPlanner is a ResetPlanner that can also say what a reset by
// owner (owner mode, the backstop sweep) would change. PgxResetter and
// SQLResetter implement it when configured WithOwnerColumn.
type OwnerPlanner interface {
	ResetPlanner
	PlanOwnerReset(ctx context.Context, owner string) (ResetPlan, error)
}

// PlanOwnerReset runs the statements ResetOwnerRows runs for owner in a
// transaction that is always rolled back, and returns the rows they would
// change (in ascending order) and quarantine, and those they would skip
// because another session holds them locked (NotReset). It implements
// OwnerPlanner.
func (r *pgResetter) PlanOwnerReset(ctx context.Context, owner string) (plan ResetPlan, err error) {
	if err := r.needOwnerColumn("planning a reset by owner"); err != nil {
		return ResetPlan{}, err
	}
	tx, err := r.conn.begin(ctx)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of rows owned by %s: begin: %w", owner, err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rbErr := tx.rollback(rbCtx); rbErr != nil && err == nil {
			plan, err = ResetPlan{}, fmt.Errorf("plan reset of rows owned by %s: roll back: %w", owner, rbErr)
		}
	}()
	sql := fmt.Sprintf("SELECT %[1]s FROM %[2]s WHERE %[3]s = $1::text AND %[4]s = $2 ORDER BY %[1]s",
		ident(r.o.idColumn), r.o.tableIdent(), ident(r.o.ownerColumn), ident(r.o.statusColumn))
	ids, err := collect(ctx, tx, sql, []any{owner, r.o.inprog}, func(row pgRows) (int64, error) {
		var id int64
		err := row.Scan(&id)
		return id, err
	})
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %w", owner, err)
	}
	res, err := r.resetOwnedInTx(ctx, tx, owner)
	if err != nil {
		return ResetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %w", owner, err)
	}
	locked := make(map[int64]bool, len(res.NotReset))
	for _, s := range res.NotReset {
		locked[s.ID] = true
	}
	ids = slices.DeleteFunc(ids, func(id int64) bool { return locked[id] })
	if int64(len(ids)) != res.Changed {
		return ResetPlan{}, fmt.Errorf("plan reset of rows owned by %s: %d rows in progress and not locked, the reset reports %d changed", owner, len(ids), res.Changed)
	}
	plan.Reset = ids
	plan.Quarantined = slices.Sorted(slices.Values(res.Quarantined))
	plan.NotReset = res.NotReset
	return plan, nil
}
