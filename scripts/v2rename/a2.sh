#!/bin/sh
# WS-A2 (docs/plans/v2.md §2): the Worker takes one Resetter. Idempotent.
# It renames only what is mechanical; a type that implemented RowResetter
# (ResetRows) or overrode ResetIncarnation, ResetOwnerRows or
# ResetRowVersions must implement or override Reset by hand (the
# compiler names the first: "missing method Check"; an override of a flow
# method compiles and is never called: grep for them).
set -eu
cd "$(dirname "$0")/../.."
files=$(git ls-files '*.go')
# shellcheck disable=SC2086
sed -i -E \
	-e 's/\bRowResetter\b/Resetter/g' \
	-e 's/\bRowVersion\b/RowState/g' \
	$files
# shellcheck disable=SC2086
~/go/bin/goimports -w $files
