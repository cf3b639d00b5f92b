#!/usr/bin/env bash
# Step 2 of v2, peers: the dead-peer path moves from the Worker to
# peerRecoverer (Worker.peers), the scan and its turn to the recoverer loop
# (Worker.recov), and the recovery log is built with its logger.
# Idempotent; run from the repository root.
set -euo pipefail
files=$(git ls-files '*.go' | grep -v '^scripts/')
# shellcheck disable=SC2086
sed -i -E \
  -e 's/\b(w|rec|sweeper)\.recoverDead(Lives)?\(/\1.peers.recoverDead\2(/g' \
  -e 's/\bw\.(countRows|rowsStuck|planPeer|peerKeys)\(/w.peers.\1(/g' \
  -e 's/\b(w|holder|other)\.(takeScanTurn|scan)\(/\1.recov.\2(/g' \
  -e 's/\brecoveryLog\{w: ([A-Za-z_][A-Za-z0-9_]*)\}/recoveryLog{log: \1.log}/g' \
  $files
# shellcheck disable=SC2086
gofmt -w $files
