package safeack_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
	"github.com/safeack/safeack/internal/kafkatest"
)

// unclaimedDeadline bounds how long after the fault a partition's
// unclaimed state is reported (the claim bound, Metadata.Retry budget plus
// 6 s, and a slow machine), and how long after its leader is back its
// records wait (Sarama looks at a held claim every 5 s).
const unclaimedDeadline = 45 * time.Second

// unclaimedStrategies are the rebalance protocols the unclaimed-partition
// tests run with.
var unclaimedStrategies = []struct {
	name     string
	strategy func() sarama.BalanceStrategy
}{
	{"eager", sarama.NewBalanceStrategyRange},
	{"cooperative", sarama.NewBalanceStrategyCooperativeSticky},
}

// unclaimedSubscriber is a subscriber of group logging to logs, with the
// given balance strategy.
func unclaimedSubscriber(t *testing.T, c *kafkatest.Cluster, group string, logs errorLog, strategy sarama.BalanceStrategy) *safeack.Subscriber {
	t.Helper()
	return newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{strategy}
	})
}

// waitUnclaimedReported waits until sub lists partition of topic as
// unclaimed and has logged it as an Error naming it.
func waitUnclaimedReported(t *testing.T, sub *safeack.Subscriber, logs errorLog, topic string, partition int32) {
	t.Helper()
	kafkatest.WaitFor(t, unclaimedDeadline, fmt.Sprintf("partition %d to be reported unclaimed", partition), func() bool {
		listed := false
		for _, u := range sub.Unclaimed() {
			listed = listed || u.Topic == topic && u.Partition == partition
		}
		return listed && len(unclaimedErrors(logs, partition)) > 0
	})
	for _, u := range sub.Unclaimed() {
		require.Equal(t, partition, u.Partition, "only the partition without a leader is unclaimed")
		require.Error(t, u.Err, "why partition %d is unclaimed", partition)
		require.False(t, u.AssignedAt.IsZero())
	}
	_, owned := statsOf(sub, topic, partition)
	require.False(t, owned, "an unclaimed partition is not in Stats")
	require.Equal(t, []string{fmt.Sprint(partition)}, unclaimedSeries(t, sub), "safeack_unclaimed_seconds")
}

// unclaimedSeries returns the partitions (as labels) that have a
// safeack_unclaimed_seconds series: the figure both exporters read
// (internal/figures), taken as the metrics package's collector takes it.
// The metrics and otel modules' own tests check the exposition itself; the
// root module does not require them (issue 38: a lean dependency graph).
func unclaimedSeries(t *testing.T, sub *safeack.Subscriber) []string {
	t.Helper()
	var out []string
	for _, u := range figures.Views[figures.Unclaimed](sub.Unclaimed()) {
		for _, g := range figures.UnclaimedGauges {
			if g.Prom != "unclaimed_seconds" {
				continue
			}
			v, ok := g.Value(&u)
			if !ok {
				continue
			}
			require.Positive(t, v)
			out = append(out, fmt.Sprint(u.Partition))
		}
	}
	return out
}

// unclaimedErrors returns the Errors logged about partition not being
// consumed.
func unclaimedErrors(logs errorLog, partition int32) []loggedError {
	return logs.matching(func(e loggedError) bool {
		return strings.Contains(e.msg, "is not consumed") && e.fields["kafka_partition"] == partition
	})
}

// groupGeneration returns the group's generation on the embedded broker
// (-1 before it exists).
func groupGeneration(c *kafkatest.Cluster, group string) int32 {
	if gi := c.Kfake().GroupInfo(group); gi != nil {
		return gi.Epoch
	}
	return -1
}

