package recovery

import (
	"fmt"
	"strconv"
	"strings"
)

// PgxConfig is a PgxResetter's configuration as plain values, so a host
// and cmd/recoveryctl can read it from one place: the RECOVERY_*
// environment variables (PgxConfigFromEnv), flags or a file of the host's
// own. The zero value means every default.
type PgxConfig struct {
	Schema              string   // WithSchema; RECOVERY_SCHEMA
	Table               string   // WithTable; RECOVERY_TABLE
	IDColumn            string   // WithIDColumn; RECOVERY_ID_COLUMN
	StatusColumn        string   // WithStatusColumn; RECOVERY_STATUS_COLUMN
	InProgressStatus    string   // WithStatuses; RECOVERY_INPROG_STATUS
	QueuedStatus        string   // WithStatuses; RECOVERY_QUEUED_STATUS
	DoneStatuses        []string // WithDoneStatuses; RECOVERY_DONE_STATUSES, comma-separated
	OwnerColumn         string   // WithOwnerColumn; RECOVERY_OWNER_COLUMN
	RecoveryCountColumn string   // WithRecoveryCountColumn; RECOVERY_RECOVERY_COUNT_COLUMN
	MaxRecoveries       int      // WithMaxRecoveries; RECOVERY_MAX_RECOVERIES
	TerminalStatus      string   // WithMaxRecoveries; RECOVERY_TERMINAL_STATUS
	ResetLedger         string   // WithResetLedger; RECOVERY_RESET_LEDGER
	NoResetLedger       bool     // WithoutResetLedger; RECOVERY_NO_RESET_LEDGER (true or 1)
}

// The environment variables of PgxConfigFromEnv, and RECOVERY_KEY_PREFIX
// for WithKeyPrefix, which cmd/recoveryctl reads too.
const (
	EnvKeyPrefix           = "RECOVERY_KEY_PREFIX"
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

// PgxConfigFromEnv reads a PgxConfig from the RECOVERY_* environment
// variables through getenv (os.Getenv); an unset or empty variable leaves
// the default. A value that cannot be parsed is an error wrapping
// ErrInvalidConfig that names the variable; the values themselves are
// checked by NewPgxResetter.
func PgxConfigFromEnv(getenv func(string) string) (PgxConfig, error) {
	c := PgxConfig{
		Schema:              getenv(EnvSchema),
		Table:               getenv(EnvTable),
		IDColumn:            getenv(EnvIDColumn),
		StatusColumn:        getenv(EnvStatusColumn),
		InProgressStatus:    getenv(EnvInProgressStatus),
		QueuedStatus:        getenv(EnvQueuedStatus),
		DoneStatuses:        splitList(getenv(EnvDoneStatuses)),
		OwnerColumn:         getenv(EnvOwnerColumn),
		RecoveryCountColumn: getenv(EnvRecoveryCountColumn),
		TerminalStatus:      getenv(EnvTerminalStatus),
		ResetLedger:         getenv(EnvResetLedger),
	}
	if v := getenv(EnvMaxRecoveries); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return PgxConfig{}, fmt.Errorf("%w: %s=%q is not an integer", ErrInvalidConfig, EnvMaxRecoveries, clip(v))
		}
		c.MaxRecoveries = n
	}
	if v := getenv(EnvNoResetLedger); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return PgxConfig{}, fmt.Errorf("%w: %s=%q is not true or false", ErrInvalidConfig, EnvNoResetLedger, clip(v))
		}
		c.NoResetLedger = b
	}
	return c, nil
}

// Options returns the ResetterOptions of c, for NewPgxResetter: one for
// every field that is set.
func (c PgxConfig) Options() []ResetterOption {
	var opts []ResetterOption
	set := func(v string, f func(string) ResetterOption) {
		if v != "" {
			opts = append(opts, f(v))
		}
	}
	set(c.Schema, WithSchema)
	set(c.Table, WithTable)
	set(c.IDColumn, WithIDColumn)
	set(c.StatusColumn, WithStatusColumn)
	set(c.OwnerColumn, WithOwnerColumn)
	set(c.RecoveryCountColumn, WithRecoveryCountColumn)
	set(c.ResetLedger, WithResetLedger)
	if c.InProgressStatus != "" || c.QueuedStatus != "" {
		inprog, queued := c.InProgressStatus, c.QueuedStatus
		if inprog == "" {
			inprog = DefaultInProgressStatus
		}
		if queued == "" {
			queued = DefaultQueuedStatus
		}
		opts = append(opts, WithStatuses(inprog, queued))
	}
	if len(c.DoneStatuses) > 0 {
		opts = append(opts, WithDoneStatuses(c.DoneStatuses...))
	}
	if c.MaxRecoveries != 0 || c.TerminalStatus != "" {
		opts = append(opts, WithMaxRecoveries(c.MaxRecoveries, c.TerminalStatus))
	}
	if c.NoResetLedger {
		opts = append(opts, WithoutResetLedger())
	}
	return opts
}

// OptionsNamingEnv returns Options, and makes the resetter's errors name
// the RECOVERY_* variable of a setting, not its option, where the
// variable (read through getenv, as PgxConfigFromEnv reads it) holds the
// value c has: "schema work (RECOVERY_SCHEMA) does not exist". Use it
// when c came from PgxConfigFromEnv, so an operator reads the name of what
// they set. A setting changed since (by a flag) is named by its option.
func (c PgxConfig) OptionsNamingEnv(getenv func(string) string) []ResetterOption {
	opts := c.Options()
	fromEnv := map[string]string{}
	for name, v := range map[string]string{
		EnvSchema: c.Schema, EnvTable: c.Table, EnvIDColumn: c.IDColumn, EnvStatusColumn: c.StatusColumn,
		EnvInProgressStatus: c.InProgressStatus, EnvQueuedStatus: c.QueuedStatus, EnvOwnerColumn: c.OwnerColumn,
		EnvRecoveryCountColumn: c.RecoveryCountColumn, EnvTerminalStatus: c.TerminalStatus, EnvResetLedger: c.ResetLedger,
		EnvMaxRecoveries: strconv.Itoa(c.MaxRecoveries),
	} {
		if v != "" && getenv(name) == v {
			fromEnv[name] = v
		}
	}
	if len(fromEnv) > 0 {
		opts = append(opts, withEnv(fromEnv))
	}
	return opts
}

// splitList splits a comma-separated list, trimming spaces and dropping
// empty parts; "" gives nil.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
