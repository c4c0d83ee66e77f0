package safeack_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestGroupProtocolsCommitCompletedPrefix checks, on both group protocols,
// the commit invariant at the broker: with acks out of order, no
// OffsetCommit covers a record not acked before it reached the broker, and
// the group's commits reach the end of every partition.
func TestGroupProtocolsCommitCompletedPrefix(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		const partitions, records = 4, 1000
		c, topic, group := kafkatest.StartTopic(t, partitions)
		c.ProduceN(t, topic, partitions, records, nil)
		acks, watch := watchCommits(t, c, group, topic)
		sub := newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
			cfg.MaxInFlight = 64
			cfg.Ordering = safeack.Unordered
			cfg.CommitInterval = 30 * time.Millisecond
		})
		handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
			randomDelay(10 * time.Millisecond)
			acks.ack(m)
		})
		hwm := c.HighWaterMarks(t, topic)
		acks.waitAllAcked(t, c, topic, 30*time.Second)
		watch.waitCommitted(t, hwm, 15*time.Second)
		n := watch.check(t)
		require.Positive(t, n, "no commit of the group was observed")
		require.Empty(t, acks.badMessages())
		if p == safeack.GroupProtocolConsumer && c.CanObserveCommits() {
			for _, oc := range watch.log.Commits() {
				require.GreaterOrEqual(t, oc.Version, int16(9), "a consumer-protocol member commits with OffsetCommit v9+ (member epoch)")
				require.Positive(t, oc.Generation, "the commit carries the member epoch")
			}
		}
	})
}

// TestConsumerProtocolConfig: what the consumer protocol moves to the
// broker, or has no place for, is refused at NewSubscriber (and
// NewTxnSubscriber refuses the protocol), each error naming the field.
func TestConsumerProtocolConfig(t *testing.T) {
	t.Parallel()
	base := func() safeack.SubscriberConfig {
		return safeack.SubscriberConfig{
			Brokers:       []string{"localhost:1"},
			ConsumerGroup: "g",
			GroupProtocol: safeack.GroupProtocolConsumer,
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*safeack.SubscriberConfig)
		want string
	}{
		{"session timeout", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Session.Timeout = 20 * time.Second
		}, "Session.Timeout"},
		{"heartbeat", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Heartbeat.Interval = time.Second
		}, "Heartbeat.Interval"},
		{"client-side assignor", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategySticky()}
		}, "GroupStrategies"},
		{"interceptors", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = sarama.NewConfig()
			c.OverwriteSaramaConfig.Consumer.Interceptors = []sarama.ConsumerInterceptor{nil}
		}, "Interceptors"},
		{"no group", func(c *safeack.SubscriberConfig) { c.ConsumerGroup = "" }, "GroupProtocol"},
		{"unknown assignor", func(c *safeack.SubscriberConfig) { c.RemoteAssignor = "roundrobin" }, "RemoteAssignor"},
		{"assignor on classic", func(c *safeack.SubscriberConfig) {
			c.GroupProtocol = safeack.GroupProtocolClassic
			c.RemoteAssignor = safeack.RemoteAssignorRange
		}, "RemoteAssignor"},
		{"unknown protocol", func(c *safeack.SubscriberConfig) { c.GroupProtocol = 7 }, "GroupProtocol"},
		{"tracer", func(c *safeack.SubscriberConfig) { c.OTELEnabled = true }, "Tracer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mod(&cfg)
			_, err := safeack.NewSubscriber(cfg, nil)
			require.Error(t, err)
			require.True(t, errors.Is(err, safeack.ErrInvalidConfig), "%v", err)
			require.ErrorContains(t, err, tc.want)
		})
	}
	cfg := base()
	cfg.RemoteAssignor = safeack.RemoteAssignorRange
	require.NoError(t, cfg.Validate())
	_, _, err := safeack.NewTxnSubscriber(base(), safeack.TxnConfig{TransactionalID: "tx"}, nil)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	require.ErrorContains(t, err, "GroupProtocol")
}

