package safeack_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Tests of what a watermill-kafka user carries over: its config fields and
// methods, and a Sarama config shared by several subscribers.

// TestPartitionOffset: Subscriber.PartitionOffset gives each partition's
// high-water mark, as watermill-kafka's does.
func TestPartitionOffset(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 3)
	c.ProduceN(t, topic, 3, 7, nil) // partitions 0, 1, 2 get 3, 2, 2 records
	sub := newTestSubscriber(t, c, c.NewGroup(t), nil)

	got, err := sub.PartitionOffset(topic)
	require.NoError(t, err)
	want := c.HighWaterMarks(t, topic)
	require.Len(t, got, len(want))
	for p, hwm := range want {
		require.Equal(t, hwm, got[p], "partition %d", p)
	}
	require.Equal(t, int64(3), got[0])
}

// spanCounter is an OpenTelemetry TracerProvider that counts the spans
// started per name; the spans themselves are no-ops.
type spanCounter struct {
	embedded.TracerProvider
	mu    sync.Mutex
	names map[string]int
}

func (p *spanCounter) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return spanCounterTracer{p: p}
}

func (p *spanCounter) count(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[name]
}

type spanCounterTracer struct {
	embedded.Tracer
	p *spanCounter
}

func (t spanCounterTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t.p.mu.Lock()
	t.p.names[name]++
	t.p.mu.Unlock()
	return noop.NewTracerProvider().Tracer("").Start(ctx, name, opts...)
}

// TestOTELEnabled: watermill-kafka's OTELEnabled field traces each
// consumed record through otelsarama (a "<topic> receive" span per record).
// No other test of this package touches OpenTelemetry's global provider.
func TestOTELEnabled(t *testing.T) {
	skipOnConsumerProtocol(t, "Tracer wraps Sarama's ConsumerGroupHandler, refused with GroupProtocolConsumer")
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 2)
	const n = 10
	c.ProduceN(t, topic, 2, n, nil)

	spans := &spanCounter{names: map[string]int{}}
	otel.SetTracerProvider(spans)

	sub := newTestSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) { cfg.OTELEnabled = true })
	msgs := mustSubscribe(t, sub, topic)
	var acked atomic.Int64
	handleAll(msgs, func(m *message.Message) {
		acked.Add(1)
		m.Ack()
	})
	kafkatest.WaitFor(t, 20*time.Second, "every record acked", func() bool { return acked.Load() >= n })
	require.GreaterOrEqual(t, spans.count(topic+" receive"), n, "a span per consumed record")
}

// TestSharedSaramaConfigStickyStrategy: one *sarama.Config with Sarama's
// sticky balance strategy, which keeps state in the strategy object, serves
// several subscribers (each the leader of its own group, so each plans the
// assignment) and several Subscribe calls of one subscriber. Under -race
// a shared strategy object is reported as a data race.
func TestSharedSaramaConfigStickyStrategy(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topics := []string{c.NewTopic(t, 4), c.NewTopic(t, 4), c.NewTopic(t, 4)}
	const n = 40
	for _, topic := range topics {
		c.ProduceN(t, topic, 4, n, func(i int) string { return fmt.Sprint(i) })
	}

	shared := c.SaramaConfig()
	shared.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategySticky()}
	strategy := shared.Consumer.Group.Rebalance.GroupStrategies[0]

	const subscribers = 4
	var acked sync.Map // "subscriber/topic/partition@offset" -> true
	var count atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range subscribers {
		sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
			Brokers:               c.Brokers(),
			OverwriteSaramaConfig: shared,
			ConsumerGroup:         c.NewGroup(t),
			DrainTimeout:          time.Second,
		}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		for _, topic := range topics {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start // join the groups at the same time
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				msgs, err := sub.Subscribe(ctx, topic)
				if err != nil {
					t.Error(err)
					return
				}
				handleAll(msgs, func(m *message.Message) {
					k, _ := msgPO(m)
					if _, dup := acked.LoadOrStore(fmt.Sprintf("%d/%s/%v", i, topic, k), true); !dup {
						count.Add(1)
					}
					m.Ack()
				})
			}()
		}
	}
	close(start)
	wg.Wait()
	kafkatest.WaitFor(t, 30*time.Second, "every subscriber acked every record", func() bool {
		return count.Load() == int64(subscribers*len(topics)*n)
	})
	require.Same(t, strategy, shared.Consumer.Group.Rebalance.GroupStrategies[0], "the caller's config was changed")
}

