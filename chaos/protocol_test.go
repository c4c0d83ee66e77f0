//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/kafkatest"
)

// What the consumer group protocol (KIP-848, -chaos.protocol=consumer)
// changes in the harness. The scenarios are the same; the consumers run
// GroupProtocolConsumer, and:
//
//   - the coordinator sets the session timeout and the heartbeat interval.
//     The embedded broker is started with short ones (kafkatest.Start); on
//     a real cluster the scenario sets the group's consumer.session.timeout.ms
//     and consumer.heartbeat.interval.ms (group configs, Kafka 4.0+) before
//     its first member joins: the broker's defaults are 45 s and 5 s, and
//     scripts/kafka.sh's brokers accept down to 1 s and 0.5 s;
//   - the commits are safeack's own OffsetCommit v9+ through its franz-go
//     client, which dials through the Sarama config's Net.Proxy.Dialer: the
//     commit tap sees them; v10 names the topic by id, so the tap is told
//     the topic's id;
//   - the group watch asks the broker with ConsumerGroupDescribe, and its
//     limit is the session timeout, the coordinator's wait for a
//     revocation (the members' rebalance timeout) and a few heartbeats;
//   - the rebalance storm runs once: the coordinator's assignor makes
//     every rebalance incremental, so there is no eager or cooperative
//     variant.

// consumerHeartbeat is the heartbeat interval a scenario sets on its group
// on a real cluster (scripts/kafka.sh's group.consumer.min.heartbeat.interval.ms).
const consumerHeartbeat = 500 * time.Millisecond

// kgoAdmin returns a franz-go client of c, connecting as the harness does.
func kgoAdmin(c *kafkatest.Cluster) (*kgo.Client, error) {
	return kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
}

// topicIDOf returns topic's id, from the cluster's metadata.
func topicIDOf(t *testing.T, c *kafkatest.Cluster, topic string) [16]byte {
	t.Helper()
	cl, err := kgoAdmin(c)
	if err != nil {
		t.Fatalf("topic id of %s: %v", topic, err)
	}
	defer cl.Close()
	var id [16]byte
	var last error
	ok := waitCond(30*time.Second, func() bool {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			last = err
			return false
		}
		for _, mt := range resp.Topics {
			if mt.Topic != nil && *mt.Topic == topic && mt.ErrorCode == 0 && mt.TopicID != [16]byte{} {
				id = mt.TopicID
				return true
			}
		}
		last = fmt.Errorf("not in the metadata yet")
		return false
	})
	if !ok {
		t.Fatalf("topic id of %s: %v", topic, last)
	}
	return id
}

// shortenConsumerSessions sets group's session timeout and heartbeat
// interval on a real cluster (group configs; the embedded broker's are set
// at its start), so that a killed member's partitions move after session,
// not after the broker's default 45 s.
func shortenConsumerSessions(t *testing.T, c *kafkatest.Cluster, group string, session time.Duration) {
	t.Helper()
	if c.Embedded() {
		return
	}
	cl, err := kgoAdmin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	configs := map[string]string{
		"consumer.session.timeout.ms":    strconv.FormatInt(session.Milliseconds(), 10),
		"consumer.heartbeat.interval.ms": strconv.FormatInt(min(consumerHeartbeat, session/3).Milliseconds(), 10),
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for name, value := range configs {
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = name, kmsg.StringPtr(value)
		res.Configs = append(res.Configs, cfg)
	}
	req.Resources = append(req.Resources, res)
	var last error
	if !waitCond(time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		resp, err := req.RequestWith(ctx, cl)
		if err == nil && len(resp.Resources) == 1 {
			err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
			if err != nil && resp.Resources[0].ErrorMessage != nil {
				err = fmt.Errorf("%w: %s", err, *resp.Resources[0].ErrorMessage)
			}
		}
		last = err
		return err == nil
	}) {
		t.Fatalf("setting the group configs %v of %s (the broker must accept them: group.consumer.min.session.timeout.ms and group.consumer.min.heartbeat.interval.ms, see scripts/kafka.sh): %v",
			configs, group, last)
	}
}

// describeConsumerGroup says what the broker reports of a consumer-protocol
// group (ConsumerGroupDescribe): its state and epochs, and each member,
// as member formats it with its client id, epoch and the partitions of
// topic it owns and is to own.
func describeConsumerGroup(c *kafkatest.Cluster, group, topic string, member func(clientID string) string) string {
	cl, err := kgoAdmin(c)
	if err != nil {
		return fmt.Sprintf("(ConsumerGroupDescribe: %v)", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Groups) != 1 {
		return fmt.Sprintf("(ConsumerGroupDescribe failed: %v)", err)
	}
	g := resp.Groups[0]
	switch err := kerr.ErrorForCode(g.ErrorCode); {
	case errors.Is(err, kerr.GroupIDNotFound):
		// As DescribeGroups says "Dead" of a group nobody joined.
		return "consumer group unknown to the broker (GROUP_ID_NOT_FOUND)"
	case err != nil:
		return fmt.Sprintf("(ConsumerGroupDescribe: %v)", err)
	}
	parts := func(a kmsg.Assignment) string {
		var ps []int32
		for _, tp := range a.TopicPartitions {
			if tp.Topic == topic || tp.Topic == "" {
				ps = append(ps, tp.Partitions...)
			}
		}
		slices.Sort(ps)
		return fmt.Sprint(ps)
	}
	var ms []string
	for _, m := range g.Members {
		ms = append(ms, fmt.Sprintf("%s epoch %d owns %s, target %s (%s)", m.ClientID, m.MemberEpoch,
			parts(m.Assignment), parts(m.TargetAssignment), member(m.ClientID)))
	}
	slices.Sort(ms)
	return fmt.Sprintf("consumer group %s, epoch %d, assignment epoch %d, %d members: %s",
		g.State, g.Epoch, g.AssignmentEpoch, len(ms), strings.Join(ms, ", "))
}

// requireConsumerProtocol skips t on a real cluster older than Kafka 4.0,
// which has no consumer group protocol (SAFEACK_KAFKA_VERSION names the
// version; unset, the cluster is taken to have it).
func requireConsumerProtocol(t *testing.T, c *kafkatest.Cluster) {
	t.Helper()
	if c.Embedded() {
		return
	}
	v, err := sarama.ParseKafkaVersion(strings.TrimSpace(os.Getenv(kafkatest.EnvVersion)))
	if err == nil && !v.IsAtLeast(sarama.V4_0_0_0) {
		t.Skipf("the consumer group protocol (KIP-848) needs Kafka 4.0+; the cluster is %v", v)
	}
}

// leaveToCoordinator puts back Sarama's defaults of what the coordinator
// decides on the consumer protocol (the session timeout, the heartbeat
// interval, the assignor), as NewSubscriber requires with
// GroupProtocolConsumer. Rebalance.Timeout stays: it is how long the
// coordinator waits for a member's revocation.
func leaveToCoordinator(cfg *sarama.Config) {
	def := sarama.NewConfig().Consumer.Group
	g := &cfg.Consumer.Group
	g.Session.Timeout, g.Heartbeat.Interval = def.Session.Timeout, def.Heartbeat.Interval
	g.Rebalance.GroupStrategies, g.Rebalance.Strategy = def.Rebalance.GroupStrategies, nil
}