// A partition whose only replica is down as the member joins: the cluster
// answers LEADER_NOT_AVAILABLE for it (leader -1), and refuses to list or
// fetch it. Before the fix, Sarama's Consume gave up on that answer before
// joining, so that the member never joined and its healthy partition was
// not consumed either. Now the member joins, consumes the healthy
// partition, reports the other (an Error naming it, Subscriber.Unclaimed)
// within the claim bound, and consumes it within a few seconds of its
// leader's return, in the same session: the group does not rebalance.
// Every commit covers only acked records.
func TestUnclaimedLeaderless(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's claim watch (Unclaimed)")
	t.Parallel()
	for _, s := range unclaimedStrategies {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks, watch := watchCommits(t, c, group, topic)
			c.ProduceN(t, topic, 2, 10, nil)
			restore := c.Leaderless(t, topic, 1)

			logs := newErrorLog()
			sub := unclaimedSubscriber(t, c, group, logs, s.strategy())
			handleAll(mustSubscribe(t, sub, topic), acks.ack)

			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's records to be acked", func() bool {
				return len(acks.missing(c, topic)) == 5 // partition 1's
			})
			waitUnclaimedReported(t, sub, logs, topic, 1)
			generation := groupGeneration(c, group)

			c.Produce(t, topic, kafkatest.Record{Partition: 0}, kafkatest.Record{Partition: 0})
			kafkatest.WaitFor(t, unclaimedDeadline, "new records of the healthy partition to be acked", func() bool {
				return len(acks.missing(c, topic)) == 5
			})

			restore()
			c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 1})
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)
			require.Empty(t, sub.Unclaimed(), "the partition is consumed again")
			require.Empty(t, unclaimedSeries(t, sub))
			require.Equal(t, generation, groupGeneration(c, group), "the group did not rebalance")
			watch.check(t)
		})
	}
}

// A partition whose leader is named but does not answer for it as the
// member joins (it refuses to list or fetch it). Before the fix, Sarama
// retried the claim for about a second, gave it up and ended the session,
// and the member rejoined at once: the group rebalanced every second or
// two for as long as the fault lasted (generation 1 to 6 in 10 s), and
// the member's other partitions started over each time. Now Setup finds
// the leader not answering and holds the claim back, so that Sarama waits
// instead of failing it: the group keeps its generation, the partition is
// reported, and it is consumed once its leader answers.
func TestUnclaimedLeaderNotAnswering(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's claim watch (Unclaimed)")
	t.Parallel()
	for _, s := range unclaimedStrategies {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
			acks, watch := watchCommits(t, c, group, topic)
			c.ProduceN(t, topic, 2, 10, nil)
			refused := c.Kfake().Fault(kfake.Fault{
				Keys: []kmsg.Key{kmsg.ListOffsets, kmsg.Fetch}, Topic: topic, Partitions: []int32{1},
				Err: kerr.NotLeaderForPartition, Count: -1,
			})
			defer refused.Remove()

			logs := newErrorLog()
			sub := unclaimedSubscriber(t, c, group, logs, s.strategy())
			handleAll(mustSubscribe(t, sub, topic), acks.ack)

			kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's records to be acked", func() bool {
				return len(acks.missing(c, topic)) == 5
			})
			generation := groupGeneration(c, group)
			kafkatest.WaitFor(t, unclaimedDeadline, "partition 1 to be reported, or the group to rebalance", func() bool {
				return len(unclaimedErrors(logs, 1)) > 0 || groupGeneration(c, group) != generation
			})
			require.Equal(t, generation, groupGeneration(c, group), "the group rebalanced while the leader did not answer")
			waitUnclaimedReported(t, sub, logs, topic, 1)

			refused.Remove()
			acks.waitAllAcked(t, c, topic, unclaimedDeadline)
			require.Empty(t, sub.Unclaimed(), "the partition is consumed again")
			require.Equal(t, generation, groupGeneration(c, group), "the group did not rebalance")
			watch.check(t)
		})
	}
}

