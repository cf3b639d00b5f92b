package recovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPgxConfigOptionsSetEveryResetterOption(t *testing.T) {
	db := struct{ PgxExecer }{}
	c := PgxConfig{
		Schema: "work", Table: "items", IDColumn: "item_id", StatusColumn: "state",
		InProgressStatus: "running", QueuedStatus: "pending", DoneStatuses: []string{"done", "cancelled"},
		OwnerColumn: "worker", RecoveryCountColumn: "retries", MaxRecoveries: 3, TerminalStatus: "dead",
		ResetLedger: "my_ledger", NoResetLedger: true,
	}
	r, err := NewPgxResetter(db, c.Options()...)
	require.NoError(t, err)
	want := resetterOptions{
		schema: "work", table: "items", idColumn: "item_id", statusColumn: "state",
		ownerColumn: "worker", countColumn: "retries", inprog: "running", queued: "pending", terminal: "dead",
		done: []string{"done", "cancelled"}, maxRecoveries: 3, chunkSize: DefaultResetChunkSize,
		ledgerTable: "my_ledger", noLedger: true, ledgerRetention: DefaultLedgerRetention,
	}
	assert.Equal(t, want, r.o)

	// The zero value is every default.
	def, err := NewPgxResetter(db)
	require.NoError(t, err)
	r, err = NewPgxResetter(db, PgxConfig{}.Options()...)
	require.NoError(t, err)
	assert.Equal(t, def.o, r.o)

	// One status alone keeps the other's default.
	r, err = NewPgxResetter(db, PgxConfig{QueuedStatus: "pending"}.Options()...)
	require.NoError(t, err)
	assert.Equal(t, []string{DefaultInProgressStatus, "pending"}, []string{r.o.inprog, r.o.queued})

	env := map[string]string{EnvTable: "items", EnvDoneStatuses: " done , ,cancelled", EnvNoResetLedger: "1", EnvMaxRecoveries: "3"}
	got, err := PgxConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	assert.Equal(t, PgxConfig{Table: "items", DoneStatuses: []string{"done", "cancelled"}, NoResetLedger: true, MaxRecoveries: 3}, got)
	env[EnvNoResetLedger] = "perhaps"
	_, err = PgxConfigFromEnv(func(k string) string { return env[k] })
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), `RECOVERY_NO_RESET_LEDGER="perhaps"`)
}

// TestOptionsNamingEnvNamesTheVariableOfASettingFromTheEnvironment: an
// error about a value the environment gave names the variable; the same
// value set by its option, or a variable overridden since, names the
// option.
func TestOptionsNamingEnvNamesTheVariableOfASettingFromTheEnvironment(t *testing.T) {
	db := struct{ PgxExecer }{}
	env := map[string]string{EnvMaxRecoveries: "3", EnvTerminalStatus: "dead"}
	getenv := func(k string) string { return env[k] }
	c, err := PgxConfigFromEnv(getenv)
	require.NoError(t, err)
	_, err = NewPgxResetter(db, c.OptionsNamingEnv(getenv)...)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 3 (RECOVERY_MAX_RECOVERIES) needs a recovery count column (WithRecoveryCountColumn or RECOVERY_RECOVERY_COUNT_COLUMN)")

	_, err = NewPgxResetter(db, c.Options()...)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 3 (WithMaxRecoveries) needs a recovery count column (WithRecoveryCountColumn)")

	c.MaxRecoveries = 4 // a flag changed it
	_, err = NewPgxResetter(db, c.OptionsNamingEnv(getenv)...)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "max recoveries 4 (WithMaxRecoveries)")

	env = map[string]string{EnvSchema: "work", EnvStatusColumn: "state"}
	c, err = PgxConfigFromEnv(getenv)
	require.NoError(t, err)
	r, err := NewPgxResetter(db, c.OptionsNamingEnv(getenv)...)
	require.NoError(t, err)
	assert.Equal(t, "RECOVERY_SCHEMA", r.o.named(EnvSchema, "WithSchema", r.o.schema))
	assert.Equal(t, "RECOVERY_STATUS_COLUMN", r.o.named(EnvStatusColumn, "WithStatusColumn", r.o.statusColumn))
	assert.Equal(t, "WithTable", r.o.named(EnvTable, "WithTable", r.o.table), "the default table came from no variable")
}
