package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestACorrectSetupLogsNoWarning runs the real program as three processes
// on a correct setup, kills one with SIGKILL mid-block and lets the other
// two recover its rows and finish the batch: nothing any of them printed
// is a warning or an error. A crash is what the library is for; recovering
// one is Info, not a warning.
func TestACorrectSetupLogsNoWarning(t *testing.T) {
	f := setup(t, 120)
	_, victimOut := killMidBlock(t, f, "bw-victim", 100*time.Millisecond)

	type proc struct {
		name string
		wait func() error
		out  *syncBuffer
	}
	var peers []proc
	for _, id := range []string{"bw-a", "bw-b"} {
		cmd, out := startProcess(t, f, f.args(id, 2*time.Millisecond, "-exit-when-done")...)
		peers = append(peers, proc{id, cmd.Wait, out})
	}
	for _, p := range peers {
		done := make(chan error, 1)
		go func() { done <- p.wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, "%s exit status 0:\n%s", p.name, p.out)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not finish the batch", p.name)
		}
	}
	assert.Equal(t, 120, f.count(t, `status = 'done'`))

	all := victimOut.String()
	for _, p := range peers {
		all += p.out.String()
	}
	assert.Contains(t, all, `msg="recovered rows of dead peer"`, "a peer recovered the killed worker")
	for _, l := range strings.Split(all, "\n") {
		// Redis answering later than the operation timeout is the
		// machine's load, not the setup's; its Warn names the assumption.
		if strings.Contains(l, `msg="heartbeat failed; retrying"`) && strings.Contains(l, "did not answer within the operation timeout") {
			continue
		}
		assert.NotRegexp(t, `level=(WARN|ERROR)`, l, "a correct setup warns of nothing")
	}
}
