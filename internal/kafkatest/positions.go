package kafkatest

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// Helpers that put a partition where users' partitions end up: a group
// commit set from outside, a log start moved by DeleteRecords or compaction,
// an aborted transaction, partitions added to a live topic.

// CommitOffset sets group's committed offset for topic/partition from
// outside the group (an OffsetCommit as an admin tool sends it, generation
// -1), whether or not the offset is in the partition's range. The group must
// have no live members.
func (c *Cluster) CommitOffset(tb testing.TB, group, topic string, partition int32, offset int64) {
	tb.Helper()
	_, admin := c.clients(tb)
	resp, err := admin.AlterConsumerGroupOffsets(group, map[string]map[int32]sarama.OffsetAndMetadata{
		topic: {partition: {Offset: offset}},
	}, nil)
	if err != nil {
		tb.Fatalf("kafkatest: committing %d for group %s on %s/%d: %v", offset, group, topic, partition, err)
	}
	if kerr := resp.Errors[topic][partition]; kerr != sarama.ErrNoError {
		tb.Fatalf("kafkatest: committing %d for group %s on %s/%d: %v", offset, group, topic, partition, kerr)
	}
}

// DeleteRecords moves the log start of topic/partition to before: records
// below it are gone, as after retention.
func (c *Cluster) DeleteRecords(tb testing.TB, topic string, partition int32, before int64) {
	tb.Helper()
	_, admin := c.clients(tb)
	if err := admin.DeleteRecords(topic, map[int32]int64{partition: before}); err != nil {
		tb.Fatalf("kafkatest: deleting records of %s/%d below %d: %v", topic, partition, before, err)
	}
	WaitFor(tb, 10*time.Second, fmt.Sprintf("log start of %s/%d to reach %d", topic, partition, before), func() bool {
		return c.LogStartOffsets(tb, topic)[partition] >= before
	})
}

// LogStartOffsets returns, per partition of topic, the first offset still in
// the log (what OffsetOldest resolves to).
func (c *Cluster) LogStartOffsets(tb testing.TB, topic string) map[int32]int64 {
	tb.Helper()
	return c.listOffsets(tb, topic, sarama.OffsetOldest, "log start")
}

// AddPartitions grows topic to total partitions and waits until metadata
// shows them with leaders.
func (c *Cluster) AddPartitions(tb testing.TB, topic string, total int) {
	tb.Helper()
	client, admin := c.clients(tb)
	if err := admin.CreatePartitions(topic, int32(total), nil, false); err != nil {
		tb.Fatalf("kafkatest: growing %s to %d partitions: %v", topic, total, err)
	}
	WaitFor(tb, 15*time.Second, fmt.Sprintf("topic %s to have %d partitions", topic, total), func() bool {
		if err := client.RefreshMetadata(topic); err != nil {
			return false
		}
		ps, err := client.Partitions(topic)
		return err == nil && len(ps) == total
	})
}

// NewCompactedTopic is NewTopic with cleanup.policy=compact, for Compact.
func (c *Cluster) NewCompactedTopic(tb testing.TB, partitions int) string {
	tb.Helper()
	name := c.NewTopic(tb, partitions)
	_, admin := c.clients(tb)
	compact := "compact"
	if err := admin.AlterConfig(sarama.TopicResource, name, map[string]*string{"cleanup.policy": &compact}, false); err != nil {
		tb.Fatalf("kafkatest: making %s compacted: %v", name, err)
	}
	return name
}

// Compact runs log compaction on every compacted topic now. Embedded broker
// only: a real broker compacts on its own schedule.
func (c *Cluster) Compact(tb testing.TB) {
	tb.Helper()
	c.RequireEmbedded(tb)
	c.kf.Compact()
}

// ProduceAborted writes n records to topic/partition in a transaction that
// it then aborts: they take offsets (and an abort marker one more) but a
// read_committed consumer never sees them. It returns the offset after the
// abort marker, the next offset produced.
func (c *Cluster) ProduceAborted(tb testing.TB, topic string, partition int32, n int) int64 {
	tb.Helper()
	cfg := c.SaramaConfig()
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = uniqueName("tx-", tb.Name())
	cfg.Net.MaxOpenRequests = 1
	p, err := sarama.NewSyncProducer(c.brokers, cfg)
	if err != nil {
		tb.Fatalf("kafkatest: transactional producer: %v", err)
	}
	defer func() { _ = p.Close() }()
	before := c.HighWaterMarks(tb, topic)[partition]
	if err := p.BeginTxn(); err != nil {
		tb.Fatalf("kafkatest: begin transaction: %v", err)
	}
	for i := range n {
		msg := &sarama.ProducerMessage{
			Topic: topic, Partition: partition,
			Value: sarama.StringEncoder(fmt.Sprintf("aborted-%d", i)),
		}
		if _, _, err := p.SendMessage(msg); err != nil {
			tb.Fatalf("kafkatest: producing in a transaction: %v", err)
		}
	}
	if err := p.AbortTxn(); err != nil {
		tb.Fatalf("kafkatest: abort transaction: %v", err)
	}
	var next int64
	WaitFor(tb, 10*time.Second, fmt.Sprintf("the abort marker on %s/%d", topic, partition), func() bool {
		next = c.HighWaterMarks(tb, topic)[partition]
		return next >= before+int64(n)+1
	})
	return next
}

// AutoCreatesTopics reports whether the cluster creates a topic that a
// metadata request names (auto.create.topics.enable, as scripts/kafka.sh
// sets it). The embedded broker does not.
func (c *Cluster) AutoCreatesTopics(tb testing.TB) bool {
	tb.Helper()
	if c.kf != nil {
		return false
	}
	client, admin := c.clients(tb)
	brokers := client.Brokers()
	if len(brokers) == 0 {
		tb.Fatalf("kafkatest: no brokers known")
	}
	res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{
		Type:        sarama.BrokerResource,
		Name:        strconv.Itoa(int(brokers[0].ID())),
		ConfigNames: []string{"auto.create.topics.enable"},
	}}, sarama.DescribeConfigsOptions{})
	if err != nil {
		tb.Fatalf("kafkatest: describing auto.create.topics.enable: %v", err)
	}
	for _, r := range res {
		for _, e := range r.Configs {
			if e.Name == "auto.create.topics.enable" {
				return e.Value == "true"
			}
		}
	}
	return true // Kafka's default
}
