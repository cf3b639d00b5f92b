package recovery

import (
	"context"
	"fmt"
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

// WithoutSchemaCheck makes Start skip the resetter's CheckSchema, for a
// database role that may not read the catalogue or a resetter whose check
// is too slow to run at every start. The first sign of a wrong
// configuration is then a failed recovery. Default: Start runs the check
// when the resetter implements SchemaChecker.
func WithoutSchemaCheck() Option {
	return optionFunc(func(o *options) { o.noSchemaCheck = true })
}

// checkSchema runs the resetter's schema check, if it has one and it is on,
// bounded by ctx and the reset timeout. It runs before anything is written
// to Redis: a failure leaves no heartbeat and no registry entry behind
// (which peers would take for a dead worker), and Start can be retried.
func (w *Worker) checkSchema(ctx context.Context) error {
	sc, ok := w.resetter.(SchemaChecker)
	if !ok || w.opts.noSchemaCheck {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.resetTimeout)
	defer cancel()
	if err := sc.CheckSchema(ctx); err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	return nil
}
