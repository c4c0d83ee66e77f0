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
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Adversarial end-to-end scenarios: combinations the other tests walk one
// at a time.

// recordAcks is an outermost router middleware that records, just before
// the router acks, the records whose handler chain returned nil. A message
// whose context already ended (its assignment was revoked or closed) is
// recorded as a late ack, which the commit check never credits.
func recordAcks(acks *ackLog) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				return out, err
			}
			k, ok := msgPO(m)
			acks.mu.Lock()
			switch {
			case !ok:
				acks.bad = append(acks.bad, m.UUID)
			case m.Context().Err() != nil:
				acks.late[k] = append(acks.late[k], time.Now())
			default:
				acks.acks[k] = append(acks.acks[k], time.Now())
			}
			acks.mu.Unlock()
			return out, err
		}
	}
}

// TestAdvPanicRetryPlainPoisonQueueEagerRebalance runs routers with
// Recoverer inside Retry inside Watermill's own (plain) PoisonQueue, with
// handlers that finish out of order, panic on some first attempts and
// always panic on poison records, while a second member joins mid-run
// (eager rebalance: the whole session ends). Every record is acked at least
// once with its assignment alive, and no commit the broker saw passes a
// record not acked before it.
func TestAdvPanicRetryPlainPoisonQueueEagerRebalance(t *testing.T) {
	t.Parallel()
	const partitions = 4
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	dlq := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c.SaramaConfig()}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	isPoison := func(k po) bool { return k.o%23 == 4 }
	panicsFirst := func(k po) bool { return k.o%7 == 1 }
	var mu sync.Mutex
	attempts := map[po]int{}
	handler := func(m *message.Message) error {
		k, ok := msgPO(m)
		if !ok {
			return errors.New("no position")
		}
		mu.Lock()
		attempts[k]++
		n := attempts[k]
		mu.Unlock()
		randomDelay(3 * time.Millisecond)
		if isPoison(k) || (panicsFirst(k) && n == 1) {
			panic(fmt.Sprintf("handler panic on %v (attempt %d)", k, n))
		}
		return nil
	}
	poison, err := middleware.PoisonQueue(pub, dlq)
	require.NoError(t, err)
	member := func() *safeack.Subscriber {
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.MaxInFlight = 64
			cfg.DrainTimeout = 500 * time.Millisecond
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		})
		mwRouter(t, sub, topic, handler,
			recordAcks(acks),
			poison,
			middleware.Retry{MaxRetries: 2, InitialInterval: 2 * time.Millisecond}.Middleware,
			middleware.Recoverer,
		)
		return sub
	}

	c.ProduceN(t, topic, partitions, partitions*400, nil)
	a := member()
	kafkatest.WaitFor(t, mwWait, "A to ack some records", func() bool { return len(acks.snapshot()) >= 300 })
	require.Less(t, len(acks.snapshot()), partitions*400-300, "A was done before B joined: no load to rebalance under")
	b := member()
	kafkatest.WaitFor(t, mwWait, "the group to settle with both members", func() bool {
		ao, bo := ownedPartitions(a, topic), ownedPartitions(b, topic)
		return len(ao) > 0 && len(bo) > 0 && len(ao)+len(bo) == partitions
	})
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
	require.Empty(t, acks.badMessages())

	// The dead-letter topic holds at least every poison record.
	var nPoison int64
	for _, p := range c.ProducedRecords(topic) {
		if isPoison(po{p.Partition, p.Offset}) {
			nPoison++
		}
	}
	kafkatest.WaitFor(t, mwWait, "the poison records to be dead-lettered", func() bool {
		return c.HighWaterMarks(t, dlq)[0] >= nPoison
	})
}

// TestAdvMixedGroupWithWatermillKafka runs a group of one safeack member
// and one watermill-kafka member on the same topic, handing partitions back
// and forth: watermill-kafka commits plain offsets with empty metadata over
// safeack's completed tails. No record is lost and no commit, of either
// member, passes a record not acked before it.
func TestAdvMixedGroupWithWatermillKafka(t *testing.T) {
	t.Parallel()
	const partitions = 4
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)

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

