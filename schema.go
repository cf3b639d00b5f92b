package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"unicode/utf8"

	"github.com/alya/recovery/internal/contract"
)

// checkSchema runs the resetter's Check, bounded by ctx and the reset
// timeout: with the schema check on (not WithoutSchemaCheck), the session
// (it must be able to write; a session without
// idle_in_transaction_session_timeout, or with a statement_timeout shorter
// than the reset timeout, is warned about, when the resetter tells what it
// serves: a database), the owner column's
// width against this worker's owner value, and the table; either way,
// what the resetter serves, which fleetView.check then records. It runs before
// anything is written to Redis: a failure leaves no heartbeat and no
// registry entry behind (which peers would take for a dead worker), and
// Start can be retried. With WithoutSchemaCheck an error only means that
// the resetter cannot tell what it serves: it is logged at Warn, and the
// fleet is not checked.
func (w *Worker) checkSchema(ctx context.Context) (ResetterInfo, error) {
	schema := !w.opts.noSchemaCheck
	ctx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	defer cancel()
	info, err := w.resetter.Check(ctx, schema)
	if !errors.Is(err, contract.ErrPoolExhausted) { // the error says it better
		w.checkPool(info)
	}
	if schema {
		// OwnerValue() counts the life in owner mode (lifeWidth more characters).
		n := utf8.RuneCountInString(w.tracker.currentOwner())
		if info.OwnerWidth > 0 && n > info.OwnerWidth {
			what := "instance ID"
			if w.tracker.heldByOwner() {
				what = fmt.Sprintf("owner value (the instance ID and its life, %d characters more: docs/safety.md §2)", lifeWidth)
			}
			return info, fmt.Errorf("check schema: %w: the owner column (WithOwnerColumn) holds at most %d characters and this worker's %s %q has %d: widen the column (text) or use a shorter WithInstanceID",
				ErrSchema, info.OwnerWidth, what, clip(w.tracker.currentOwner()), n)
		}
		if err != nil {
			return info, err
		}
		if info.IdleInTxTimeout == 0 && info.Serves != "" {
			w.log.Warn("the database session has no idle_in_transaction_session_timeout: a transaction left open by a host that vanished keeps its rows locked, and recovery skips them, until the server drops the connection (about 2 h 11 min with Linux's TCP keepalive defaults); set it for the role or database of the workers (docs/operations.md)")
		}
		if st := info.StatementTimeout; st > 0 && st < w.opts.resetTimeout {
			w.log.Warn("the database session's statement_timeout is shorter than the reset timeout: resets size their chunks to fit half of it, and a reset whose chunk of one row takes longer (a slow trigger, a wait for a table lock) never completes; raise it for the role of the workers (docs/operations.md)",
				slog.Duration("statement_timeout", st), slog.Duration("reset_timeout", w.opts.resetTimeout),
				slog.Duration("lock_timeout", info.LockTimeout))
		}
		return info, nil
	}
	if err != nil {
		w.log.Warn("cannot tell what this worker serves; the key prefix is not checked against the fleet's record",
			slog.Any("error", err))
		return ResetterInfo{}, nil
	}
	return info, nil
}

// minResetterConns is how many connections of its pool the resetter may
// use at once: the recovery loop's reset and one more, the backstop
// sweep's, the self-check's, Release's or ops.RecoverNow's, which run in
// their own goroutines.
const minResetterConns = 2

// checkPool warns when the resetter's pool (ResetterInfo.PoolSize, a pool
// with a limit) had fewer than minResetterConns connections free when
// Check began. A host that shares the pool with the resetter can then
// hold every connection, and recovery waits for one past its reset
// timeout, scan after scan. It only warns: a pool shared with a host
// whose transactions are short serves both in practice, and a pool with
// room at Start may still be exhausted later, which the recovery's error
// then says (postgres.ErrPoolExhausted).
func (w *Worker) checkPool(info ResetterInfo) {
	free := info.PoolSize - info.PoolInUse
	if info.PoolSize <= 0 || free >= minResetterConns {
		return
	}
	w.log.Warn("the resetter's connection pool had fewer connections free at Start than recovery uses at once (2); a host that shares the pool can hold them all, leaving dead peers' rows in progress until one is free: give the resetter a pool of its own (docs/operations.md)",
		slog.Int("pool_max_conns", info.PoolSize), slog.Int("pool_in_use", info.PoolInUse), slog.Int("pool_free", max(free, 0)))
}
