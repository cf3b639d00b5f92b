// Package testsignal lets a background loop tell a test that it did
// something (finished a turn, sent a message), so the test waits for that
// event instead of sleeping or polling a log. It follows River's
// internal/testsignal: a loop holds a Signal and calls Signal(v) at the end
// of a turn; in production the Signal is never initialised and the call does
// nothing; a test calls Init before the loop starts and WaitOrTimeout to
// wait for the next value.
package testsignal

import "time"

// TB is the part of testing.TB the waits use. The package does not import
// testing: loops in production code hold Signals, and a program that links
// them must not link the testing package.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Buffer is how many values a Signal keeps that no test has taken yet.
const Buffer = 1000

// Timeout is how long WaitOrTimeout waits. It is long: it only bounds a
// test whose loop never does what the test waits for, and a loaded 2-core
// machine must not make a healthy test fail.
const Timeout = 10 * time.Second

// A Signal carries values of type T from a loop to a test. Its zero value
// and a nil *Signal are off: Signal does nothing and costs a nil check. Init
// turns it on; copies of a Signal taken after Init share its values.
type Signal[T any] struct {
	ch chan T
}

// Init turns the signal on, with room for Buffer values. Call it before the
// loop that signals starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, Buffer) }

// On reports whether the signal was initialised: a loop that must build
// its value asks first.
func (s *Signal[T]) On() bool { return s != nil && s.ch != nil }

// Signal hands v to the test. It never blocks the loop: when Buffer values
// are already waiting (a test that does not wait on this signal), the oldest
// is dropped to make room, so a waiting test always sees the newest values.
// A nil or never initialised Signal does nothing.
func (s *Signal[T]) Signal(v T) {
	if s == nil || s.ch == nil {
		return
	}
	for {
		select {
		case s.ch <- v:
			return
		default:
		}
		select {
		case <-s.ch: // full: drop the oldest
		default:
		}
	}
}

// WaitOrTimeout returns the next value, failing the test if none comes
// within Timeout.
func (s *Signal[T]) WaitOrTimeout(t TB) T {
	t.Helper()
	return s.WaitFor(t, func(T) bool { return true })
}

// WaitFor returns the first value, from now on, for which ok holds, and drops
// the values before it; it fails the test if none comes within Timeout.
func (s *Signal[T]) WaitFor(t TB, ok func(T) bool) T {
	t.Helper()
	return s.WaitForWithin(t, Timeout, ok)
}

// WaitForWithin is WaitFor with a timeout of d instead of Timeout: a test
// whose loop must do something within a bound waits for that bound.
func (s *Signal[T]) WaitForWithin(t TB, d time.Duration, ok func(T) bool) T {
	t.Helper()
	s.requireInit(t)
	timer := time.NewTimer(d)
	defer timer.Stop()
	others := 0 // values that came and did not match
	for {
		select {
		case v := <-s.ch:
			if ok(v) {
				return v
			}
			others++
		case <-timer.C:
			if others > 0 {
				t.Fatalf("testsignal: no matching value within %v (%d came, none matched: the loop turned, what it waited for did not happen)", d, others)
			} else {
				t.Fatalf("testsignal: no value within %v", d)
			}
			var zero T
			return zero
		}
	}
}

// Clear drops the values waiting and returns how many there were: a test
// calls it before the action whose effect it then waits for. A turn already
// under way when Clear returns may still signal after it; a test that needs
// a turn begun after its action waits for two values (WaitTurn).
func (s *Signal[T]) Clear() int {
	if s == nil || s.ch == nil {
		return 0
	}
	for n := 0; ; n++ {
		select {
		case <-s.ch:
		default:
			return n
		}
	}
}

// Take returns the oldest value waiting and true, or false at once when
// none is: a test asks what a call it just made signalled, for a signal
// emitted, if at all, before that call returned.
func (s *Signal[T]) Take() (T, bool) {
	var zero T
	if s == nil || s.ch == nil {
		return zero, false
	}
	select {
	case v := <-s.ch:
		return v, true
	default:
		return zero, false
	}
}

// WaitTurn drops the values waiting, then waits for two more: the second
// comes from a turn that began after WaitTurn was called, so whatever the
// test did before the call, that turn saw it. It returns the second value.
func (s *Signal[T]) WaitTurn(t TB) T {
	t.Helper()
	s.Clear()
	s.WaitOrTimeout(t)
	return s.WaitOrTimeout(t)
}

// RequireEmpty fails the test if a value is waiting.
func (s *Signal[T]) RequireEmpty(t TB) {
	t.Helper()
	s.requireInit(t)
	select {
	case v := <-s.ch:
		t.Fatalf("testsignal: expected no value, got %v", v)
	default:
	}
}

func (s *Signal[T]) requireInit(t TB) {
	t.Helper()
	if s == nil || s.ch == nil {
		t.Fatal("testsignal: the signal was not initialised (Init)")
	}
}

// Span waits on the signal's values until d has passed since the call, and
// returns the values that came meanwhile, in order: the turns the loop took
// across the window. A test that asserts that something holds for a span of
// time (a TTL, say) waits with Span instead of sleeping, and asserts that the
// loop that could break it took its turns across that span, so a loop that
// stalled cannot pass it. Values waiting at the call are dropped first. It
// returns at least one value; the last may come a little after d, from the
// turn under way at its end. It fails the test if no value comes for
// Timeout.
func (s *Signal[T]) Span(t TB, d time.Duration) []T {
	t.Helper()
	return s.span(t, d, Timeout)
}

func (s *Signal[T]) span(t TB, d, gap time.Duration) []T {
	t.Helper()
	s.requireInit(t)
	s.Clear()
	end := time.Now().Add(d)
	var got []T
	for len(got) == 0 || time.Now().Before(end) {
		got = append(got, s.WaitForWithin(t, gap, func(T) bool { return true }))
	}
	return got
}
