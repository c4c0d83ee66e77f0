package partition

import (
	"errors"
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

// TestWorkerDeferralFailingAtOnce: every record's first delivery is
// deferred, acked and failed at once by the goroutine that received it,
// so its redelivery can start while the worker is still handing the first
// one out. Each delivery's answer must reach the waiter of that delivery:
// every record completes once, and no token is left held.
func TestWorkerDeferralFailingAtOnce(t *testing.T) {
	const n = 2000
	r := newRig(t, rigOptions{maxInFlight: 8, config: func(c *Config) { c.CompletedTail = false }})
	go r.sendN(n)
	seen := make(map[int64]bool, n)
	for range 2 * n {
		m := r.receive()
		off := offsetOf(m)
		if seen[off] {
			m.Ack()
			continue
		}
		seen[off] = true
		rec, _ := FromContext(m.Context())
		d, ok := rec.Defer(m, nil)
		require.True(t, ok)
		m.Ack()
		d.Resolve(errors.New("write failed"))
	}
	waitUntil(t, "every record marked", func() bool { return r.marker.last().offset == n })
	waitUntil(t, "nothing in flight", func() bool { return r.w.Stats().InFlight <= 0 })
	require.Zero(t, r.w.Stats().InFlight)
	require.Equal(t, uint64(n), r.w.Stats().Counters.Completed)
	r.stopped()
	r.tokensFree()
}
