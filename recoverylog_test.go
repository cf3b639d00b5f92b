package recovery

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRecoveryLoopLogsAFailingPeerOncePerOutage(t *testing.T) {
	_, rdb := newMini(t)
	plantDeadPeer(t, rdb, "ALYA", "p1", "1")
	r := &fakeResetter{}
	r.setFail("p1", errors.New("db down"))
	w, logs := startWorker(t, rdb, r, "workerB", WithTimings(Timings{RecoveryInterval: 100 * time.Millisecond}), WithScanTurn(false))

	waitTurns(t, &signals(w).scan, 3*time.Second, func() bool { return logs.Count("recovery scan done") >= 5 })
	assert.Equal(t, 1, logs.Count("recovery of dead peer failed"))

	r.setFail("p1", nil)
	waitTurns(t, &signals(w).scan, 3*time.Second, func() bool { return logs.Count("recovered rows of dead peer") == 1 })
	assert.Contains(t, logs.String(), `"peer_id":"p1"`)
	assert.Contains(t, logs.String(), `"rows_reset":1`)
}
