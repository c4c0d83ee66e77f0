package kafkatest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// CommittedOffset is a group's commit for one partition: the next offset to
// consume (-1 when the group has committed nothing there) and the metadata
// string stored with it.
type CommittedOffset struct {
	Offset   int64
	Metadata string
}

// TopicPartition names one partition of one topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// partitions returns the topic's partition ids from fresh metadata.
func (c *Cluster) partitions(tb testing.TB, topic string) []int32 {
	tb.Helper()
	client, _ := c.clients(tb)
	if err := client.RefreshMetadata(topic); err != nil {
		tb.Fatalf("kafkatest: metadata for %s: %v", topic, err)
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		tb.Fatalf("kafkatest: partitions of %s: %v", topic, err)
	}
	return ps
}

// CommittedOffsets reads group's committed offsets for every partition of
// topic from the broker (an OffsetFetch through the ClusterAdmin). Partitions
// without a commit are present with Offset -1. Works on both kfake and real
// clusters: it is the fallback where ObserveCommits is unavailable.
func (c *Cluster) CommittedOffsets(tb testing.TB, group, topic string) map[int32]CommittedOffset {
	tb.Helper()
	ps := c.partitions(tb, topic)
	_, admin := c.clients(tb)
	// A coordinator that is still loading the group's offsets, or moving
	// (a broker just started or restarted), is asked again for a while.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := committedOnce(admin, group, topic, ps)
		if err == nil {
			return out
		}
		if !coordinatorBusy(err) || time.Now().After(deadline) {
			tb.Fatalf("kafkatest: committed offsets of group %s on %s: %v", group, topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func committedOnce(admin sarama.ClusterAdmin, group, topic string, ps []int32) (map[int32]CommittedOffset, error) {
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		// kfake answers GROUP_ID_NOT_FOUND for a group it has never seen,
		// where real Kafka answers -1 per partition: same meaning.
		resp, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[int32]CommittedOffset, len(ps))
	for _, p := range ps {
		co := CommittedOffset{Offset: -1}
		if b := blockOf(resp, topic, p); b != nil {
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("partition %d: %w", p, b.Err)
			}
			co = CommittedOffset{Offset: b.Offset, Metadata: b.Metadata}
		}
		out[p] = co
	}
	return out, nil
}

// coordinatorBusy reports an error a group coordinator answers while it
// loads or moves a group: asking again later gets the offsets.
func coordinatorBusy(err error) bool {
	return errors.Is(err, sarama.ErrOffsetsLoadInProgress) ||
		errors.Is(err, sarama.ErrNotCoordinatorForConsumer) ||
		errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable)
}

// HighWaterMarks returns, per partition of topic, the offset the next
// produced record will get (the end of the log).
func (c *Cluster) HighWaterMarks(tb testing.TB, topic string) map[int32]int64 {
	tb.Helper()
	return c.listOffsets(tb, topic, sarama.OffsetNewest, "high watermark")
}

// listOffsets resolves at (OffsetNewest or OffsetOldest) for every
// partition of topic; what names it in a failure.
func (c *Cluster) listOffsets(tb testing.TB, topic string, at int64, what string) map[int32]int64 {
	tb.Helper()
	ps := c.partitions(tb, topic)
	client, _ := c.clients(tb)
	out := make(map[int32]int64, len(ps))
	for _, p := range ps {
		off, err := client.GetOffset(topic, p, at)
		if err != nil {
			tb.Fatalf("kafkatest: %s of %s/%d: %v", what, topic, p, err)
		}
		out[p] = off
	}
	return out
}

// blockOf is resp.GetBlock, tolerating a nil resp (no group, no commits).
func blockOf(resp *sarama.OffsetFetchResponse, topic string, p int32) *sarama.OffsetFetchResponseBlock {
	if resp == nil {
		return nil
	}
	return resp.GetBlock(topic, p)
}