// TestAdvSubscribeSameTopicTwice subscribes one Subscriber to the same
// topic twice: two members of one group. Every record is acked, no commit
// passes an unacked record, no partition shows up twice in Stats, and
// Close closes both channels.
func TestAdvSubscribeSameTopicTwice(t *testing.T) {
	t.Parallel()
	for _, cooperative := range []bool{false, true} {
		name := "eager"
		if cooperative {
			name = "cooperative"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testSubscribeSameTopicTwice(t, cooperative)
		})
	}
}

func testSubscribeSameTopicTwice(t *testing.T, cooperative bool) {
	const partitions = 4
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		if cooperative {
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky(),
			}
		}
	})
	handler := func(m *message.Message) {
		randomDelay(2 * time.Millisecond)
		acks.ack(m)
	}
	// got[i] holds the partitions subscription i delivered from.
	var gotMu sync.Mutex
	got := [2]map[int32]bool{{}, {}}
	handlerOf := func(i int) func(*message.Message) {
		return func(m *message.Message) {
			k, _ := msgPO(m)
			gotMu.Lock()
			got[i][k.p] = true
			gotMu.Unlock()
			handler(m)
		}
	}
	done1 := handleAll(mustSubscribe(t, sub, topic), handlerOf(0))
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	kafkatest.WaitFor(t, mwWait, "some acks", func() bool { return len(acks.snapshot()) >= 50 })
	done2 := handleAll(mustSubscribe(t, sub, topic), handlerOf(1))
	kafkatest.WaitFor(t, mwWait, "the partitions split between the subscriptions, each listed once", func() bool {
		c.ProduceN(t, topic, partitions, partitions, nil)
		st := sub.Stats()
		seen := map[int32]bool{}
		for _, ps := range st {
			if seen[ps.Partition] {
				return false
			}
			seen[ps.Partition] = true
		}
		gotMu.Lock()
		defer gotMu.Unlock()
		return len(st) == partitions && len(got[1]) > 0
	})
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	for i, done := range []<-chan struct{}{done1, done2} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Close left subscription %d's channel open", i+1)
		}
	}
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	require.Empty(t, sub.Stats())
}

// TestAdvNackStormByKeyKeyless nacks the first delivery of every record
// under OrderByKey, on a partition mixing keyed records and key-less ones
// published by watermill-kafka's DefaultMarshaler: records of one key (and
// key-less records) never run at the same time and start in offset order
// (a redelivery of the same record may repeat its offset), and every
// record is eventually acked.
func TestAdvNackStormByKeyKeyless(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)

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

// TestAdvRouterCloseHandlersIgnoreContext closes a router whose handlers
// block on a few records and ignore their context. Close returns (the
// subscriber's drain gives up, the router's CloseTimeout passes), the
// commit stays below the blocked records, their late acks change nothing,
// and the next member of the group handles them.
func TestAdvRouterCloseHandlersIgnoreContext(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	c.ProduceN(t, topic, partitions, partitions*40, nil)

	blocked := func(k po) bool { return k.o == 7 }
	release := make(chan struct{})
	var nBlocked atomic.Int32
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = 300 * time.Millisecond
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 500 * time.Millisecond}, testLogger())
	require.NoError(t, err)
	r.AddMiddleware(recordAcks(acks))
	r.AddConsumerHandler("h", topic, sub, func(m *message.Message) error {
		k, _ := msgPO(m)
		if blocked(k) {
			nBlocked.Add(1)
			<-release // ignores its context
		}
		return nil
	})
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = r.Run(context.Background())
	}()
	defer func() { <-runDone }()
	kafkatest.WaitFor(t, mwWait, "everything but the blocked records acked", func() bool {
		return nBlocked.Load() == partitions && len(acks.missing(c, topic)) == partitions
	})
	watch.waitCommitted(t, map[int32]int64{0: 7, 1: 7}, mwWait)

	closeStart := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("router Close hung on handlers that ignore their context")
	}
	t.Logf("router Close took %v", time.Since(closeStart).Round(time.Millisecond))
	// The blocked handlers finish after Close: late acks.
	close(release)
	kafkatest.WaitFor(t, mwWait, "the blocked handlers to finish", func() bool {
		acks.mu.Lock()
		defer acks.mu.Unlock()
		return len(acks.late) == partitions
	})
	require.Equal(t, map[int32]int64{0: 7, 1: 7}, watch.committed(t), "commit moved past a blocked record")

	// The next member handles the blocked records.
	next := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	handleAll(mustSubscribe(t, next, topic), acks.ack)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
}

