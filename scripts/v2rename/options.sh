#!/usr/bin/env bash
# options.sh: v2's renames of the root's options, names and events (WS-D of
# docs/plans/v2.md). Idempotent: run it on any tree of this repository, as
# often as you like, after merging the branch that defines the new names.
#
#   scripts/v2rename/options.sh [tree]     (default: the git top level of .)
#
# It rewrites every .go file of the tree but vendor/, testdata/, docs/ and
# this script's own directory:
# - calls, through the go/ast program optionsrw next to this script:
#     WithHeartbeatTTL(x) -> WithTimings(Timings{HeartbeatTTL: x}), and
#       WithHeartbeatInterval, WithRecoveryInterval, WithRowsTTL,
#       WithOperationTimeout, WithResetTimeout, WithSelfCheckWindow alike;
#     WithExpiryNotifications(true) -> WithExpiryNotifications(), WithExpiryConfigSet()
#     WithExpiryNotifications(false) -> WithExpiryNotifications()
#     WithBackstopSweep() -> WithBackstopSweep(true); WithoutBackstopSweep() -> WithBackstopSweep(false)
#     WithScanLease -> WithScanTurn
#     ObserverFunc(f) -> f; the type ObserverFunc -> func(Event);
#     WithObserver(o) -> WithObserver(o.Observe) for an o that is no function
#     DefaultHeartbeatTTL, DefaultHeartbeatInterval, DefaultRecoveryInterval,
#       DefaultRowsTTL, DefaultOperationTimeout, DefaultResetTimeout,
#       DefaultSelfCheckWindow, DefaultHistoryLength, MinDuration, MaxDuration:
#       unexported inside package recovery, their value (60 * time.Second...)
#       where the root is imported;
# - names, with sed (word boundaries), in code and comments:
#     .Owner() and Owner() -> .OwnerValue(), Worker.Owner -> Worker.OwnerValue
#     .OwnerMode() -> .Stats().OwnerMode
#     RowsStuck -> StuckFor, LastRowsStuck -> LastStuckFor, MaxRowsStuck -> MaxStuckFor
#     WithoutBackstopSweep -> WithBackstopSweep(false), WithScanLease -> WithScanTurn (comments)
#   and, in the root package's own files only, what remains of the timing
#   options (WithRowsTTL -> Timings.RowsTTL) and of the unexported constants
#   (DefaultRowsTTL -> defaultRowsTTL, MaxDuration -> maxDuration);
# then goimports -w on the files it changed (time may need importing).
# Calls it cannot rewrite alone are printed on stderr ("by hand: ...").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tree=${1:-$(git rev-parse --show-toplevel)}
tree=$(cd "$tree" && pwd)

goimports=${GOIMPORTS:-$(command -v goimports || echo "$HOME/go/bin/goimports")}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$here/optionsrw" && go build -o "$tmp/optionsrw" .)

mapfile -t files < <(cd "$tree" && find . -name '*.go' \
	-not -path './vendor/*' -not -path '*/testdata/*' -not -path './docs/*' \
	-not -path './scripts/v2rename/*' -not -path './.git/*' | sort)
[ ${#files[@]} -gt 0 ] || exit 0

cd "$tree"
"$tmp/optionsrw" "${files[@]}" >"$tmp/changed"

sedexpr=(
	-e 's/\.Owner\(\)/.OwnerValue()/g'
	-e 's/\bOwner\(\)/OwnerValue()/g'
	-e 's/\bWorker\.Owner\b/Worker.OwnerValue/g'
	-e 's/\.OwnerMode\(\)/.Stats().OwnerMode/g'
	-e 's/\bLastRowsStuck\b/LastStuckFor/g'
	-e 's/\bMaxRowsStuck\b/MaxStuckFor/g'
	-e 's/\bRowsStuck\b/StuckFor/g'
	-e '/^func WithoutBackstopSweep/!s/\bWithoutBackstopSweep\(\)/WithBackstopSweep(false)/g'
	-e '/^func WithoutBackstopSweep/!s/\bWithoutBackstopSweep\b/WithBackstopSweep(false)/g'
	-e 's/\bWithScanLease\b/WithScanTurn/g'
)
for f in "${files[@]}"; do
	if grep -qE '\bOwner\(\)|\bWorker\.Owner\b|\.OwnerMode\(\)|RowsStuck\b|\bWithoutBackstopSweep\b|\bWithScanLease\b' "$f"; then
		# The definitions: OwnerValue's is a rename; OwnerMode's goes with
		# the method (ownermode.go), so leave a tree that still has it alone.
		before=$(cksum <"$f")
		sed -i -E "${sedexpr[@]}" "$f"
		[ "$before" = "$(cksum <"$f")" ] || echo "$f" >>"$tmp/changed"
	fi
done

# What the go/ast pass leaves of the unexported and merged names in the
# root package (comments, messages) names the Timings field or the
# unexported constant. Only there: elsewhere (recoveryctl's messages and
# golden files) the owner of the file words it.
rootexpr=(
	-e '/^func With/!s/\bWith(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow)\b/Timings.\1/g'
	-e 's/\bDefault(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow|HistoryLength)\b/default\1/g'
	-e 's/\bMinDuration\b/minDuration/g'
	-e 's/\bMaxDuration\b/maxDuration/g'
)
for f in ./*.go; do
	[ -e "$f" ] || continue
	grep -q '^package recovery$' "$f" || continue
	if grep -qE '\bWith(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow)\b|\bDefault(HeartbeatTTL|HeartbeatInterval|RecoveryInterval|RowsTTL|OperationTimeout|ResetTimeout|SelfCheckWindow|HistoryLength)\b|\b(Min|Max)Duration\b' "$f"; then
		before=$(cksum <"$f")
		sed -i -E "${rootexpr[@]}" "$f"
		[ "$before" = "$(cksum <"$f")" ] || echo "$f" >>"$tmp/changed"
	fi
done

sort -u "$tmp/changed" -o "$tmp/changed"
if [ -s "$tmp/changed" ]; then
	xargs "$goimports" -w <"$tmp/changed"
	sed 's/^/options.sh: rewrote /' "$tmp/changed"
fi
