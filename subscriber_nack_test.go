package safeack_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestSubscriberNackRedelivers nacks one record several times while the
// records after it on the same partition keep flowing and are acked. The
// redelivered message keeps the UUID and payload and gets a fresh context;
// the commit never passes the nacked record until its final ack, and then
// reaches the end.
func TestSubscriberNackRedelivers(t *testing.T) {
	t.Parallel()
	const (
		records = 300
		nacks   = 3
		sleep   = 20 * time.Millisecond
	)
	nacked := po{0, 10}
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	c.ProduceN(t, topic, 1, records, nil)

	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = 16
		cfg.Ordering = safeack.Unordered
		cfg.NackResendSleep = sleep
	})

	type delivery struct {
		uuid    string
		payload string
		ctx     context.Context
		ctxErr  error // at delivery
		at      time.Time
	}
	var mu sync.Mutex
	var deliveries []delivery
	finalAck := make(chan *message.Message, 1)
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		k, _ := msgPO(m)
		if k != nacked {
			randomDelay(time.Millisecond)
			acks.ack(m)
			return
		}
		mu.Lock()
		deliveries = append(deliveries, delivery{m.UUID, string(m.Payload), m.Context(), m.Context().Err(), time.Now()})
		n := len(deliveries)
		mu.Unlock()
		if n <= nacks {
			m.Nack()
			return
		}
		finalAck <- m
	})

	// The record comes back nacks times; meanwhile the partition flows past
	// it, but the commit stays at it.
	var last *message.Message
	select {
	case last = <-finalAck:
	case <-time.After(20 * time.Second):
		t.Fatalf("the nacked record was not redelivered %d times", nacks)
	}
	missing := acks.missing(c, topic)
	kafkatest.WaitFor(t, 20*time.Second, "every other record to be acked", func() bool {
		missing = acks.missing(c, topic)
		return len(missing) == 1
	})
	require.Equal(t, []po{nacked}, missing)
	watch.waitCommitted(t, map[int32]int64{0: nacked.o}, 10*time.Second)
	ps, ok := statsOf(sub, topic, 0)
	require.True(t, ok)
	require.Equal(t, nacked.o, ps.SafeOffset, "the completed prefix moved past the nacked record")
	require.Equal(t, uint64(nacks), ps.Redeliveries)
	require.Equal(t, nacked.o, watch.committed(t)[0], "the commit passed the nacked record")

	acks.ack(last)
	watch.waitCommitted(t, map[int32]int64{0: records}, 10*time.Second)
	require.Positive(t, watch.check(t), "no commit observed")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, deliveries, nacks+1)
	first := deliveries[0]
	produced := c.ProducedRecords(topic)
	require.Equal(t, string(produced[nacked.o].Value), first.payload)
	for i, d := range deliveries {
		require.Equal(t, first.uuid, d.uuid, "delivery %d changed the UUID", i)
		require.Equal(t, first.payload, d.payload, "delivery %d changed the payload", i)
		require.NoError(t, d.ctxErr, "delivery %d arrived with a done context", i)
		if i > 0 {
			prev := deliveries[i-1]
			require.True(t, prev.ctx != d.ctx, "delivery %d reused the previous context", i)
			require.Error(t, prev.ctx.Err(), "the context of nacked delivery %d was not cancelled", i-1)
			require.GreaterOrEqual(t, d.at.Sub(prev.at), sleep, "delivery %d came before NackResendSleep", i)
		}
		p, ok1 := safeack.MessagePartitionFromCtx(d.ctx)
		o, ok2 := safeack.MessagePartitionOffsetFromCtx(d.ctx)
		require.True(t, ok1 && ok2)
		require.Equal(t, nacked, po{p, o})
	}
	// The final delivery's context ends with its Ack.
	require.Eventually(t, func() bool { return deliveries[nacks].ctx.Err() != nil }, 5*time.Second, 5*time.Millisecond,
		"the context of the acked delivery was not cancelled")
	for k, n := range acks.snapshot() {
		require.Equal(t, 1, n, "record %v acked %d times", k, n)
	}
}
