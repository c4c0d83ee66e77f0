package safeack_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestTokensSharedAcrossPartitions starts one partition alone until its
// handlers hold every in-flight token, then gives a second partition
// records. An ack hands its token on to its own partition's next ready
// record only when no other partition waits for one, so the tokens freed by
// the first partition's acks must reach the second, and the second, with far
// fewer records, finishes first.
func TestTokensSharedAcrossPartitions(t *testing.T) {
	t.Parallel()
	const (
		busyRecords = 6000
		lateRecords = 1000
		maxInFlight = 64
		work        = 2 * time.Millisecond
	)
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 2)
	group := c.NewGroup(t)
	produceTo := func(partition int32, n int) {
		recs := make([]kafkatest.Record, n)
		for i := range recs {
			recs[i] = kafkatest.Record{Partition: partition, Value: fmt.Appendf(nil, "p%d-%d", partition, i)}
		}
		c.Produce(t, topic, recs...)
	}
	produceTo(0, busyRecords)

	var acked [2]atomic.Int64
	var lateDoneWithBusyLeft atomic.Int64 // records of partition 0 left when partition 1 finished
	lateDoneWithBusyLeft.Store(-1)
	meter := &inFlightMeter{}
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = maxInFlight
		cfg.Ordering = safeack.Unordered
	})
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		meter.enter()
		time.Sleep(work)
		meter.leave()
		p, _ := safeack.MessagePartitionFromCtx(m.Context())
		m.Ack()
		if acked[p].Add(1) == lateRecords && p == 1 {
			lateDoneWithBusyLeft.Store(busyRecords - acked[0].Load())
		}
	})

	require.True(t, waitCond(30*time.Second, func() bool {
		return acked[0].Load() >= 50 && meter.max() == maxInFlight
	}), "partition 0 alone should fill all %d tokens (peak %d, %d acked)", maxInFlight, meter.max(), acked[0].Load())
	produceTo(1, lateRecords)

	require.True(t, waitCond(60*time.Second, func() bool {
		return acked[0].Load() >= busyRecords && acked[1].Load() >= lateRecords
	}), "every record should be acked: partition 0 %d/%d, partition 1 %d/%d",
		acked[0].Load(), busyRecords, acked[1].Load(), lateRecords)
	left := lateDoneWithBusyLeft.Load()
	require.Positive(t, left,
		"partition 1 (%d records) should finish while partition 0 still has records: it waited for tokens that partition 0 kept", lateRecords)
	require.LessOrEqual(t, meter.max(), maxInFlight, "MaxInFlight exceeded")
	t.Logf("partition 1 finished with %d of partition 0's %d records left", left, busyRecords)
}
