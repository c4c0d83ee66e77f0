package safeack_test

import (
	"cmp"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// testLogger logs at debug level when SAFEACK_TEST_DEBUG is set.
func testLogger() watermill.LoggerAdapter {
	if os.Getenv("SAFEACK_TEST_DEBUG") != "" {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// suiteEnv builds publishers and subscribers for Watermill's universal
// Pub/Sub suite on one broker.
type suiteEnv struct {
	cluster      *kafkatest.Cluster
	ordering     safeack.Ordering
	marshaler    kafka.MarshalerUnmarshaler
	drainTimeout time.Duration // 0: 2 s
	protocol     safeack.GroupProtocol
}

func newSuiteEnv(t *testing.T, ordering safeack.Ordering, marshaler kafka.MarshalerUnmarshaler) *suiteEnv {
	return &suiteEnv{
		cluster:   kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.AllowAutoTopicCreation())),
		ordering:  ordering,
		marshaler: marshaler,
		protocol:  envGroupProtocol,
	}
}

func (e *suiteEnv) publisher(t *testing.T) message.Publisher {
	cfg := e.cluster.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               e.cluster.Brokers(),
		Marshaler:             e.marshaler,
		OverwriteSaramaConfig: cfg,
	}, testLogger())
	require.NoError(t, err)
	return pub
}

func (e *suiteEnv) subscriber(t *testing.T, group string) message.Subscriber {
	cfg := e.cluster.SaramaConfig()
	cfg.Consumer.Return.Errors = true
	protocol := safeack.GroupProtocolClassic
	if group != "" && e.protocol == safeack.GroupProtocolConsumer {
		protocol = e.protocol
		def := sarama.NewConfig().Consumer.Group
		cfg.Consumer.Group.Session.Timeout, cfg.Consumer.Group.Heartbeat.Interval = def.Session.Timeout, def.Heartbeat.Interval
	}
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		GroupProtocol:         protocol,
		Brokers:               e.cluster.Brokers(),
		Unmarshaler:           e.marshaler,
		OverwriteSaramaConfig: cfg,
		ConsumerGroup:         group,
		Ordering:              e.ordering,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
		DrainTimeout:          cmp.Or(e.drainTimeout, 2*time.Second),
		InitializeTopicDetails: &sarama.TopicDetail{
			NumPartitions:     8,
			ReplicationFactor: 1,
		},
	}, testLogger())
	require.NoError(t, err)
	return sub
}

func (e *suiteEnv) constructors() (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return e.publisher(t), e.subscriber(t, group)
	}
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		// One group per test, shared by the subscribers the test makes
		// (the persistence tests resume in the same group). The suite's
		// tests run in parallel, each on its own topic: in one group for
		// all (watermill-kafka's "test"), every member joining or leaving
		// makes every test's members rebalance, each waiting for the
		// others to drain, and on a loaded machine a test's subscriber
		// then received nothing within the suite's timeouts.
		return withGroup(t, "test-"+strings.ReplaceAll(t.Name(), "/", "."))
	}, withGroup
}

// fullSuite reports whether Watermill's universal suite runs at full size
// on c (up to 10,000 messages a test, 50 subscribers): against a real
// broker, as CI's integration runs do, or when SAFEACK_TEST_FULL is set.
// On the embedded broker by default it runs its short mode: the same
// tests and checks, with 100 to 1,000 messages and 10 subscribers. Full
// size there took the default suite's longest minutes (two of its tests
// over 50 s each under -race on two cores).
func fullSuite(c *kafkatest.Cluster) bool {
	return !c.Embedded() || os.Getenv("SAFEACK_TEST_FULL") != ""
}

// runGroupSuite runs Watermill's universal suite with consumer groups.
func runGroupSuite(t *testing.T, ordering safeack.Ordering, marshaler kafka.MarshalerUnmarshaler, guaranteedOrder bool) {
	runGroupSuiteOn(t, envGroupProtocol, ordering, marshaler, guaranteedOrder)
}

// runGroupSuiteOn is runGroupSuite on group protocol p.
func runGroupSuiteOn(t *testing.T, p safeack.GroupProtocol, ordering safeack.Ordering, marshaler kafka.MarshalerUnmarshaler, guaranteedOrder bool) {
	if p == safeack.GroupProtocolConsumer {
		requireConsumerProtocol(t)
	}
	env := newSuiteEnv(t, ordering, marshaler)
	env.protocol = p
	pubSub, group := env.constructors()
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:  true,
		Persistent:      true,
		GuaranteedOrder: guaranteedOrder,
		ForceShort:      !fullSuite(env.cluster),
	}, pubSub, group)
}

func TestPubSubUnordered(t *testing.T) {
	t.Parallel()
	runGroupSuite(t, safeack.Unordered, kafka.DefaultMarshaler{}, false)
}

// TestPubSubConsumerProtocol runs the suite (Unordered) on the consumer
// group protocol (KIP-848) in the default suite; SAFEACK_TEST_GROUP_PROTOCOL
// runs every variant on it.
func TestPubSubConsumerProtocol(t *testing.T) {
	t.Parallel()
	runGroupSuiteOn(t, safeack.GroupProtocolConsumer, safeack.Unordered, kafka.DefaultMarshaler{}, false)
}

func TestPubSubByKey(t *testing.T) {
	t.Parallel()
	runGroupSuite(t, safeack.OrderByKey, kafka.DefaultMarshaler{}, false)
}

// TestPubSubByPartition runs the suite with GuaranteedOrder, which enables
// TestNoAck and TestPublishSubscribeInOrder. The latter needs all its
// messages on one partition: the partitioning marshaler with an empty
// partition key puts them there, as watermill-kafka's own ordered test does.
func TestPubSubByPartition(t *testing.T) {
	t.Parallel()
	runGroupSuite(t, safeack.OrderByPartition, kafka.NewWithPartitioningMarshaler(
		func(topic string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("partition_key"), nil
		}), true)
}

func TestPubSubNoConsumerGroup(t *testing.T) {
	t.Parallel()
	env := newSuiteEnv(t, safeack.Unordered, kafka.DefaultMarshaler{})
	// TestConcurrentSubscribe reads 5,000 messages from 50 subscribers
	// that each hand out all of them, then closes them one by one: each
	// Close waits DrainTimeout for acks of handed-out messages nobody reads.
	env.drainTimeout = 200 * time.Millisecond
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:                   false,
		Persistent:                       true,
		GuaranteedOrder:                  false,
		NewSubscriberReceivesOldMessages: true,
		ForceShort:                       !fullSuite(env.cluster),
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return env.publisher(t), env.subscriber(t, "")
	}, nil)
}
