package pgcore

import (
	"errors"
	"maps"
	"time"
)

// Defaults of the resetter, from the design's schema. Package postgres
// exports them (postgres.DefaultTable, ...), where their users read them.
const (
	DefaultTable            = "batchrows"
	DefaultIDColumn         = "rowid"
	DefaultStatusColumn     = "status"
	DefaultInProgressStatus = "inprog"
	DefaultQueuedStatus     = "queued"
	DefaultDoneStatus       = "done"
	DefaultChunkSize        = 5000
	DefaultTerminalStatus   = "failed"
	DefaultLedgerTable      = "recovery_ledger"
	DefaultLedgerRetention  = 7 * 24 * time.Hour
)

// The RECOVERY_* environment variables of postgres.ConfigFromEnv. Errors
// about a value that came from one of them name it (Settings.Named).
const (
	EnvSchema              = "RECOVERY_SCHEMA"
	EnvTable               = "RECOVERY_TABLE"
	EnvIDColumn            = "RECOVERY_ID_COLUMN"
	EnvStatusColumn        = "RECOVERY_STATUS_COLUMN"
	EnvInProgressStatus    = "RECOVERY_INPROG_STATUS"
	EnvQueuedStatus        = "RECOVERY_QUEUED_STATUS"
	EnvDoneStatuses        = "RECOVERY_DONE_STATUSES"
	EnvOwnerColumn         = "RECOVERY_OWNER_COLUMN"
	EnvRecoveryCountColumn = "RECOVERY_RECOVERY_COUNT_COLUMN"
	EnvMaxRecoveries       = "RECOVERY_MAX_RECOVERIES"
	EnvTerminalStatus      = "RECOVERY_TERMINAL_STATUS"
	EnvResetLedger         = "RECOVERY_RESET_LEDGER"
	EnvNoResetLedger       = "RECOVERY_NO_RESET_LEDGER"
)

// ErrNoLedger is postgres.ErrNoLedger: see there.
var ErrNoLedger = errors.New("recovery: reset ledger table missing")

// Settings are a resetter's options, applied over Defaults.
type Settings struct {
	Schema, Table, IDColumn, StatusColumn string
	OwnerColumn, CountColumn              string
	InProg, Queued, Terminal              string
	Done                                  []string
	MaxRecoveries                         int
	ChunkSize                             int
	LedgerTable                           string
	NoLedger                              bool
	LedgerRetention                       time.Duration
	// FromEnv holds the values postgres.Config.Options took from the
	// environment, by variable: an error about such a value names the
	// variable, which is what the operator set, not the option.
	FromEnv map[string]string
}

// Defaults returns the settings no option has changed.
func Defaults() Settings {
	return Settings{
		Table:           DefaultTable,
		IDColumn:        DefaultIDColumn,
		StatusColumn:    DefaultStatusColumn,
		InProg:          DefaultInProgressStatus,
		Queued:          DefaultQueuedStatus,
		Done:            []string{DefaultDoneStatus},
		ChunkSize:       DefaultChunkSize,
		LedgerTable:     DefaultLedgerTable,
		LedgerRetention: DefaultLedgerRetention,
	}
}

// Option is postgres.Option: it changes Settings. Apply is nil only in
// the zero Option, which New refuses as a nil option.
type Option struct {
	Apply func(*Settings)
}

// WithEnv records that the values in vars (variable → value) came from
// the environment, for Named.
func WithEnv(vars map[string]string) Option {
	return Option{Apply: func(s *Settings) {
		if s.FromEnv == nil {
			s.FromEnv = map[string]string{}
		}
		maps.Copy(s.FromEnv, vars)
	}}
}

// Named is how errors name the setting of value: the environment variable
// env when the value came from it (postgres.ConfigFromEnv), else option.
func (s *Settings) Named(env, option, value string) string {
	if v, ok := s.FromEnv[env]; ok && v == value {
		return env
	}
	return option
}
