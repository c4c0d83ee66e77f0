package safeack

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

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
		got, errs := listOffsets(client, topic, parts, at)
		require.Empty(t, errs)
		for _, p := range parts {
			want, err := client.GetOffset(topic, p, at)
			require.NoError(t, err)
			require.Equal(t, want, got[p], "partition %d at %d", p, at)
		}
	}

	got, errs := listOffsets(client, topic, []int32{0, partitions + 3}, sarama.OffsetNewest)
	require.Contains(t, got, int32(0))
	require.NotContains(t, got, int32(partitions+3))
	require.Error(t, errs[partitions+3])
}
