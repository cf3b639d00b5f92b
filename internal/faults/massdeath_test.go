//go:build faults

package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Scenario D1: a zone outage. 10,000 registered workers died at once
// (registry entries without a heartbeat), then one of two live workers
// is SIGKILLed mid-block (one survivor: no second scanner takes the scan
// turn while the first works through the dead). Its rows come back within the detection bound,
// found by the scan (rows-set mode without the backstop sweep: nothing
// else would find them), whatever the dead entries ahead of it. With the
// scan of release 0.2, one peer after another, they came back after 4.5
// to 8.8 s, or never without the sweep.
func TestScenarioD1MassDeathThenSigkillMidBlock(t *testing.T) {
	for _, ownerMode := range []bool{false, true} {
		name := "D1 10,000 dead entries, then SIGKILL mid-block (rows sets, no sweep)"
		if ownerMode {
			name = "D1 owner mode: 10,000 dead entries, then SIGKILL mid-block"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, name, envConfig{rows: 300, ownerMode: ownerMode})
			var extra []string
			if !ownerMode {
				extra = append(extra, "-no-backstop")
			}
			ws := e.start([]string{"d1-w1", "d1-w2"}, extra...)
			victim := ws[0]
			e.waitMidBlock(victim)
			dead := make([]any, 10_000)
			for i := range dead {
				dead[i] = fmt.Sprintf("d1-dead-%05d", i)
			}
			require.NoError(t, e.rdb.SAdd(context.Background(), e.registry(), dead...).Err())
			killedAt := time.Now()
			victim.kill(t)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded, "killed mid-block")

			e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
			e.res.Bound = detectionBound
			e.res.note("stranded=%d, dead entries=%d", len(stranded), len(dead))
			e.finish(true)
		})
	}
}
