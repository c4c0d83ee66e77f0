package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// shutdownRun is one run of TestPoisonQueueShutdown: the records, which of
// them are poison, and what the handlers and the dead-letter topic saw.
type shutdownRun struct {
	c      *kafkatest.Cluster
	topic  string
	dlq    string
	group  string
	dlqPub message.Publisher

	release chan struct{} // lets slow first deliveries finish

	mu        sync.Mutex
	processed map[po]int  // handler returned nil
	delivered map[po]int  // handler started
	slowHeld  map[po]bool // a slow first delivery is running
	canceled  map[po]bool // a handler saw its context cancelled
}

func newShutdownRun(t *testing.T) *shutdownRun {
	c := kafkatest.Start(t)
	r := &shutdownRun{
		c:         c,
		topic:     c.NewTopic(t, 4),
		dlq:       c.NewTopic(t, 1),
		group:     c.NewGroup(t),
		release:   make(chan struct{}),
		processed: make(map[po]int),
		delivered: make(map[po]int),
		slowHeld:  make(map[po]bool),
		canceled:  make(map[po]bool),
	}
	pcfg := c.SaramaConfig()
	pcfg.Producer.Partitioner = sarama.NewHashPartitioner
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r.dlqPub = pub
	return r
}

// Which records are poison (fail every time) and which are slow (the
// first delivery runs until its context ends or the test releases it).
func isPoison(k po) bool { return k.o%41 == 3 }
func isSlow(k po) bool   { return k.o == 30 }

var errPoisonRecord = errors.New("poison record")

// handler works for a few milliseconds, honouring its context as a real
// handler calling a database or an HTTP service would.
func (r *shutdownRun) handler(m *message.Message) error {
	k, ok := msgPO(m)
	if !ok {
		return errors.New("no Kafka position in the context")
	}
	r.mu.Lock()
	r.delivered[k]++
	first := r.delivered[k] == 1
	if first && isSlow(k) {
		r.slowHeld[k] = true
	}
	r.mu.Unlock()
	var work <-chan time.Time
	var release <-chan struct{}
	if first && isSlow(k) {
		release = r.release
	} else {
		work = time.After(time.Duration(10+rand.IntN(20)) * time.Millisecond)
	}
	select {
	case <-work:
	case <-release:
	case <-m.Context().Done():
		r.mu.Lock()
		r.canceled[k] = true
		r.mu.Unlock()
		return m.Context().Err()
	}
	if isPoison(k) {
		return fmt.Errorf("record %v: %w", k, errPoisonRecord)
	}
	r.mu.Lock()
	r.processed[k]++
	r.mu.Unlock()
	return nil
}

// member starts a subscriber of the group behind a router with the
// middleware chain docs/middleware.md recommends.
func (r *shutdownRun) member(t *testing.T, cooperative bool) (*safeack.Subscriber, *message.Router) {
	sub := newTestSubscriber(t, r.c, r.group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 64
		cfg.DrainTimeout = time.Second
		if cooperative {
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky(),
			}
		}
	})
	poison, err := safeack.PoisonQueue(r.dlqPub, r.dlq)
	require.NoError(t, err)
	router := mwRouter(t, sub, r.topic, r.handler,
		safeack.SkipRevoked,
		safeack.KafkaMetadata,
		poison,
		middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, Multiplier: 2, ResetContextOnRetry: true}.Middleware,
		middleware.Recoverer,
	)
	return sub, router
}

func (r *shutdownRun) processedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.processed)
}

func (r *shutdownRun) slowHeldCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.slowHeld)
}

// requireOnlySlowCanceled checks that the drains gave up only on the slow
// handlers: every other handler running at Close or revocation finished
// with its context alive.
func (r *shutdownRun) requireOnlySlowCanceled(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.canceled {
		require.True(t, isSlow(k), "the context of %v was cancelled although its handler could finish within DrainTimeout", k)
	}
}

