package recovery

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"
)

// A SchemaChecker is a RowResetter that can compare its configuration with
// the store it resets before any row depends on it. Worker.Start calls
// CheckSchema before the first heartbeat, so a wrong table, column or
// status is reported when the process starts instead of the first time a
// peer dies. PgxResetter and SQLResetter implement it; a custom RowResetter may.
//
// CheckSchema returns nil when the store matches, an error wrapping
// ErrSchema that names the object at fault when it does not, and any other
// error when it could not look (the database unreachable). It must not
// change anything and must return soon after ctx ends.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// checkSchema runs the resetter's schema check, if it has one and it is on,
// bounded by ctx and the reset timeout, after its session check (a
// PgxResetter or SQLResetter: the session must be able to write; a session
// without idle_in_transaction_session_timeout is warned about). It runs
// before anything is written to Redis: a failure leaves no heartbeat and no
// registry entry behind (which peers would take for a dead worker), and
// Start can be retried.
func (w *Worker) checkSchema(ctx context.Context) error {
	sc, ok := w.resetter.(SchemaChecker)
	if !ok || w.opts.noSchemaCheck {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	defer cancel()
	if ss, ok := w.resetter.(sessionChecker); ok {
		s, err := ss.checkSession(ctx)
		if err != nil {
			return fmt.Errorf("check database session: %w", err)
		}
		// OwnerValue() counts the life in owner mode (lifeWidth more characters).
		n := utf8.RuneCountInString(w.currentOwner())
		if s.ownerWidth > 0 && n > s.ownerWidth {
			what := "instance ID"
			if w.ownerMode {
				what = fmt.Sprintf("owner value (the instance ID and its life, %d characters more: docs/safety.md §2)", lifeWidth)
			}
			return fmt.Errorf("check schema: %w: the owner column (WithOwnerColumn) holds at most %d characters and this worker's %s %q has %d: widen the column (text) or use a shorter WithInstanceID",
				ErrSchema, s.ownerWidth, what, clip(w.currentOwner()), n)
		}
		if s.idleInTxTimeout == 0 {
			w.log.Warn("the database session has no idle_in_transaction_session_timeout: a transaction left open by a host that vanished keeps its rows locked, and recovery skips them, until the server drops the connection (about 2 h 11 min with Linux's TCP keepalive defaults); set it for the role or database of the workers (docs/operations.md)")
		}
	}
	if err := sc.CheckSchema(ctx); err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	return nil
}

// sessionChecker is a resetter that can look at its database session:
// PgxResetter and SQLResetter.
type sessionChecker interface {
	// checkSession returns what Start needs to know about the session, or
	// an error wrapping ErrReadOnly when it cannot write.
	checkSession(ctx context.Context) (sessionInfo, error)
}

// sessionInfo is what Start learns about the resetter's database session.
type sessionInfo struct {
	// idleInTxTimeout is idle_in_transaction_session_timeout; 0 is none.
	idleInTxTimeout time.Duration
	// ownerWidth is how many characters the owner column holds; 0 is no
	// limit (text, or no owner column).
	ownerWidth int
}
