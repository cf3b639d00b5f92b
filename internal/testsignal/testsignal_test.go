package testsignal

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSignalOffIsANoOp(t *testing.T) {
	var nilSig *Signal[int]
	nilSig.Signal(1)
	var zero Signal[int]
	zero.Signal(1)
	if n := zero.Clear(); n != 0 {
		t.Fatalf("Clear on an off signal = %d, want 0", n)
	}
}

func TestSignalWaitReturnsTheValuesInOrder(t *testing.T) {
	var s Signal[int]
	s.Init()
	go func() {
		for i := 1; i <= 3; i++ {
			s.Signal(i)
		}
	}()
	for want := 1; want <= 3; want++ {
		if got := s.WaitOrTimeout(t); got != want {
			t.Fatalf("got %d, want %d", got, want)
		}
	}
	s.RequireEmpty(t)
}

func TestSignalNeverBlocksWhenFullAndKeepsTheNewest(t *testing.T) {
	var s Signal[int]
	s.Init()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range Buffer + 10 {
			s.Signal(i)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Signal blocked on a full buffer")
	}
	if got := s.WaitOrTimeout(t); got != 10 {
		t.Fatalf("oldest kept = %d, want 10 (the 10 oldest dropped)", got)
	}
	if n := s.Clear(); n != Buffer-1 {
		t.Fatalf("Clear = %d, want %d", n, Buffer-1)
	}
}

func TestSignalWaitForSkipsValuesThatDoNotMatch(t *testing.T) {
	var s Signal[int]
	s.Init()
	for i := range 5 {
		s.Signal(i)
	}
	if got := s.WaitFor(t, func(v int) bool { return v >= 3 }); got != 3 {
		t.Fatalf("got %d, want 3", got)
	}
	if got := s.WaitOrTimeout(t); got != 4 {
		t.Fatalf("got %d, want 4", got)
	}
}

func TestSignalWaitTurnSkipsWhatWasWaiting(t *testing.T) {
	var s Signal[int]
	s.Init()
	s.Signal(1) // a turn from before the test's action
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(10 * time.Millisecond) // the loop's pace, not a wait
		s.Signal(2)
		s.Signal(3)
	}()
	if got := s.WaitTurn(t); got != 3 {
		t.Fatalf("got %d, want 3", got)
	}
	wg.Wait()
}

// fakeT records a failure instead of ending the test.
type fakeT struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}
func (f *fakeT) Fatal(...any) {
	f.failed = true
	panic(f)
}

func fails(fn func(TB)) (failed bool) {
	failed, _ = failsSaying(fn)
	return failed
}

// failsSaying is fails, with the failure's message.
func failsSaying(fn func(TB)) (failed bool, msg string) {
	f := &fakeT{}
	defer func() {
		if r := recover(); r != nil && r != any(f) {
			panic(r)
		}
		failed, msg = f.failed, f.msg
	}()
	fn(f)
	return f.failed, f.msg
}

// A wait that times out says whether the loop turned: values that came and
// did not match tell a loop that ran from one that stalled.
func TestSignalWaitTellsAStalledLoopFromAConditionNeverMet(t *testing.T) {
	var s Signal[int]
	s.Init()
	_, msg := failsSaying(func(t TB) { s.WaitForWithin(t, 10*time.Millisecond, func(int) bool { return true }) })
	if !strings.Contains(msg, "no value within") {
		t.Fatalf("nothing came: %q", msg)
	}
	s.Signal(1)
	s.Signal(2)
	_, msg = failsSaying(func(t TB) { s.WaitForWithin(t, 10*time.Millisecond, func(v int) bool { return v > 5 }) })
	if !strings.Contains(msg, "2 came, none matched") {
		t.Fatalf("two values came and did not match: %q", msg)
	}
}

func TestSignalRequireEmptyFailsWhenAValueWaits(t *testing.T) {
	var s Signal[string]
	s.Init()
	if fails(s.RequireEmpty) {
		t.Fatal("RequireEmpty failed on an empty signal")
	}
	s.Signal("x")
	if !fails(s.RequireEmpty) {
		t.Fatal("RequireEmpty passed with a value waiting")
	}
}

func TestSignalWaitOnAnOffSignalFails(t *testing.T) {
	var s Signal[int]
	if !fails(func(t TB) { s.WaitOrTimeout(t) }) {
		t.Fatal("waiting on a signal never initialised passed")
	}
}

func TestSignalIsOnOnlyAfterInit(t *testing.T) {
	var nilSignal *Signal[int]
	var s Signal[int]
	if nilSignal.On() || s.On() {
		t.Fatal("a nil or zero Signal is on")
	}
	s.Init()
	if !s.On() {
		t.Fatal("an initialised Signal is off")
	}
}

func TestSignalSpanReturnsTheTurnsOfTheWindowOnly(t *testing.T) {
	var s Signal[int]
	s.Init()
	s.Signal(-1) // a turn from before the window
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond) // the loop's pace
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				s.Signal(i)
			}
		}
	}()
	began := time.Now()
	got := s.Span(t, 100*time.Millisecond)
	took := time.Since(began)
	close(stop)
	<-done
	if took < 100*time.Millisecond {
		t.Fatalf("Span returned after %v, before its window of 100ms", took)
	}
	if len(got) < 2 {
		t.Fatalf("Span saw %d turns in 100ms of a loop ticking every 10ms", len(got))
	}
	for i, v := range got {
		if v < 0 {
			t.Fatalf("turn %d is %d, which waited before the window", i, v)
		}
		if i > 0 && v <= got[i-1] {
			t.Fatalf("turns out of order: %v", got)
		}
	}
}

func TestSignalSpanFailsWhenTheLoopStalls(t *testing.T) {
	var s Signal[int]
	s.Init()
	if !fails(func(t TB) { s.span(t, time.Nanosecond, 20*time.Millisecond) }) {
		t.Fatal("Span passed with no turn at all")
	}
	time.AfterFunc(10*time.Millisecond, func() { s.Signal(1) }) // one turn, then the loop stalls
	if !fails(func(t TB) { s.span(t, time.Second, 50*time.Millisecond) }) {
		t.Fatal("Span passed a window in which the loop stalled after one turn")
	}
}

func TestSignalTakeReturnsWhatWaitsWithoutWaiting(t *testing.T) {
	take := func(s *Signal[int], want int, wantOK bool) {
		t.Helper()
		if v, ok := s.Take(); v != want || ok != wantOK {
			t.Fatalf("Take() = %d, %v; want %d, %v", v, ok, want, wantOK)
		}
	}
	var off Signal[int]
	take(&off, 0, false) // an off signal has nothing
	var s Signal[int]
	s.Init()
	take(&s, 0, false) // nothing waits yet
	s.Signal(1)
	s.Signal(2)
	take(&s, 1, true) // the oldest first
	take(&s, 2, true)
	take(&s, 0, false)
}
