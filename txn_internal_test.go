package safeack

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack/frontier"
)

func mustTail(t *testing.T, base int64, ranges ...frontier.Range) string {
	t.Helper()
	meta, _, err := frontier.EncodeTail(base, ranges, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	return meta
}

// What a committed position covers may only grow: the committer holds back
// a position whose tail drops a record an earlier one listed.
func TestCoverageWithin(t *testing.T) {
	prev := coverageOf(10, mustTail(t, 10, frontier.Range{From: 12, To: 15}, frontier.Range{From: 20, To: 21}))
	require.True(t, prev.covers(9))
	require.False(t, prev.covers(10))
	require.True(t, prev.covers(13))
	require.False(t, prev.covers(15))
	require.True(t, prev.covers(20))

	for _, tc := range []struct {
		name string
		next coverage
		ok   bool
	}{
		{"same", prev, true},
		{"prefix passed everything", coverageOf(21, ""), true},
		{"prefix inside the first range, rest listed", coverageOf(13, mustTail(t, 13, frontier.Range{From: 13, To: 16}, frontier.Range{From: 20, To: 21})), true},
		{"prefix passed the first range, second dropped", coverageOf(15, ""), false},
		{"a listed record dropped", coverageOf(10, mustTail(t, 10, frontier.Range{From: 12, To: 15})), false},
		{"a range shortened", coverageOf(10, mustTail(t, 10, frontier.Range{From: 13, To: 15}, frontier.Range{From: 20, To: 21})), false},
		{"prefix went back", coverageOf(9, mustTail(t, 9, frontier.Range{From: 12, To: 15}, frontier.Range{From: 20, To: 21})), false},
		{"ranges merged", coverageOf(10, mustTail(t, 10, frontier.Range{From: 12, To: 21})), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, prev.within(tc.next))
		})
	}
	// A tail cut by its budget covers nothing at or above its bound.
	cut := coverage{offset: 10, tail: frontier.Tail{Base: 10, Bound: 14, Ranges: []frontier.Range{{From: 12, To: 14}}}}
	require.False(t, prev.within(cut))
	require.False(t, cut.covers(14))
}

// A transaction's outputs to a topic whose max.message.bytes is below what
// Sarama batches go in rounds whose bytes fit it, in their order; the
// other outputs go in the first round, and without such a topic there is
// one round.
func TestOutputRounds(t *testing.T) {
	pcfg := sarama.NewConfig()
	c := &txnCommitter{pub: &TxnPublisher{pcfg: pcfg}}
	out := func(topic string, size int) *sarama.ProducerMessage {
		return &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(make([]byte, size))}
	}
	size := out("", 1000).ByteSize(recordBatchVersion)
	var outputs []*sarama.ProducerMessage
	for i := range 10 {
		outputs = append(outputs, out("small", 1000), out("big", 1000+i))
	}
	c.topics.set("big", outputTopic{maxMessageBytes: pcfg.Producer.MaxMessageBytes + recordBatchHeader})
	require.Equal(t, [][]*sarama.ProducerMessage{outputs}, c.outputRounds(outputs), "no topic below Sarama's batches")

	const limit = 4096
	c.topics.set("small", outputTopic{maxMessageBytes: limit})
	perRound := (limit - recordBatchHeader) / size // 3
	rounds := c.outputRounds(outputs)
	require.Len(t, rounds, (10+perRound-1)/perRound)
	var small, big []*sarama.ProducerMessage
	for i, round := range rounds {
		bytes := 0
		for _, m := range round {
			switch m.Topic {
			case "small":
				small = append(small, m)
				bytes += m.ByteSize(recordBatchVersion)
			case "big":
				require.Zero(t, i, "outputs to a topic Sarama's batches fit go in the first round")
				big = append(big, m)
			}
		}
		require.LessOrEqual(t, bytes+recordBatchHeader, limit)
	}
	var wantSmall, wantBig []*sarama.ProducerMessage
	for _, m := range outputs {
		if m.Topic == "small" {
			wantSmall = append(wantSmall, m)
		} else {
			wantBig = append(wantBig, m)
		}
	}
	require.Equal(t, wantSmall, small)
	require.Equal(t, wantBig, big)
}