// TestWatermillKafkaContextHelpers pins a difference docs/migrating.md lists:
// watermill-kafka's context helpers use unexported keys, so on a safeack
// message they report false; safeack's helpers of the same names answer.
func TestWatermillKafkaContextHelpers(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, kafkatest.Record{Key: []byte("k"), Value: []byte("v")})
	sub := newTestSubscriber(t, c, c.NewGroup(t), nil)
	msgs := mustSubscribe(t, sub, topic)

	m := receive(t, msgs, 20*time.Second, "no message")
	defer m.Ack()
	ctx := m.Context()

	_, ok1 := kafka.MessagePartitionFromCtx(ctx)
	_, ok2 := kafka.MessagePartitionOffsetFromCtx(ctx)
	_, ok3 := kafka.MessageTimestampFromCtx(ctx)
	_, ok4 := kafka.MessageKeyFromCtx(ctx)
	require.Equal(t, []bool{false, false, false, false}, []bool{ok1, ok2, ok3, ok4}, "watermill-kafka's helpers on a safeack message")

	_, ok1 = safeack.MessagePartitionFromCtx(ctx)
	_, ok2 = safeack.MessagePartitionOffsetFromCtx(ctx)
	_, ok3 = safeack.MessageTimestampFromCtx(ctx)
	key, ok4 := safeack.MessageKeyFromCtx(ctx)
	require.Equal(t, []bool{true, true, true, true}, []bool{ok1, ok2, ok3, ok4}, "safeack's helpers")
	require.Equal(t, "k", string(key))
}

// TestMixedGroupWithWatermillKafka runs a group of one safeack member
// and one watermill-kafka member on the same topic, handing partitions back
// and forth: watermill-kafka commits plain offsets with empty metadata over
// safeack's completed tails. No record is lost and no commit, of either
// member, passes a record not acked before it.
func TestMixedGroupWithWatermillKafka(t *testing.T) {
	skipOnConsumerProtocol(t, "watermill-kafka's Sarama members share the group: a classic group")
	t.Parallel()
	const partitions = 4
	c, topic, group, acks, watch := startWatched(t, partitions)

	// Holes in safeack's prefix, so its commits carry a completed tail.
	hold := newHolder(po{0, 10}, po{1, 10}, po{2, 10}, po{3, 10})
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 64
		cfg.DrainTimeout = 200 * time.Millisecond
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		if hold.take(m) {
			return
		}
		randomDelay(2 * time.Millisecond)
		acks.ack(m)
	})
	c.ProduceN(t, topic, partitions, partitions*100, nil)
	kafkatest.WaitFor(t, mwWait, "safeack to hold one record per partition and ack the rest", func() bool {
		return hold.count() == partitions && len(acks.missing(c, topic)) == partitions
	})
	want := map[int32]int64{0: 10, 1: 10, 2: 10, 3: 10}
	watch.waitCommitted(t, want, mwWait)

	// The watermill-kafka member joins: it acks one message at a time per
	// partition and marks each in Sarama with empty metadata.
	wkMember := func() *kafka.Subscriber {
		sc := c.SaramaConfig()
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
		wk, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               c.Brokers(),
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: sc,
			ConsumerGroup:         group,
			ReconnectRetrySleep:   100 * time.Millisecond,
		}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = wk.Close() })
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		msgs, err := wk.Subscribe(ctx, topic)
		require.NoError(t, err)
		go func() {
			for m := range msgs {
				p, _ := kafka.MessagePartitionFromCtx(m.Context())
				o, _ := kafka.MessagePartitionOffsetFromCtx(m.Context())
				acks.addAt(po{p, o}, time.Now())
				m.Ack()
			}
		}()
		return wk
	}
	wk := wkMember()
	kafkatest.WaitFor(t, mwWait, "safeack to give up some partitions", func() bool {
		return len(ownedPartitions(sub, topic)) < partitions
	})
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	// The held records of revoked partitions are late now; the ones safeack
	// kept are acked normally.
	kafkatest.WaitFor(t, mwWait, "the group to settle with both members", func() bool {
		n := len(ownedPartitions(sub, topic))
		return n > 0 && n < partitions
	})
	for _, h := range hold.all() {
		if h.m.Context().Err() != nil {
			acks.ackLate(h.m)
		} else {
			acks.ack(h.m)
		}
	}
	acks.waitAllAcked(t, c, topic, mwWait)

	// watermill-kafka leaves: safeack takes back the partitions over
	// watermill-kafka's plain commits.
	require.NoError(t, wk.Close())
	kafkatest.WaitFor(t, mwWait, "safeack to own every partition again", func() bool {
		return len(ownedPartitions(sub, topic)) == partitions
	})
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	// And once more the other way, so safeack's new commits are read by
	// watermill-kafka.
	wkMember()
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
	require.Empty(t, acks.badMessages())
}
