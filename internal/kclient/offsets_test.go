package kclient

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestListOffsets: the batched listing (one request per leader, leaders at
// once) answers what client.GetOffset answers partition by partition, on a
// cluster whose partitions have different leaders, for both ends of the log;
// a partition that does not exist is reported as an error, not guessed.
func TestListOffsets(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.WithBrokers(3))
	const partitions = 6
	topic := c.NewTopic(t, partitions)
	c.ProduceN(t, topic, partitions, 60, nil)

	client, err := sarama.NewClient(c.Brokers(), c.SaramaConfig())
	require.NoError(t, err)
	defer client.Close()
	parts := []int32{0, 1, 2, 3, 4, 5}
	leaders := map[int32]bool{}
	for _, p := range parts {
		b, err := client.Leader(topic, p)
		require.NoError(t, err)
		leaders[b.ID()] = true
	}
	if len(leaders) < 2 {
		t.Logf("all partitions led by one broker: the per-leader split is not exercised")
	}
	for _, at := range []int64{sarama.OffsetNewest, sarama.OffsetOldest} {
		got, errs := ListOffsets(client, topic, parts, at)
		require.Empty(t, errs)
		for _, p := range parts {
			want, err := client.GetOffset(topic, p, at)
			require.NoError(t, err)
			require.Equal(t, want, got[p], "partition %d at %d", p, at)
		}
	}

	got, errs := ListOffsets(client, topic, []int32{0, partitions + 3}, sarama.OffsetNewest)
	require.Contains(t, got, int32(0))
	require.NotContains(t, got, int32(partitions+3))
	require.Error(t, errs[partitions+3])
}

// TestCommittedOffsetHolds: a read-back holds a wanted position when it is
// the same or later; at an equal offset metadata that lists no completed
// record (the leader epoch alone) holds a want without metadata, and a tail
// that differs is a position of its own.
func TestCommittedOffsetHolds(t *testing.T) {
	t.Parallel()
	epochOnly, _, err := frontier.EncodeTailEpoch(5, nil, frontier.DefaultMetadataBudget, 0)
	require.NoError(t, err)
	withTail, _, err := frontier.EncodeTailEpoch(5, []frontier.Range{{From: 6, To: 8}}, frontier.DefaultMetadataBudget, 0)
	require.NoError(t, err)
	otherTail, _, err := frontier.EncodeTailEpoch(5, []frontier.Range{{From: 6, To: 9}}, frontier.DefaultMetadataBudget, 0)
	require.NoError(t, err)
	at := func(offset int64, meta string) CommittedOffset {
		return CommittedOffset{Offset: offset, Metadata: meta}
	}
	for _, tc := range []struct {
		name       string
		held, want CommittedOffset
		holds      bool
	}{
		{"same", at(5, withTail), at(5, withTail), true},
		{"later", at(6, ""), at(5, withTail), true},
		{"earlier", at(4, epochOnly), at(5, ""), false},
		{"epoch alone for no metadata", at(5, epochOnly), at(5, ""), true},
		{"foreign metadata for no metadata", at(5, "someone else's"), at(5, ""), true},
		{"no metadata for the epoch", at(5, ""), at(5, epochOnly), false},
		{"tail missing", at(5, epochOnly), at(5, withTail), false},
		{"other tail", at(5, otherTail), at(5, withTail), false},
		{"a tail for no metadata", at(5, withTail), at(5, ""), false},
	} {
		require.Equal(t, tc.holds, tc.held.Holds(tc.want), tc.name)
	}
}
