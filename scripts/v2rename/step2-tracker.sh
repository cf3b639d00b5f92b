#!/usr/bin/env bash
# Step 2 of v2, the tracker seam (docs/plans/v2.md §4b): the Worker's
# row-tracking methods and atomics move into the tracker New picks
# (rowtrack.go, owner.go). Call sites in other files become calls into
# w.tracker. Idempotent; run from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\bw\.rotateLocked\(/w.tracker.rotateLocked(/g' \
  -e 's/\bw\.retrack\(/w.tracker.retrack(/g' \
  -e 's/\bw\.currentOwner\(/w.tracker.currentOwner(/g' \
  -e 's/\bw\.trackCalls\.Load\(\) > 0/w.tracker.trackCalled()/g' \
  -e 's/\bw\.flusher\.runOnce\(/w.tracker.(*rowsSetTracker).flusher.runOnce(/g' \
  -e 's/\(Worker\.trackOwner\)/(ownerTracker.trackOwner)/g' \
  $files
gofmt -w $files
