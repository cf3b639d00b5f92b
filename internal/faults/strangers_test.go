//go:build faults

package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
)

// strangerCase is one shared key (or two) a stranger overwrites while
// three workers run, before one of them is SIGKILLed mid-block.
type strangerCase struct {
	name string
	// keys are the keys the stranger writes; victim is the worker to kill.
	keys  func(e *env, victim string) []string
	write func(e *env, key string) error
	// args are the workers' flags beyond backstopArgs.
	args []string
	// check is the case's own assertion, once the victim's rows are back:
	// what the live workers logged of the stranger, what became of its
	// write. It returns the result line's note.
	check func(t *testing.T, e *env, live []*proc, keys []string) string
}

// Scenario T: a stranger overwrites a key the fleet shares while three
// workers run, then one of them is SIGKILLed mid-block. The dead worker's
// rows must be back within the detection bound whichever key it was, and
// nothing done twice; each case then checks what the live workers said
// of the stranger. The workers run without an owner column, so both turns
// are in use (the sweep by row version).
//
// T1-T3 overwrite both turn keys (the scan turn and the sweep turn):
// before, a string without a TTL over both stopped recovery fleet-wide,
// silently. T1 writes strings without a TTL, T2 hashes (another type), T3
// strings with an hour's TTL that no worker writes. The workers take both
// turns back, each once, logged at Error (turn, reason); each turn ends up
// held by a worker.
//
// T4-T8 overwrite one other shared key with a string without a TTL:
// T4 the registry (with expiry notifications, which find the death
// without it: scans and the sweep by row version read the registry, and
// stop until someone DELs it, runbook step 8), logged at Error; T5 the
// fleet record and T6 the history stream, whose writes fail, logged at
// Warn; T7 the untracked-rows hash, which nothing writes while every host
// tracks and whose failed read is no note, so nothing is logged; T8 the
// dead worker's claim key, which counts as no claim and is replaced by
// the recoverer's.
func TestScenarioTSharedKeysOverwrittenByAStranger(t *testing.T) {
	turnKeys := func(e *env, _ string) []string {
		return []string{store.ScanTurnKey(e.prefix), store.SweepTurnKey(e.prefix)}
	}
	stray := func(e *env, key string) error { return e.rdb.Set(context.Background(), key, "stray", 0).Err() }
	turnsTaken := func(reason string) func(t *testing.T, e *env, live []*proc, keys []string) string {
		return func(t *testing.T, e *env, live []*proc, keys []string) string {
			const took = "took a turn from a key no live worker held: something other than a worker wrote it (a stray write, a tool, another application under the same prefix); left alone it would have stopped that turn fleet-wide"
			takes := func() map[string]int {
				n := map[string]int{}
				for _, p := range live {
					for _, l := range p.lines(took) {
						assert.Equal(t, "ERROR", l["level"])
						assert.Equal(t, reason, l["reason"])
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
			for _, key := range keys {
				typ, err := e.rdb.Type(context.Background(), key).Result()
				require.NoError(t, err)
				assert.Contains(t, []string{"string", "none"}, typ, "%s a worker's again", key)
				if typ == "string" {
					assert.NotEqual(t, "stray", e.rdb.Get(context.Background(), key).Val())
				}
			}
			return fmt.Sprintf("turns taken from the stranger: %v", taken)
		}
	}
	// logged asserts that a live worker logged msg (a prefix of the
	// message) at level, about the stranger's key, once per outage: at
	// most once per worker.
	logged := func(level, msg string) func(t *testing.T, e *env, live []*proc, keys []string) string {
		return func(t *testing.T, e *env, live []*proc, keys []string) string {
			n := 0
			for _, p := range live {
				k := 0
				for _, l := range p.lines("") {
					if m, _ := l["msg"].(string); strings.HasPrefix(m, msg) {
						assert.Equal(t, level, l["level"], "%s: %s", p.id, m)
						k++
					}
				}
				assert.LessOrEqual(t, k, 1, "%s logged %q once per outage", p.id, msg)
				n += k
			}
			assert.Positive(t, n, "a live worker logged %q", msg)
			return fmt.Sprintf("%d workers logged the stranger at %s", n, level)
		}
	}

	for _, v := range []strangerCase{
		{name: "T1 TTL-less strings over both turn keys", keys: turnKeys, write: stray, check: turnsTaken(store.StrangerNoTTL)},
		{name: "T2 hashes over both turn keys", keys: turnKeys, write: func(e *env, key string) error {
			ctx := context.Background()
			if err := e.rdb.Del(ctx, key).Err(); err != nil {
				return err
			}
			return e.rdb.HSet(ctx, key, "stray", "1").Err()
		}, check: turnsTaken(store.StrangerType)},
		{name: "T3 unknown holders with an hour's TTL over both turn keys", keys: turnKeys, write: func(e *env, key string) error {
			return e.rdb.Set(context.Background(), key, "stray", time.Hour).Err()
		}, check: turnsTaken(store.StrangerNotWorker)},
		{name: "T4 a TTL-less string over the registry, expiry notifications on",
			keys: func(e *env, _ string) []string { return []string{e.registry()} }, write: stray,
			args:  []string{"-expiry-notifications"},
			check: logged("ERROR", "worker registry key is not a set")},
		{name: "T5 a TTL-less string over the fleet record",
			keys: func(e *env, _ string) []string { return []string{store.FleetKey(e.prefix)} }, write: stray,
			check: logged("WARN", "cannot write the fleet record")},
		{name: "T6 a TTL-less string over the history stream",
			keys: func(e *env, _ string) []string { return []string{store.HistoryKey(e.prefix)} }, write: stray,
			check: logged("WARN", "fleet history not appended")},
		{name: "T7 a TTL-less string over the untracked-rows hash",
			keys: func(e *env, _ string) []string { return []string{store.UntrackedKey(e.prefix)} }, write: stray,
			check: func(t *testing.T, e *env, live []*proc, keys []string) string {
				assert.Equal(t, "stray", e.rdb.Get(context.Background(), keys[0]).Val(), "nothing needed the hash")
				return "nothing wrote or needed the hash"
			}},
		{name: "T8 a TTL-less string over the dead worker's claim",
			keys: func(e *env, victim string) []string { return []string{e.keysOf(victim).Claim} }, write: stray,
			check: func(t *testing.T, e *env, live []*proc, keys []string) string {
				assert.NotEqual(t, "stray", e.rdb.Get(context.Background(), keys[0]).Val(), "the recoverer's claim replaced the stranger's")
				return "the stranger's claim counted as none"
			}},
	} {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, v.name, envConfig{rows: 300})
			ids := []string{"t-w1", "t-w2", "t-w3"}
			ws := e.start(ids, backstopArgs(v.args...)...) // no owner column: the sweep by row version takes the sweep turn
			victim := ws[0]
			e.waitMidBlock(victim)
			keys := v.keys(e, victim.id)
			for _, key := range keys {
				require.NoError(t, v.write(e, key))
			}
			killedAt := time.Now()
			victim.kill(t)
			stranded := e.inprogOf(victim.id)
			require.NotEmpty(t, stranded, "killed mid-block")

			e.res.Detection = e.waitReset(victim.id, stranded, killedAt, detectionBound)
			e.res.Bound = detectionBound
			if !strings.HasPrefix(v.name, "T4 ") { // no registry entry to look for in a string
				e.waitGone(victim.id, e.goneWithin())
			}
			note := v.check(t, e, ws[1:], keys)
			e.res.note("stranded=%d; %s", len(stranded), note)
			e.finish(true)
		})
	}
}
