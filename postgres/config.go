package postgres

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgcore"
)

// Config is a resetter's configuration as plain values, so a host and
// cmd/recoveryctl can read it from one place: the RECOVERY_* environment
// variables (ConfigFromEnv), flags or a file of the host's own. The zero
// value means every default.
type Config struct {
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

	// fromEnv holds the values ConfigFromEnv read, by variable (the
	// integer as strconv.Itoa writes it), so that Options can make the
	// resetter's errors name the variable of a value still as read.
	fromEnv map[string]string
}

// The environment variables of ConfigFromEnv.
const (
	EnvSchema              = pgcore.EnvSchema
	EnvTable               = pgcore.EnvTable
	EnvIDColumn            = pgcore.EnvIDColumn
	EnvStatusColumn        = pgcore.EnvStatusColumn
	EnvInProgressStatus    = pgcore.EnvInProgressStatus
	EnvQueuedStatus        = pgcore.EnvQueuedStatus
	EnvDoneStatuses        = pgcore.EnvDoneStatuses
	EnvOwnerColumn         = pgcore.EnvOwnerColumn
	EnvRecoveryCountColumn = pgcore.EnvRecoveryCountColumn
	EnvMaxRecoveries       = pgcore.EnvMaxRecoveries
	EnvTerminalStatus      = pgcore.EnvTerminalStatus
	EnvResetLedger         = pgcore.EnvResetLedger
	EnvNoResetLedger       = pgcore.EnvNoResetLedger
)

// ConfigFromEnv reads a Config from the RECOVERY_* environment variables
// through getenv (os.Getenv); an unset or empty variable leaves the
// default. A value that cannot be parsed is an error wrapping
// recovery.ErrInvalidConfig that names the variable; the values themselves
// are checked by the resetter's New. The Config remembers which values it
// read: the errors of a resetter built from its Options name the variable
// of such a value ("schema work (RECOVERY_SCHEMA) does not exist"), which
// is what the operator set, unless the field was changed since (by a
// flag): then they name the option.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
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
			return Config{}, fmt.Errorf("%w: %s=%q is not an integer", contract.ErrInvalidConfig, EnvMaxRecoveries, clip(v))
		}
		c.MaxRecoveries = n
	}
	if v := getenv(EnvNoResetLedger); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, fmt.Errorf("%w: %s=%q is not true or false", contract.ErrInvalidConfig, EnvNoResetLedger, clip(v))
		}
		c.NoResetLedger = b
	}
	c.fromEnv = map[string]string{}
	for name, v := range c.named() {
		if getenv(name) != "" {
			c.fromEnv[name] = v
		}
	}
	return c, nil
}

// named returns the value of each field an error may name, by variable.
func (c Config) named() map[string]string {
	return map[string]string{
		EnvSchema: c.Schema, EnvTable: c.Table, EnvIDColumn: c.IDColumn, EnvStatusColumn: c.StatusColumn,
		EnvInProgressStatus: c.InProgressStatus, EnvQueuedStatus: c.QueuedStatus, EnvOwnerColumn: c.OwnerColumn,
		EnvRecoveryCountColumn: c.RecoveryCountColumn, EnvTerminalStatus: c.TerminalStatus, EnvResetLedger: c.ResetLedger,
		EnvMaxRecoveries: strconv.Itoa(c.MaxRecoveries),
	}
}

// Options returns the Options of c, for pgxreset.New or sqlreset.New: one
// for every field that is set. When c came from ConfigFromEnv, the
// resetter's errors about a value still as read name its RECOVERY_*
// variable, not its option.
func (c Config) Options() []Option {
	var opts []Option
	set := func(v string, f func(string) Option) {
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
	fromEnv := map[string]string{}
	for name, v := range c.named() {
		if read, ok := c.fromEnv[name]; ok && read == v {
			fromEnv[name] = v
		}
	}
	if len(fromEnv) > 0 {
		opts = append(opts, pgcore.WithEnv(fromEnv))
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

// clip shortens s for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
