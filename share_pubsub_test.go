package safeack_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestSharePubSub runs Watermill's universal Pub/Sub suite against the
// ShareSubscriber. Features say what share groups give: consumer groups
// (a share group per name: members of one split the records, two groups
// each get all), persistence, and no order (GuaranteedOrder false, so
// TestNoAck, which needs one message at a time, does not run). A new share
// group starts at the log start (InitialOffset OffsetOldest), but a new
// member of an existing group does not get what the group accepted, so
// NewSubscriberReceivesOldMessages is false.
//
// TestContinueAfterErrors nacks 300 deliveries of 50 records in one group
// and expects every record afterwards: share groups cap deliveries
// (group.share.delivery.count.limit, 5 by default, at most 10 on Kafka),
// after which a record is archived. The embedded broker gets a limit of
// 1,000 for it; on a real cluster the suite runs short (5 nacks).
func TestSharePubSub(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0, kfake.AllowAutoTopicCreation(),
		kfake.BrokerConfigs(map[string]string{"group.share.delivery.count.limit": "1000"}))
	env := &suiteEnv{cluster: c, marshaler: kafka.DefaultMarshaler{}}
	sub := func(t *testing.T, group string) message.Subscriber {
		s, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
			Brokers:       c.Brokers(),
			ShareGroup:    group,
			InitialOffset: sarama.OffsetOldest,
			DrainTimeout:  200 * time.Millisecond,
			MaxDeliveries: 1000,
			ClientOptions: c.KgoOpts(),
			InitializeTopicDetails: &sarama.TopicDetail{
				NumPartitions:     8,
				ReplicationFactor: 1,
			},
		}, testLogger())
		require.NoError(t, err)
		return shareSkipping{t: t, c: c, ShareSubscriber: s}
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:  true,
		Persistent:      true,
		GuaranteedOrder: false,
		// Short on a real broker too: each test waits out share
		// heartbeats and acquisition locks there.
		ForceShort: !c.Embedded() || !fullSuite(c),
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return env.publisher(t), sub(t, "share-"+strings.ReplaceAll(t.Name(), "/", "."))
	}, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return env.publisher(t), sub(t, group)
	})
}

// shareSkipping skips the test when the cluster does not serve share
// groups.
type shareSkipping struct {
	t *testing.T
	c *kafkatest.Cluster
	*safeack.ShareSubscriber
}

// SubscribeInitialize creates the topic, as the harness on a secured
// cluster: ShareSubscriber.SubscribeInitialize connects with Sarama's
// defaults there, not ClientOptions (TestSecuredShareSubscribeInitialize).
func (s shareSkipping) SubscribeInitialize(topic string) error {
	if !s.c.Secured() {
		return s.ShareSubscriber.SubscribeInitialize(topic)
	}
	err := s.c.Admin(s.t).CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 8, ReplicationFactor: -1}, false)
	if errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return nil
	}
	return err
}

func (s shareSkipping) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	msgs, err := s.ShareSubscriber.Subscribe(ctx, topic)
	if errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		s.t.Skipf("share groups not served by this cluster: %v", err)
	}
	return msgs, err
}
