package partition

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWorkerDeferRacingAck: a Defer that races with the router's Ack
// (code the handler started calls it as the handler returns) either
// defers the delivery, and its resolution completes the record, or fails
// because the delivery was answered: never both an ack completion and a
// deferred one, which would count the record out of flight twice.
func TestWorkerDeferRacingAck(t *testing.T) {
	const n = 3000
	r := newRig(t, rigOptions{maxInFlight: 8, config: func(c *Config) { c.CompletedTail = false }})
	go r.sendN(n)
	var wg sync.WaitGroup
	deferred := 0
	var mu sync.Mutex
	for range n {
		m := r.receive()
		rec, _ := FromContext(m.Context())
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			m.Ack()
		})
		wg.Go(func() {
			<-start
			if d, ok := rec.Defer(m, nil); ok {
				mu.Lock()
				deferred++
				mu.Unlock()
				d.Resolve(nil)
			}
		})
		close(start)
	}
	wg.Wait()
	waitUntil(t, "every record marked", func() bool { return r.marker.last().offset == n })
	waitUntil(t, "nothing in flight", func() bool { return r.w.Stats().InFlight <= 0 })
	require.Zero(t, r.w.Stats().InFlight, "in flight after every record completed (%d deferred)", deferred)
	t.Logf("%d of %d deferred", deferred, n)
}
