#!/usr/bin/env bash
# Step 2 of v2, beat: the heartbeat, the lease, the twin check and the
# self-check own their dependencies. Worker methods of heartbeat.go,
# lease.go, twin.go, selfcheck.go and selfcheck_fetch.go move onto the
# lease, the twin and the selfChecker. Idempotent; run from the
# repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\bw\.markLeaseLost\(/w.lease.markLeaseLost(/g' \
  -e 's/\bw\.noteLeaseLoss\(/w.lease.noteLeaseLoss(/g' \
  -e 's/\bw\.noteBareOwners\(/w.lease.noteBareOwners(/g' \
  -e 's/\bw\.noteOusted\(/w.twin.noteOusted(/g' \
  -e 's/\bw\.claimInstanceID\(/w.twin.claimInstanceID(/g' \
  -e 's/\bw\.misconfigured\(/w.checker.alarmErr(/g' \
  -e 's/\bw\.unverifiedHold\(/w.checker.unverifiedHold(/g' \
  -e 's/\bw\.runningSince\./w.checker.runningSince./g' \
  $files
gofmt -w $files
