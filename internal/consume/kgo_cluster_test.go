package consume

import (
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/kclient"
)

// readsOf returns the consumer protocol's reads (through a franz-go
// client) and the classic engine's (through a Sarama client) of group and
// topic on c, to be compared.
func readsOf(t *testing.T, c *kafkatest.Cluster, group, topic string) (*kgoReads, saramaReads) {
	t.Helper()
	sc := c.SaramaConfig()
	sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 2, 50*time.Millisecond
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	client, err := sarama.NewClient(c.Brokers(), sc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	return newKgoReads(cl, &Options{OverwriteSaramaConfig: sc, ConsumerGroup: group}, topic),
		saramaReads{client: client, group: group, topic: topic}
}

// commitWithMetadata commits offset with metadata for partition of topic
// in group, as an admin does.
func commitWithMetadata(t *testing.T, client sarama.Client, group, topic string, partition int32, offset int64, metadata string) {
	t.Helper()
	admin, err := sarama.NewClusterAdminFromClient(client)
	require.NoError(t, err)
	// Not closed: closing it would close client.
	resp, err := admin.AlterConsumerGroupOffsets(group, map[string]map[int32]sarama.OffsetAndMetadata{
		topic: {partition: {Offset: offset, Metadata: metadata}},
	}, nil)
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, resp.Errors[topic][partition])
}

// TestKgoReads: each read of the cluster the consumer-protocol engine
// makes through franz-go answers what the classic engine's read through
// Sarama answers, on the same cluster: the group's commits (with their
// metadata, and -1 without one), the log start after records were
// deleted, the high-water marks, and the starts listed at OffsetOldest and
// OffsetNewest. A partition the topic does not have, a topic that does not
// exist, a leaderless partition and the cluster's refusals are errors that
// name them and match the Kafka error as both clients name it; a partition
// that fails leaves the others' answers alone.
func TestKgoReads(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2)
	c.ProduceN(t, topic, 2, 10, nil) // offsets 0..4 of each
	kr, sr := readsOf(t, c, group, topic)
	commitWithMetadata(t, sr.client, group, topic, 0, 3, "tail")

	t.Run("committed", func(t *testing.T) {
		got, err := kr.Committed([]int32{0, 1})
		require.NoError(t, err)
		require.Equal(t, map[int32]kclient.CommittedOffset{0: {Offset: 3, Metadata: "tail"}, 1: {Offset: -1}}, got)
		want, err := sr.Committed([]int32{0, 1})
		require.NoError(t, err)
		require.Equal(t, want, got, "the Sarama read's answer")
		once, err := kr.CommittedOnce([]int32{0, 1})
		require.NoError(t, err)
		require.Equal(t, got, once)
	})

	t.Run("log start", func(t *testing.T) {
		c.DeleteRecords(t, topic, 1, 2)
		got, err := kr.LogStart(1)
		require.NoError(t, err)
		require.Equal(t, int64(2), got)
		want, err := sr.LogStart(1)
		require.NoError(t, err)
		require.Equal(t, want, got, "the Sarama read's answer")
	})

	t.Run("high-water marks", func(t *testing.T) {
		got, failed := kr.HighWaterMarks([]int32{0, 1})
		require.Empty(t, failed)
		require.Equal(t, map[int32]int64{0: 5, 1: 5}, got)
		want, _ := sr.HighWaterMarks([]int32{0, 1})
		require.Equal(t, want, got, "the Sarama read's answer")
	})

	t.Run("starts", func(t *testing.T) {
		for _, at := range []int64{sarama.OffsetOldest, sarama.OffsetNewest} {
			got, errs := kr.ListOffsets([]int32{0, 1}, at)
			require.Empty(t, errs)
			want, _ := sr.ListOffsets([]int32{0, 1}, at)
			require.Equal(t, want, got, "at %d: the Sarama read's answer", at)
		}
	})

	t.Run("unknown partition", func(t *testing.T) {
		start := time.Now()
		got, failed := kr.HighWaterMarks([]int32{0, 7})
		require.Equal(t, map[int32]int64{0: 5}, got, "the partition that exists is answered")
		requireKafkaError(t, failed[7], kerr.UnknownTopicOrPartition, sarama.ErrUnknownTopicOrPartition)
		require.ErrorContains(t, failed[7], "partition 7")
		_, err := kr.LogStart(7)
		requireKafkaError(t, err, kerr.UnknownTopicOrPartition, sarama.ErrUnknownTopicOrPartition)
		require.Less(t, time.Since(start), 5*time.Second)
	})

	t.Run("missing topic", func(t *testing.T) {
		missing := newKgoReads(kr.cl, &Options{OverwriteSaramaConfig: c.SaramaConfig(), ConsumerGroup: group}, topic+"-missing")
		start := time.Now()
		_, errs := missing.ListOffsets([]int32{0}, sarama.OffsetOldest)
		requireKafkaError(t, errs[0], kerr.UnknownTopicOrPartition, sarama.ErrUnknownTopicOrPartition)
		require.ErrorContains(t, errs[0], topic+"-missing")
		require.Less(t, time.Since(start), 5*time.Second, "an unknown topic is not asked again")
	})
}