// check waits until the group committed every record, then checks that
// every record but the poison ones was processed, and that the dead-letter
// topic holds exactly the poison ones.
func (r *shutdownRun) check(t *testing.T) {
	t.Helper()
	hwm := r.c.HighWaterMarks(t, r.topic)
	mwWaitCommitted(t, r.c, r.group, r.topic, hwm)

	var poison []po
	r.mu.Lock()
	var lost []po
	for _, p := range r.c.ProducedRecords(r.topic) {
		k := po{p.Partition, p.Offset}
		if isPoison(k) {
			poison = append(poison, k)
			continue
		}
		if r.processed[k] == 0 {
			lost = append(lost, k)
		}
	}
	canceled := len(r.canceled)
	r.mu.Unlock()
	require.Empty(t, lost, "records never processed")
	t.Logf("%d handlers saw their context cancelled", canceled)

	// Read the dead-letter topic back.
	n := int(r.c.HighWaterMarks(t, r.dlq)[0])
	reader := newTestSubscriber(t, r.c, "", nil)
	msgs := mustSubscribe(t, reader, r.dlq)
	dead := make(map[po]int)
	var notPoison []string
	for range n {
		select {
		case m := <-msgs:
			m.Ack()
			p, err1 := strconv.ParseInt(m.Metadata.Get(safeack.MetadataPartition), 10, 32)
			o, err2 := strconv.ParseInt(m.Metadata.Get(safeack.MetadataOffset), 10, 64)
			require.NoError(t, errors.Join(err1, err2), "dead letter without its position: %v", m.Metadata)
			k := po{int32(p), o}
			dead[k]++
			if !isPoison(k) {
				notPoison = append(notPoison, fmt.Sprintf("%v (%s)", k, m.Metadata.Get(middleware.ReasonForPoisonedKey)))
			}
		case <-time.After(mwWait):
			t.Fatalf("read %d of the %d dead letters", len(dead), n)
		}
	}
	require.Empty(t, notPoison, "records dead-lettered that are not poison")
	var missing []po
	for _, k := range poison {
		if dead[k] == 0 {
			missing = append(missing, k)
		}
	}
	require.Empty(t, missing, "poison records not dead-lettered")
	if n != len(poison) {
		t.Logf("%d dead letters for %d poison records", n, len(poison))
	}
}

// loadedMember produces perPartition records to each of the 4
// partitions, starts member A (cooperative or not) and waits until it
// processed some and holds the slow ones, with enough left (unloaded: the
// failure message) to shut down under load.
func (r *shutdownRun) loadedMember(t *testing.T, perPartition int, cooperative bool, unloaded string) (*safeack.Subscriber, *message.Router) {
	t.Helper()
	r.c.ProduceN(t, r.topic, 4, 4*perPartition, nil)
	sub, router := r.member(t, cooperative)
	kafkatest.WaitFor(t, mwWait, "A to process some records and hold the slow ones", func() bool {
		return r.processedCount() >= 300 && r.slowHeldCount() == 4
	})
	require.Less(t, r.processedCount(), 4*perPartition-200, unloaded)
	return sub, router
}

// TestPoisonQueueShutdown runs the recommended middleware chain (Retry
// inside safeack.PoisonQueue) under load, with handlers that honour their
// context, a few poison records and one slow record per partition that
// the drain gives up on. A Close, and a cooperative revocation, dead-letter
// nothing but the poison records, and every other record is processed by
// the member that owns it next.
func TestPoisonQueueShutdown(t *testing.T) {
	t.Parallel()
	const perPartition = 750
	t.Run("close", func(t *testing.T) {
		t.Parallel()
		r := newShutdownRun(t)
		_, a := r.loadedMember(t, perPartition, false, "A was done before Close: no load to close under")
		require.NoError(t, a.Close())
		r.requireOnlySlowCanceled(t)

		r.member(t, false) // the next subscriber of the group
		r.check(t)
	})
	t.Run("cooperative-revoke", func(t *testing.T) {
		t.Parallel()
		r := newShutdownRun(t)
		a, _ := r.loadedMember(t, perPartition, true, "A was done before B joined: no load to revoke under")
		b, _ := r.member(t, true)
		kafkatest.WaitFor(t, mwWait, "the group to settle with both members", func() bool {
			ao, bo := ownedPartitions(a, r.topic), ownedPartitions(b, r.topic)
			for p := range bo {
				if _, both := ao[p]; both {
					return false
				}
			}
			return len(ao) > 0 && len(bo) > 0 && len(ao)+len(bo) == 4
		})
		// A's slow records of the partitions it kept may finish now.
		close(r.release)
		r.check(t)
		r.mu.Lock()
		assert.NotEmpty(t, r.canceled, "the drain of a revoked partition gave up on no handler")
		r.mu.Unlock()
		r.requireOnlySlowCanceled(t)
	})
}

