package postgres

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/contract"
	"github.com/alya/recovery/internal/pgcore"
)

// apply returns the settings opts give over the defaults.
func apply(opts ...Option) pgcore.Settings {
	s := pgcore.Defaults()
	for _, o := range opts {
		o.Apply(&s)
	}
	return s
}

func TestConfigOptionsSetEveryResetterOption(t *testing.T) {
	c := Config{
		Schema: "work", Table: "items", IDColumn: "item_id", StatusColumn: "state",
		InProgressStatus: "running", QueuedStatus: "pending", DoneStatuses: []string{"done", "cancelled"},
		OwnerColumn: "worker", RecoveryCountColumn: "retries", MaxRecoveries: 3, TerminalStatus: "dead",
		ResetLedger: "my_ledger", NoResetLedger: true,
	}
	want := pgcore.Settings{
		Schema: "work", Table: "items", IDColumn: "item_id", StatusColumn: "state",
		OwnerColumn: "worker", CountColumn: "retries", InProg: "running", Queued: "pending", Terminal: "dead",
		Done: []string{"done", "cancelled"}, MaxRecoveries: 3, ChunkSize: DefaultChunkSize,
		LedgerTable: "my_ledger", NoLedger: true, LedgerRetention: DefaultLedgerRetention,
	}
	assert.Equal(t, want, apply(c.Options()...))

	// The zero value is every default.
	assert.Equal(t, pgcore.Defaults(), apply(Config{}.Options()...))

	// One status alone keeps the other's default.
	s := apply(Config{QueuedStatus: "pending"}.Options()...)
	assert.Equal(t, []string{DefaultInProgressStatus, "pending"}, []string{s.InProg, s.Queued})

	env := map[string]string{EnvTable: "items", EnvDoneStatuses: " done , ,cancelled", EnvNoResetLedger: "1", EnvMaxRecoveries: "3"}
	got, err := ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	got.fromEnv = nil
	assert.Equal(t, Config{Table: "items", DoneStatuses: []string{"done", "cancelled"}, NoResetLedger: true, MaxRecoveries: 3}, got)
	env[EnvNoResetLedger] = "perhaps"
	_, err = ConfigFromEnv(func(k string) string { return env[k] })
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), `RECOVERY_NO_RESET_LEDGER="perhaps"`)
	env[EnvNoResetLedger], env[EnvMaxRecoveries] = "", "three"
	_, err = ConfigFromEnv(func(k string) string { return env[k] })
	require.ErrorIs(t, err, contract.ErrInvalidConfig)
	assert.Contains(t, err.Error(), `RECOVERY_MAX_RECOVERIES="three" is not an integer`)
}

// TestConfigFromEnvNamesTheVariableOfASettingFromTheEnvironment: the
// errors of a resetter built from a Config read from the environment name
// the variable of a value still as read; a value set by its option, or
// changed since (by a flag), is named by its option.
func TestConfigFromEnvNamesTheVariableOfASettingFromTheEnvironment(t *testing.T) {
	env := map[string]string{EnvSchema: "work", EnvStatusColumn: "state", EnvMaxRecoveries: "3"}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	s := apply(c.Options()...)
	assert.Equal(t, "RECOVERY_SCHEMA", s.Named(EnvSchema, "WithSchema", s.Schema))
	assert.Equal(t, "RECOVERY_STATUS_COLUMN", s.Named(EnvStatusColumn, "WithStatusColumn", s.StatusColumn))
	assert.Equal(t, "RECOVERY_MAX_RECOVERIES", s.Named(EnvMaxRecoveries, "WithMaxRecoveries", "3"))
	assert.Equal(t, "WithTable", s.Named(EnvTable, "WithTable", s.Table), "the default table came from no variable")

	c.MaxRecoveries, c.Schema = 4, "other" // flags changed them
	s = apply(c.Options()...)
	assert.Equal(t, "WithMaxRecoveries", s.Named(EnvMaxRecoveries, "WithMaxRecoveries", "4"))
	assert.Equal(t, "WithSchema", s.Named(EnvSchema, "WithSchema", s.Schema))
	assert.Equal(t, "RECOVERY_STATUS_COLUMN", s.Named(EnvStatusColumn, "WithStatusColumn", s.StatusColumn))

	plain := Config{Schema: "work"}
	s = apply(plain.Options()...)
	assert.Equal(t, "WithSchema", s.Named(EnvSchema, "WithSchema", s.Schema), "set by hand, not from the environment")
}