// TestAdvMembershipChurn keeps records flowing while members join and leave
// again and again (some leave while the group is still rebalancing for
// them) (eager and cooperative, at OffsetOldest and at
// OffsetNewest over history), with handlers that finish out of order, nack
// some first deliveries and sit on a few records past DrainTimeout. Every
// record is acked with its assignment alive, and no commit the broker saw
// passes a record not acked before it (nor goes below where the group
// started).
func TestAdvMembershipChurn(t *testing.T) {
	t.Parallel()
	for _, cooperative := range []bool{false, true} {
		for _, initial := range []int64{sarama.OffsetOldest, sarama.OffsetNewest} {
			name := "eager"
			if cooperative {
				name = "cooperative"
			}
			t.Run(name+"/"+initialName(initial), func(t *testing.T) {
				t.Parallel()
				testChurn(t, cooperative, initial, safeack.Unordered)
			})
		}
		// Under OrderByKey, with keyed and key-less records.
		name := "eager/by-key"
		if cooperative {
			name = "cooperative/by-key"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testChurn(t, cooperative, sarama.OffsetOldest, safeack.OrderByKey)
		})
	}
}

func testChurn(t *testing.T, cooperative bool, initial int64, ordering safeack.Ordering) {
	const partitions = 6
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	startAfterHistory(t, c, watch, topic, partitions, initial, 20)

	var mu sync.Mutex
	seen := map[po]int{}
	handler := func(m *message.Message) {
		k, _ := msgPO(m)
		mu.Lock()
		seen[k]++
		n := seen[k]
		mu.Unlock()
		switch {
		case k.o%31 == 3 && n == 1:
			// Slow: past DrainTimeout, ignoring the context.
			time.Sleep(150 * time.Millisecond)
		case k.o%5 == 2 && n == 1:
			m.Nack()
			return
		default:
			randomDelay(3 * time.Millisecond)
		}
		if m.Context().Err() != nil {
			acks.ackLate(m)
			return
		}
		acks.ack(m)
	}
	member := func(id string) *safeack.Subscriber {
		s := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = ordering
			cfg.MaxInFlight = 32
			cfg.MaxPendingPerPartition = 16
			cfg.DrainTimeout = 100 * time.Millisecond
			cfg.OverwriteSaramaConfig.ClientID = id
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = initial
			if cooperative {
				cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
					sarama.NewBalanceStrategyCooperativeSticky(),
				}
			}
		})
		handleAll(mustSubscribe(t, s, topic), handler)
		return s
	}

	a := member("a")
	kafkatest.WaitFor(t, mwWait, "A to own every partition", func() bool {
		return len(ownedPartitions(a, topic)) == partitions
	})
	stopProducing := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		pace := time.NewTicker(10 * time.Millisecond) // a steady flow, not a flood
		defer pace.Stop()
		for {
			select {
			case <-stopProducing:
				return
			case <-pace.C:
			}
			c.ProduceN(t, topic, partitions, partitions, func(i int) string {
				if i%7 == 0 {
					return ""
				}
				return fmt.Sprintf("k%d", i%5)
			})
		}
	}()
	for i := range 3 {
		x := member(fmt.Sprintf("x%d", i))
		kafkatest.WaitFor(t, mwWait, "the newcomer to own partitions", func() bool {
			return len(ownedPartitions(x, topic)) > 0
		})
		// One more joins and leaves at once, mid-rebalance.
		y := member(fmt.Sprintf("y%d", i))
		require.NoError(t, x.Close())
		require.NoError(t, y.Close())
	}
	close(stopProducing)
	<-produced
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
	require.Empty(t, acks.badMessages())
}

