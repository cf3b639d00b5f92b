package testutil

import (
	"slices"
	"testing"
)

// TestGoBuildFlagsFollowTheTestBinary: a program built with GoBuildFlags
// uses the race detector exactly when this test binary does.
func TestGoBuildFlagsFollowTheTestBinary(t *testing.T) {
	if got := slices.Contains(GoBuildFlags(), "-race"); got != raceBuild {
		t.Fatalf("GoBuildFlags() = %q in a test binary built with -race=%v", GoBuildFlags(), raceBuild)
	}
}
