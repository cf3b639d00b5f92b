package postgres

import (
	"slices"
	"time"

	"github.com/alya/recovery/internal/pgcore"
)

// An Option configures a pgxreset.Resetter or a sqlreset.Resetter: its
// table, columns, statuses, reset ledger and quarantine. Build one with
// the With* functions of this package; the zero Option is refused as nil.
type Option = pgcore.Option

func option(f func(*pgcore.Settings)) Option { return Option{Apply: f} }

// WithTable sets the table that holds the rows; it is quoted as one
// identifier (use WithSchema for a schema). Default: DefaultTable ("batchrows").
func WithTable(name string) Option {
	return option(func(s *pgcore.Settings) { s.Table = name })
}

// WithSchema sets the schema of the table. Default: none, the connection's
// search_path decides.
func WithSchema(name string) Option {
	return option(func(s *pgcore.Settings) { s.Schema = name })
}

// WithIDColumn sets the bigint row ID column. Default: DefaultIDColumn ("rowid").
func WithIDColumn(name string) Option {
	return option(func(s *pgcore.Settings) { s.IDColumn = name })
}

// WithStatusColumn sets the status column. Default: DefaultStatusColumn ("status").
func WithStatusColumn(name string) Option {
	return option(func(s *pgcore.Settings) { s.StatusColumn = name })
}

// WithStatuses sets the status values of a row in progress and of a queued
// row; they must differ and not be empty. Defaults: DefaultInProgressStatus
// ("inprog") and DefaultQueuedStatus ("queued").
func WithStatuses(inprog, queued string) Option {
	return option(func(s *pgcore.Settings) { s.InProg, s.Queued = inprog, queued })
}

// WithDoneStatuses lists every status a finished row can have. Recovery
// uses it to tell a row a dead worker finished (left alone, as it should
// be) from a row it could not reset because a status is misconfigured
// (kept and reported, see recovery.ResetResult.NotReset). Each must differ
// from the in-progress status. Default: DefaultDoneStatus ("done").
func WithDoneStatuses(statuses ...string) Option {
	return option(func(s *pgcore.Settings) { s.Done = slices.Clone(statuses) })
}

// WithChunkSize sets how many row IDs one UPDATE carries; it must be
// positive. Default: DefaultChunkSize (5000).
func WithChunkSize(n int) Option {
	return option(func(s *pgcore.Settings) { s.ChunkSize = n })
}

// WithOwnerColumn turns on owner fencing: the text column col holds the
// owner value of the worker that took the row (recovery.Worker.OwnerValue;
// FetchBlockOfRows sets it when it marks rows in progress). A reset then
// only changes rows that the dead instance still owns, and clears the
// owner:
//
//	... SET <status> = $queued, <owner> = NULL
//	WHERE <id> = ANY($1) AND <status> = $inprog AND <owner> = $dead
//
// so a row another worker has taken since is never reset under it. It
// also turns on owner mode and the backstop sweep by owner
// (recovery.ResetterInfo.OwnerFencing). Default: off. Recommended; see
// docs/safety.md for the host side.
func WithOwnerColumn(col string) Option {
	return option(func(s *pgcore.Settings) { s.OwnerColumn = col })
}

// WithRecoveryCountColumn names an integer column (NOT NULL DEFAULT 0) that
// every reset increments in the same UPDATE. Default: off.
func WithRecoveryCountColumn(col string) Option {
	return option(func(s *pgcore.Settings) { s.CountColumn = col })
}

// WithMaxRecoveries quarantines poison rows: a reset that brings a row's
// recovery count to n sets it to terminalStatus ("" means
// DefaultTerminalStatus, "failed") instead of queued, so a row that kills
// every worker that takes it stops crash-looping the fleet. It needs
// WithRecoveryCountColumn; n must be at least 1. Default: off.
func WithMaxRecoveries(n int, terminalStatus string) Option {
	return option(func(s *pgcore.Settings) {
		s.MaxRecoveries = n
		s.Terminal = terminalStatus
		if s.Terminal == "" {
			s.Terminal = DefaultTerminalStatus
		}
	})
}

// WithResetLedger names the reset ledger's table (in the schema of
// WithSchema). Without WithOwnerColumn every reset by ID is recorded
// there; with it, only the reset of rows without an owner that a dead
// worker's rows set lists (a worker that does not set the column, during
// its rollout), and only when the table exists. Create it with
// CreateLedger or the migration in docs/integration.md. Default:
// DefaultLedgerTable ("recovery_ledger").
func WithResetLedger(table string) Option {
	return option(func(s *pgcore.Settings) { s.LedgerTable = table })
}

// WithoutResetLedger turns the reset ledger off: for a resetter without an
// owner column, and, with one, for the rows without an owner of a dead
// worker's rows set (reset then without it). Then a reset whose outcome
// Redis never learnt (the recoverer died, or lost the COMMIT's reply) is
// applied again by the next recoverer, and resets rows a live worker has
// taken since: use it only where rows are processed idempotently.
// Default: the ledger is on.
func WithoutResetLedger() Option {
	return option(func(s *pgcore.Settings) { s.NoLedger = true })
}

// WithLedgerRetention sets how long reset ledger entries are kept; it must
// be at least an hour. Default: DefaultLedgerRetention (7 days).
func WithLedgerRetention(d time.Duration) Option {
	return option(func(s *pgcore.Settings) { s.LedgerRetention = d })
}
