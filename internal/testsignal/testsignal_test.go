package testsignal

import (
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
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(string, ...any) {
	f.failed = true
	panic(f)
}
func (f *fakeT) Fatal(...any) {
	f.failed = true
	panic(f)
}

func fails(fn func(TB)) (failed bool) {
	f := &fakeT{}
	defer func() {
		if r := recover(); r != nil && r != any(f) {
			panic(r)
		}
		failed = f.failed
	}()
	fn(f)
	return f.failed
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
