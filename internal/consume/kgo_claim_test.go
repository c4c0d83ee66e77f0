package consume

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConsumerMessageFromRecord: the Sarama-typed record the Unmarshaler,
// OrderingKey and OnUnmarshalError get from a franz-go record keeps its
// key, value, headers (in order, repeated keys kept), timestamp, topic,
// partition and offset.
func TestConsumerMessageFromRecord(t *testing.T) {
	ts := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	r := &kgo.Record{
		Key: []byte("k"), Value: []byte("v"), Topic: "t", Partition: 3, Offset: 42, Timestamp: ts,
		Headers: []kgo.RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("2")}, {Key: "b"}},
	}
	m := consumerMessage(r)
	require.Equal(t, &sarama.ConsumerMessage{
		Key: []byte("k"), Value: []byte("v"), Topic: "t", Partition: 3, Offset: 42, Timestamp: ts,
		Headers: []*sarama.RecordHeader{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("a"), Value: []byte("2")}, {Key: []byte("b")}},
	}, m)
	require.Nil(t, consumerMessage(&kgo.Record{Topic: "t"}).Headers)
}

// TestKgoClaimFeed: records pushed to a claim reach its worker's channel in
// order, with or without a buffer (Consumer.ChannelBufferSize); stop
// closes the channel, leaving what was not taken.
func TestKgoClaimFeed(t *testing.T) {
	for _, buffered := range []int{0, 256} {
		t.Run(fmt.Sprint("buffered ", buffered), func(t *testing.T) { testKgoClaimFeed(t, buffered) })
	}
}

func testKgoClaimFeed(t *testing.T, buffered int) {
	c := newKgoClaim("t", 0, buffered)
	c.push([]kgoRecord{{msg: &sarama.ConsumerMessage{Offset: 0}}, {msg: &sarama.ConsumerMessage{Offset: 1}}})
	c.push([]kgoRecord{{msg: &sarama.ConsumerMessage{Offset: 2}}})
	for want := int64(0); want < 3; want++ {
		select {
		case m := <-c.out:
			require.Equal(t, want, m.Offset)
		case <-time.After(5 * time.Second):
			t.Fatalf("record %d not fed", want)
		}
	}
	// A record of a newer leader epoch waits until the watch validated
	// it.
	validated := atomic.Int32{}
	c.watching(validated.Load)
	c.push([]kgoRecord{{msg: &sarama.ConsumerMessage{Offset: 3}, epoch: 1}})
	select {
	case m := <-c.out:
		t.Fatalf("record %d of an epoch not validated was fed", m.Offset)
	case <-time.After(100 * time.Millisecond):
	}
	validated.Store(1)
	select {
	case m := <-c.out:
		require.EqualValues(t, 3, m.Offset)
	case <-time.After(5 * time.Second):
		t.Fatal("the record was not fed once its epoch was validated")
	}
	c.push([]kgoRecord{{msg: &sarama.ConsumerMessage{Offset: 4}}})
	c.stop()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-c.out:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the feed did not close after stop")
		}
	}
}

// TestKgoClaimDivergedBeforeItsWorkerRuns: a divergence franz-go reports
// before the claim's worker runs is kept, the lowest of several, and
// passed on once the worker gives the claim its way to report one; later
// ones are passed on at once.
func TestKgoClaimDivergedBeforeItsWorkerRuns(t *testing.T) {
	c := newKgoClaim("t", 0, 0)
	defer c.stop()
	c.diverged(7)
	c.diverged(5)
	c.diverged(9)
	var got []int64
	c.diverging(func(at int64) { got = append(got, at) })
	require.Equal(t, []int64{5}, got)
	c.diverged(8)
	require.Equal(t, []int64{5, 8}, got)
}