// TestAdvDeferredByKeyFailKeepsOrder defers every record under OrderByKey
// and resolves it later from another goroutine, failing the first
// resolution of a third of them: a record of a key does not start while an
// earlier one of that key is unresolved (deferred work counts as running),
// starts are in offset order per key, and every record is completed and
// committed.
func TestAdvDeferredByKeyFailKeepsOrder(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 2)
	group := c.NewGroup(t)
	const n = 120
	c.ProduceN(t, topic, 2, n, func(i int) string {
		if i%10 == 0 {
			return "" // key-less
		}
		return fmt.Sprintf("k%d", i%4)
	})
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.OrderByKey
		cfg.MaxInFlight = 16
		cfg.NackResendSleep = time.Millisecond
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	trackers := map[int32]*keyTracker{0: newKeyTracker(), 1: newKeyTracker()}
	var mu sync.Mutex
	tries := map[po]int{}
	done := map[po]bool{}
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k, _ := msgPO(m)
		key, _ := safeack.MessageKeyFromCtx(m.Context())
		kt := trackers[k.p]
		kt.start(string(key), k.o)
		comp, err := safeack.Defer(m)
		if err != nil {
			kt.end(string(key))
			return err
		}
		mu.Lock()
		tries[k]++
		fail := tries[k] == 1 && k.o%3 == 0
		mu.Unlock()
		go func() {
			randomDelay(3 * time.Millisecond)
			kt.end(string(key))
			if fail {
				comp.Fail(errors.New("deferred failure"))
				return
			}
			mu.Lock()
			done[k] = true
			mu.Unlock()
			comp.Done()
		}()
		return nil
	})
	kafkatest.WaitFor(t, mwWait, "every record completed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == n
	})
	for p, kt := range trackers {
		kt.mu.Lock()
		require.Empty(t, kt.violations, "partition %d", p)
		kt.mu.Unlock()
	}
	mwWaitCommitted(t, c, group, topic, c.HighWaterMarks(t, topic))
}

// TestAdvNoGroupConsumesAddedPartitions: without a consumer group, at
// Sarama's default OffsetNewest, partitions added to the topic while the
// subscription runs are consumed once the subscription sees them (within
// Metadata.RefreshFrequency, as a group notices them), from their first
// record: every record of a partition that did not exist when Subscribe
// returned was written after it. Before, they were never consumed at all
// until a reconnect, which then started them at their end.
func TestAdvNoGroupConsumesAddedPartitions(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.ProduceN(t, topic, 1, 5, nil) // history, before the subscription: skipped at OffsetNewest
	c.ForgetProduced(topic, 0, 5)
	acks := newAckLog()
	sub := newTestSubscriber(t, c, "", func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 200 * time.Millisecond
	})
	handleAll(mustSubscribe(t, sub, topic), acks.ack)
	c.Produce(t, topic, records(0, 3)...)
	acks.waitAllAcked(t, c, topic, mwWait)

	c.AddPartitions(t, topic, 3)
	c.Produce(t, topic, append(records(1, 4), records(2, 4)...)...)
	acks.waitAllAcked(t, c, topic, mwWait)
	kafkatest.WaitFor(t, mwWait, "Stats to show every partition", func() bool {
		return len(ownedPartitions(sub, topic)) == 3
	})
	c.Produce(t, topic, append(records(1, 2), records(2, 2)...)...)
	acks.waitAllAcked(t, c, topic, mwWait)
	for k, n := range acks.snapshot() {
		require.Equal(t, 1, n, "record %v handled more than once", k)
	}
}

