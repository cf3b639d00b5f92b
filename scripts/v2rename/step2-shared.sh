#!/usr/bin/env bash
# Step 2 of v2, shared pieces: the Worker's timing and fleet helpers move
# to options and fleetView. Idempotent; run from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\b(w|via|s|p|wk)\.opContext\(/\1.opts.opContext(/g' \
  -e 's/\b(w|via)\.tombstoneTTL\(/\1.opts.tombstoneTTL(/g' \
  -e 's/\b(w)\.jitter\(/\1.opts.jitter(/g' \
  -e 's/\b(w|via|s)\.fleetTTL\(/\1.fleet.ttl(/g' \
  -e 's/\b(w|via|s)\.fleetClaimTTL\(/\1.fleet.claimTTL(/g' \
  -e 's/\b(w|via|s)\.rowsTTL\(/\1.fleet.rowsTTL(/g' \
  -e 's/\b(w|via|s)\.incarnationTTL\(/\1.fleet.incarnationTTL(/g' \
  -e 's/\b(w|via|s)\.failureNoteTTL\(/\1.fleet.failureNoteTTL(/g' \
  -e 's/\bw\.checkFleet\(/w.fleet.check(/g' \
  -e 's/\bw\.announcement\(/w.fleet.announcement(/g' \
  -e 's/\bw\.noteFleet\(/w.fleet.note(/g' \
  -e 's/\bw\.learnFleetRecord\(/w.fleet.learnRecord(/g' \
  -e 's/\bw\.learnMembers\(/w.fleet.learnMembers(/g' \
  -e 's/\bw\.countFailure\(/w.stats.countFailure(/g' \
  -e 's/\b(w|off)\.emit\(/\1.events.emit(/g' \
  -e 's/\b(short|w)\.fleet\.(longest|served)\(/\1.fleet.mem.\2(/g' \
  $files
gofmt -w $files
