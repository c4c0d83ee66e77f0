package consume

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// TestFirstRecordsDecoding: a partition's early fetch yields what Sarama's
// partition consumer would deliver at ReadUncommitted: records of complete
// batches from the fetch offset on, transaction markers left out, Sarama's
// timestamps; and nothing at all for what it does not expect.
func TestFirstRecordsDecoding(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_700_000_000_000)
	batch := func(first int64, n int, mod func(*sarama.RecordBatch)) *sarama.Records {
		b := &sarama.RecordBatch{Version: 2, FirstOffset: first, FirstTimestamp: base, MaxTimestamp: base.Add(time.Hour)}
		for i := range n {
			b.Records = append(b.Records, &sarama.Record{
				OffsetDelta:    int64(i),
				TimestampDelta: time.Duration(i) * time.Second,
				Key:            []byte{byte('a' + i)},
				Value:          []byte{byte(i)},
				Headers:        []*sarama.RecordHeader{{Key: []byte("h"), Value: []byte{byte(i)}}},
			})
		}
		if mod != nil {
			mod(b)
		}
		return &sarama.Records{RecordBatch: b}
	}
	block := func(sets ...*sarama.Records) *sarama.FetchResponseBlock {
		return &sarama.FetchResponseBlock{Err: sarama.ErrNoError, RecordsSet: sets}
	}
	offsets := func(msgs []*sarama.ConsumerMessage) []int64 {
		var out []int64
		for _, m := range msgs {
			out = append(out, m.Offset)
		}
		return out
	}

	t.Run("batches, a marker and a partial tail", func(t *testing.T) {
		got, err := firstRecords(block(
			batch(8, 4, nil), // 8..11: the fetch asked for 10
			batch(12, 1, func(b *sarama.RecordBatch) { b.Control = true }),
			batch(13, 2, func(b *sarama.RecordBatch) { b.LogAppendTime = true }),
			batch(15, 0, func(b *sarama.RecordBatch) { b.PartialTrailingRecord = true }),
		), "t", 3, 10)
		require.NoError(t, err)
		require.Equal(t, []int64{10, 11, 13, 14}, offsets(got))
		m := got[0]
		require.Equal(t, "t", m.Topic)
		require.Equal(t, int32(3), m.Partition)
		require.Equal(t, []byte("c"), m.Key)
		require.Equal(t, []byte{2}, m.Value)
		require.Equal(t, base.Add(2*time.Second), m.Timestamp, "create time: first timestamp + delta")
		require.Equal(t, []byte{2}, m.Headers[0].Value)
		require.Equal(t, base.Add(time.Hour), got[2].Timestamp, "log append time: the batch's max timestamp")
	})
	t.Run("nothing yet", func(t *testing.T) {
		got, err := firstRecords(block(), "t", 3, 10)
		require.NoError(t, err)
		require.Empty(t, got)
	})
	refused := map[string]*sarama.FetchResponseBlock{
		"no block":            nil,
		"offset out of range": {Err: sarama.ErrOffsetOutOfRange},
		"legacy format":       block(&sarama.Records{MsgSet: &sarama.MessageSet{}}),
		"offsets going back":  block(batch(10, 2, nil), batch(11, 2, nil)),
	}
	for name, b := range refused {
		t.Run(name, func(t *testing.T) {
			got, err := firstRecords(b, "t", 3, 10)
			require.Error(t, err)
			require.Empty(t, got)
		})
	}
}