// finalCommits is an Observer that keeps the partitions of each final
// commit (an assignment ending: a revocation, Close).
type finalCommits struct {
	mu    sync.Mutex
	ended map[int32]int // partition: final commits seen
}

func newFinalCommits() *finalCommits { return &finalCommits{ended: make(map[int32]int)} }

func (f *finalCommits) Delivered(ctx context.Context, _ safeack.Delivery) (context.Context, safeack.DeliveryObserver) {
	return ctx, nil
}

func (f *finalCommits) Committed(c safeack.CommitEvent) {
	if !c.Final {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range c.Partitions {
		f.ended[p.Partition]++
	}
}

func (f *finalCommits) partitions() map[int32]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.ended)
}

// TestGroupProtocolsJoinLeave runs member A while records keep coming, lets
// member B join, then B closes. Nothing is lost, no commit passes an
// unacked record, the two never own a partition at once, and B's Close
// commits what it acked. On the consumer protocol only the partitions that
// move stop: A ends (final commit) only the partitions B takes, and none
// when B leaves.
func TestGroupProtocolsJoinLeave(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		const partitions = 6
		c, topic, group, acks, watch := startWatched(t, partitions)
		member := func(id string, obs safeack.Observer) *safeack.Subscriber {
			return newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
				cfg.MaxInFlight = 32
				cfg.Ordering = safeack.Unordered
				cfg.DrainTimeout = 2 * time.Second
				cfg.Observer = obs
				cfg.OverwriteSaramaConfig.ClientID = id
				cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout = 30 * time.Second
			})
		}
		produce := func() { c.ProduceN(t, topic, partitions, partitions, nil) }
		keepProducing := func(what string, cond func() bool) {
			t.Helper()
			if !waitCond(20*time.Second, func() bool { produce(); return cond() }) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
		handle := func(m *message.Message) {
			randomDelay(2 * time.Millisecond)
			acks.ack(m)
		}
		aFinal := newFinalCommits()
		a := member("member-a", aFinal)
		handleAll(mustSubscribe(t, a, topic), handle)
		keepProducing("A to own every partition", func() bool { return len(ownedPartitions(a, topic)) == partitions })

		var aMember string
		if log := watch.log; log != nil {
			kafkatest.WaitFor(t, 10*time.Second, "a commit of A", func() bool { return log.Len() > 0 })
			cs := log.Commits()
			aMember = cs[len(cs)-1].MemberID
		}
		b := member("member-b", nil)
		handleAll(mustSubscribe(t, b, topic), handle)
		var bOwns map[int32]safeack.PartitionStats
		keepProducing("B to own partitions and A the rest", func() bool {
			aOwns := ownedPartitions(a, topic)
			bOwns = ownedPartitions(b, topic)
			if len(bOwns) == 0 || len(aOwns)+len(bOwns) != partitions {
				return false
			}
			for q := range bOwns {
				if _, both := aOwns[q]; both {
					return false
				}
			}
			return true
		})
		if p == safeack.GroupProtocolConsumer {
			for q := range aFinal.partitions() {
				_, moved := bOwns[q]
				require.True(t, moved, "A ended partition %d, which did not move to B (moved: %v)", q, bOwns)
			}
		}
		if log := watch.log; log != nil {
			// Once B committed a partition it took, A never commits it
			// again (its revocation ended with its final commit).
			bFirst := make(map[int32]time.Time)
			for _, oc := range log.Commits() {
				for tp := range oc.Offsets {
					if _, moved := bOwns[tp.Partition]; !moved || tp.Topic != topic {
						continue
					}
					if first, ok := bFirst[tp.Partition]; oc.MemberID != aMember && (!ok || oc.At.Before(first)) {
						bFirst[tp.Partition] = oc.At
					}
				}
			}
			for _, oc := range log.Commits() {
				for tp := range oc.Offsets {
					if first, ok := bFirst[tp.Partition]; ok && oc.MemberID == aMember && tp.Topic == topic && oc.At.After(first) {
						t.Errorf("A committed partition %d at %v, after B took it (B's first commit at %v)", tp.Partition, oc.At, first)
					}
				}
			}
		}
		afterJoin := aFinal.partitions()
		require.NotEmpty(t, afterJoin, "A gave partitions to B without a final commit")
		if p == safeack.GroupProtocolConsumer {
			requireConsumerGroup(t, c, group)
		}

		require.NoError(t, b.Close())
		keepProducing("A to own every partition again", func() bool { return len(ownedPartitions(a, topic)) == partitions })
		if p == safeack.GroupProtocolConsumer {
			require.Equal(t, afterJoin, aFinal.partitions(), "A ended partitions when B left")
		}
		hwm := c.HighWaterMarks(t, topic)
		acks.waitAllAcked(t, c, topic, 30*time.Second)
		watch.waitCommitted(t, hwm, 15*time.Second)
		require.Positive(t, watch.check(t))
	})
}

