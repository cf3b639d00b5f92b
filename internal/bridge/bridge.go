package bridge

import (
	"context"

	"github.com/alya/recovery/internal/report"
)

// RecoverNow runs one recovery scan of w, a *recovery.Worker, now. The
// root package sets it in its init; ops.RecoverNow calls it.
var RecoverNow func(ctx context.Context, w any) (report.RecoveryReport, error)

// PlanRecovery says what RecoverNow of w, a *recovery.Worker, would do
// now, changing nothing. The root package sets it in its init;
// ops.PlanRecovery calls it.
var PlanRecovery func(ctx context.Context, w any) (report.RecoveryPlan, error)

// SweepNow runs the backstop sweep by row version of w, a
// *recovery.Worker that is never started, now (dryRun: the first look
// only). The root package sets it in its init; ops.SweepNow calls it.
var SweepNow func(ctx context.Context, w any, dryRun bool) (report.SweepReport, error)

// RecoverNowKeeping is RecoverNow leaving the dead peers of keep
// registered and untouched. The root package sets it in its init;
// ops.RecoverNowKeeping calls it.
var RecoverNowKeeping func(ctx context.Context, w any, keep []string) (report.RecoveryReport, error)
