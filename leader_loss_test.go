package safeack_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// leaderFaults are the ways a partition loses its leader in these tests:
// the cluster names none (kafkatest.Leaderless: nothing can be produced to
// it either), or the leader it names refuses to list or fetch it.
var leaderFaults = []struct {
	name  string
	apply func(t *testing.T, c *kafkatest.Cluster, topic string, partition int32) (restore func())
}{
	{"no leader", func(t *testing.T, c *kafkatest.Cluster, topic string, partition int32) func() {
		return c.Leaderless(t, topic, partition)
	}},
	{"leader not answering", func(t *testing.T, c *kafkatest.Cluster, topic string, partition int32) func() {
		refused := c.Kfake().Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.ListOffsets, kmsg.Fetch}, Topic: topic, Partitions: []int32{partition},
			Err: kerr.NotLeaderForPartition, Count: -1,
		})
		t.Cleanup(refused.Remove)
		return refused.Remove
	}},
}

// ownerOf returns which of subs owns partition of topic (in Stats), or -1.
func ownerOf(subs []*safeack.Subscriber, topic string, partition int32) int {
	for i, s := range subs {
		if _, ok := statsOf(s, topic, partition); ok {
			return i
		}
	}
	return -1
}

// A cooperative group of two members, each consuming one partition; one
// partition loses its leader and its member leaves, so that the cooperative
// rebalance adds the partition to the other member's running session (no
// Setup for it). The member keeps its session (the group's generation does
// not move after the rebalance), consumes its own partition on, reports
// the added one (an Error, Unclaimed, safeack_unclaimed_seconds), and
// consumes it once its leader answers. Every commit covers acked records.
// Before the fix, a leader that is named but does not answer made Sarama
// give the added claim up after its retries, which ended the member's
// session (and so every claim it had) once.
func TestUnclaimedAddedByCooperativeRebalance(t *testing.T) {
	for _, f := range leaderFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks, watch := watchCommits(t, c, group, topic)
			c.ProduceN(t, topic, 2, 4, nil)

			logs := []errorLog{newErrorLog(), newErrorLog()}
			subs := make([]*safeack.Subscriber, 2)
			for i := range subs {
				subs[i] = unclaimedSubscriber(t, c, group, logs[i], unclaimedStrategies[1].strategy())
				handleAll(mustSubscribe(t, subs[i], topic), acks.ack)
				if i == 0 {
					acks.waitAllAcked(t, c, topic, unclaimedDeadline)
				}
			}
			kafkatest.WaitFor(t, unclaimedDeadline, "each member to consume one partition", func() bool {
				gi := c.Kfake().GroupInfo(group)
				return gi != nil && gi.State == "Stable" && len(ownedPartitions(subs[0], topic)) == 1 &&
					len(ownedPartitions(subs[1], topic)) == 1
			})
			leaving := ownerOf(subs, topic, 1)
			staying := 1 - leaving
			sub, log := subs[staying], logs[staying]

			restore := f.apply(t, c, topic, 1)
			require.NoError(t, subs[leaving].Close())
			kafkatest.WaitFor(t, unclaimedDeadline, "the group to give the staying member both partitions", func() bool {
				gi := c.Kfake().GroupInfo(group)
				return gi != nil && gi.State == "Stable" && len(gi.Members) == 1 && gi.NumAssigned() == 2
			})
			generation := groupGeneration(c, group)

			waitUnclaimedReported(t, sub, log, topic, 1)
			c.Produce(t, topic, kafkatest.Record{Partition: 0}, kafkatest.Record{Partition: 0})
			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's new records to be acked", func() bool {
				return len(acks.missing(c, topic)) == 0
			})
			require.Equal(t, generation, groupGeneration(c, group), "the staying member's session ended")

			restore()
			c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 1})
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)
			require.Empty(t, sub.Unclaimed(), "the partition is consumed")
			require.Empty(t, unclaimedSeries(t, sub))
			require.Equal(t, generation, groupGeneration(c, group), "the staying member's session ended")
			watch.check(t)
		})
	}
}
