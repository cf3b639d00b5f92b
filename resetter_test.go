package recovery

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/alya/recovery/internal/testutil"
)

// metricsResetter is a host's plain decorator: it counts resets and
// forwards ResetRows, and nothing else.
type metricsResetter struct {
	inner RowResetter
	calls int
}

func (m *metricsResetter) ResetRows(ctx context.Context, peer string, ids []int64) (int64, error) {
	m.calls++
	return m.inner.ResetRows(ctx, peer, ids)
}

// fullWrapper forwards every method of the bundled resetters.
type fullWrapper struct{ pgResetterAPI }

func TestNewWarnsOnceWhatAWrappedResetterLoses(t *testing.T) {
	_, rdb := newMini(t)
	db := testutil.Postgres(t)
	const warning = "the resetter lacks optional interfaces"

	_, logs := newWorker(t, rdb, &metricsResetter{inner: fencedResetter(t, db)}, "wrapped")
	assert.Equal(t, 1, logs.Count(warning), "one Warn")
	line := ""
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, warning) {
			line = l
		}
	}
	assert.Contains(t, line, `"level":"WARN"`)
	assert.Contains(t, line, `"resetter_type":"*recovery.metricsResetter"`)
	assert.Contains(t, line, `"missing":"IncarnationResetter, ResetReporter, OwnerFencer, UsesLedger() bool, OwnerSweeper, RowsSweeper, SchemaChecker, RowStateReader, OwnerPlanner, ResetPlanner"`)
	assert.Contains(t, line, "a recoverer dying after its COMMIT can have the same rows reset twice", "each loss says what it costs")

	for _, impl := range resetterImpls {
		_, logs := newWorker(t, rdb, impl.mustResetter(t, db), "bare-"+impl.name)
		assert.Zero(t, logs.Count(warning), "%s: ours have everything", impl.name)
		_, logs = newWorker(t, rdb, impl.mustResetter(t, db, WithOwnerColumn("owner")), "fenced-"+impl.name)
		assert.Zero(t, logs.Count(warning), impl.name)
	}
	_, logs = newWorker(t, rdb, fullWrapper{fencedResetter(t, db)}, "complete")
	assert.Zero(t, logs.Count(warning), "a wrapper that forwards everything")
}
