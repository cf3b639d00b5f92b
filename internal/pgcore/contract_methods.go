package pgcore

import (
	"context"
	"fmt"
	"slices"

	"github.com/alya/recovery/internal/contract"
)

// The PostgreSQL resetter implements the Resetter contract by delegating
// to its flows: the reset by IDs (resetIncarnation, ResetRows), by owner
// (resetOwnerRows, ResetOwner) and by row version (resetRowVersions,
// ResetVersions), their plans (planReset, planOwnerReset, planVersions,
// PlanReset), the schema and session checks
// (checkSchema, checkSession) and what it serves (fleetIdentity,
// serverIdentity).

// Info says what the resetter guarantees: owner fencing with
// WithOwnerColumn, the reset ledger (usesLedger), dry runs, and the lists
// of rows in progress (InProgressOwners with an owner column,
// InProgressRows without); and its in-progress and queued statuses, as
// RowStates reads them. It does no I/O. It implements Resetter.
func (r *Resetter) Info() ResetterInfo {
	return ResetterInfo{
		Name:             r.kind,
		OwnerFencing:     r.fencesByOwner(),
		Ledger:           r.usesLedger(),
		DryRun:           true,
		ListsInProgress:  true,
		InProgressStatus: r.o.InProg,
		QueuedStatus:     r.o.Queued,
	}
}

// Check returns Info filled with what it reads from the server. It
// first reads the handle's pool, when it is one (PoolSize, PoolInUse).
// With schema, it first checks the session (checkSession: an error wrapping
// ErrReadOnly, prefixed "check database session: ", when it cannot
// write; it fills OwnerWidth, IdleInTxTimeout, StatementTimeout and
// LockTimeout), then the table
// (checkSchema: errors wrapping ErrSchema, prefixed "check schema: ").
// Then, with schema or without, it reads what it serves (Serves,
// fleetIdentity) and the server's identifier (Server, serverIdentity: ""
// when the role may not read it). On an error the info returned holds
// the fields read before it (OwnerWidth among them, so that a Worker can
// report an owner column too narrow first, as before). It implements
// Resetter.
func (r *Resetter) Check(ctx context.Context, schema bool) (ResetterInfo, error) {
	info := r.Info()
	if st, ok := r.poolStats(); ok {
		info.PoolSize, info.PoolInUse = st.Max, st.InUse
	}
	if schema {
		s, err := r.checkSession(ctx)
		if err != nil {
			return info, fmt.Errorf("check database session: %w", err)
		}
		info.OwnerWidth, info.IdleInTxTimeout = s.ownerWidth, s.idleInTxTimeout
		info.StatementTimeout, info.LockTimeout = s.statementTimeout, s.lockTimeout
		if err := r.checkSchema(ctx); err != nil {
			return info, fmt.Errorf("check schema: %w", err)
		}
	}
	serves, err := r.fleetIdentity(ctx)
	if err != nil {
		return info, err
	}
	server, err := r.serverIdentity(ctx)
	if err != nil {
		return info, err
	}
	info.Serves, info.Server = serves, server
	return info, nil
}

// ResetRows returns req.RowIDs to the queue (or quarantine), under
// req.InstanceID and req.Incarnation (resetIncarnation). It lists the
// rows it changed in ChangedIDs (ascending). It implements Resetter.
func (r *Resetter) ResetRows(ctx context.Context, req RowsReset) (ResetResult, error) {
	return r.resetIncarnation(ctx, req)
}

// ResetOwner returns every row still in progress and owned by req.Owner
// to the queue (or quarantine) (resetOwnerRows; it needs
// WithOwnerColumn). It lists the rows it changed in ChangedIDs
// (ascending). An empty Owner is refused with an error wrapping
// ErrInvalidConfig. It implements Resetter.
func (r *Resetter) ResetOwner(ctx context.Context, req OwnerReset) (ResetResult, error) {
	if err := needOwner(req); err != nil {
		return ResetResult{}, err
	}
	return r.resetOwnerRows(ctx, req.Owner)
}

