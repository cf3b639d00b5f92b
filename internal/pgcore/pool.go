package pgcore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PoolStats is how much of its connection pool a resetter's handle uses
// now: InUse connections of at most Max (0: no limit).
type PoolStats struct{ InUse, Max int }

// Pooled is a DB over a connection pool that can say how much of it is
// in use: pgxreset's over a *pgxpool.Pool, sqlDB over a *sql.DB. Check
// reads it into ResetterInfo.PoolSize and PoolInUse.
type Pooled interface {
	PoolStats() (PoolStats, bool)
}

// PoolWait returns err, the failure of a call that ran for waited on a
// pool now at st, as what it is when the call's deadline passed with
// every connection of the pool in use: a wait for a connection the
// host's transactions (or the resetter's own) held, wrapping
// ErrPoolExhausted and err. Any other error (a connection the pool failed
// to open, a slow statement on a pool with room) is returned as it is.
func PoolWait(err error, waited time.Duration, st PoolStats) error {
	if !errors.Is(err, context.DeadlineExceeded) || st.Max <= 0 || st.InUse < st.Max {
		return err
	}
	return fmt.Errorf("%w: resetter waited %v for a connection from its pool (%d of %d in use): give the resetter its own pool (docs/operations.md): %w",
		ErrPoolExhausted, waited.Round(time.Millisecond), st.InUse, st.Max, err)
}

// poolStats reads the pool behind r's handle, when it is one.
func (r *Resetter) poolStats() (PoolStats, bool) {
	if p, ok := r.conn.(Pooled); ok {
		return p.PoolStats()
	}
	return PoolStats{}, false
}
