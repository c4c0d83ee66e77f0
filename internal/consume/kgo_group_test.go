package consume

import (
	"testing"
	"time"
)

// TestMemberRetryBackoff: a consumer-protocol member retries a failed
// heartbeat (or any request) within a second, however many tries failed,
// so that a coordinator's restart does not outwait a short group session;
// it starts near 100 ms and grows.
func TestMemberRetryBackoff(t *testing.T) {
	for fails := range 40 {
		for range 50 {
			d := memberRetryBackoff(fails)
			if d <= 0 || d > time.Second {
				t.Fatalf("backoff after %d failures: %v, want within (0, 1s]", fails, d)
			}
		}
	}
	if d := memberRetryBackoff(1); d > 100*time.Millisecond || d < 80*time.Millisecond {
		t.Errorf("first backoff %v, want 80-100 ms", d)
	}
	if d := memberRetryBackoff(20); d < 800*time.Millisecond {
		t.Errorf("backoff after 20 failures %v, want 0.8-1 s", d)
	}
}
