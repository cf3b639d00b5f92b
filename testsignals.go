package recovery

import "github.com/alya/recovery/internal/testsignal"

// testSignals are the loops' notes to the package's tests that they did
// something, so a test waits for the turn it needs instead of sleeping or
// polling a log or Stats (River's test signals). The options hold them; in
// production they are never initialised and each emission is a nil check.
// Every loop emits once at the end of its turn, through the options it
// holds.
type testSignals struct {
	beat    testsignal.Signal[error]    // a heartbeat turn ended, with its error (heartbeat.go)
	scan    testsignal.Signal[struct{}] // a recovery turn ended, scanned or not (recovery.go)
	expired testsignal.Signal[string]   // the recovery loop acted on an expiry message for this peer (recovery.go)
	sweep   testsignal.Signal[error]    // a sweep turn ended, with its error (sweep.go)
	look    testsignal.Signal[bool]     // a self-check turn ended; true when it read the rows, none locked (selfcheck.go)
	flush   testsignal.Signal[struct{}] // a deferred-Untrack flush turn ended (untrack.go)
	history testsignal.Signal[error]    // a history entry was sent, with the send's error (history.go)
}

// withTestSignals turns the loops' test signals on (testSignals); the
// package's test helpers set it on every Worker they build.
func withTestSignals() Option {
	return optionFunc(func(o *options) {
		o.sig.beat.Init()
		o.sig.scan.Init()
		o.sig.expired.Init()
		o.sig.sweep.Init()
		o.sig.look.Init()
		o.sig.flush.Init()
		o.sig.history.Init()
	})
}
