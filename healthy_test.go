package recovery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHealthyReportsEveryReasonAtOnce: a worker whose lease is not valid
// and that tracked rows after their COMMIT fails Healthy with both, so a
// probe asking errors.Is for ErrUntrackedRows is answered during an
// outage too; a single reason is returned unwrapped.
func TestHealthyReportsEveryReasonAtOnce(t *testing.T) {
	w, err := New(idleClient(t), &fakeResetter{})
	require.NoError(t, err)
	assert.Same(t, ErrNotStarted, w.Healthy(), "one reason, as it is")
	w.untracked.at.Store(time.Now().UnixNano())
	got := w.Healthy()
	assert.ErrorIs(t, got, ErrNotStarted)
	assert.ErrorIs(t, got, ErrUntrackedRows)
}
