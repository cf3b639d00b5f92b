#!/usr/bin/env bash
# Step 2 of v2: what New decides (the Redis target, the resetter's Info,
# owner mode, the heartbeat value) lives in the Worker's options, not in
# Worker fields of its own. Idempotent; run from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\b(w|first)\.(target|info|ownerMode|beatValue)\b/\1.opts.\2/g' \
  $files
gofmt -w $files
