package safeack_test

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// connectionsBySoftware counts, from now on, the connections made to the
// embedded broker by the client software that made them: each connection
// starts with an ApiVersions request naming it (Sarama's "sarama",
// franz-go's "kgo").
func connectionsBySoftware(c *kafkatest.Cluster) func() map[string]int {
	var mu sync.Mutex
	counts := make(map[string]int)
	c.Answer(kmsg.ApiVersions, func(req kmsg.Request, _ int32) (kmsg.Response, bool) {
		av := req.(*kmsg.ApiVersionsRequest)
		mu.Lock()
		counts[av.ClientSoftwareName]++
		mu.Unlock()
		return nil, false
	})
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(counts))
		for k, v := range counts {
			out[k] = v
		}
		return out
	}
}

// TestConsumerProtocolOpensNoSaramaClient: a consumer-protocol subscription
// reads the cluster (its checks at Subscribe, the commits, the starts and
// the high-water marks) through franz-go: from Subscribe to Close, no
// connection of Sarama's reaches the broker, and Sarama's Version does not
// matter (an old one, which Sarama's own requests would follow, changes
// nothing). The classic protocol's subscription, the control, connects
// through Sarama.
func TestConsumerProtocolOpensNoSaramaClient(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
		c.ProduceN(t, topic, 2, 20, nil)
		conns := connectionsBySoftware(c) // the harness's clients are connected already

		var mu sync.Mutex
		seen := make(map[po]bool)
		sub := newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
			cfg.CommitInterval = 50 * time.Millisecond
			if p == safeack.GroupProtocolConsumer {
				cfg.OverwriteSaramaConfig.Version = sarama.V0_10_0_0
			}
		})
		handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
			k, _ := msgPO(m)
			mu.Lock()
			seen[k] = true
			mu.Unlock()
			m.Ack()
		})
		kafkatest.WaitFor(t, 30*time.Second, "every record to be handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) == 20
		})
		kafkatest.WaitFor(t, 15*time.Second, "the group to commit the end of each partition", func() bool {
			cm := c.CommittedOffsets(t, group, topic)
			return cm[0].Offset == 10 && cm[1].Offset == 10
		})
		require.NoError(t, sub.Close())
		got := conns()
		t.Logf("%v: connections by client software, Subscribe to Close: %v", p, got)
		if p == safeack.GroupProtocolConsumer {
			require.Zero(t, got["sarama"], "a connection of Sarama's")
			require.Positive(t, got["kgo"])
		} else {
			require.Positive(t, got["sarama"], "the classic protocol connects through Sarama")
		}
	})
}

// TestConsumerProtocolMissingTopicLoggedAsError: a consumer-protocol
// subscription to a topic the cluster does not have logs an Error naming
// the topic with UNKNOWN_TOPIC_OR_PARTITION (matching
// sarama.ErrUnknownTopicOrPartition, as on the classic protocol) and is not
// ready. Before, franz-go's member joined, waited for the topic without a
// word, and Ready reported it consuming.
func TestConsumerProtocolMissingTopicLoggedAsError(t *testing.T) {
	t.Parallel()
	requireConsumerProtocol(t)
	c := kafkatest.Start(t)
	if c.AutoCreatesTopics(t) {
		t.Skip("the cluster creates a topic its metadata is asked for (auto.create.topics.enable)")
	}
	logger := watermill.NewCaptureLogger()
	cfg := protocolConfig(c, c.NewGroup(t), safeack.GroupProtocolConsumer, func(cfg *safeack.SubscriberConfig) {
		cfg.WaitForTopicCreationTimeout = 50 * time.Millisecond
	})
	sub, err := safeack.NewSubscriber(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	missing := "missing-" + c.NewGroup(t)
	_, err = sub.Subscribe(context.Background(), missing)
	require.NoError(t, err, "Subscribe does not wait for the topic")
	kafkatest.WaitFor(t, 5*time.Second, "an Error naming the missing topic", func() bool {
		for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
			if errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition) && m.Fields["topic"] == missing {
				return true
			}
		}
		return false
	})
	require.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
}

// TestConsumerProtocolUnreachableBroker: a consumer-protocol Subscribe
// fails with a clear error when no broker can be reached (refused, or a
// broker that never answers), within the time Sarama's config allows, as
// the classic protocol's does (TestSubscribeUnreachableBroker).
func TestConsumerProtocolUnreachableBroker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		broker func(t *testing.T) string
	}{
		{"refused", func(*testing.T) string { return "127.0.0.1:1" }},
		{"silent", silentBroker},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			broker := tc.broker(t)
			cfg := unreachableConfig([]string{broker}, "g")
			cfg.GroupProtocol = safeack.GroupProtocolConsumer
			sub, err := safeack.NewSubscriber(cfg, testLogger())
			require.NoError(t, err)
			defer sub.Close()
			start := time.Now()
			_, err = sub.Subscribe(context.Background(), "orders")
			took := time.Since(start)
			t.Logf("Subscribe failed after %v: %v", took.Round(time.Millisecond), err)
			require.Error(t, err)
			require.ErrorContains(t, err, "orders")
			require.ErrorContains(t, err, broker)
			if tc.name == "refused" {
				require.ErrorIs(t, err, syscall.ECONNREFUSED)
			} else {
				require.GreaterOrEqual(t, took, cfg.OverwriteSaramaConfig.Net.ReadTimeout)
				require.ErrorContains(t, err, "no answer within")
			}
			require.Less(t, took, 10*time.Second)
			require.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
		})
	}
}
