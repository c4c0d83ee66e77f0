package safeack_test

import (
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestGroupProtocolsCommitCompletedPrefix checks, on both group protocols,
// the commit invariant at the broker: with acks out of order, no
// OffsetCommit covers a record not acked before it reached the broker, and
// the group's commits reach the end of every partition.
func TestGroupProtocolsCommitCompletedPrefix(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		const partitions, records = 4, 1000
		c, topic, group := kafkatest.StartTopic(t, partitions)
		c.ProduceN(t, topic, partitions, records, nil)
		acks, watch := watchCommits(t, c, group, topic)
		sub := newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
			cfg.MaxInFlight = 64
			cfg.Ordering = safeack.Unordered
			cfg.CommitInterval = 30 * time.Millisecond
		})
		handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
			randomDelay(10 * time.Millisecond)
			acks.ack(m)
		})
		hwm := c.HighWaterMarks(t, topic)
		acks.waitAllAcked(t, c, topic, 30*time.Second)
		watch.waitCommitted(t, hwm, 15*time.Second)
		n := watch.check(t)
		require.Positive(t, n, "no commit of the group was observed")
		require.Empty(t, acks.badMessages())
		if p == safeack.GroupProtocolConsumer && c.CanObserveCommits() {
			for _, oc := range watch.log.Commits() {
				require.GreaterOrEqual(t, oc.Version, int16(9), "a consumer-protocol member commits with OffsetCommit v9+ (member epoch)")
				require.Positive(t, oc.Generation, "the commit carries the member epoch")
			}
		}
	})
}

// TestConsumerProtocolConfig: what the consumer protocol moves to the
// broker, or has no place for, is refused at NewSubscriber (and
// NewTxnSubscriber refuses the protocol), each error naming the field.
func TestConsumerProtocolConfig(t *testing.T) {
	t.Parallel()
	base := func() safeack.SubscriberConfig {
		return safeack.SubscriberConfig{
			Brokers:       []string{"localhost:1"},
			ConsumerGroup: "g",
			GroupProtocol: safeack.GroupProtocolConsumer,
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*safeack.SubscriberConfig)
		want string
	}{
		{"session timeout", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Session.Timeout = 20 * time.Second
		}, "Session.Timeout"},
		{"heartbeat", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Heartbeat.Interval = time.Second
		}, "Heartbeat.Interval"},
		{"client-side assignor", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategySticky()}
		}, "GroupStrategies"},
		{"no group", func(c *safeack.SubscriberConfig) { c.ConsumerGroup = "" }, "GroupProtocol"},
		{"unknown assignor", func(c *safeack.SubscriberConfig) { c.RemoteAssignor = "roundrobin" }, "RemoteAssignor"},
		{"assignor on classic", func(c *safeack.SubscriberConfig) {
			c.GroupProtocol = safeack.GroupProtocolClassic
			c.RemoteAssignor = safeack.RemoteAssignorRange
		}, "RemoteAssignor"},
		{"unknown protocol", func(c *safeack.SubscriberConfig) { c.GroupProtocol = 7 }, "GroupProtocol"},
		{"tracer", func(c *safeack.SubscriberConfig) { c.OTELEnabled = true }, "Tracer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mod(&cfg)
			_, err := safeack.NewSubscriber(cfg, nil)
			require.Error(t, err)
			require.True(t, errors.Is(err, safeack.ErrInvalidConfig), "%v", err)
			require.ErrorContains(t, err, tc.want)
		})
	}
	cfg := base()
	cfg.RemoteAssignor = safeack.RemoteAssignorRange
	require.NoError(t, cfg.Validate())
	_, _, err := safeack.NewTxnSubscriber(base(), safeack.TxnConfig{TransactionalID: "tx"}, nil)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	require.ErrorContains(t, err, "GroupProtocol")
}
