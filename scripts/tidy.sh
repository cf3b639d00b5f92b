#!/usr/bin/env bash
# Runs go mod tidy in every module of the repository (go mod tidy ignores
# go.work). The nested modules require the root module at the version they
# will be released with (docs/releasing.md), which need not be on the
# module proxy yet: they resolve it, and each other, through a file proxy
# made from the working tree (internal/modcheck/cmd/fileproxy). The root's
# lines are then taken out of their go.sum: the hash that belongs there is
# that of the tagged release, which the first tidy after the tag adds.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
env_file="$tmp/env"
(cd internal/modcheck && GOWORK=off go run ./cmd/fileproxy -repo ../.. -out "$tmp") >"$env_file"
for m in . internal/containers internal/modcheck; do
	(cd "$m" && GOWORK=off go mod tidy)
done
for m in prom otel; do
	[ -f "$m/go.mod" ] || continue
	(
		cd "$m"
		while IFS= read -r kv; do export "$kv"; done <"$env_file"
		go mod tidy
	)
	sed -i '\#^github.com/alya/recovery #d' "$m/go.sum"
done
