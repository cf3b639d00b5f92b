#!/usr/bin/env bash
# v2 renames in the prose of docs/*.md (issue 23, docs/plans/v2.md §1b and
# §3; workstream E). Idempotent: each rule rewrites only the old form.
# docs/plans/ (plans name what was) and docs/migrating.md (its "before"
# column) are left alone. The Redis keys <prefix>_SCAN_LEASE and
# <prefix>_SWEEP_LEASE keep their names, and so do the tests named after
# the scan lease (TestScanLease...): only the prose says "turn".
# What needs a sentence rewritten (timing options, the optional resetter
# interfaces) is done by hand; doccheck (make lint) lists what is left.
set -euo pipefail
cd "$(dirname "$0")/../.."

files=()
for f in docs/*.md; do
	[ "$f" = docs/migrating.md ] && continue
	files+=("$f")
done

sed -i -E \
	-e 's/\b([Ss])can lease(s?)\b/\1can turn\2/g' \
	-e 's/\b([Ss])can-lease\b/\1can-turn/g' \
	-e 's/\b([Ss])weep lease(s?)\b/\1weep turn\2/g' \
	-e 's/\b([Ss])weep-lease\b/\1weep-turn/g' \
	-e 's/\bWithScanLease\b/WithScanTurn/g' \
	-e 's/\b(recovery\.)?NewPgxResetter\b/pgxreset.New/g' \
	-e 's/\b(recovery\.)?NewSQLResetter\b/sqlreset.New/g' \
	-e 's/\brecovery\.(With(Table|Schema|IDColumn|StatusColumn|Statuses|DoneStatuses|OwnerColumn|RecoveryCountColumn|MaxRecoveries|ResetLedger|LedgerRetention|ChunkSize)|WithoutResetLedger)\b/postgres.\1/g' \
	-e 's/\brecovery\.(ReadHistory|Inspect|InspectInstance|ReadTrackedRows|HistoryQuery|HistoryEntry|EnvKeyPrefix|DefaultKeyPrefix|FleetState|InstanceState|TrackedRows|RecoveryReport|PeerRecovery|PeerError|RecoveryPlan|PeerPlan|PlanAction)\b/ops.\1/g' \
	-e 's/\b(recovery\.)?PgxConfigFromEnv\b/ops.FromEnv/g' \
	-e 's/\b(recovery\.)?PgxConfig\b/postgres.Config/g' \
	-e 's/([^.]|^)\bPgxResetter\b/\1pgxreset.Resetter/g' \
	-e 's/([^.]|^)\bSQLResetter\b/\1sqlreset.Resetter/g' \
	-e 's/([^.]|^)\b(recovery\.)?PgxExecer\b/\1pgxreset.Execer/g' \
	-e 's/([^.]|^)\b(recovery\.)?SQLExecer\b/\1sqlreset.Execer/g' \
	-e 's/\bResetterOption\b/postgres.Option/g' \
	-e 's/\bDefaultResetChunkSize\b/postgres.DefaultChunkSize/g' \
	-e 's/\b(recovery\.)?HistoryPeerDead\b/ops.HistoryPeerClaimed/g' \
	-e 's/\bw\.RecoverNow\(ctx\)/ops.RecoverNow(ctx, w)/g' \
	-e 's/\bw\.PlanRecovery\(ctx\)/ops.PlanRecovery(ctx, w)/g' \
	-e 's/\b(Worker\.|w\.)?RecoverNow\b/ops.RecoverNow/g' \
	-e 's/\b(Worker\.|w\.)?PlanRecovery\b/ops.PlanRecovery/g' \
	-e 's/\bops\.ops\./ops./g' \
	-e 's/\bops\.(RecoverNow|PlanRecovery)\(ctx\)/ops.\1(ctx, w)/g' \
	-e 's/\bOwner\(\)/OwnerValue()/g' \
	-e 's/\bWorker\.Owner\b([^A-Za-z(]|$)/Worker.OwnerValue\1/g' \
	-e 's/\b(w\.)?OwnerMode\(\)/\1Stats().OwnerMode/g' \
	-e 's/\bWithoutBackstopSweep\(\)/WithBackstopSweep(false)/g' \
	-e 's/\bWithoutBackstopSweep\b/WithBackstopSweep(false)/g' \
	-e 's/\bWithBackstopSweep\(\)/WithBackstopSweep(true)/g' \
	-e 's/\bWithExpiryNotifications\(true\)/WithExpiryNotifications(), WithExpiryConfigSet()/g' \
	-e 's/\bWithExpiryNotifications\(false\)/WithExpiryNotifications()/g' \
	-e 's/\b(Event\.)?RowsStuck\b/\1StuckFor/g' \
	-e 's/\bLastRowsStuck\b/LastStuckFor/g' \
	-e 's/\bMaxRowsStuck\b/MaxStuckFor/g' \
	-e 's/\bRowResetter\b/Resetter/g' \
	-e 's/\brecovery\.With(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow)\(([^()]*(\([^()]*\))?[^()]*)\)/recovery.WithTimings(recovery.Timings{\1: \2})/g' \
	-e 's/\bWith(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow)\(([^()]*(\([^()]*\))?[^()]*)\)/WithTimings(Timings{\1: \2})/g' \
	-e 's/\bWith(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow)\b/Timings.\1/g' \
	"${files[@]}"
