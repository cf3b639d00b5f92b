//go:build faults

package faults

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
)

// Scenario T: a stranger overwrites both turn keys (the scan turn and the
// sweep turn) while three workers run, then one of them is SIGKILLed
// mid-block. Before, a string without a TTL over both stopped recovery
// fleet-wide, silently. The workers take both turns back: the dead
// worker's rows are back within the detection bound, the takeover is
// logged at Error (turn, reason, what the stranger wrote), each turn ends
// up held by a worker, nothing is done twice. T1 writes strings without a
// TTL, T2 hashes (another type), T3 strings with an hour's TTL that no
// worker writes. The workers run without an owner column, so both turns
// are in use (the sweep by row version).
func TestScenarioTTurnKeysOverwrittenByAStranger(t *testing.T) {
	for _, v := range []struct {
		name, reason string
		write        func(e *env, key string) error
	}{
		{"T1 TTL-less strings over both turn keys", store.StrangerNoTTL, func(e *env, key string) error {
			return e.rdb.Set(context.Background(), key, "stray", 0).Err()
		}},
		{"T2 hashes over both turn keys", store.StrangerType, func(e *env, key string) error {
			ctx := context.Background()
			if err := e.rdb.Del(ctx, key).Err(); err != nil {
				return err
			}
			return e.rdb.HSet(ctx, key, "stray", "1").Err()
		}},
		{"T3 unknown holders with an hour's TTL over both turn keys", store.StrangerNotWorker, func(e *env, key string) error {
			return e.rdb.Set(context.Background(), key, "stray", time.Hour).Err()
		}},
	} {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, v.name, envConfig{rows: 300})
			ids := []string{"t-w1", "t-w2", "t-w3"}
			ws := e.start(ids, backstopArgs()...) // no owner column: the sweep by row version takes the sweep turn
			victim := ws[0]
			e.waitMidBlock(victim)
			turns := []string{store.ScanTurnKey(e.prefix), store.SweepTurnKey(e.prefix)}
			for _, key := range turns {
				require.NoError(t, v.write(e, key))
			}
			killedAt := time.Now()
			victim.kill(t)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded, "killed mid-block")

			e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
			e.res.Bound = detectionBound
			e.waitGone(victim.id, 2*time.Second)

			const took = "took a turn from a key no live worker held: something other than a worker wrote it (a stray write, a tool, another application under the same prefix); left alone it would have stopped that turn fleet-wide"
			takes := func() map[string]int {
				n := map[string]int{}
				for _, p := range ws[1:] {
					for _, l := range p.lines(took) {
						assert.Equal(t, "ERROR", l["level"])
						assert.Equal(t, v.reason, l["reason"])
						n[l["turn"].(string)]++
					}
				}
				return n
			}
			// The sweep turn is taken at the next sweep, which may come
			// after the scan that found the victim.
			taken := takes()
			for deadline := time.Now().Add(detectionBound); taken["sweep"] == 0 && time.Now().Before(deadline); taken = takes() {
				time.Sleep(50 * time.Millisecond) // pace: the suite's polling of worker logs
			}
			assert.Equal(t, map[string]int{"scan": 1, "sweep": 1}, taken, "each turn taken back once, by one worker")
			for _, key := range turns {
				typ, err := e.rdb.Type(context.Background(), key).Result()
				require.NoError(t, err)
				assert.Contains(t, []string{"string", "none"}, typ, "%s a worker's again", key)
				if typ == "string" {
					assert.NotEqual(t, "stray", e.rdb.Get(context.Background(), key).Val())
				}
			}
			e.res.note("stranded=%d; turns taken from the stranger: %v", len(stranded), taken)
			e.finish(true)
		})
	}
}
