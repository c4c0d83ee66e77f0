package share

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// InitializeTopic creates topic as details say, through a kgo client made
// with opts (the share subscriber's ClientOptions: its TLS, SASL and
// dialer, as its members connect), and waits until every partition has a
// leader or ctx ends. A topic that exists already is fine.
func InitializeTopic(ctx context.Context, brokers []string, opts []kgo.Opt, topic string, details *sarama.TopicDetail) error {
	client, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...), kgo.SeedBrokers(brokers...))...)
	if err != nil {
		return fmt.Errorf("cannot create a client to create topic %q: %w", topic, err)
	}
	defer client.Close()

	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = details.NumPartitions
	rt.ReplicationFactor = details.ReplicationFactor
	for partition, replicas := range details.ReplicaAssignment {
		ra := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
		ra.Partition, ra.Replicas = partition, replicas
		rt.ReplicaAssignment = append(rt.ReplicaAssignment, ra)
	}
	if len(rt.ReplicaAssignment) > 0 {
		rt.NumPartitions, rt.ReplicationFactor = -1, -1 // Kafka refuses both with an assignment
	}
	for name, value := range details.ConfigEntries {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = name, value
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30_000
	resp, err := req.RequestWith(ctx, client)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("cannot create topic %q: %w", topic, err)
	}
	return waitForLeaders(ctx, client, topic, details.NumPartitions)
}

// waitForLeaders waits until topic has at least want partitions (any, for
// want <= 0), each with a leader.
func waitForLeaders(ctx context.Context, client *kgo.Client, topic string, want int32) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req := kmsg.NewPtrMetadataRequest()
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, mt)
		if resp, err := req.RequestWith(ctx, client); err == nil && len(resp.Topics) == 1 && leadersReady(resp.Topics[0], want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %q not ready: %w", topic, ctx.Err())
		case <-tick.C:
		}
	}
}

func leadersReady(t kmsg.MetadataResponseTopic, want int32) bool {
	if t.ErrorCode != 0 || len(t.Partitions) == 0 || (want > 0 && int32(len(t.Partitions)) < want) {
		return false
	}
	for _, p := range t.Partitions {
		if p.ErrorCode != 0 || p.Leader < 0 {
			return false
		}
	}
	return true
}
