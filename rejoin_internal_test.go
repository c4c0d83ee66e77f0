package safeack

import (
	"testing"
	"time"
)

func TestRejoinRetry(t *testing.T) {
	const window = 3 * time.Second
	var r rejoinRetry
	t0 := time.Unix(1000, 0)
	for i, want := range []struct {
		at   time.Duration // since the first failure
		wait time.Duration
		ok   bool
	}{
		{0, 100 * time.Millisecond, true},
		{200 * time.Millisecond, 200 * time.Millisecond, true},
		{500 * time.Millisecond, 400 * time.Millisecond, true},
		{time.Second, 800 * time.Millisecond, true},
		{2 * time.Second, time.Second, true},                    // capped at rejoinMaxBackoff
		{2500 * time.Millisecond, 500 * time.Millisecond, true}, // capped at what is left of the window
		{window, 0, false},
	} {
		wait, ok := r.next(t0.Add(want.at), window)
		if wait != want.wait || ok != want.ok {
			t.Fatalf("failure %d at +%v: got (%v, %v), want (%v, %v)", i+1, want.at, wait, ok, want.wait, want.ok)
		}
	}
	if r.failures != 7 {
		t.Fatalf("failures = %d, want 7", r.failures)
	}
	// A successful Consume starts a new window.
	r.reset()
	if wait, ok := r.next(t0.Add(time.Hour), window); wait != rejoinMinBackoff || !ok {
		t.Fatalf("after reset: got (%v, %v)", wait, ok)
	}
}
