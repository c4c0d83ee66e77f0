package safeack_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// A principal that may read the topic but has no ACL for the consumer
// group: Subscribe fails within seconds with an error that names the group
// and wraps sarama.ErrGroupAuthorizationFailed, at Sarama's defaults.
// Before, Subscribe succeeded (the refusal, met while checking the commit
// metadata budget, was logged at Info) and Ready told it only once the
// group's join retries ran out, 15 s later on a secured Kafka 4.4.0.
func TestGroupNotAuthorizedFailsSubscribe(t *testing.T) {
	t.Parallel()
	allow := func(typ kmsg.ACLResourceType, name string) kfake.ACL {
		return kfake.ACL{Resource: typ, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true}
	}
	c := kafkatest.Start(t, kafkatest.WithPlainSuperuser("admin", "admin"), kafkatest.WithKfakeOpts(
		kfake.EnableACLs(),
		kfake.User("PLAIN", "reader", "reader",
			allow(kmsg.ACLResourceTypeTopic, "*"),
			allow(kmsg.ACLResourceTypeCluster, "kafka-cluster"),
		),
	))
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)

	sc := safeack.DefaultSaramaSubscriberConfig()
	sc.Version = c.SaramaConfig().Version
	sc.Net.SASL = c.SaramaConfig().Net.SASL
	sc.Net.SASL.User, sc.Net.SASL.Password = "reader", "reader"
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: group, OverwriteSaramaConfig: sc}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = sub.Subscribe(ctx, topic)
	took := time.Since(start)
	require.ErrorIs(t, err, sarama.ErrGroupAuthorizationFailed)
	require.ErrorContains(t, err, group)
	require.ErrorContains(t, err, "READ on the group")
	require.Less(t, took, 10*time.Second, "Subscribe took %v to report the refusal", took)
	t.Logf("Subscribe failed after %v: %v", took.Round(time.Millisecond), err)
}