// TestAdvCooperativeRoundTripKeepsTail: under cooperative-sticky, a
// partition moves from A to B and back to A within A's one session. B
// holds a record and completes the ones after it, so B's final commit
// carries a completed tail; A, taking the partition back, must read that
// commit (not the one its session started with) and skip B's completed
// records.
func TestAdvCooperativeRoundTripKeepsTail(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	member := func(id string) *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 200 * time.Millisecond
			cfg.OverwriteSaramaConfig.ClientID = id
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky(),
			}
		})
	}
	c.ProduceN(t, topic, partitions, partitions*20, nil)

	a := member("a")
	handleAll(mustSubscribe(t, a, topic), acks.ack)
	watch.waitCommitted(t, map[int32]int64{0: 20, 1: 20}, mwWait)
	beforeB := ownedPartitions(a, topic)
	require.Len(t, beforeB, partitions)

	// B holds the first record it gets of each partition it takes, and
	// acks the rest.
	var mu sync.Mutex
	bHeld := map[int32]int64{}
	b := member("b")
	handleAll(mustSubscribe(t, b, topic), func(m *message.Message) {
		k, _ := msgPO(m)
		mu.Lock()
		if _, ok := bHeld[k.p]; !ok {
			bHeld[k.p] = k.o
			mu.Unlock()
			return
		}
		mu.Unlock()
		acks.ack(m)
	})
	kafkatest.WaitFor(t, mwWait, "B to own a partition", func() bool {
		return len(ownedPartitions(b, topic)) == 1 && len(ownedPartitions(a, topic)) == 1
	})
	var moved int32
	for p := range ownedPartitions(b, topic) {
		moved = p
	}
	c.Produce(t, topic, records(moved, 20)...)
	kafkatest.WaitFor(t, mwWait, "B to hold one record and ack the rest", func() bool {
		mu.Lock()
		_, held := bHeld[moved]
		mu.Unlock()
		return held && len(acks.missing(c, topic)) == 1
	})
	mu.Lock()
	heldAt := bHeld[moved]
	mu.Unlock()
	watch.waitCommitted(t, map[int32]int64{moved: heldAt}, mwWait)
	before := acks.snapshot()

	require.NoError(t, b.Close())
	kafkatest.WaitFor(t, mwWait, "A to take the partition back", func() bool {
		return len(ownedPartitions(a, topic)) == partitions
	})
	ps := ownedPartitions(a, topic)
	require.Equal(t, beforeB[1-moved].AssignedAt, ps[1-moved].AssignedAt, "A's session was not kept (not cooperative)")
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))

	var replayed []po
	for k, n := range acks.snapshot() {
		if k.p == moved && k.o > heldAt && n > before[k] {
			replayed = append(replayed, k)
		}
	}
	require.Empty(t, replayed, "records B completed after its held one were handled again by A")
	ps = ownedPartitions(a, topic)
	require.Positive(t, ps[moved].SkippedTail, "A did not skip B's completed tail")
}