// recordingPublisher keeps what is published, for tests without a broker.
type recordingPublisher struct {
	mu  sync.Mutex
	got []*message.Message
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, msgs...)
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}

// TestPoisonQueueForeignMessages: with messages of another subscriber,
// PoisonQueue dead-letters a failure while the message's context is alive
// (and the filter agrees), and nacks it when the subscriber had cancelled
// the context; a Timeout inside it does not count as the subscriber's.
func TestPoisonQueueForeignMessages(t *testing.T) {
	t.Parallel()
	_, err := safeack.PoisonQueue(&recordingPublisher{}, "")
	require.ErrorIs(t, err, middleware.ErrInvalidPoisonQueueTopic)
	_, err = safeack.PoisonQueue(nil, "dlq")
	require.Error(t, err)

	fail := func(err error) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) { return nil, err }
	}
	honour := func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		return nil, m.Context().Err()
	}
	newMsg := func(ctx context.Context) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		m.SetContext(ctx)
		return m
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	boom := errors.New("boom")

	for _, tc := range []struct {
		name   string
		ctx    context.Context
		h      message.HandlerFunc
		inner  []message.HandlerMiddleware
		filter func(error) bool
		dead   bool
	}{
		{name: "failure", ctx: context.Background(), h: fail(boom), dead: true},
		{name: "filtered-out", ctx: context.Background(), h: fail(boom), filter: func(error) bool { return false }},
		{name: "subscriber-cancelled", ctx: cancelled, h: fail(context.Canceled)},
		{name: "subscriber-cancelled-other-error", ctx: cancelled, h: fail(boom)},
		{name: "timeout-inside", ctx: context.Background(), h: honour, inner: []message.HandlerMiddleware{middleware.Timeout(time.Millisecond)}, dead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &recordingPublisher{}
			pq, err := safeack.PoisonQueueWithFilter(pub, "dlq", tc.filter)
			require.NoError(t, err)
			h := tc.h
			for _, mw := range slices.Backward(tc.inner) {
				h = mw(h)
			}
			_, err = pq(h)(newMsg(tc.ctx))
			if tc.dead {
				require.NoError(t, err)
				require.Equal(t, 1, pub.count())
				return
			}
			require.Error(t, err)
			require.Zero(t, pub.count(), "dead-lettered")
			if tc.ctx.Err() != nil {
				require.ErrorIs(t, err, safeack.ErrAssignmentEnded)
			} else {
				require.NotErrorIs(t, err, safeack.ErrAssignmentEnded)
			}
		})
	}
}

// TestPanicRetryPlainPoisonQueueEagerRebalance runs routers with
// Recoverer inside Retry inside Watermill's own (plain) PoisonQueue, with
// handlers that finish out of order, panic on some first attempts and
// always panic on poison records, while a second member joins mid-run
// (eager rebalance: the whole session ends). Every record is acked at least
// once with its assignment alive, and no commit the broker saw passes a
// record not acked before it.
func TestPanicRetryPlainPoisonQueueEagerRebalance(t *testing.T) {
	t.Parallel()
	const partitions = 4
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, partitions)
	dlq := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	acks, watch := watchCommits(t, c, group, topic)

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

// flakyPublisher fails its first Publish, blocks the second until released,
// and remembers when a publish succeeded.
type flakyPublisher struct {
	message.Publisher
	mu          sync.Mutex
	calls       int
	blocked     chan struct{} // closed when the second publish waits
	release     chan struct{}
	publishedAt time.Time
}

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	p.calls++
	n := p.calls
	p.mu.Unlock()
	switch n {
	case 1:
		return errors.New("dead-letter topic unavailable")
	case 2:
		close(p.blocked)
		<-p.release
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.mu.Lock()
	p.publishedAt = time.Now()
	p.mu.Unlock()
	return nil
}

