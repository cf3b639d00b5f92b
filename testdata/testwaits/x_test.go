//go:build sim

package x

import "time"

func f() {
	time.Sleep(1) // pace: a host's work
	// fake clock: the next fault's instant,
	// in the bubble
	time.Sleep(2)
	time.Sleep(3)
	// real time: the snapshot's expiry
	time.Sleep(4)
	// a comment that names no kind
	time.Sleep(5)
	time.Sleep(6) // real time but no colon
	_ = 0         // pace: a comment after the code of the line above
	time.Sleep(8)
}

type logBuffer struct{}

func (logBuffer) Count(string) int { return 0 }
func (logBuffer) String() string   { return "" }

type w struct{}

func (w) Stats() struct{ N int } { return struct{ N int }{} }

type fake struct{}

func (fake) Eventually(func() bool, ...any) {}

var assert fake

func polls(logs logBuffer, wk w, db func() bool, n interface{ Load() int32 }) {
	assert.Eventually(func() bool { return logs.Count("x") == 1 })
	assert.Eventually(func() bool { return wk.Stats().N == 1 })
	assert.Eventually(func() bool { return n.Load() == 1 })
	assert.Eventually(func() bool { return logs.String() != "" })
	assert.Eventually(db, logs.String())
	assert.Eventually(func() bool { return db() }, "message %s", logs.String())
}

var require fake

func (fake) NoError(error, ...any) {}

func actsItself(logs logBuffer, recoverNow func() (int, error)) {
	require.Eventually(func() bool {
		n, err := recoverNow()
		require.NoError(err, logs.String())
		return n == 1
	})
}

type lw struct{}

func (lw) CheckLease() error { return nil }

func leasePolls(w lw) {
	assert.Eventually(func() bool { return w.CheckLease() != nil })
	// poll: the lease runs out with the heartbeat frozen; no turn marks it
	assert.Eventually(func() bool { return w.CheckLease() != nil })
}

func closurePoll(wk w) {
	scans := func() int { return wk.Stats().N }
	before := scans()
	assert.Eventually(func() bool { return scans() > before })
}
