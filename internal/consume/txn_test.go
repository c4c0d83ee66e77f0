package consume

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
	t.Parallel()
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

// A log found diverged at 8 while a transactional assignment consumes it
// (see txnMarker.diverge): what the group's commit covers is cut there, so
// the position held there is taken though it covers less than the last
// commit; the mark recorded before is dropped, and so are the outputs of
// the records from 8 on. A transaction in flight that commits a position
// past 8 leaves the coverage cut. A coverage below the divergence keeps
// its offset and loses its tail from there on.
func TestTxnMarkerDiverge(t *testing.T) {
	t.Parallel()
	c := &txnCommitter{}
	c.resetLocked()
	m := c.newMarker(0)
	other := c.newMarker(1)
	c.covered[0] = coverageOf(10, mustTail(t, 10, frontier.Range{From: 12, To: 15}))
	c.covered[1] = coverageOf(10, "")
	c.marks[0] = txnMark{offset: 16, m: m}
	c.marks[1] = txnMark{offset: 16, m: other}
	for _, off := range []int64{4, 9, 12} {
		c.pending[0] = append(c.pending[0], pendingOutputs{offset: off, msgs: []*sarama.ProducerMessage{{}}})
	}

	m.diverge(8)
	require.Equal(t, coverage{offset: 8, tail: frontier.Tail{Base: 8, Bound: 8}}, c.covered[0])
	require.NotContains(t, c.marks, int32(0), "the mark from before the divergence was kept")
	require.Equal(t, []int64{4}, pendingOffsets(c.pending[0]))
	require.EqualValues(t, 10, c.covered[1].offset, "another partition's coverage changed")
	require.Contains(t, c.marks, int32(1))

	// The held position is taken, with the outputs below it.
	m.MarkOffset("", 0, 8, "")
	c.mu.Lock()
	outputs, marks, next := c.takeCoveredLocked()
	require.Len(t, outputs, 1, "the outputs of partition 0's record 4 (partition 1 has none)")
	require.EqualValues(t, 8, marks[0].offset)
	// A transaction in flight past the divergence leaves the coverage cut.
	require.Equal(t, int64(8), m.coverageLocked(coverageOf(16, "")).offset)
	require.Equal(t, next[1], other.coverageLocked(next[1]), "the coverage of an assignment without a divergence was cut")
	c.mu.Unlock()

	below := coverageOf(10, mustTail(t, 10, frontier.Range{From: 12, To: 15}, frontier.Range{From: 20, To: 21})).cutAt(14)
	require.EqualValues(t, 10, below.offset)
	require.Equal(t, []frontier.Range{{From: 12, To: 14}}, below.tail.Ranges)
	require.True(t, below.covers(13))
	require.False(t, below.covers(14))
	require.False(t, below.covers(20))
}

func pendingOffsets(pending []pendingOutputs) []int64 {
	offs := make([]int64, len(pending))
	for i, po := range pending {
		offs[i] = po.offset
	}
	return offs
}

// A transaction's outputs to a topic whose max.message.bytes is below what
// Sarama batches go in rounds whose bytes fit it, in their order; the
// other outputs go in the first round, and without such a topic there is
// one round.
func TestOutputRounds(t *testing.T) {
	t.Parallel()
	pcfg := sarama.NewConfig()
	c := &txnCommitter{pub: &Txn{pcfg: pcfg}}
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
