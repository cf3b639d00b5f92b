#!/usr/bin/env bash
# pg.sh: v2's PostgreSQL renames (plan docs/plans/v2.md §1, §1b, WS-A1).
#
# The resetters left the root package: recovery.NewPgxResetter → pgxreset.New,
# NewSQLResetter → sqlreset.New, the 13 resetter options, ResetterOption,
# PgxConfig, PgxConfigFromEnv, the RECOVERY_* names (but RECOVERY_KEY_PREFIX),
# the table defaults and ErrNoLedger → package postgres; the removed methods
# of the old optional interfaces become calls of the contract
# (ResetIncarnation → Reset, ResetOwnerRows(ctx, o) → Reset(ctx,
# ResetRequest{Owner: o}), UsesLedger() → Info().Ledger, ...).
#
# Usage: scripts/v2rename/pg.sh [file-or-dir ...]
# Without arguments it rewrites the root's _test.go files, examples/, cmd/,
# internal/{faultworker,faults,modcheck,twinworker}, prom and otel. It is
# idempotent: run it again on a tree that has it, and nothing changes. Then
# it runs goimports on the files it changed. The ResetRows(ctx, id, ids)
# calls become resetRows(r, ctx, id, ids), a helper of the root's tests
# (pg_move_helpers_test.go); outside the root, write them by hand.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

if [ $# -eq 0 ]; then
	set -- *_test.go examples cmd internal/faultworker internal/faults internal/modcheck internal/twinworker prom otel
fi

GOIMPORTS=${GOIMPORTS:-$HOME/go/bin/goimports}

files=$(find "$@" -name '*.go' -type f 2>/dev/null | sort -u)
[ -n "$files" ] || exit 0

opts='Table|Schema|IDColumn|StatusColumn|Statuses|DoneStatuses|ChunkSize|OwnerColumn|RecoveryCountColumn|MaxRecoveries|ResetLedger|LedgerRetention'
envs='Schema|Table|IDColumn|StatusColumn|InProgressStatus|QueuedStatus|DoneStatuses|OwnerColumn|RecoveryCountColumn|MaxRecoveries|TerminalStatus|ResetLedger|NoResetLedger'
defs='Table|IDColumn|StatusColumn|InProgressStatus|QueuedStatus|DoneStatus|TerminalStatus|LedgerTable|LedgerRetention'

changed=()
for f in $files; do
	before=$(md5sum "$f")
	perl -0pi -e '
		# Constructors and types; an embedded *PgxResetter (PgxExecer) is
		# now an embedded *pgxreset.Resetter (pgxreset.Execer), field
		# Resetter (Execer).
		s/(?<!\w)(?<!\w\.)(?:PgxResetter|SQLResetter|pgxreset\.Resetter|sqlreset\.Resetter):(?=\s)/Resetter:/g;
		s/(?<!\w)(?<!\w\.)(?:PgxExecer|SQLExecer|pgxreset\.Execer|sqlreset\.Execer):(?=\s)/Execer:/g;
		s/(?<!recovery)(?<=\w)\.(?:PgxExecer|SQLExecer)\b/.Execer/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?NewPgxResetter\(/pgxreset.New(/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?NewSQLResetter\(/sqlreset.New(/g;
		s/(?<!\w)(?<!\w\.)recovery\.PgxResetter\b/pgxreset.Resetter/g;
		s/(?<!\w)(?<!\w\.)recovery\.SQLResetter\b/sqlreset.Resetter/g;
		s/(?<!\w)(?<!\w\.)(?<!")PgxResetter\b(?!\w)/pgxreset.Resetter/g;
		s/(?<!\w)(?<!\w\.)(?<!")SQLResetter\b(?!\w)/sqlreset.Resetter/g;
		s/(?<!recovery)(?<=\w)\.PgxResetter\b/.Resetter/g;
		s/(?<!recovery)(?<=\w)\.SQLResetter\b/.Resetter/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?PgxExecer\b/pgxreset.Execer/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?SQLExecer\b/sqlreset.Execer/g;
		# Options and configuration.
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?With('"$opts"')\(/postgres.With$1(/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?WithoutResetLedger\(/postgres.WithoutResetLedger(/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?ResetterOption\b/postgres.Option/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?PgxConfigFromEnv\b/postgres.ConfigFromEnv/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?PgxConfig\b/postgres.Config/g;
		s/\.OptionsNamingEnv\([^()]*\)/.Options()/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?Env('"$envs"')\b/postgres.Env$1/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?DefaultResetChunkSize\b/postgres.DefaultChunkSize/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?Default('"$defs"')\b/postgres.Default$1/g;
		s/(?<!\w)(?<!\w\.)(?:recovery\.)?ErrNoLedger\b/postgres.ErrNoLedger/g;
		# The methods of the old optional interfaces, as contract calls.
		s/\.ResetIncarnation\(/.Reset(/g;
		s/\.ResetOwnerRows\(([^,()]+(?:\(\))?), ([^()]+?)\)/.Reset($1, ResetRequest{Owner: $2})/g;
		s/\.ResetRowsReport\(([^,()]+(?:\(\))?), ([^,]+), ([^()]+?(?:\{[^{}]*\})?)\)/.Reset($1, ResetRequest{InstanceID: $2, RowIDs: $3})/g;
		s/(?<!\w)(?<!\w\.)(\w+)\.ResetRows\(/resetRows($1, /g;
		s/\.UsesLedger\(\)/.Info().Ledger/g;
		s/\.FencesByOwner\(\)/.Info().OwnerFencing/g;
	' "$f"
	# Outside the root package the contract types are recovery.X.
	if ! grep -q '^package recovery$' "$f"; then
		perl -0pi -e 's/(?<!\w)(?<!\w\.)ResetRequest\{Owner: /recovery.ResetRequest{Owner: /g; s/(?<!\w)(?<!\w\.)ResetRequest\{InstanceID: /recovery.ResetRequest{InstanceID: /g' "$f"
		perl -0pi -e 's/recovery\.recovery\./recovery./g' "$f"
	fi
	if [ "$before" != "$(md5sum "$f")" ]; then
		changed+=("$f")
	fi
done

if [ ${#changed[@]} -gt 0 ]; then
	"$GOIMPORTS" -w "${changed[@]}"
	printf '%s\n' "${changed[@]}"
fi
