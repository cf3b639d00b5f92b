#!/usr/bin/env bash
# Step 2 of v2, sweep: the backstop sweep's and the untracked-rows alarm's
# Worker methods move onto their parts (sweep.go, rowsweep.go). Call sites
# in other files follow. Idempotent; run from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\bw\.sweepsByOwner\(\)/w.sweeper.byOwner()/g' \
  -e 's/\bw\.sweepsByVersion\(\)/w.sweeper.byVersion()/g' \
  -e 's/\bw\.untrackedCall\(/w.untracked.untrackCall(/g' \
  -e 's/\bw\.noteUntracked\(/w.untracked.note(/g' \
  -e 's/\b(w|host|sweeper|s)\.untracked\(\)/\1.untracked.err()/g' \
  -e 's/\b(require|assert)\.NotNil\(t, (w|s)\.sweeper\.rows\b/\1.True(t, \2.sweeper.byVersion()/g' \
  -e 's/\b(require|assert)\.Nil\(t, (w|s)\.sweeper\.sw\b/\1.False(t, \2.sweeper.byOwner()/g' \
  -e 's/\bw\.mastersTrusted\(/w.sweeper.by.(*rowSweep).mastersTrusted(/g' \
  $files
gofmt -w $files