// requireConsumerGroup checks at the broker that group runs the consumer
// group protocol (ConsumerGroupDescribe knows only those groups).
func requireConsumerGroup(t *testing.T, c *kafkatest.Cluster, group string) {
	t.Helper()
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Groups, 1)
	require.NoError(t, kerr.ErrorForCode(resp.Groups[0].ErrorCode), "group %s is not a consumer-protocol group", group)
	require.NotEmpty(t, resp.Groups[0].Members)
}

// TestConsumerProtocolRefusedEpochRetried: a commit the coordinator refuses
// for the member's epoch (STALE_MEMBER_EPOCH: it raced a heartbeat;
// FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) is not lost: the member sends it
// again while it owns the partition, and the group's commits still reach
// the end of every partition without passing an unacked record.
func TestConsumerProtocolRefusedEpochRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.StaleMemberEpoch, kerr.FencedMemberEpoch, kerr.UnknownMemberID} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			const partitions, records = 2, 200
			c, topic, group, acks, watch := startWatched(t, partitions)
			c.RequireEmbedded(t)
			c.ProduceN(t, topic, partitions, records, nil)
			// The commits of the end of a partition: nothing marked later
			// sends it again, only the member's retry.
			hwm := c.HighWaterMarks(t, topic)
			refused := c.RefuseCommits(group, code.Code, 3, func(rp kmsg.OffsetCommitRequestTopicPartition) bool {
				return rp.Offset == hwm[rp.Partition]
			})
			sub := newProtocolSubscriber(t, c, group, safeack.GroupProtocolConsumer, func(cfg *safeack.SubscriberConfig) {
				cfg.Ordering = safeack.Unordered
			})
			handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) { acks.ack(m) })
			acks.waitAllAcked(t, c, topic, 30*time.Second)
			// Read at the broker: the commit watch sees refused commits too.
			kafkatest.WaitFor(t, 15*time.Second, "the group to hold the end of every partition", func() bool {
				held := c.CommittedOffsets(t, group, topic)
				for p, end := range hwm {
					if held[p].Offset != end {
						return false
					}
				}
				return true
			})
			require.EqualValues(t, 3, refused.Load(), "the coordinator refused fewer commits than asked")
			require.Positive(t, watch.check(t))
		})
	}
}

// TestConsumerProtocolNeedsKafka4: on a cluster that does not run the
// consumer group protocol (an embedded broker answering as Kafka 3.9, which
// serves ConsumerGroupHeartbeat as an early access but has no group.version
// feature), Subscribe with GroupProtocolConsumer fails with an error that
// says so, instead of running on the classic protocol franz-go would fall
// back to.
func TestConsumerProtocolNeedsKafka4(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Embedded(), kafkatest.WithKfakeOpts(kfake.MaxVersions(kversion.V3_9_0())))
	topic := c.NewTopic(t, 1)
	sub, err := safeack.NewSubscriber(protocolConfig(c, c.NewGroup(t), safeack.GroupProtocolConsumer, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Version = sarama.V3_9_0_0
	}), keptLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Subscribe(t.Context(), topic)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	assert.ErrorContains(t, err, "KIP-848")
}
