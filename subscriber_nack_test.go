package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
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
	c, topic, group := kafkatest.StartTopic(t, 1)
	c.ProduceN(t, topic, 1, records, nil)

	acks, watch := watchCommits(t, c, group, topic)
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

// TestNackStormByKeyKeyless nacks the first delivery of every record
// under OrderByKey, on a partition mixing keyed records and key-less ones
// published by watermill-kafka's DefaultMarshaler: records of one key (and
// key-less records) never run at the same time and start in offset order
// (a redelivery of the same record may repeat its offset), and every
// record is eventually acked.
func TestNackStormByKeyKeyless(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c.SaramaConfig()}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	const n = 40
	for i := range n {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("wk-%d", i), []byte("keyless"))))
		c.Produce(t, topic, kafkatest.Record{Key: fmt.Appendf(nil, "k%d", i%3), Value: []byte("keyed")})
	}
	total := int64(2 * n)

	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.OrderByKey
		cfg.MaxInFlight = 32
		cfg.NackResendSleep = time.Millisecond
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	kt := newKeyTracker()
	var mu sync.Mutex
	seen := map[int64]bool{}
	acked := map[int64]bool{}
	var nAcked atomic.Int64
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		key, _ := safeack.MessageKeyFromCtx(m.Context())
		off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		mu.Lock()
		first := !seen[off]
		seen[off] = true
		mu.Unlock()
		kt.start(string(key), off)
		randomDelay(2 * time.Millisecond)
		kt.end(string(key))
		if first {
			m.Nack()
			return
		}
		mu.Lock()
		if !acked[off] {
			acked[off] = true
			nAcked.Add(1)
		}
		mu.Unlock()
		m.Ack()
	})
	kafkatest.WaitFor(t, mwWait, "every record acked", func() bool { return nAcked.Load() == total })
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Empty(t, kt.violations)
	kafkatest.WaitFor(t, mwWait, "the group to commit everything", func() bool {
		return c.CommittedOffsets(t, group, topic)[0].Offset == total
	})
}

// TestOneSlotNackStorm runs the tightest limits: one message in flight
// for the whole subscription, two pending records per partition, redelivery
// without a pause, and every first delivery nacked, across four partitions
// under each ordering. Nothing starves or deadlocks: every record is acked
// and committed.
func TestOneSlotNackStorm(t *testing.T) {
	t.Parallel()
	for _, ordering := range []safeack.Ordering{safeack.OrderByKey, safeack.OrderByPartition, safeack.Unordered} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			const partitions = 4
			c, topic, group := kafkatest.StartTopic(t, partitions)
			c.ProduceN(t, topic, partitions, partitions*30, func(i int) string {
				if i%3 == 0 {
					return ""
				}
				return fmt.Sprintf("k%d", i%2)
			})
			acks, watch := watchCommits(t, c, group, topic)
			sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.Ordering = ordering
				cfg.MaxInFlight = 1
				cfg.MaxPendingPerPartition = 2
				cfg.NackResendSleep = safeack.NoSleep
				cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
			})
			var mu sync.Mutex
			seen := map[po]bool{}
			handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
				k, _ := msgPO(m)
				mu.Lock()
				first := !seen[k]
				seen[k] = true
				mu.Unlock()
				if first {
					m.Nack()
					return
				}
				acks.ack(m)
			})
			acks.waitAllAcked(t, c, topic, mwWait)
			watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
			require.Positive(t, watch.check(t))
		})
	}
}

// flakyUnmarshaler rejects the records at the chosen offsets until healed.
type flakyUnmarshaler struct {
	kafka.DefaultMarshaler
	rejectAt int64
	healed   *atomic.Bool
}

func (u flakyUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	if m.Offset == u.rejectAt && !u.healed.Load() {
		return nil, errors.New("cannot unmarshal (for now)")
	}
	return u.DefaultMarshaler.Unmarshal(m)
}
