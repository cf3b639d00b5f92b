#!/usr/bin/env bash
# Installs what `make test` needs beyond Go: redis-server and redis-cli, and
# PostgreSQL's server binaries (initdb, postgres). Nothing is started here:
# the tests start throwaway servers on free loopback ports themselves.
# With REDIS_URL and DATABASE_URL both set, nothing needs installing.
set -euo pipefail

have_pg() {
	command -v initdb >/dev/null 2>&1 && return 0
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()
if [ -z "${REDIS_URL:-}" ] || [ -z "${DATABASE_URL:-}" ]; then
	# The Cluster tests need local redis-server and redis-cli even with REDIS_URL.
	command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
	command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
fi
if [ -z "${DATABASE_URL:-}" ] && ! have_pg; then
	missing+=(postgresql)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		sudo="sudo -n"
	else
		echo "install-deps: not root and no sudo: install ${missing[*]} by hand, or set REDIS_URL and DATABASE_URL" >&2
		exit 1
	fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# postgresql's package starts a cluster on 5432 under systemd where there is
# one; the tests do not use it, they start their own.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
