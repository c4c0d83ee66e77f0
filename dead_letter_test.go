package safeack_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestDeadLettersVisible: with docs/middleware.md's chain, each record
// PoisonQueue dead-letters is logged by the subscriber at Error level
// (topic, partition, offset, dead-letter topic, reason), counted in Stats
// and Totals (DeadLettered), and reported to Telemetry as
// OutcomeDeadLettered with the handler's error; the other records are
// reported as acks and counted nowhere else.
func TestDeadLettersVisible(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic, dlq, group := c.NewTopic(t, 1), c.NewTopic(t, 1), c.NewGroup(t)
	logs := watermill.NewCaptureLogger()
	sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c.SaramaConfig()}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	poison, err := safeack.PoisonQueue(pub, dlq)
	require.NoError(t, err)

	var mu sync.Mutex
	events := map[int64]safeack.CompletionEvent{}
	hook := func(ev safeack.CompletionEvent) {
		mu.Lock()
		events[ev.Offset] = ev
		mu.Unlock()
	}
	poisoned := map[int64]bool{1: true, 3: true}
	const records = 5
	mwRouter(t, sub, topic, func(m *message.Message) error {
		if k := mwOffset(t, m); poisoned[k.o] {
			return fmt.Errorf("record %d cannot be billed", k.o)
		}
		return nil
	}, safeack.Telemetry(hook), safeack.SkipRevoked, safeack.KafkaMetadata, poison,
		middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware)
	c.ProduceN(t, topic, 1, records, nil)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: records})
	kafkatest.WaitFor(t, mwWait, "a Telemetry event per record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == records
	})

	// Telemetry.
	mu.Lock()
	for off, ev := range events {
		if poisoned[off] {
			assert.Equal(t, safeack.OutcomeDeadLettered, ev.Outcome, "offset %d", off)
			if assert.Error(t, ev.Err, "offset %d", off) {
				assert.Contains(t, ev.Err.Error(), fmt.Sprintf("record %d cannot be billed", off))
			}
		} else {
			assert.Equal(t, safeack.OutcomeAck, ev.Outcome, "offset %d", off)
		}
	}
	mu.Unlock()
	assert.Equal(t, "dead-lettered", safeack.OutcomeDeadLettered.String())

	// Counters: Stats over the assignment, Totals over all of them.
	ps, ok := statsOf(sub, topic, 0)
	require.True(t, ok, "partition 0 not owned")
	assert.EqualValues(t, 2, ps.DeadLettered, "Stats")
	var total uint64
	for _, pt := range sub.Totals() {
		if pt.Topic == topic {
			total += pt.DeadLettered
		}
	}
	assert.EqualValues(t, 2, total, "Totals")

	// The log: one Error line per dead letter.
	logged := map[int64]int{}
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Msg != "Record dead-lettered: published to the dead-letter topic and acked" {
			continue
		}
		off, _ := m.Fields["kafka_partition_offset"].(int64)
		logged[off]++
		assert.Equal(t, topic, m.Fields["kafka_topic"])
		assert.EqualValues(t, 0, m.Fields["kafka_partition"])
		assert.Equal(t, dlq, m.Fields["dead_letter_topic"])
		if assert.Error(t, m.Err) {
			assert.Contains(t, m.Err.Error(), fmt.Sprintf("record %d cannot be billed", off))
		}
	}
	assert.Equal(t, map[int64]int{1: 1, 3: 1}, logged, "Error lines per dead-lettered offset")
	assert.EqualValues(t, 2, c.HighWaterMarks(t, dlq)[0], "records on the dead-letter topic")
}

// TestTelemetryDeadLetterOfOtherSubscribers: a message of another
// subscriber that Watermill's own PoisonQueue dead-letters is reported to
// Telemetry as OutcomeDeadLettered too (its reason_poisoned metadata was
// set on the way out), and one that succeeds as an ack.
func TestTelemetryDeadLetterOfOtherSubscribers(t *testing.T) {
	t.Parallel()
	var got []safeack.CompletionEvent
	dlq := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	t.Cleanup(func() { _ = dlq.Close() })
	pq, err := middleware.PoisonQueue(dlq, "dlq")
	require.NoError(t, err)
	h := safeack.Telemetry(func(ev safeack.CompletionEvent) { got = append(got, ev) })(pq(func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "poison" {
			return nil, errors.New("cannot handle poison")
		}
		return nil, nil
	}))
	for _, payload := range []string{"poison", "fine"} {
		_, err := h(message.NewMessage(watermill.NewUUID(), []byte(payload)))
		require.NoError(t, err)
	}
	require.Len(t, got, 2)
	assert.Equal(t, safeack.OutcomeDeadLettered, got[0].Outcome)
	assert.ErrorContains(t, got[0].Err, "cannot handle poison")
	assert.False(t, got[0].FromSafeack)
	assert.Equal(t, safeack.OutcomeAck, got[1].Outcome)
	dead, err := dlq.Subscribe(t.Context(), "dlq")
	require.NoError(t, err)
	select {
	case m := <-dead:
		assert.Equal(t, "poison", string(m.Payload))
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the dead-letter topic")
	}
}
