#!/bin/sh
# testwaits.sh prints how the root package's tests wait: the time.Sleep
# calls and the Eventually polls in *_test.go at the repository root, in
# total and by file (files with none left out), and the waits on the loops'
# test signals (testSignals, events.go) for comparison. Run from anywhere.
set -eu
cd "$(dirname "$0")/.."
count() { grep -o "$1" ./*_test.go | wc -l | tr -d ' '; }
echo "root tests: sleeps $(count 'Sleep(')  polls $(count 'Eventually')  signal waits $(count 'signals(\|waitLook\|waitBeat')"
# The kind each sleep's comment names (TestEverySleepInTheTestsSaysWhyItIsNotAWait
# enforces it): on the sleep's line, or the first line of the comment group just
# above.
echo "sleeps by kind: $(awk '
	/^[ \t]*\/\// { if (!c && match($0, /^[ \t]*\/\/ (real time|pace|fake clock):/)) m = substr($0, RSTART, RLENGTH); c = 1; next }
	/Sleep\(/ { k = "unmarked"; if (match($0, /\/\/ (real time|pace|fake clock):/)) k = substr($0, RSTART + 3, RLENGTH - 4); else if (m != "") { sub(/^[ \t]*\/\/ /, "", m); k = substr(m, 1, length(m) - 1) }; n[k]++ }
	{ m = ""; c = 0 }
	END { for (k in n) printf "%s %d; ", k, n[k] }' ./*_test.go)"
echo "by file (sleeps polls):"
for f in ./*_test.go; do
	s=$(grep -o 'Sleep(' "$f" | wc -l | tr -d ' ')
	p=$(grep -o 'Eventually' "$f" | wc -l | tr -d ' ')
	if [ "$s" != 0 ] || [ "$p" != 0 ]; then
		printf '  %-34s %3s %3s\n' "${f#./}" "$s" "$p"
	fi
done
