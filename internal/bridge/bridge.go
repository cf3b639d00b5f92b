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