// TestMiddlewareRetryPoisonQueue: a record that keeps failing is retried a
// bounded number of times, then published to a dead-letter topic with its
// original position in metadata, and only then completed. The first
// dead-letter publish fails (the record is nacked and redelivered) and the
// second is slow: no commit passes the record before it succeeded.
func TestMiddlewareRetryPoisonQueue(t *testing.T) {
	t.Parallel()
	const maxRetries = 2
	c := kafkatest.Start(t)
	topic, dlq, group := c.NewTopic(t, 1), c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })

	pcfg := c.SaramaConfig()
	pcfg.Producer.Partitioner = sarama.NewHashPartitioner
	kpub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pcfg}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = kpub.Close() })
	pub := &flakyPublisher{Publisher: kpub, blocked: make(chan struct{}), release: make(chan struct{})}
	poison, err := middleware.PoisonQueue(pub, dlq)
	require.NoError(t, err)
	retry := middleware.Retry{MaxRetries: maxRetries, InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, Multiplier: 1.5}

	var (
		mu       sync.Mutex
		attempts int
		done     = newDoneLog()
	)
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		if k.o == 2 {
			mu.Lock()
			attempts++
			mu.Unlock()
			return errors.New("cannot process record 2")
		}
		done.done(k)
		return nil
	}, safeack.KafkaMetadata, poison, retry.Middleware)

	produced := c.ProduceN(t, topic, 1, 5, func(i int) string { return fmt.Sprintf("key-%d", i) })
	select {
	case <-pub.blocked:
	case <-time.After(mwWait):
		t.Fatal("no second dead-letter publish")
	}
	mu.Lock()
	assert.Equal(t, 2*(maxRetries+1), attempts, "two deliveries, each retried %d times", maxRetries)
	mu.Unlock()
	kafkatest.WaitFor(t, mwWait, "records 3 and 4 completed behind record 2", func() bool {
		ps, ok := statsOf(sub, topic, 0)
		return ok && ps.SafeOffset == 2 && ps.Blocked == 2
	})
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 2})
	assert.EqualValues(t, 2, c.CommittedOffsets(t, group, topic)[0].Offset, "committed past a record not yet dead-lettered")

	close(pub.release)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 5})
	pub.mu.Lock()
	publishedAt := pub.publishedAt
	pub.mu.Unlock()
	require.False(t, publishedAt.IsZero())
	done.set(po{0, 2}, publishedAt) // record 2 is done once dead-lettered
	if checked := mwCheckCommits(t, commits, group, topic, done); commits != nil {
		assert.Positive(t, checked, "no commit of the topic was observed")
	}
	mu.Lock()
	assert.Equal(t, 2*(maxRetries+1), attempts, "retried again after the dead-letter publish")
	mu.Unlock()

	// The dead-letter topic holds the record with its original position.
	reader := newTestSubscriber(t, c, "", nil)
	msgs := mustSubscribe(t, reader, dlq)
	select {
	case m := <-msgs:
		m.Ack()
		assert.Equal(t, produced[2].Value, []byte(m.Payload))
		assert.Equal(t, topic, m.Metadata.Get(safeack.MetadataTopic))
		assert.Equal(t, "0", m.Metadata.Get(safeack.MetadataPartition))
		assert.Equal(t, "2", m.Metadata.Get(safeack.MetadataOffset))
		assert.Equal(t, "key-2", m.Metadata.Get(safeack.MetadataKey))
		assert.Equal(t, topic, m.Metadata.Get(middleware.PoisonedTopicKey))
		assert.Equal(t, "h", m.Metadata.Get(middleware.PoisonedHandlerKey))
		assert.Contains(t, m.Metadata.Get(middleware.ReasonForPoisonedKey), "cannot process record 2")
	case <-time.After(mwWait):
		t.Fatal("nothing on the dead-letter topic")
	}
	assert.EqualValues(t, 1, c.HighWaterMarks(t, dlq)[0], "dead-lettered once")
}
