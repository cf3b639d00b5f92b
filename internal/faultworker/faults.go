package main

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/alya/recovery"
	"github.com/alya/recovery/postgres/pgxreset"
)

// faultyResetter is the pgxreset.Resetter with the recoverer's faults of issue
// 10: it can SIGKILL its own process right after a reset of one peer's
// rows committed (-die-after-reset-of: a recoverer that dies between its
// COMMIT and the finish script), or hold the recovery there for a while
// (-delay-finish-of: a recoverer whose finish comes late). Each fault
// fires once, on the first reset of that peer's rows by ID that changed
// rows. Every other method is pgxreset.Resetter's own, and its Info with them,
// so the worker sees the same guarantees (ledger, owner fencing, schema
// check) as without faults.
type faultyResetter struct {
	*pgxreset.Resetter
	cfg  config
	log  *slog.Logger
	once sync.Once
}

// ResetRows resets through the pgxreset.Resetter, then injects the fault
// when the reset was of the chosen peer's rows and changed rows. Resets by
// owner or by version, and plans, go straight to the pgxreset.Resetter.
func (f *faultyResetter) ResetRows(ctx context.Context, req recovery.RowsReset) (recovery.ResetResult, error) {
	res, err := f.Resetter.ResetRows(ctx, req)
	if err != nil || res.Changed == 0 {
		return res, err
	}
	f.once.Do(func() {
		switch req.InstanceID {
		case f.cfg.dieAfterResetOf:
			f.log.Warn("fault: killing this process after its reset committed, before the finish script",
				"peer_id", req.InstanceID, "rows_reset", res.Changed)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns: the kernel ends the process
		case f.cfg.delayFinishOf:
			f.log.Warn("fault: holding the finish script after the reset committed",
				"peer_id", req.InstanceID, "rows_reset", res.Changed, "delay", f.cfg.finishDelay)
			time.Sleep(f.cfg.finishDelay)
			f.log.Info("fault: finish script released", "peer_id", req.InstanceID)
		}
	})
	return res, err
}

// resetterWithFaults returns r, wrapped when a recoverer fault is asked for.
func resetterWithFaults(r *pgxreset.Resetter, cfg config, log *slog.Logger) recovery.Resetter {
	if cfg.dieAfterResetOf == "" && cfg.delayFinishOf == "" {
		return r
	}
	return &faultyResetter{Resetter: r, cfg: cfg, log: log}
}
