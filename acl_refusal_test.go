package safeack_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

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

// Share subscribers of principals the broker refuses: without an ACL for
// the share group, or for the topic, Subscribe fails within seconds with
// an error naming what is missing (GROUP_AUTHORIZATION_FAILED,
// TOPIC_AUTHORIZATION_FAILED); with READ on both, the same subscriber
// consumes. Before, Subscribe succeeded and WaitReady said "joining share
// group" for as long as one waited, the cause only in "Share fetch failed"
// log lines.
func TestShareNotAuthorizedFailsSubscribe(t *testing.T) {
	t.Parallel()
	allow := func(typ kmsg.ACLResourceType) kfake.ACL {
		return kfake.ACL{Resource: typ, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true}
	}
	c := kafkatest.Start(t, kafkatest.WithPlainSuperuser("admin", "admin"), kafkatest.WithKfakeOpts(
		kfake.EnableACLs(),
		kfake.User("PLAIN", "no-group", "pw", allow(kmsg.ACLResourceTypeTopic)),
		kfake.User("PLAIN", "no-topic", "pw", allow(kmsg.ACLResourceTypeGroup)),
		kfake.User("PLAIN", "reader", "pw", allow(kmsg.ACLResourceTypeTopic), allow(kmsg.ACLResourceTypeGroup)),
	))
	c.RequireEmbedded(t)
	requireShareGroups(t, c)
	for _, tc := range []struct {
		user, refused string
		err           error
	}{
		{"no-group", "share group", kerr.GroupAuthorizationFailed},
		{"no-topic", "topic", kerr.TopicAuthorizationFailed},
		{"reader", "", nil},
	} {
		t.Run(tc.user, func(t *testing.T) {
			t.Parallel()
			topic, group := c.NewTopic(t, 1), c.NewGroup(t)
			sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
				Brokers:       c.Brokers(),
				ShareGroup:    group,
				ClientOptions: []kgo.Opt{kgo.SASL(plain.Auth{User: tc.user, Pass: "pw"}.AsMechanism())},
			}, testLogger())
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			msgs, err := sub.Subscribe(ctx, topic)
			took := time.Since(start)
			if tc.err == nil {
				require.NoError(t, err)
				// The group starts at the log's end once the member's
				// assignment comes (a heartbeat after joining): records
				// until one arrives.
				for {
					c.Produce(t, topic, kafkatest.Record{Value: []byte("r")})
					select {
					case m := <-msgs:
						m.Ack()
						return
					case <-time.After(200 * time.Millisecond):
					case <-ctx.Done():
						t.Fatal("no record for a principal with READ on the group and the topic")
					}
				}
			}
			require.ErrorIs(t, err, tc.err)
			require.ErrorContains(t, err, tc.refused)
			require.ErrorContains(t, err, "it needs READ")
			require.Less(t, took, 10*time.Second, "Subscribe took %v to report the refusal", took)
			t.Logf("Subscribe failed after %v: %v", took.Round(time.Millisecond), err)
		})
	}
}
