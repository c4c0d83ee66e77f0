package partition

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	contract "github.com/safeack/safeack/internal/delivery"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

// Deferrals whose resolution races the waiter of their delivery's ack, and
// redeliveries of a record whose earlier delivery was deferred.

// heldWaiter holds the first ack's waiter just before it asks whether its
// delivery was deferred (Worker.beforeDeferredCheck), until released.
type heldWaiter struct {
	t       *testing.T
	first   atomic.Bool
	reached chan struct{}
	proceed chan struct{}
	once    sync.Once
}

func newHeldWaiter(t *testing.T) *heldWaiter {
	return &heldWaiter{t: t, reached: make(chan struct{}), proceed: make(chan struct{})}
}

func (h *heldWaiter) hook() {
	if h.first.CompareAndSwap(false, true) {
		close(h.reached)
		<-h.proceed
	}
}

// waitReached waits until the waiter is held.
func (h *heldWaiter) waitReached() {
	h.t.Helper()
	select {
	case <-h.reached:
	case <-time.After(waitLimit):
		h.t.Fatal("no ack's waiter reached the deferred check")
	}
}

// release lets the held waiter go on; it is safe to call more than once
// (tests also call it on cleanup, so a failed test does not hang the drain).
func (h *heldWaiter) release() { h.once.Do(func() { close(h.proceed) }) }

// countingHooks counts the Acked and Nacked calls of each delivery.
type countingHooks struct {
	mu     sync.Mutex
	states map[*message.Message]*int // delivery → its state
	acked  map[*int]int
	nacked map[*int]int
}

func newCountingHooks() *countingHooks {
	return &countingHooks{states: map[*message.Message]*int{}, acked: map[*int]int{}, nacked: map[*int]int{}}
}

func (h *countingHooks) Started(ctx context.Context, msg *message.Message) (context.Context, any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	state := new(int)
	h.states[msg] = state
	return ctx, state
}

func (h *countingHooks) Acked(_ *sarama.ConsumerMessage, _ *message.Message, state any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acked[state.(*int)]++
}

func (h *countingHooks) Nacked(_ *message.Message, state any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nacked[state.(*int)]++
}

// calls returns how often delivery msg was told acked and nacked.
func (h *countingHooks) calls(msg *message.Message) (acked, nacked int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.states[msg]
	return h.acked[s], h.nacked[s]
}

// newHeldRig is a rig with two tokens, no completed tail, counting hooks
// and the first ack's waiter held before its deferred check.
func newHeldRig(t *testing.T) (*rig, *heldWaiter, *countingHooks) {
	held := newHeldWaiter(t)
	hooks := newCountingHooks()
	r := newRig(t, rigOptions{
		maxInFlight: 2,
		config:      func(c *Config) { c.CompletedTail = false },
		deliveries:  hooks,
		beforeRun:   func(w *Worker) { w.beforeDeferredCheck = held.hook },
	})
	t.Cleanup(held.release) // runs before the rig's shutdown
	return r, held, hooks
}

// TestWorkerDeferredAgainBeforeAckCheck: delivery wm1 is deferred and
// acked; before wm1's waiter looks at the deferral, the deferral fails,
// the record is redelivered as wm2 and wm2 is deferred too. wm1's waiter
// must still see wm1 as deferred: the record completes only when wm2's
// deferral is resolved, once, and the prefix does not pass it before.
func TestWorkerDeferredAgainBeforeAckCheck(t *testing.T) {
	r, held, hooks := newHeldRig(t)
	r.sendN(1)
	wm1 := r.receive()
	rec, _ := FromContext(wm1.Context())
	d1, ok := rec.Defer(wm1, nil)
	require.True(t, ok)
	wm1.Ack()
	held.waitReached()

	d1.Resolve(errors.New("write failed")) // wm1 is acked: applies now, redelivers at once
	wm2 := r.receive()
	require.Equal(t, int64(0), offsetOf(wm2))
	require.NotSame(t, wm1, wm2)
	d2, ok := rec.Defer(wm2, nil)
	require.True(t, ok)
	held.release()

	// wm1's waiter frees its token whatever it decides; wm2 holds the other.
	waitUntil(t, "wm1's waiter freed its token", func() bool { return len(r.w.pool.tokens) == 1 })
	st := r.w.Stats()
	require.Zero(t, st.Counters.Completed, "record 0 completed while its redelivery is deferred")
	require.Equal(t, 1, st.InFlight, "the deferred redelivery must stay in flight")
	for _, mk := range r.marker.all() {
		require.LessOrEqual(t, mk.offset, int64(0), "marked past record 0, whose redelivery is deferred")
	}
	acked, _ := hooks.calls(wm2)
	require.Zero(t, acked, "wm2 told acked before its deferral was resolved")

	wm2.Ack()
	d2.Resolve(nil)
	waitUntil(t, "record 0 marked", func() bool { return r.marker.last().offset == 1 })
	waitUntil(t, "nothing in flight", func() bool { return r.w.Stats().InFlight <= 0 })
	st = r.w.Stats()
	require.Zero(t, st.InFlight, "record 0 counted out of flight twice")
	require.Equal(t, uint64(1), st.Counters.Completed)
	acked1, nacked1 := hooks.calls(wm1)
	acked2, nacked2 := hooks.calls(wm2)
	require.Equal(t, [4]int{0, 1, 1, 0}, [4]int{acked1, nacked1, acked2, nacked2},
		"hook calls (wm1 acked, wm1 nacked, wm2 acked, wm2 nacked)")
	r.stopped()
	r.tokensFree()
}

