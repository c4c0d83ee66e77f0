package consume

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack/internal/backoff"
)

func TestRejoinRetry(t *testing.T) {
	t.Parallel()
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
		{2 * time.Second, time.Second, true},                    // capped at backoff.Max
		{2500 * time.Millisecond, 500 * time.Millisecond, true}, // capped at what is left of the window
		{window, 0, false},
	} {
		wait, ok := r.next(t0.Add(want.at), window, false)
		if wait != want.wait || ok != want.ok {
			t.Fatalf("failure %d at +%v: got (%v, %v), want (%v, %v)", i+1, want.at, wait, ok, want.wait, want.ok)
		}
	}
	if r.failures != 7 {
		t.Fatalf("failures = %d, want 7", r.failures)
	}
	// A successful Consume starts a new window.
	r.reset()
	if wait, ok := r.next(t0.Add(time.Hour), window, false); wait != backoff.Min || !ok {
		t.Fatalf("after reset: got (%v, %v)", wait, ok)
	}
	// A failure that says the group is moving restarts the window, not
	// the backoff.
	t1 := t0.Add(time.Hour)
	if _, ok := r.next(t1.Add(window-time.Millisecond), window, true); !ok {
		t.Fatal("moving: window over")
	}
	if wait, ok := r.next(t1.Add(window+time.Second), window, false); wait != 400*time.Millisecond || !ok {
		t.Fatalf("after moving: got (%v, %v), want (400ms, true)", wait, ok)
	}
	if _, ok := r.next(t1.Add(2*window), window, false); ok {
		t.Fatal("window not over a window after the last move")
	}
}

func TestCoordinatorMoving(t *testing.T) {
	t.Parallel()
	for _, err := range []error{sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable,
		sarama.ErrOffsetsLoadInProgress, sarama.ErrRebalanceInProgress, fmt.Errorf("wrapped: %w", sarama.ErrOffsetsLoadInProgress)} {
		if !coordinatorMoving(err) {
			t.Errorf("coordinatorMoving(%v) = false", err)
		}
	}
	for _, err := range []error{errors.New("dial tcp: connection refused"), sarama.ErrOutOfBrokers, sarama.ErrUnknownMemberId} {
		if coordinatorMoving(err) {
			t.Errorf("coordinatorMoving(%v) = true", err)
		}
	}
}