// A member consuming both partitions, one of which loses its leader; then a
// second member joins. Before the fix, neither member could rejoin (Sarama
// gave up each join on the leaderless partition), and no record of either
// partition was handled until the leader was back. Now the group re-forms:
// the healthy partition is consumed by whichever member has it, the other
// waits, is reported by its member, and is consumed after its leader's
// return.
func TestUnclaimedLeaderlessAtRebalance(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's claim watch (Unclaimed)")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
	acks, watch := watchCommits(t, c, group, topic)
	c.ProduceN(t, topic, 2, 4, nil)

	logsA := newErrorLog()
	subA := unclaimedSubscriber(t, c, group, logsA, sarama.NewBalanceStrategyRange())
	handleAll(mustSubscribe(t, subA, topic), acks.ack)
	acks.waitAllAcked(t, c, topic, unclaimedDeadline)

	restore := c.Leaderless(t, topic, 1)
	logsB := newErrorLog()
	subB := unclaimedSubscriber(t, c, group, logsB, sarama.NewBalanceStrategyRange())
	handleAll(mustSubscribe(t, subB, topic), acks.ack)
	kafkatest.WaitFor(t, unclaimedDeadline, "both members to have an assignment", func() bool {
		gi := c.Kfake().GroupInfo(group)
		return gi != nil && len(gi.Members) == 2 && gi.NumAssigned() == 2 && gi.State == "Stable"
	})
	c.Produce(t, topic, kafkatest.Record{Partition: 0}, kafkatest.Record{Partition: 0})
	kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's new records to be acked", func() bool {
		return len(acks.missing(c, topic)) == 0
	})
	kafkatest.WaitFor(t, unclaimedDeadline, "the leaderless partition to be reported by its member", func() bool {
		return len(subA.Unclaimed())+len(subB.Unclaimed()) == 1 &&
			len(unclaimedErrors(logsA, 1))+len(unclaimedErrors(logsB, 1)) > 0
	})

	restore()
	c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 1})
	acks.waitAllAcked(t, c, topic, unclaimedDeadline)
	require.Empty(t, subA.Unclaimed())
	require.Empty(t, subB.Unclaimed())
	watch.check(t)
}

// A claim Sarama gives up although Setup's look at the leader found it
// answering (here it answers for the partition's start but not its end,
// which Sarama also asks for): Sarama ends the session. The member logs it
// as an Error naming the partition and Sarama's error, and rejoins after a
// wait that doubles while it goes on (1 s, 2 s, ... up to half the session
// timeout) instead of at once. Once the leader answers, the records are
// handled.
func TestUnclaimedClaimGivenUp(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's claim watch (Unclaimed)")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
	acks, watch := watchCommits(t, c, group, topic)
	c.ProduceN(t, topic, 2, 10, nil)
	refused := c.Kfake().Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: topic, Partitions: []int32{1},
		Err: kerr.NotLeaderForPartition, Count: -1,
		When: func(req kmsg.Request) bool {
			for _, rt := range req.(*kmsg.ListOffsetsRequest).Topics {
				for _, rp := range rt.Partitions {
					if rp.Partition == 1 && rp.Timestamp == sarama.OffsetNewest {
						return true
					}
				}
			}
			return false
		},
	})
	defer refused.Remove()

	logs := newErrorLog()
	sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
		sc := cfg.OverwriteSaramaConfig
		sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 3, 100*time.Millisecond // Sarama gives the claim up quickly
		sc.Consumer.Group.Session.Timeout = 10 * time.Second                       // rejoin waits up to 5 s
		sc.Consumer.Group.Heartbeat.Interval = time.Second
	})
	handleAll(mustSubscribe(t, sub, topic), acks.ack)

	givenUp := func() []loggedError {
		return logs.matching(func(e loggedError) bool {
			return strings.Contains(e.msg, "gave up the claim") && e.fields["kafka_partitions"] == "[1]"
		})
	}
	kafkatest.WaitFor(t, unclaimedDeadline, "three claims given up to be logged", func() bool { return len(givenUp()) >= 3 })
	logged := givenUp()
	for i, e := range logged[:3] {
		require.ErrorIs(t, e.err, sarama.ErrNotLeaderForPartition, "Sarama's claim error is logged")
		require.Equal(t, (time.Second << i).String(), e.fields["rejoin_in"], "the rejoin waits more after each")
	}
	require.GreaterOrEqual(t, logged[2].at.Sub(logged[0].at), 3*time.Second, "the member waited before rejoining")

	refused.Remove()
	acks.waitAllAcked(t, c, topic, unclaimedDeadline)
	watch.check(t)
}
