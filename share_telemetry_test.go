package safeack_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareTelemetryAndSkipRevoked: Telemetry reports a share message with
// its record's position and outcome (ack, deferred); a message still
// waiting before SkipRevoked when the subscriber closes is not handled,
// reported as skipped, and released: the next member gets it.
func TestShareTelemetryAndSkipRevoked(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.DrainTimeout = 5 * time.Second })

	var mu sync.Mutex
	var events []safeack.CompletionEvent
	hook := func(ev safeack.CompletionEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}
	reachedGate := make(chan struct{})
	// gate holds the "wait" record until the subscriber is closing, as a
	// throttling middleware could.
	gate := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if string(msg.Payload) == "wait" {
				close(reachedGate)
				for !safeack.AssignmentEnded(msg) {
					time.Sleep(5 * time.Millisecond)
				}
			}
			return h(msg)
		}
	}
	handled := newShareSeen()
	mwRouter(t, sub, topic, func(msg *message.Message) error {
		handled.add(msg)
		if string(msg.Payload) == "defer" {
			comp, err := safeack.CompletionFromCtx(msg.Context())
			require.NoError(t, err)
			comp.Done()
		}
		return nil
	}, safeack.Telemetry(hook), gate, safeack.SkipRevoked, safeack.DeferredCompletion)

	c.Produce(t, topic, kafkatest.Record{Value: []byte("ack")}, kafkatest.Record{Value: []byte("defer")})
	kafkatest.WaitFor(t, mwWait, "two events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 2
	})
	c.Produce(t, topic, kafkatest.Record{Value: []byte("wait")})
	select {
	case <-reachedGate:
	case <-time.After(mwWait):
		t.Fatal("the wait record did not arrive")
	}
	require.NoError(t, sub.Close())

	mu.Lock()
	require.Len(t, events, 3)
	byValue := map[int64]safeack.CompletionEvent{}
	for _, ev := range events {
		assert.True(t, ev.FromSafeack)
		assert.Equal(t, topic, ev.Topic)
		assert.Equal(t, int32(0), ev.Partition)
		assert.False(t, ev.DeliveredAt.IsZero())
		byValue[ev.Offset] = ev
	}
	mu.Unlock()
	assert.Equal(t, safeack.OutcomeAck, byValue[0].Outcome)
	assert.Equal(t, safeack.OutcomeDeferred, byValue[1].Outcome)
	assert.Equal(t, safeack.OutcomeSkipped, byValue[2].Outcome)
	assert.Zero(t, handled.count("wait"), "the handler ran for a message of a closing subscriber")
	tot, _ := shareTotals(sub)
	assert.Equal(t, uint64(2), tot.Accepted)
	assert.Equal(t, uint64(1), tot.Released)

	next := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, next, topic)
	select {
	case m := <-msgs:
		assert.Equal(t, "wait", string(m.Payload))
		// Its second delivery, unless a sibling member's share fetch was
		// still in flight at the broker past leave's bound (fetchSettleLimit,
		// 2 s) and acquired it once more before the close released it: seen
		// once on a loaded SASL_SSL 4.4.0 broker in a local CI run (3).
		dc, _ := safeack.MessageDeliveryCountFromCtx(m.Context())
		assert.GreaterOrEqual(t, dc, int32(2))
		assert.LessOrEqual(t, dc, int32(3))
		if dc != 2 {
			t.Logf("delivery count %d: a sibling's fetch outlasted leave's bound", dc)
		}
		m.Ack()
	case <-time.After(mwWait):
		t.Fatal("the skipped record did not come back")
	}
}
