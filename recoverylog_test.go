package recovery

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecoveryLoopLogsAFailingPeerOncePerOutage(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "1")
	r := &fakeResetter{}
	r.setFail("p1", errors.New("db down"))
	_, logs := startWorker(t, rdb, r, "workerB", WithTimings(Timings{RecoveryInterval: 100 * time.Millisecond}), WithScanTurn(false))

	require.Eventually(t, func() bool { return logs.Count("recovery scan done") >= 5 }, 3*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.Count("recovery of dead peer failed"))

	r.setFail("p1", nil)
	require.Eventually(t, func() bool { return logs.Count("recovered rows of dead peer") == 1 }, 3*time.Second, 5*time.Millisecond)
	assert.Contains(t, logs.String(), `"peer_id":"p1"`)
	assert.Contains(t, logs.String(), `"rows_reset":1`)
}
