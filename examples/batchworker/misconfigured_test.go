package main

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// misspellSQL makes every fetch leave its rows 'in_progress', a status the
// resetter (statuses inprog and queued) does not take for in progress: the
// table of a host whose statuses disagree with its resetter's.
const misspellSQL = `
CREATE FUNCTION misspell_inprog() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.status = 'inprog' THEN
		NEW.status := 'in_progress';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER misspell_inprog BEFORE UPDATE ON batchrows
	FOR EACH ROW EXECUTE FUNCTION misspell_inprog();`

// TestAMisconfiguredWorkerShutsDownAndExitsNonZero runs the real program on
// a table whose fetch leaves a status the resetter does not take for in
// progress: the self-check fails Healthy with ErrMisconfigured within its
// first blocks, and the program shuts the worker down (heartbeat and
// registry entry gone) and exits with status 1, saying why at Error, so a
// rollout fails loudly instead of running a fleet whose crashes strand
// rows. (Reverted, the loop not asking Healthy: it ran on until killed.)
func TestAMisconfiguredWorkerShutsDownAndExitsNonZero(t *testing.T) {
	f := setup(t, 200)
	_, err := f.pool.Exec(context.Background(), misspellSQL)
	require.NoError(t, err)
	cmd, out := startProcess(t, f, f.args("bw-misconf", 50*time.Millisecond)...)

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a misconfigured worker did not exit")
	}
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "a non-zero exit status")
	assert.Equal(t, 1, exit.ExitCode())
	assert.Regexp(t, `level=ERROR msg="batchworker failed" error="stopping: crash recovery is misconfigured[^\n]*misspelt\?`, out.String())
	assert.Contains(t, out.String(), "batchworker stopped", "Shutdown ran first")
	f.assertGone(t, "bw-misconf")
}