// TestWorkerDeferralDoneBeforeAckCheck: a deferral resolved with nil
// after the router's ack but before the ack's waiter looks at it completes
// the record once; the waiter then only frees its token.
func TestWorkerDeferralDoneBeforeAckCheck(t *testing.T) {
	r, held, hooks := newHeldRig(t)
	r.sendN(2)
	got := r.receiveAll(2)
	wm := got[0]
	rec, _ := FromContext(wm.Context())
	d, ok := rec.Defer(wm, nil)
	require.True(t, ok)
	wm.Ack()
	held.waitReached()
	d.Resolve(nil)
	waitUntil(t, "record 0 completed", func() bool { return r.w.Stats().Counters.Completed == 1 })
	require.Equal(t, 1, r.w.Stats().InFlight, "only record 1 is in flight")
	held.release()
	waitUntil(t, "the waiter freed its token", func() bool { return len(r.w.pool.tokens) == 1 })

	got[1].Ack()
	waitUntil(t, "both marked", func() bool { return r.marker.last().offset == 2 })
	st := r.w.Stats()
	require.Zero(t, st.InFlight)
	require.Equal(t, uint64(2), st.Counters.Completed)
	acked, nacked := hooks.calls(wm)
	require.Equal(t, [2]int{1, 0}, [2]int{acked, nacked}, "hook calls (acked, nacked) of the deferred delivery")
	r.stopped()
	r.tokensFree()
}

// TestWorkerDeferralOfNackedDelivery: a deferred delivery that is nacked
// (its handler failed after deferring) is redelivered; the earlier
// deferral's resolution then changes nothing, whether the redelivery is
// deferred in turn or not, and deferring the nacked delivery again fails.
func TestWorkerDeferralOfNackedDelivery(t *testing.T) {
	for _, deferAgain := range []bool{false, true} {
		t.Run(map[bool]string{false: "acked", true: "deferred"}[deferAgain], func(t *testing.T) {
			r, held, hooks := newHeldRig(t)
			held.first.Store(true) // hold nothing
			r.sendN(1)
			wm1 := r.receive()
			rec, _ := FromContext(wm1.Context())
			d1, ok := rec.Defer(wm1, nil)
			require.True(t, ok)
			wm1.Nack()
			wm2 := r.receive()
			require.Equal(t, int64(0), offsetOf(wm2))
			_, ok = rec.Defer(wm1, nil)
			require.False(t, ok, "a nacked delivery cannot be deferred")
			require.False(t, rec.Deferred(wm2), "the redelivery inherits no deferral")
			d1.Resolve(nil) // changes nothing: wm1 was nacked
			var d2 contract.Deferral
			if deferAgain {
				d2, ok = rec.Defer(wm2, nil)
				require.True(t, ok)
				require.NotSame(t, d1, d2)
			}
			wm2.Ack()
			if deferAgain {
				waitUntil(t, "wm2's waiter freed its token", func() bool { return len(r.w.pool.tokens) == 0 })
				require.Zero(t, r.w.Stats().Counters.Completed, "completed before wm2's deferral was resolved")
				d2.Resolve(nil)
			}
			waitUntil(t, "record 0 marked", func() bool { return r.marker.last().offset == 1 })
			waitUntil(t, "nothing in flight", func() bool { return r.w.Stats().InFlight <= 0 })
			st := r.w.Stats()
			require.Zero(t, st.InFlight)
			require.Equal(t, uint64(1), st.Counters.Completed)
			acked1, nacked1 := hooks.calls(wm1)
			acked2, nacked2 := hooks.calls(wm2)
			require.Equal(t, [4]int{0, 1, 1, 0}, [4]int{acked1, nacked1, acked2, nacked2},
				"hook calls (wm1 acked, wm1 nacked, wm2 acked, wm2 nacked)")
			r.stopped()
			r.tokensFree()
		})
	}
}
