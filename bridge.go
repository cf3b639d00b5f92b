package recovery

import (
	"context"
	"fmt"

	"github.com/alya/recovery/internal/bridge"
	"github.com/alya/recovery/internal/report"
)

// Package ops reaches the Worker's recovery through internal/bridge: the
// functions below are the only route from ops into the Worker's
// unexported code.
func init() {
	bridge.RecoverNow = func(ctx context.Context, w any) (report.RecoveryReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryReport{}, err
		}
		return wk.recoverNow(ctx)
	}
	bridge.PlanRecovery = func(ctx context.Context, w any) (report.RecoveryPlan, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryPlan{}, err
		}
		return wk.planRecovery(ctx)
	}
	bridge.SweepNow = func(ctx context.Context, w any, dryRun bool) (report.SweepReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.SweepReport{}, err
		}
		return wk.sweepNow(ctx, dryRun)
	}
	bridge.RecoverNowKeeping = func(ctx context.Context, w any, keep []string) (report.RecoveryReport, error) {
		wk, err := bridged(w)
		if err != nil {
			return report.RecoveryReport{}, err
		}
		return wk.recoverNowKeeping(ctx, keep)
	}
}

// bridged returns the Worker ops passed, refusing a nil one.
func bridged(w any) (*Worker, error) {
	wk, ok := w.(*Worker)
	if !ok || wk == nil {
		return nil, fmt.Errorf("%w: worker is nil", ErrInvalidConfig)
	}
	return wk, nil
}
