package consume

import (
	"sync"
	"testing"
)

// TestClaimWatchHoldsWhileReleased: Sarama asks holds for a held claim
// (every 5 s, from the claim's goroutine) while the watch's check releases
// it under mu. The answer must be read under mu too (the race detector
// caught holds reading it after unlocking, in a CI run against Kafka 4.1.2).
func TestClaimWatchHoldsWhileReleased(t *testing.T) {
	t.Parallel()
	st := &claimState{held: true, asked: true}
	w := &claimWatch{
		sub:   &subscription{topic: "t"},
		stop:  make(chan struct{}),
		parts: map[int32]*claimState{0: st},
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 1000 {
			w.holds("t", 0)
		}
	})
	wg.Go(func() {
		for i := range 1000 {
			w.mu.Lock()
			st.held = i%2 == 0 // as check releases, and begin holds
			w.mu.Unlock()
		}
	})
	wg.Wait()
	w.mu.Lock()
	st.held = false
	w.mu.Unlock()
	if w.holds("t", 0) {
		t.Fatal("a released claim is still held")
	}
}
