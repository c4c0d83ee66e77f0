package safeack_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestTelemetryOutcomes reports, per handler run, the record's position,
// the wait from delivery, the duration and the outcome.
func TestTelemetryOutcomes(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	var (
		mu    sync.Mutex
		calls = make(map[int64]int)
	)
	var events eventLog
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		mu.Lock()
		calls[k.o]++
		n := calls[k.o]
		mu.Unlock()
		switch {
		case k.o == 0:
			time.Sleep(20 * time.Millisecond) // handler work, measured
		case k.o == 1 && n == 1:
			return errors.New("transient")
		case k.o == 2:
			comp, err := safeack.CompletionFromCtx(m.Context())
			if err != nil {
				return err
			}
			go comp.Done()
		case k.o == 3 && n == 1:
			panic("boom") // recovered by the router, after Telemetry saw it
		case k.o == 4 && n == 1:
			m.Nack()
		}
		return nil
	}, safeack.Telemetry(events.hook), safeack.DeferredCompletion)

	c.ProduceN(t, topic, 1, 5, nil)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 5})

	type key struct {
		off     int64
		outcome safeack.Outcome
	}
	got := make(map[key]safeack.CompletionEvent)
	for _, e := range events.all() {
		assert.True(t, e.FromSafeack)
		assert.Equal(t, topic, e.Topic)
		assert.EqualValues(t, 0, e.Partition)
		assert.Equal(t, "h", e.Handler)
		assert.False(t, e.DeliveredAt.IsZero())
		assert.GreaterOrEqual(t, e.Wait, time.Duration(0))
		got[key{e.Offset, e.Outcome}] = e
	}
	assert.Len(t, events.all(), 8, "events: %v", events.all())
	if e, ok := got[key{0, safeack.OutcomeAck}]; assert.True(t, ok) {
		assert.GreaterOrEqual(t, e.Duration, 20*time.Millisecond)
	}
	if e, ok := got[key{1, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.EqualError(t, e.Err, "transient")
	}
	assert.Contains(t, got, key{1, safeack.OutcomeAck})
	assert.Contains(t, got, key{2, safeack.OutcomeDeferred})
	if e, ok := got[key{3, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.ErrorIs(t, e.Err, safeack.ErrHandlerPanicked)
	}
	assert.Contains(t, got, key{3, safeack.OutcomeAck})
	if e, ok := got[key{4, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.NoError(t, e.Err, "nacked by the handler itself")
	}
	assert.Contains(t, got, key{4, safeack.OutcomeAck})
	assert.Equal(t, "deferred", safeack.OutcomeDeferred.String())
}
