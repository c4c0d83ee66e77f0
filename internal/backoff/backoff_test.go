package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDoublingDoublesUpToMax(t *testing.T) {
	var d Doubling
	want := []time.Duration{Min, 2 * Min, 4 * Min, 8 * Min, Max, Max}
	for i, w := range want {
		if got := d.Next(); got != w {
			t.Fatalf("wait %d: got %v, want %v", i, got, w)
		}
	}
	d.Reset()
	if got := d.Next(); got != Min {
		t.Fatalf("after Reset: got %v, want %v", got, Min)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep reported an ended context for a live one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan bool, 1)
	go func() { done <- Sleep(ctx, time.Hour) }()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("Sleep reported a full wait on an ended context")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sleep did not return when its context had ended")
	}
}

func TestWaitEndsWithStop(t *testing.T) {
	stop := make(chan struct{})
	if !Wait(context.Background(), 0, stop) {
		t.Fatal("Wait(0) reported an end with nothing ended")
	}
	close(stop)
	if Wait(context.Background(), 0, stop) {
		t.Fatal("Wait(0) reported a full wait after stop closed")
	}
	done := make(chan bool, 1)
	go func() { done <- Wait(context.Background(), time.Hour, stop) }()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("Wait reported a full wait after stop closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return when stop was closed")
	}
}