// TestKgoReadsRefused: the cluster's refusals of each read (no ACL for the
// group or the topic, a leaderless partition) are errors that match the
// Kafka error as both clients name it. Embedded broker: it answers the
// refusals.
func TestKgoReadsRefused(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 3, kafkatest.Embedded())
	c.ProduceN(t, topic, 3, 9, nil)
	kr, _ := readsOf(t, c, group, topic)

	t.Run("group not authorized", func(t *testing.T) {
		c.Answer(kmsg.OffsetFetch, func(req kmsg.Request, _ int32) (kmsg.Response, bool) {
			of := req.(*kmsg.OffsetFetchRequest)
			resp := of.ResponseKind().(*kmsg.OffsetFetchResponse)
			resp.SetVersion(of.GetVersion())
			resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
			for _, g := range of.Groups {
				rg := kmsg.NewOffsetFetchResponseGroup()
				rg.Group, rg.ErrorCode = g.Group, kerr.GroupAuthorizationFailed.Code
				resp.Groups = append(resp.Groups, rg)
			}
			return resp, true
		})
		_, err := kr.Committed([]int32{0})
		requireKafkaError(t, err, kerr.GroupAuthorizationFailed, sarama.ErrGroupAuthorizationFailed)
		require.ErrorContains(t, err, "committed offsets")
	})

	t.Run("leaderless", func(t *testing.T) {
		restore := c.Leaderless(t, topic, 1)
		defer restore()
		got, failed := kr.HighWaterMarks([]int32{0, 1})
		require.Equal(t, map[int32]int64{0: 3}, got)
		requireKafkaError(t, failed[1], kerr.LeaderNotAvailable, sarama.ErrLeaderNotAvailable)
	})

	t.Run("topic not authorized", func(t *testing.T) {
		c.Answer(kmsg.ListOffsets, func(req kmsg.Request, _ int32) (kmsg.Response, bool) {
			lo := req.(*kmsg.ListOffsetsRequest)
			resp := lo.ResponseKind().(*kmsg.ListOffsetsResponse)
			resp.SetVersion(lo.GetVersion())
			for _, t := range lo.Topics {
				rt := kmsg.NewListOffsetsResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewListOffsetsResponseTopicPartition()
					rp.Partition, rp.Offset = p.Partition, 3 // each partition's high-water mark
					if p.Partition == 2 {
						rp.Offset, rp.ErrorCode = -1, kerr.TopicAuthorizationFailed.Code
					}
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, lo.Topics[0].Topic == topic
		})
		got, failed := kr.HighWaterMarks([]int32{0, 2})
		require.Equal(t, map[int32]int64{0: 3}, got)
		requireKafkaError(t, failed[2], kerr.TopicAuthorizationFailed, sarama.ErrTopicAuthorizationFailed)
	})

}

// TestKgoReadsLeaderEpoch: a partition's leader epoch is the member
// client's metadata's, or the newest one fetched when newer; before the
// member has any, an error.
func TestKgoReadsLeaderEpoch(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	c.ProduceN(t, topic, 1, 2, nil)
	kr, _ := readsOf(t, c, group, topic)
	_, err := kr.LeaderEpoch(0)
	require.Error(t, err, "no member metadata yet")

	member, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics(topic))
	require.NoError(t, err)
	t.Cleanup(member.Close)
	kr.member.Store(member)
	want := c.Kfake().PartitionInfo(topic, 0).Epoch
	kafkatest.WaitFor(t, 10*time.Second, "the member's metadata", func() bool {
		e, err := kr.LeaderEpoch(0)
		return err == nil && e == want
	})
	kr.sawEpoch(0, want+3)
	e, err := kr.LeaderEpoch(0)
	require.NoError(t, err)
	require.Equal(t, want+3, e, "the epoch of a record fetched, newer")
}

// requireKafkaError checks that err matches the Kafka error as franz-go
// and Sarama name it.
func requireKafkaError(t *testing.T, err error, k *kerr.Error, s sarama.KError) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.Is(err, k), "%v is not %v", err, k)
	require.ErrorIs(t, err, s)
}
