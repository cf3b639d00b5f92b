package recovery

import (
	"time"

	"github.com/alya/recovery/internal/testsignal"
)

// testSignals are the loops' notes to the package's tests that they did
// something, so a test waits for the turn it needs instead of sleeping or
// polling a log or Stats (River's test signals). The options hold them; in
// production they are never initialised and each emission is a nil check.
// Every loop emits once at the end of its turn, through the options it
// holds; deliver, heard and locked are emitted once per event or try, as
// their fields say; preread once per read.
type testSignals struct {
	beat    testsignal.Signal[error]    // a heartbeat turn ended, with its error (heartbeat.go)
	scan    testsignal.Signal[struct{}] // a recovery turn ended, scanned or not (recovery.go)
	expired testsignal.Signal[string]   // the recovery loop acted on an expiry message for this peer (recovery.go)
	sweep   testsignal.Signal[error]    // a sweep turn ended, with its error (sweep.go)
	look    testsignal.Signal[lookTurn] // a self-check turn ended (selfcheck.go)
	flush   testsignal.Signal[struct{}] // a deferred-Untrack flush turn ended (untrack.go)
	history testsignal.Signal[error]    // a history entry was sent, with the send's error (history.go)
	deliver testsignal.Signal[struct{}] // the event dispatcher handed an event to the observer, which returned or panicked (events.go)
	masters testsignal.Signal[struct{}] // the expiry watcher's check of the masters ended (expiry.go)
	heard   testsignal.Signal[string]   // the expiry watcher judged an expiry event of this peer's heartbeat (expiry.go)
	locked  testsignal.Signal[struct{}] // Start's try at rows its predecessor left locked ended; it tries again (twin.go)
	preread testsignal.Signal[bool]     // Track's read of the rows being fetched ended: true if it answered in time (selfcheck_fetch.go)
	gave    testsignal.Signal[error]    // a give-back of the rows held at a lost lease ended, with its error (giveback.go)
}

// lookTurn is a self-check turn, as its test signal tells it.
type lookTurn struct {
	began time.Time // when the turn began
	read  bool      // it read the rows it looked for, none locked
	over  bool      // the self-check is over: no turn follows
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
		o.sig.deliver.Init()
		o.sig.masters.Init()
		o.sig.heard.Init()
		o.sig.locked.Init()
		o.sig.preread.Init()
		o.sig.gave.Init()
	})
}

// looked signals the end of c's turn begun at began, when c had made
// checks reads; *done is the turn's result. The turn defers it only when
// the signal is on, so an off signal costs no clock read.
func (s *testSignals) looked(c *selfChecker, began time.Time, checks uint64, done *bool) {
	s.look.Signal(lookTurn{began: began, read: c.checks.Load() > checks && !c.skipped, over: *done || c.off.Load()})
}
