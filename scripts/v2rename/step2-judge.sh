#!/usr/bin/env bash
# Step 2 of v2, judge: the Worker's registry methods (registry.go) move to
# the judge part (w.judge), its node-age and eviction methods (nodeage.go,
# eviction.go) to the nodeWatch part (w.nodes), whose memory of the nodes
# is nodes.ages. Call expressions and method values both. Idempotent; run
# from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
sed -i -E \
  -e 's/\bw\.(registeredPeers|deadPeers|deadOwners|judgeDead|keepHeld|deregister|noteRegistry)\b/w.judge.\1/g' \
  -e 's/\bw\.(nodeInfo|observeNodes|youngNodeHolds|nodeHold|infoUnavailable|infoAvailable|checkEviction|holdForEvictions|predecessorHeld)\b/w.nodes.\1/g' \
  -e 's/\bw\.nodes\.observe\(/w.nodes.ages.observe(/g' \
  $files
gofmt -w $files
