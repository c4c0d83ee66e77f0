package safeack_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
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

// leaderLostErrors returns the Errors logged about partition losing its
// leader while it was consumed.
func leaderLostErrors(logs errorLog, partition int32) []loggedError {
	return logs.matching(func(e loggedError) bool {
		return strings.Contains(e.msg, "lost its leader") && e.fields["kafka_partition"] == partition
	})
}

// waitLeaderLostReported waits until sub lists partition of topic as not
// consumed although its claim runs (Claimed), and has logged it as an
// Error naming it; the partition stays in Stats.
func waitLeaderLostReported(t *testing.T, sub *safeack.Subscriber, logs errorLog, topic string, partition int32) {
	t.Helper()
	kafkatest.WaitFor(t, unclaimedDeadline, fmt.Sprintf("partition %d to be reported not consumed", partition), func() bool {
		return len(sub.Unclaimed()) > 0 && len(leaderLostErrors(logs, partition)) > 0
	})
	for _, u := range sub.Unclaimed() {
		require.Equal(t, safeack.TopicPartition{Topic: topic, Partition: partition}, u.TopicPartition,
			"only the partition that lost its leader is listed")
		require.True(t, u.Claimed, "the partition's claim runs")
		require.Error(t, u.Err, "why partition %d is not consumed", partition)
		require.False(t, u.AssignedAt.IsZero())
		require.True(t, u.Since.After(u.AssignedAt), "not consumed since the leader went, not since the assignment")
	}
	_, owned := statsOf(sub, topic, partition)
	require.True(t, owned, "a claimed partition stays in Stats")
	require.Equal(t, []string{fmt.Sprint(partition)}, unclaimedSeries(t, sub), "safeack_unclaimed_seconds")
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
	skipOnConsumerProtocol(t, "Sarama's cooperative-sticky strategy and claim watch")
	t.Parallel()
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

// A partition loses its leader while its claim consumes it, with one of
// its records still in a handler. Sarama's partition consumer waits for a
// leader by itself, silently when the named leader refuses the fetch, and
// Stats kept the last high-water mark (lag 0 while records wait): before
// the fix nothing reported that the partition was not consumed. Now the
// member keeps its session, consumes its other partition on, commits the
// ack of the record in the handler, reports the partition (an Error,
// Unclaimed with Claimed set, safeack_unclaimed_seconds) within the claim
// bound, and consumes it again once its leader answers, which clears the
// report.
func TestUnclaimedLeaderLostWhileConsuming(t *testing.T) {
	t.Parallel()
	for _, s := range unclaimedStrategies {
		for _, f := range leaderFaults {
			t.Run(s.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
				acks, watch := watchCommits(t, c, group, topic)
				c.ProduceN(t, topic, 2, 4, nil) // offsets 0 and 1 of each

				logs := newErrorLog()
				sub := unclaimedSubscriber(t, c, group, logs, s.strategy())
				release := make(chan struct{})
				handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
					if k, _ := msgPO(m); k == (po{1, 2}) {
						<-release
					}
					acks.ack(m)
				})
				c.Produce(t, topic, kafkatest.Record{Partition: 1})
				kafkatest.WaitFor(t, unclaimedDeadline, "record 1@2 to be in its handler, the others acked", func() bool {
					ps, ok := statsOf(sub, topic, 1)
					return ok && ps.InFlight == 1 && len(acks.missing(c, topic)) == 1
				})
				generation := groupGeneration(c, group)

				restore := f.apply(t, c, topic, 1)
				c.Produce(t, topic, kafkatest.Record{Partition: 0})
				close(release)
				kafkatest.WaitFor(t, unclaimedDeadline, "every record to be acked", func() bool {
					return len(acks.missing(c, topic)) == 0
				})
				watch.waitCommitted(t, map[int32]int64{0: 3, 1: 3}, unclaimedDeadline)
				waitLeaderLostReported(t, sub, logs, topic, 1)
				require.Equal(t, generation, groupGeneration(c, group), "the session ended")

				restore()
				c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 0})
				acks.waitAllAcked(t, c, topic, unclaimedDeadline)
				kafkatest.WaitFor(t, unclaimedDeadline, "the report to clear", func() bool {
					return len(sub.Unclaimed()) == 0 && len(unclaimedSeries(t, sub)) == 0
				})
				require.Equal(t, generation, groupGeneration(c, group), "the session ended")
				watch.check(t)
			})
		}
	}
}

// Close while a consumed partition has no leader, with a record of it in
// its handler that acks during the drain: Close returns within its bound
// (DrainTimeout + min(max(DrainTimeout, 1 s), 5 s) + 2 s), and the final
// commit covers every acked record, that one included.
func TestCloseWhileLeaderLost(t *testing.T) {
	skipOnConsumerProtocol(t, "it waits for Sarama's error about the leaderless partition")
	t.Parallel()
	for _, s := range unclaimedStrategies {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks, watch := watchCommits(t, c, group, topic)
			c.ProduceN(t, topic, 2, 6, nil) // offsets 0..2 of each

			logs := newErrorLog()
			sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
				sc := cfg.OverwriteSaramaConfig
				sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{s.strategy()}
				// Sarama's partition consumer looks for a leader sooner.
				sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 3, 100*time.Millisecond
			})
			release := make(chan struct{})
			handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
				if k, _ := msgPO(m); k == (po{1, 2}) {
					<-release
				}
				acks.ack(m)
			})
			kafkatest.WaitFor(t, unclaimedDeadline, "record 1@2 to be in its handler, the others acked", func() bool {
				return len(acks.missing(c, topic)) == 1
			})
			restore := c.Leaderless(t, topic, 1)
			kafkatest.WaitFor(t, unclaimedDeadline, "Sarama to find partition 1 without a leader", func() bool {
				return len(logs.matching(func(e loggedError) bool {
					return errors.Is(e.err, sarama.ErrLeaderNotAvailable) && strings.Contains(e.err.Error(), topic+"/1:")
				})) > 0
			})

			closed := make(chan time.Duration)
			go func() {
				start := time.Now()
				_ = sub.Close()
				closed <- time.Since(start)
			}()
			time.AfterFunc(200*time.Millisecond, func() { close(release) }) // acked during the drain
			took := receive(t, closed, 30*time.Second, "Close did not return")
			t.Logf("Close took %v", took)
			require.Less(t, took, 4*time.Second, "Close took longer than its bound")
			restore() // the checks below read the topic's metadata
			acks.waitAllAcked(t, c, topic, time.Second)
			require.Equal(t, map[int32]int64{0: 3, 1: 3}, watch.committed(t), "the final commit covers every ack")
			watch.check(t)
		})
	}
}

