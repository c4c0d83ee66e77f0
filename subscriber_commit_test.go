package safeack_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestSubscriberCommitNeverPassesUnacked checks invariant 1 at the broker:
// with many messages per partition in flight and acks arriving out of order,
// no OffsetCommit request ever covers a record whose Ack had not been called
// before the request reached the broker; and the group's final commits reach
// the end of every partition.
func TestSubscriberCommitNeverPassesUnacked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		autoCommit bool
	}{
		{"sarama-auto-commit", true},
		{"manual-commit-interval", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const partitions, records = 4, 2000
			c := kafkatest.Start(t)
			topic := c.NewTopic(t, partitions)
			group := c.NewGroup(t)
			c.ProduceN(t, topic, partitions, records, nil)

			acks := newAckLog()
			watch := newCommitWatch(t, c, group, topic, acks)
			sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.MaxInFlight = 100
				cfg.Ordering = safeack.Unordered
				cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = tc.autoCommit
				cfg.CommitInterval = 30 * time.Millisecond
			})
			msgs := mustSubscribe(t, sub, topic)

			var maxInFlight inFlightMeter
			handleAll(msgs, func(m *message.Message) {
				maxInFlight.enter()
				randomDelay(20 * time.Millisecond)
				// Leave before Ack: the subscriber frees the slot only after
				// it, so the meter never runs ahead of the real bound.
				maxInFlight.leave()
				acks.ack(m)
			})

			hwm := c.HighWaterMarks(t, topic)
			acks.waitAllAcked(t, c, topic, 30*time.Second)
			watch.waitCommitted(t, hwm, 15*time.Second)

			n := watch.check(t)
			require.Positive(t, n, "no commit of the group was observed")
			require.Empty(t, acks.badMessages(), "messages without partition/offset in their context")
			// Out-of-order acks need several messages per partition at once.
			require.Greater(t, maxInFlight.max(), partitions, "handlers never ran concurrently beyond one per partition")
			require.LessOrEqual(t, maxInFlight.max(), 100, "more messages in flight than MaxInFlight")
			t.Logf("%d commits checked, %d records, max %d handlers at once", n, records, maxInFlight.max())
		})
	}
}
