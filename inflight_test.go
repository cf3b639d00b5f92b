package recovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestARowReleasedButNotYetUntrackedIsNoRetakenRow: Release marks its rows
// released before its reset and untracks them after. A heartbeat in
// between must not take them for rows tracked again and rotate the
// incarnation: a Release repeated after a lost reply would then reset
// under the new incarnation, out of the ledger's sight, rows a peer took
// once the first reset committed (simulator seed 1193: five rows reset
// under the peer that held them).
func TestARowReleasedButNotYetUntrackedIsNoRetakenRow(t *testing.T) {
	var s inflight
	s.init()
	s.add([]int64{1, 2, 3})
	s.markReleased([]int64{1, 2})
	assert.False(t, s.retaken(), "released, still tracked until the Release untracks them")

	assert.True(t, s.add([]int64{2}), "Track of a released row")
	assert.True(t, s.retaken())
	gone, next := s.rotation()
	assert.Equal(t, []int64(nil), gone, "row 1 is still tracked: the Release has not untracked it yet")
	s.rotated(next, gone)
	assert.False(t, s.retaken(), "a new incarnation: nothing released under it")

	s.markReleased([]int64{3})
	s.unmarkReleased([]int64{3}) // its reset failed
	s.add([]int64{3})
	assert.False(t, s.retaken(), "a row whose release failed is no released row")
}