// noGroupSubscriber is a subscriber without a consumer group, logging to
// logs.
func noGroupSubscriber(t *testing.T, c *kafkatest.Cluster, logs errorLog) *safeack.Subscriber {
	t.Helper()
	return newLoggedSubscriber(t, c, "", logs, func(cfg *safeack.SubscriberConfig) {
		cfg.ConsumerGroup = ""
	})
}

// reconnects returns the Errors logged about the connection ending.
func reconnects(logs errorLog) []loggedError {
	return logs.matching(func(e loggedError) bool { return strings.Contains(e.msg, "reconnecting") })
}

// Without a consumer group, a partition loses its leader while it is
// consumed: Sarama's partition consumer waits for it by itself. Before the
// fix, nothing reported it, and Stats showed a lag of 0 while records
// waited. Now the other partition is consumed on, the partition is
// reported (an Error, Unclaimed with Claimed set) within the claim bound,
// and consumed again, without a reconnect, once its leader answers.
func TestNoGroupLeaderLostWhileConsuming(t *testing.T) {
	t.Parallel()
	for _, f := range leaderFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c, topic, _ := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks := newAckLog()
			c.ProduceN(t, topic, 2, 4, nil)

			logs := newErrorLog()
			sub := noGroupSubscriber(t, c, logs)
			handleAll(mustSubscribe(t, sub, topic), acks.ack)
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)

			restore := f.apply(t, c, topic, 1)
			c.Produce(t, topic, kafkatest.Record{Partition: 0})
			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's new record to be acked", func() bool {
				return len(acks.missing(c, topic)) == 0
			})
			waitLeaderLostReported(t, sub, logs, topic, 1)

			restore()
			c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 0})
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)
			kafkatest.WaitFor(t, unclaimedDeadline, "the report to clear", func() bool {
				return len(sub.Unclaimed()) == 0 && len(unclaimedSeries(t, sub)) == 0
			})
			require.Empty(t, reconnects(logs), "the connection did not end")
		})
	}
}

// Without a consumer group, a partition whose leader is away when the
// subscription connects. Before the fix, the connection failed on it and
// reconnected every ReconnectRetrySleep for as long as the fault lasted
// ("Consumer stopped; reconnecting"), and the healthy partition was not
// consumed either. Now the healthy partition is consumed, the other is
// reported (an Error naming it, Unclaimed, safeack_unclaimed_seconds)
// within the claim bound, and consumed, from its first record (Offsets
// Oldest here), within seconds of its leader's return; the connection does
// not end.
func TestNoGroupUnclaimedAtSubscribe(t *testing.T) {
	t.Parallel()
	for _, f := range leaderFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c, topic, _ := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks := newAckLog()
			c.ProduceN(t, topic, 2, 4, nil)
			restore := f.apply(t, c, topic, 1)

			logs := newErrorLog()
			sub := noGroupSubscriber(t, c, logs)
			handleAll(mustSubscribe(t, sub, topic), acks.ack)
			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's records to be acked", func() bool {
				return len(acks.missing(c, topic)) == 2 // partition 1's
			})
			kafkatest.WaitFor(t, unclaimedDeadline, "partition 1 to be reported", func() bool {
				return len(sub.Unclaimed()) == 1 && len(logs.matching(func(e loggedError) bool {
					return strings.Contains(e.msg, "is not consumed") && e.fields["kafka_partition"] == int32(1)
				})) > 0
			})
			u := sub.Unclaimed()[0]
			require.Equal(t, safeack.TopicPartition{Topic: topic, Partition: 1}, u.TopicPartition)
			require.False(t, u.Claimed)
			require.Error(t, u.Err)
			_, owned := statsOf(sub, topic, 1)
			require.False(t, owned, "a partition not started is not in Stats")
			require.Equal(t, []string{"1"}, unclaimedSeries(t, sub), "safeack_unclaimed_seconds")

			c.Produce(t, topic, kafkatest.Record{Partition: 0})
			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's new record to be acked", func() bool {
				return len(acks.missing(c, topic)) == 2
			})

			restore()
			c.Produce(t, topic, kafkatest.Record{Partition: 1})
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)
			require.Empty(t, sub.Unclaimed(), "the partition is consumed")
			require.Empty(t, unclaimedSeries(t, sub))
			require.Empty(t, reconnects(logs), "the connection did not end")
			for k, n := range acks.snapshot() {
				require.Equal(t, 1, n, "record %v handled %d times", k, n)
			}
		})
	}
}
