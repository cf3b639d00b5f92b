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
