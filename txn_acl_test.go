package safeack_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// An output topic the producer may not write to (an ACL; whether or not
// it may describe it): Publish refuses the output (sarama.ErrTopicAuthorizationFailed), so the
// handler's error reaches PoisonQueue, the input is dead-lettered and the
// other inputs' outputs are committed. Before, Publish took it, the
// broker refused it inside the transaction, and every transaction that
// carried it aborted: the record was handled again and the subscription
// never committed again.
func TestTxnOutputTopicNotWritable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		denied kmsg.ACLOperation
	}{
		{"described, not written", kmsg.ACLOperationWrite},
		{"neither described nor written", kmsg.ACLOperationAll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testTxnOutputTopicNotWritable(t, tc.denied)
		})
	}
}

func testTxnOutputTopicNotWritable(t *testing.T, denied kmsg.ACLOperation) {
	const forbiddenPrefix = "forbidden-"
	allow := func(typ kmsg.ACLResourceType, name string) kfake.ACL {
		return kfake.ACL{Resource: typ, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true}
	}
	c := kafkatest.Start(t, kafkatest.WithPlainSuperuser("admin", "admin"), kafkatest.WithKfakeOpts(
		kfake.EnableACLs(),
		kfake.User("PLAIN", "app", "app",
			allow(kmsg.ACLResourceTypeTopic, "*"),
			allow(kmsg.ACLResourceTypeGroup, "*"),
			allow(kmsg.ACLResourceTypeTransactionalId, "*"),
			allow(kmsg.ACLResourceTypeCluster, "kafka-cluster"),
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: forbiddenPrefix, Pattern: kmsg.ACLResourcePatternTypePrefixed,
				Operation: denied, Allow: false},
		),
	))
	in, out, dlq := c.NewTopic(t, 1), c.NewTopic(t, 1), c.NewTopic(t, 1)
	forbidden := forbiddenPrefix + in
	require.NoError(t, c.Admin(t).CreateTopic(forbidden, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: -1}, false))

	app := c.SaramaConfig()
	app.Net.SASL.User, app.Net.SASL.Password = "app", "app"
	logger := testLogger()
	sub, pub, err := safeack.NewTxnSubscriber(safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: c.NewGroup(t), OverwriteSaramaConfig: app},
		safeack.TxnConfig{TransactionalID: "txn-acl"}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	poison, err := middleware.PoisonQueue(pub, dlq)
	require.NoError(t, err)
	refused := make(chan error, 1)
	router.AddMiddleware(poison, errorsTo(refused), pub.Middleware)
	router.AddHandler("h", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		o := outputFor(msg, "out")
		if string(msg.Payload) != "bad" {
			return []*message.Message{o}, nil
		}
		o.SetContext(msg.Context())
		return nil, pub.Publish(forbidden, o)
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})
	<-router.Running()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, sub.WaitReady(ctx))

	pcfg := kafka.DefaultSaramaSyncPublisherConfig()
	pcfg.Net.SASL = c.SaramaConfig().Net.SASL
	inPub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = inPub.Close() })
	publish := func(payload string, n int) []string {
		ids := make([]string, n)
		for i := range ids {
			m := message.NewMessage(watermill.NewUUID(), []byte(payload))
			ids[i] = m.UUID
			require.NoError(t, inPub.Publish(in, m))
		}
		return ids
	}
	rd := readOutputs(t, c, out, 1, sarama.ReadCommitted)
	dl := readOutputs(t, c, dlq, 1, sarama.ReadCommitted)
	ids := publish("ok", 3)
	publish("bad", 1)
	ids = append(ids, publish("ok", 3)...)

	rd.waitAll(t, ids, 20*time.Second)
	dl.waitRecords(t, 1, "the input whose output topic is not writable dead-lettered")
	rd.complete(t, c, out, 1)
	rd.checkExactlyOnce(t, ids)
	require.ErrorIs(t, <-refused, sarama.ErrTopicAuthorizationFailed)
	require.Zero(t, pub.Stats().Aborted)
}
