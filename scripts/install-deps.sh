#!/usr/bin/env bash
# Installs, with apt-get, what a make target needs beyond Go, and only that:
#
#   scripts/install-deps.sh test    make test, test-integration, bench: redis-server
#                                   and redis-cli, PostgreSQL's server binaries
#                                   (initdb, postgres), tmux (the terminal
#                                   recoveryctl watch is tested in) and promtool
#                                   (Debian package prometheus) for prom/'s
#                                   alert-rule tests, and pgbouncer for the
#                                   tests through a pooler in transaction mode
#   scripts/install-deps.sh faults  make test-faults: the servers, ip(8)
#                                   (iproute2) for the network namespaces, and
#                                   pgbouncer for scenario P1 (workers through
#                                   a pooler in transaction mode)
#   scripts/install-deps.sh demo    make demo: redis-server and PostgreSQL's
#                                   server binaries
#   scripts/install-deps.sh model   make model: the Spin model checker, and gcc
#                                   to compile its verifiers
#   scripts/install-deps.sh all     all of the above (make deps)
#
# Nothing is started here: the tests and the demo start throwaway servers on
# free loopback ports themselves, and promtool runs without a Prometheus
# server. With DATABASE_URL set no PostgreSQL is installed; with REDIS_URL
# and DATABASE_URL both set, no redis-server either (except for the fault
# suite, whose Cluster, Sentinel and persistence scenarios need local ones).
set -euo pipefail

what=${1:-all}
case "$what" in
test | faults | demo | model | all) ;;
*)
	echo "usage: $0 test|faults|demo|model|all" >&2
	exit 2
	;;
esac
wants() { # wants <set>...: whether the requested set is one of these
	local s
	for s in "$@" all; do [ "$what" = "$s" ] && return 0; done
	return 1
}

have_pg() {
	command -v initdb >/dev/null 2>&1 && return 0
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()
if wants faults || { wants test && { [ -z "${REDIS_URL:-}" ] || [ -z "${DATABASE_URL:-}" ]; }; }; then
	# The Cluster tests need local redis-server and redis-cli even with REDIS_URL.
	command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
	command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
fi
# The demo starts a throwaway redis-server when one is installed (an
# embedded miniredis otherwise, which cannot report its uptime and makes the
# worker warn about it).
if wants demo && ! wants test faults; then
	command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
fi
if wants test faults demo && [ -z "${DATABASE_URL:-}" ] && ! have_pg; then
	missing+=(postgresql)
fi
# The fault suite's real partitions put workers in network namespaces with
# ip(8); Sentinel needs no package of its own: the suite runs
# redis-server --sentinel.
if wants faults; then
	command -v ip >/dev/null 2>&1 || missing+=(iproute2)
fi
installs_prometheus=0
if wants test; then
	# recoveryctl's watch is tested in a real terminal: tmux's (send-keys,
	# capture-pane; cmd/recoveryctl/watch_test.go).
	command -v tmux >/dev/null 2>&1 || missing+=(tmux)
	# promtool tests prom/alerts.yml (prom/alerts_test.go); it ships in the
	# prometheus package, which also holds a server we never run.
	if ! command -v promtool >/dev/null 2>&1; then
		missing+=(prometheus)
		installs_prometheus=1
	fi
fi
# pgbouncer (in /usr/sbin: on root's PATH) stands in front of the test
# PostgreSQL in transaction pooling mode for the PgBouncer tests
# (pg_bouncer_test.go) and the fault suite's scenario P1; they start their
# own on a free loopback port.
installs_pgbouncer=0
if wants test faults && ! command -v pgbouncer >/dev/null 2>&1; then
	missing+=(pgbouncer)
	installs_pgbouncer=1
fi
# spin checks model/recovery.pml (scripts/model.sh); it needs gcc.
if wants model; then
	command -v spin >/dev/null 2>&1 || missing+=(spin)
	command -v gcc >/dev/null 2>&1 || missing+=(gcc)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps ($what): installing ${missing[*]}" >&2
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
# prometheus' package enables and starts its server (port 9090) under
# systemd; --no-install-recommends keeps out prometheus-node-exporter. Where
# a policy-rc.d forbids starting services (containers), nothing starts;
# elsewhere the server is stopped and disabled right after: only promtool is
# wanted, and it was not installed before, so no server of the host's is
# touched.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
if [ "$installs_prometheus" -eq 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	$sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
# pgbouncer's package enables its service (port 6432) the same way; only
# the binary is wanted.
if [ "$installs_pgbouncer" -eq 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	$sudo systemctl disable --now pgbouncer.service >/dev/null 2>&1 || true
fi
