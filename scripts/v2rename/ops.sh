#!/bin/sh
# ops.sh: v2 rename for workstream C (package ops, internal/report).
# Idempotent: run it from the module root on any tree, as often as needed.
#
#   - root (package recovery) files: RecoveryReport, PeerRecovery and
#     PeerError are internal/report's; w.RecoverNow(ctx) and
#     w.PlanRecovery(ctx) in internal tests become w.recoverNow(ctx) and
#     w.planRecovery(ctx); the Plan* actions of internal tests become
#     report.Plan*.
#   - other packages: recovery.Inspect, recovery.ReadHistory, ... become
#     ops.*; x.RecoverNow(ctx) becomes ops.RecoverNow(ctx, x).
# Then goimports fixes the imports.
set -eu
cd "$(dirname "$0")/../.."
GOIMPORTS=${GOIMPORTS:-$HOME/go/bin/goimports}

root_go=$(ls *.go)
root_internal_tests=$(grep -l '^package recovery$' *_test.go || true)

# Report types, in every root file (not after a qualifier).
perl -pi -e 's/(?<![\w.])(RecoveryReport|PeerRecovery|PeerError)\b/report.$1/g' $root_go

# Root comments name the moved functions by their new package. (Not
# committed on v2-c outside C's files, to spare merge conflicts: run it
# after merging.)
root_src=$(ls *.go | grep -v '_test\.go$')
# shellcheck disable=SC2086
perl -pi -e 'if (m{^\s*//}) {
	s/\bWorker\.(RecoverNow|PlanRecovery)\b/ops.$1/g;
	s/(?<![\w.])(RecoverNow|PlanRecovery|Inspect|InspectInstance|ReadTrackedRows|ReadHistory)\b/ops.$1/g;
}' $root_src

# Internal root tests: the Worker's methods that moved to ops.
if [ -n "$root_internal_tests" ]; then
	perl -pi -e 's/\.RecoverNow\(/.recoverNow(/g; s/\.PlanRecovery\(/.planRecovery(/g;
		s/(?<![\w.])(Plan(?:Reset|Keep|Deregister|Lost|Skip|Unknown))\b(?!\()/report.$1/g;
		s/\b(p|plan\.Peers\[\d+\])\.Reset\b(?!\()/$1.WouldReset/g' $root_internal_tests
fi

# Everything outside the root package: recovery.X -> ops.X.
others=$(grep -rlE --include='*.go' '(recovery|ops)\.|RecoverNow\(|PlanRecovery\(' . |
	grep -v '^\./[^/]*\.go$' | grep -v '^\./ops/' | grep -v '^\./internal/report/' | grep -v '^\./internal/bridge/' || true)
root_external_tests=$(grep -l '^package recovery_test$' *_test.go || true)
for f in $others $root_external_tests; do
	perl -pi -e '
		s/\brecovery\.(Inspect|InspectInstance|ReadTrackedRows|ReadHistory|HistoryEntry|HistoryQuery|ClaimState|ClaimNone|ClaimHeld|ClaimFailed|ClaimFinished|FleetState|InstanceState|TrackedRows|RecoveryReport|PeerRecovery|PeerError|RecoveryPlan|PeerPlan|PlanAction|PlanReset|PlanKeep|PlanDeregister|PlanLost|PlanSkip|PlanUnknown|HistoryRowsRecovered|HistoryRowsQuarantined|HistoryRecoveryFailed|HistoryLeaseLost|HistoryLeaseRegained|HistoryRowsNotReset|HistoryStrayRowsReset|HistoryUntrackedRows)\b/ops.$1/g;
		s/\brecovery\.HistoryPeerDead\b/ops.HistoryPeerClaimed/g;
		s/(?<![\w.])(?!ops\.)([\w.]+)\.RecoverNow\(((?:[^()]|\([^()]*\))*)\)/ops.RecoverNow($2, $1)/g;
		s/(?<![\w.])(?!ops\.)([\w.]+)\.PlanRecovery\(((?:[^()]|\([^()]*\))*)\)/ops.PlanRecovery($2, $1)/g;
	' "$f"
done

# The root's example of RecoverNow names a method that is gone.
if [ -f example_test.go ]; then
	perl -0pi -e 's/\nfunc ExampleWorker_RecoverNow\(\) \{\n/\n\/\/ ops.RecoverNow runs one scan of a Worker that is never started (moved to\n\/\/ package ops in v2; the example stays here beside queue, its resetter).\nfunc Example_recoverNow() {\n/' example_test.go
fi

# shellcheck disable=SC2086
"$GOIMPORTS" -w $root_go $others $root_external_tests
