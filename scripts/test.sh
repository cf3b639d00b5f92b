#!/usr/bin/env bash
# The tests of make test, after its gofmt check and install-deps.sh: every
# package of PKGS and NESTED_PKGS with -race and go vet's full set, and
# internal/modcheck's -short check beside them; the exit status is
# non-zero if any of them fails.
#
# The root package runs as two shards at once, two processes of one
# race-built test binary: its tests mostly wait on TTLs and servers of
# their own, so one process leaves the two cores half idle. Shard 1 runs
# the sequential tests named in scripts/root-shard1.txt (anchored names),
# shard 2 every other test (-test.skip of the same list, so a new test
# lands there), its sequential tests first, then the parallel ones eight
# at a time. The other packages run as one go test beside them. A shard's
# output is shown only if it fails, each line starting with "root 1/2: "
# or "root 2/2: "; each shard ends with a line like go test's: "ok  " or
# "FAIL", the package, the shard and its time.
#
#   GO=go PKGS=./... NESTED_PKGS="./prom/... ./otel/..." scripts/test.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
GO=${GO:-go}
PKGS=${PKGS:-./...}
NESTED_PKGS=${NESTED_PKGS:-}
rootpkg=$($GO list .)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The root package leaves PKGS when PKGS has it: it runs as the shards.
# shellcheck disable=SC2086 # PKGS is a list of patterns
pkgs=$($GO list $PKGS)
others=()
sharded=false
for p in $pkgs; do
	if [ "$p" = "$rootpkg" ]; then sharded=true; else others+=("$p"); fi
done

# The first shard's names, one alternation of anchored names.
names=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' scripts/root-shard1.txt | paste -sd'|')
list="^($names)\$"

st=0
echo "(cd internal/modcheck && $GO test -short -vet=all -count=1 ./...) &"
(cd internal/modcheck && $GO test -short -vet=all -count=1 ./...) &
modcheck=$!

# The root test binary first: the shards are the longest part of the run.
if $sharded; then
	echo "$GO test -c -race -vet=all -o \$tmp/root.test ."
	if ! $GO test -c -race -vet=all -o "$work/root.test" .; then
		echo "FAIL	$rootpkg [build failed]"
		st=1
		sharded=false
	fi
fi

# shard <n> <args>...: one process of the root test binary, run as go test
# runs it (in the package's folder, with GOROOT/bin first in PATH and a
# 10-minute timeout). As go test does with a list of packages, its output
# is shown only when it fails, each line prefixed with the shard's name;
# then an ok or FAIL line.
shard() {
	local n=$1
	shift
	local out="$work/shard$n.out" start rc took
	start=$(date +%s.%N)
	set +e
	PATH="$gobin:$PATH" "$work/root.test" -test.paniconexit0 -test.timeout=10m0s \
		-test.count=1 -test.parallel=8 "$@" >"$out" 2>&1
	rc=$?
	set -e
	took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.3fs", e - s }')
	if [ "$rc" -eq 0 ]; then
		echo "ok  	$rootpkg [shard $n/2]	$took"
	else
		sed -e "s|^|root $n/2: |" "$out"
		echo "FAIL	$rootpkg [shard $n/2]	$took (exit status $rc)"
	fi
	return "$rc"
}

gobin="$($GO env GOROOT)/bin"
if $sharded; then
	echo "list='^(<the names in scripts/root-shard1.txt, joined by |>)\$'"
	echo '$tmp/root.test -test.parallel=8 -test.run "$list" &   # shard 1/2'
	echo '$tmp/root.test -test.parallel=8 -test.skip "$list" &  # shard 2/2'
	shard 1 -test.run "$list" &
	s1=$!
	shard 2 -test.skip "$list" &
	s2=$!
fi

# The other packages, as one go test, beside the shards.
if [ ${#others[@]} -gt 0 ] || [ -n "$NESTED_PKGS" ]; then
	echo "$GO test -race -vet=all -count=1 -parallel 8 <PKGS but the root package> $NESTED_PKGS"
	# shellcheck disable=SC2086 # NESTED_PKGS is a list of patterns
	$GO test -race -vet=all -count=1 -parallel 8 "${others[@]}" $NESTED_PKGS || st=1
fi

failed=()
if $sharded; then
	wait "$s1" || failed+=("1/2 (scripts/root-shard1.txt)")
	wait "$s2" || failed+=("2/2 (every test not in scripts/root-shard1.txt)")
fi
wait "$modcheck" || { st=1; echo "FAIL	internal/modcheck -short check"; }
if [ ${#failed[@]} -gt 0 ]; then
	st=1
	for f in "${failed[@]}"; do
		echo "FAIL	$rootpkg shard $f: its lines start with \"root ${f%% *}: \""
	done
fi
exit $st