// needOwner refuses a reset by owner that names none: it would reset the
// rows whose owner is the empty string, which no worker writes.
func needOwner(req OwnerReset) error {
	if req.Owner == "" {
		return fmt.Errorf("%w: a reset by owner names the owner; this one is empty", ErrInvalidConfig)
	}
	return nil
}

// ResetVersions returns the rows still in progress at the versions
// req.Versions gives to the queue (or quarantine) (resetRowVersions; it
// needs a resetter without WithOwnerColumn). It lists the rows it changed
// in ChangedIDs (ascending). It implements Resetter.
func (r *Resetter) ResetVersions(ctx context.Context, req VersionsReset) (ResetResult, error) {
	return r.resetRowVersions(ctx, req.Versions)
}

// PlanReset runs the statements of the reset plan names in a transaction
// it always rolls back (planReset, planOwnerReset, planVersions) and
// returns what they changed: the rows in ChangedIDs (ascending) and their
// count in Changed. A plan naming none or several resets, or a reset by
// an empty owner, is refused with an error wrapping ErrInvalidConfig. It
// implements Resetter.
func (r *Resetter) PlanReset(ctx context.Context, plan PlanRequest) (ResetResult, error) {
	if err := contract.CheckPlan(plan); err != nil {
		return ResetResult{}, err
	}
	switch {
	case plan.Owner != nil:
		if err := needOwner(*plan.Owner); err != nil {
			return ResetResult{}, err
		}
		p, err := r.planOwnerReset(ctx, plan.Owner.Owner)
		return p.result(), err
	case plan.Versions != nil:
		return r.planVersions(ctx, plan.Versions.Versions)
	default:
		p, err := r.planReset(ctx, *plan.Rows)
		return p.result(), err
	}
}

// result is the plan as PlanReset's ResetResult.
func (p resetPlan) result() ResetResult {
	return ResetResult{
		Changed:     int64(len(p.Reset)),
		ChangedIDs:  p.Reset,
		Quarantined: p.Quarantined,
		NotReset:    p.NotReset,
	}
}

// planVersions runs the statements resetRowVersions runs for rows in a
// transaction that is always rolled back, and returns what they changed,
// the rows in ChangedIDs (ascending).
func (r *Resetter) planVersions(ctx context.Context, rows []RowState) (res ResetResult, err error) {
	if r.inProgress == "" {
		return ResetResult{}, fmt.Errorf("%w: a %s WithOwnerColumn sweeps by owner, not by row version", ErrInvalidConfig, r.kind)
	}
	sorted := sortedVersions(rows)
	ids := make([]int64, len(sorted))
	for i, rv := range sorted {
		ids[i] = rv.ID
	}
	ids = slices.Compact(ids)
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return ResetResult{}, fmt.Errorf("plan reset of %d stray rows: begin: %w", len(rows), err)
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rbErr := tx.Rollback(rbCtx); rbErr != nil && err == nil {
			res, err = ResetResult{}, fmt.Errorf("plan reset of %d stray rows: roll back: %w", len(rows), rbErr)
		}
	}()
	before, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return ResetResult{}, fmt.Errorf("plan reset of %d stray rows: %w", len(rows), err)
	}
	res, err = r.resetVersionsInTx(ctx, tx, sorted)
	if err != nil {
		return ResetResult{}, fmt.Errorf("plan reset of %d stray rows: %w", len(rows), err)
	}
	after, err := r.statuses(ctx, tx, ids)
	if err != nil {
		return ResetResult{}, fmt.Errorf("plan reset of %d stray rows: %w", len(rows), err)
	}
	res.ChangedIDs = nil // the plan's are read from the statuses, as checked below
	for _, id := range ids {
		if a, ok := after[id]; ok && a != before[id] {
			res.ChangedIDs = append(res.ChangedIDs, id)
		}
	}
	if int64(len(res.ChangedIDs)) != res.Changed {
		return ResetResult{}, fmt.Errorf("plan reset of %d stray rows: the reset reports %d rows changed, their statuses show %d",
			len(rows), res.Changed, len(res.ChangedIDs))
	}
	res.Quarantined = slices.Sorted(slices.Values(res.Quarantined))
	return res, nil
}