// TestAdvOneSlotNackStorm runs the tightest limits: one message in flight
// for the whole subscription, two pending records per partition, redelivery
// without a pause, and every first delivery nacked, across four partitions
// under each ordering. Nothing starves or deadlocks: every record is acked
// and committed.
func TestAdvOneSlotNackStorm(t *testing.T) {
	t.Parallel()
	for _, ordering := range []safeack.Ordering{safeack.OrderByKey, safeack.OrderByPartition, safeack.Unordered} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			const partitions = 4
			c := kafkatest.Start(t)
			topic := c.NewTopic(t, partitions)
			group := c.NewGroup(t)
			c.ProduceN(t, topic, partitions, partitions*30, func(i int) string {
				if i%3 == 0 {
					return ""
				}
				return fmt.Sprintf("k%d", i%2)
			})
			acks := newAckLog()
			watch := newCommitWatch(t, c, group, topic, acks)
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

// TestAdvStuckAtCapacityEagerRebalance: every partition of A is stuck on a
// record its unmarshaler rejects, with a slow record before it holding the
// prefix, when B joins (eager: the whole
// session ends). The rebalance completes well within Rebalance.Timeout,
// no commit passes the rejected record or the unacked one, and once the
// unmarshaler accepts it everything is acked and committed.
func TestAdvStuckAtCapacityEagerRebalance(t *testing.T) {
	t.Parallel()
	const (
		partitions = 2
		rejectAt   = 10
		slowAt     = 4
		capacity   = 7 // the slow record to the rejected one
	)
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	c.ProduceN(t, topic, partitions, partitions*40, nil)
	var healed atomic.Bool
	release := make(chan struct{})
	member := func(id string) *safeack.Subscriber {
		s := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.MaxPendingPerPartition = capacity
			cfg.DrainTimeout = 300 * time.Millisecond
			cfg.ReconnectRetrySleep = 50 * time.Millisecond
			cfg.Unmarshaler = flakyUnmarshaler{rejectAt: rejectAt, healed: &healed}
			cfg.OverwriteSaramaConfig.ClientID = id
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		})
		handleAll(mustSubscribe(t, s, topic), func(m *message.Message) {
			if k, _ := msgPO(m); k.o == slowAt {
				select {
				case <-release:
				case <-m.Context().Done():
					acks.ackLate(m) // its assignment ended: changes nothing
					return
				}
			}
			acks.ack(m)
		})
		return s
	}
	a := member("a")
	kafkatest.WaitFor(t, mwWait, "A stuck at capacity on every partition", func() bool {
		own := ownedPartitions(a, topic)
		if len(own) != partitions {
			return false
		}
		for _, ps := range own {
			if !ps.Stuck || ps.Retained < rejectAt-slowAt {
				return false
			}
		}
		return true
	})
	for p, ps := range ownedPartitions(a, topic) {
		t.Logf("A partition %d: retained %d of %d, stuck %v, safe %d", p, ps.Retained, capacity, ps.Stuck, ps.SafeOffset)
	}
	joined := time.Now()
	b := member("b")
	kafkatest.WaitFor(t, mwWait, "the group to settle with both members", func() bool {
		ao, bo := ownedPartitions(a, topic), ownedPartitions(b, topic)
		return len(ao) == 1 && len(bo) == 1
	})
	require.Less(t, time.Since(joined), 6*time.Second, "the rebalance waited for Rebalance.Timeout")
	t.Logf("settled after %v", time.Since(joined).Round(time.Millisecond))
	kafkatest.WaitFor(t, mwWait, "both members stuck again", func() bool {
		ao, bo := ownedPartitions(a, topic), ownedPartitions(b, topic)
		for _, ps := range []map[int32]safeack.PartitionStats{ao, bo} {
			for _, s := range ps {
				if !s.Stuck {
					return false
				}
			}
		}
		return true
	})
	require.Positive(t, watch.check(t))
	for p, off := range watch.committed(t) {
		require.LessOrEqual(t, off, int64(slowAt), "partition %d committed past the unacked record", p)
	}
	close(release)
	healed.Store(true)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
}

// TestAdvStaticMemberRestart: a static member (Group.InstanceId) closes
// while holding a record and is replaced by a new Subscriber with the same
// instance id, which gets its partitions back without a rebalance of the
// others; meanwhile the old one, still in its drain, acks late. No commit
// passes an unacked record, the completed tail is skipped, and everything
// is acked.
func TestAdvStaticMemberRestart(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	c.ProduceN(t, topic, partitions, partitions*30, nil)
	member := func() *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 200 * time.Millisecond
			cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "static-1"
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		})
	}
	hold := newHolder(po{0, 3}, po{1, 3})
	a := member()
	handleAll(mustSubscribe(t, a, topic), func(m *message.Message) {
		if !hold.take(m) {
			acks.ack(m)
		}
	})
	kafkatest.WaitFor(t, mwWait, "A to hold its records and ack the rest", func() bool {
		return hold.count() == partitions && len(acks.missing(c, topic)) == partitions
	})
	watch.waitCommitted(t, map[int32]int64{0: 3, 1: 3}, mwWait)
	before := acks.snapshot()
	require.NoError(t, a.Close())
	for _, h := range hold.all() {
		acks.ackLate(h.m)
	}

	b := member()
	handleAll(mustSubscribe(t, b, topic), acks.ack)
	c.ProduceN(t, topic, partitions, partitions*10, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
	for k, n := range acks.snapshot() {
		if n > before[k] && before[k] > 0 {
			t.Errorf("record %v completed before the restart was handled again", k)
		}
	}
}
