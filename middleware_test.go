package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
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

// Tests of middleware.go, each on a real Watermill router with the
// subscriber on the test broker.

const mwWait = 15 * time.Second // deadline of every wait in these tests

// mwRouter runs a router with one consumer handler named "h" on sub and
// closes it at the end of the test (which closes sub).
func mwRouter(t *testing.T, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, testLogger())
	require.NoError(t, err)
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("h", topic, sub, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	select {
	case <-r.Running():
	case <-time.After(mwWait):
		cancel()
		t.Fatal("router did not start")
	}
	t.Cleanup(func() {
		_ = r.Close()
		cancel()
		<-done
	})
	return r
}

// mwOffset returns the partition and offset of a message of the subscriber.
func mwOffset(t *testing.T, m *message.Message) po {
	k, ok := msgPO(m)
	if !ok {
		panic(fmt.Sprintf("message %s carries no Kafka position", m.UUID))
	}
	return k
}

// doneLog records when the test considered each record completed: a
// handler about to return nil, a Completion about to be resolved, a
// dead-letter publish that succeeded. Every observed commit is checked
// against it.
type doneLog struct {
	mu sync.Mutex
	at map[po]time.Time
}

func newDoneLog() *doneLog { return &doneLog{at: make(map[po]time.Time)} }

func (l *doneLog) done(k po) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.at[k]; !ok {
		l.at[k] = time.Now()
	}
}

// set records k done at a known time.
func (l *doneLog) set(k po, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at[k] = at
}

func (l *doneLog) has(k po) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.at[k]
	return ok
}

func (l *doneLog) get(k po) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.at[k]
	return at, ok
}

// mwCheckCommits checks every commit of group on topic observed by the
// broker: committing offset o of partition p needs every record of p below
// o (offsets start at 0 in these tests) done before the broker saw the
// commit. It returns how many commits touched the topic.
func mwCheckCommits(t *testing.T, log *kafkatest.CommitLog, group, topic string, done *doneLog) int {
	t.Helper()
	if log == nil {
		return 0 // real cluster: the waits poll committed offsets instead
	}
	n := 0
	log.CheckUntil(t, time.Now(), func(o kafkatest.ObservedCommit) error {
		if o.Group != group {
			return nil
		}
		for tp, co := range o.Offsets {
			if tp.Topic != topic {
				continue
			}
			n++
			for off := int64(0); off < co.Offset; off++ {
				at, ok := done.get(po{tp.Partition, off})
				if !ok {
					return fmt.Errorf("partition %d committed %d, but record %d was never done", tp.Partition, co.Offset, off)
				}
				if !at.Before(o.At) {
					return fmt.Errorf("partition %d committed %d %v before record %d was done", tp.Partition, co.Offset, at.Sub(o.At), off)
				}
			}
		}
		return nil
	})
	return n
}

// mwWaitCommitted waits until group's committed offsets on topic reach
// want, read back from the broker (on the embedded broker and on a real
// cluster alike).
func mwWaitCommitted(t *testing.T, c *kafkatest.Cluster, group, topic string, want map[int32]int64) {
	t.Helper()
	kafkatest.WaitFor(t, mwWait, fmt.Sprintf("group to commit %v", want), func() bool {
		co := c.CommittedOffsets(t, group, topic)
		for p, off := range want {
			if co[p].Offset < off {
				return false
			}
		}
		return true
	})
}

// eventLog collects Telemetry events.
type eventLog struct {
	mu     sync.Mutex
	events []safeack.CompletionEvent
}

func (l *eventLog) hook(e safeack.CompletionEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) all() []safeack.CompletionEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func (l *eventLog) count(o safeack.Outcome) int {
	n := 0
	for _, e := range l.all() {
		if e.Outcome == o {
			n++
		}
	}
	return n
}

func answeredAck(m *message.Message) bool {
	select {
	case <-m.Acked():
		return true
	default:
		return false
	}
}

// TestMiddlewareDeferredOutOfOrder defers every record of a partition and
// resolves the handles out of order: the completed prefix, and every
// commit the broker sees, only ever passes records whose handle reported
// Done, although the router acked them all at once.
func TestMiddlewareDeferredOutOfOrder(t *testing.T) {
	t.Parallel()
	const n = 8
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })

	var mu sync.Mutex
	handles := make(map[int64]*safeack.Completion)
	msgs := make(map[int64]*message.Message)
	calls := 0
	var events eventLog
	mwRouter(t, sub, topic, func(m *message.Message) error {
		comp, err := safeack.CompletionFromCtx(m.Context())
		if err != nil {
			return err
		}
		again, err := safeack.Defer(m)
		if err != nil || again != comp {
			return fmt.Errorf("Defer after CompletionFromCtx: %v, same handle %v", err, again == comp)
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		handles[comp.Offset()], msgs[comp.Offset()] = comp, m
		return nil // the router acks now; the record stays unfinished
	}, safeack.Telemetry(events.hook), safeack.DeferredCompletion)

	c.ProduceN(t, topic, 1, n, nil)
	kafkatest.WaitFor(t, mwWait, "every record deferred and acked by the router", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(msgs) != n {
			return false
		}
		for _, m := range msgs {
			if !answeredAck(m) {
				return false
			}
		}
		return true
	})
	ps, ok := statsOf(sub, topic, 0)
	require.True(t, ok)
	assert.EqualValues(t, 0, ps.SafeOffset, "nothing resolved yet")
	assert.EqualValues(t, n, ps.Deferred)
	assert.Equal(t, n, ps.InFlight, "unresolved handles stay in flight")
	assert.True(t, ps.HasUnfinished)
	assert.EqualValues(t, 0, ps.OldestUnfinished)

	done := newDoneLog()
	resolved := make(map[int64]bool)
	for _, off := range []int64{5, 2, 7, 1, 0, 4, 3, 6} {
		done.done(po{0, off})
		resolved[off] = true
		handles[off].Done()
		want := int64(0)
		for resolved[want] {
			want++
		}
		// The router acked every message before: Done takes effect at once.
		ps, ok := statsOf(sub, topic, 0)
		require.True(t, ok)
		require.Equal(t, want, ps.SafeOffset, "after resolving %d", off)
		if off == 0 || off == 3 {
			mwWaitCommitted(t, c, group, topic, map[int32]int64{0: want})
		}
	}
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: n})

	// Resolving again is harmless: no completion, no redelivery.
	handles[3].Done()
	handles[3].Fail(errors.New("late failure"))
	handles[6].Fail(nil)
	ps, _ = statsOf(sub, topic, 0)
	assert.Zero(t, ps.Redeliveries)
	assert.Zero(t, ps.InFlight)
	assert.EqualValues(t, n, ps.SafeOffset)
	mu.Lock()
	assert.Equal(t, n, calls, "each record handled once")
	mu.Unlock()

	if commits != nil {
		assert.Positive(t, mwCheckCommits(t, commits, group, topic, done))
		for _, o := range commits.Commits() {
			if co, ok := o.Offset(topic, 0); ok && o.Group == group {
				assert.Contains(t, []int64{0, 3, 6, n}, co.Offset, "commit %d at a position no prefix of resolved handles had", co.Offset)
			}
		}
	}
	evs := events.all()
	require.Len(t, evs, n)
	for _, e := range evs {
		assert.Equal(t, safeack.OutcomeDeferred, e.Outcome)
		assert.True(t, e.FromSafeack)
		assert.Equal(t, topic, e.Topic)
	}
}

// TestMiddlewareDeferredFailAndStaleHandles: a Completion of a delivery
// that was then nacked changes nothing; Fail redelivers; Done called before
// the handler returns takes effect with the router's ack.
func TestMiddlewareDeferredFailAndStaleHandles(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })

	var (
		mu       sync.Mutex
		attempts int
		h1, h2   *safeack.Completion
		m2       *message.Message
		release2 = make(chan struct{})
		done     = newDoneLog()
	)
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		if k.o != 0 {
			done.done(k)
			return nil
		}
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		comp, err := safeack.CompletionFromCtx(m.Context())
		if err != nil {
			return err
		}
		switch n {
		case 1: // defer, then fail anyway: the router nacks
			mu.Lock()
			h1 = comp
			mu.Unlock()
			return errors.New("failed after deferring")
		case 2: // held until the stale handle was resolved, then deferred
			<-release2
			mu.Lock()
			h2, m2 = comp, m
			mu.Unlock()
			return nil
		default: // resolved before returning
			done.done(k)
			comp.Done()
			return nil
		}
	}, safeack.DeferredCompletion)

	c.ProduceN(t, topic, 1, 2, nil)
	kafkatest.WaitFor(t, mwWait, "the second delivery of record 0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts == 2
	})
	mu.Lock()
	stale := h1
	mu.Unlock()
	stale.Done() // its delivery was nacked: nothing to complete
	ps, _ := statsOf(sub, topic, 0)
	assert.EqualValues(t, 0, ps.SafeOffset, "a stale handle completed a redelivered record")
	assert.Equal(t, 1, ps.InFlight)

	close(release2)
	kafkatest.WaitFor(t, mwWait, "the second delivery deferred and acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return m2 != nil && answeredAck(m2)
	})
	ps, _ = statsOf(sub, topic, 0)
	assert.EqualValues(t, 0, ps.SafeOffset)
	mu.Lock()
	second := h2
	mu.Unlock()
	second.Fail(errors.New("batch write failed")) // redelivers
	second.Done()                                 // too late: the first call won

	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 2})
	mu.Lock()
	assert.Equal(t, 3, attempts)
	mu.Unlock()
	ps, _ = statsOf(sub, topic, 0)
	assert.EqualValues(t, 2, ps.Redeliveries)
	assert.EqualValues(t, 3, ps.Deferred)
	assert.Zero(t, ps.InFlight)
	mwCheckCommits(t, commits, group, topic, done)
}

// TestMiddlewareDeferredResolvedAfterRevoke: a handle of a record whose
// partition was revoked while it was unresolved changes nothing when it
// is resolved later: the old member commits nothing past the record, and
// the partition's new owner handles it again.
func TestMiddlewareDeferredResolvedAfterRevoke(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	member := func() *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 300 * time.Millisecond
		})
	}

	var (
		mu         sync.Mutex
		deliveries = make(map[int64]int)
		stale      *safeack.Completion
		staleMsg   *message.Message
		owner      *safeack.Subscriber // the one that got record 1 again
		release    = make(chan struct{})
		done       = newDoneLog()
	)
	handler := func(s *safeack.Subscriber) message.NoPublishHandlerFunc {
		return func(m *message.Message) error {
			k := mwOffset(t, m)
			mu.Lock()
			deliveries[k.o]++
			n := deliveries[k.o]
			mu.Unlock()
			if k.o == 1 && n == 1 {
				comp, err := safeack.CompletionFromCtx(m.Context())
				if err != nil {
					return err
				}
				mu.Lock()
				stale, staleMsg = comp, m
				mu.Unlock()
				return nil // never resolved while A owns the partition
			}
			if k.o == 1 {
				mu.Lock()
				owner = s
				mu.Unlock()
				<-release
			}
			done.done(k)
			return nil
		}
	}
	a := member()
	mwRouter(t, a, topic, handler(a), safeack.DeferredCompletion)
	c.ProduceN(t, topic, 1, 3, nil)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 1})
	kafkatest.WaitFor(t, mwWait, "A to hold record 1 deferred, record 2 completed behind it", func() bool {
		ps, ok := statsOf(a, topic, 0)
		return ok && ps.SafeOffset == 1 && ps.Blocked == 1 && ps.InFlight == 1 && ps.Deferred == 1
	})

	b := member()
	mwRouter(t, b, topic, handler(b), safeack.DeferredCompletion)
	kafkatest.WaitFor(t, mwWait, "record 1 delivered again after the rebalance", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return owner != nil
	})
	require.True(t, safeack.AssignmentEnded(staleMsg))
	stale.Done() // after the revocation: changes nothing
	stale.Done()

	// The new owner completes record 3 behind record 1; its prefix stays
	// before record 1 although the stale handle said Done.
	c.ProduceN(t, topic, 1, 1, nil)
	kafkatest.WaitFor(t, mwWait, "record 3 handled", func() bool { return done.has(po{0, 3}) })
	mu.Lock()
	o := owner
	mu.Unlock()
	kafkatest.WaitFor(t, mwWait, "the new owner to hold record 1 with record 3 completed behind it", func() bool {
		ps, ok := statsOf(o, topic, 0)
		return ok && ps.Blocked >= 1 && ps.HasUnfinished && ps.OldestUnfinished == 1
	})
	ps, _ := statsOf(o, topic, 0)
	assert.EqualValues(t, 1, ps.SafeOffset)
	assert.EqualValues(t, 1, c.CommittedOffsets(t, group, topic)[0].Offset)

	close(release)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 4})
	mwCheckCommits(t, commits, group, topic, done)
}

// TestMiddlewareSkipRevoked holds the handler start of member A's
// messages until a rebalance revokes their partitions: SkipRevoked then
// does not run the handler, nothing is acked or committed for them, and
// their partitions' new owners handle them.
func TestMiddlewareSkipRevoked(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	member := func() *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 2 * time.Second
		})
	}

	var (
		mu      sync.Mutex
		held    = make(map[po]bool)
		handled = make(map[po][]string)
		done    = newDoneLog()
	)
	// holdFirst delays the first delivery of every record to A until its
	// assignment ends. The message context stays alive through the drain:
	// SkipRevoked must act on the assignment's end, not on the context.
	holdFirst := func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			k := mwOffset(t, m)
			mu.Lock()
			first := !held[k]
			held[k] = true
			mu.Unlock()
			if first {
				waitCond(mwWait, func() bool { return safeack.AssignmentEnded(m) })
				if m.Context().Err() != nil {
					t.Errorf("record %v: context cancelled when the drain started", k)
				}
			}
			return h(m)
		}
	}
	handler := func(name string) message.NoPublishHandlerFunc {
		return func(m *message.Message) error {
			k := mwOffset(t, m)
			mu.Lock()
			handled[k] = append(handled[k], name)
			mu.Unlock()
			done.done(k)
			return nil
		}
	}
	var aEvents, bEvents eventLog
	a := member()
	mwRouter(t, a, topic, handler("a"), safeack.Telemetry(aEvents.hook), holdFirst, safeack.SkipRevoked)
	c.ProduceN(t, topic, partitions, partitions, nil)
	kafkatest.WaitFor(t, mwWait, "A to hold one record per partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == partitions
	})

	b := member()
	mwRouter(t, b, topic, handler("b"), safeack.Telemetry(bEvents.hook), safeack.SkipRevoked)
	want := map[int32]int64{0: 1, 1: 1}
	mwWaitCommitted(t, c, group, topic, want)

	mu.Lock()
	for p := int32(0); p < partitions; p++ {
		assert.Len(t, handled[po{p, 0}], 1, "record %d@0 handled by %v", p, handled[po{p, 0}])
	}
	byB := 0
	for _, who := range handled {
		if slices.Contains(who, "b") {
			byB++
		}
	}
	mu.Unlock()
	assert.Positive(t, byB, "the new owner B handled none of the skipped records")
	assert.Equal(t, partitions, aEvents.count(safeack.OutcomeSkipped), "A's telemetry: %v", aEvents.all())
	assert.Zero(t, bEvents.count(safeack.OutcomeSkipped))
	var skipped uint64
	for _, pt := range a.Totals() {
		if pt.Topic == topic {
			skipped += pt.SkippedRevoked
		}
	}
	assert.EqualValues(t, partitions, skipped, "Totals().SkippedRevoked of A")
	mwCheckCommits(t, commits, group, topic, done)
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

// TestMiddlewareRecoverer: a panicking handler (behind middleware.Recoverer)
// nacks, the record is redelivered, and the partition keeps flowing even
// in partition order.
func TestMiddlewareRecoverer(t *testing.T) {
	t.Parallel()
	const n = 5
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.OrderByPartition })

	var (
		mu       sync.Mutex
		calls    = make(map[int64]int)
		done     = newDoneLog()
		recorded []error
	)
	var events eventLog
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		mu.Lock()
		calls[k.o]++
		first := calls[k.o] == 1
		mu.Unlock()
		if k.o == 1 && first {
			panic("boom")
		}
		done.done(k)
		return nil
	}, safeack.Telemetry(events.hook), middleware.Recoverer)

	c.ProduceN(t, topic, 1, n, nil)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: n})
	mu.Lock()
	assert.Equal(t, 2, calls[1])
	for off := int64(0); off < n; off++ {
		if off != 1 {
			assert.Equal(t, 1, calls[off], "record %d", off)
		}
	}
	mu.Unlock()
	for _, e := range events.all() {
		if e.Outcome == safeack.OutcomeNack {
			recorded = append(recorded, e.Err)
		}
	}
	require.Len(t, recorded, 1)
	var rp middleware.RecoveredPanicError
	assert.ErrorAs(t, recorded[0], &rp)
	ps, _ := statsOf(sub, topic, 0)
	assert.EqualValues(t, 1, ps.Redeliveries)
	mwCheckCommits(t, commits, group, topic, done)
}

// TestMiddlewareTimeout: middleware.Timeout ends the handler's context,
// and so does the revocation of the message's partition (once its drain
// gives up on the handler), long before the timeout.
func TestMiddlewareTimeout(t *testing.T) {
	t.Parallel()
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.Start(t)
		topic, group := c.NewTopic(t, 1), c.NewGroup(t)
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
		var (
			mu    sync.Mutex
			calls int
			errs  []error
		)
		mwRouter(t, sub, topic, func(m *message.Message) error {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if !first {
				return nil
			}
			<-m.Context().Done()
			mu.Lock()
			errs = append(errs, m.Context().Err())
			mu.Unlock()
			return m.Context().Err()
		}, middleware.Timeout(100*time.Millisecond))
		c.ProduceN(t, topic, 1, 1, nil)
		mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 1})
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, 2, calls)
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
	})
	t.Run("revoked", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.Start(t)
		topic, group := c.NewTopic(t, 1), c.NewGroup(t)
		member := func() *safeack.Subscriber {
			return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
		}
		var (
			mu      sync.Mutex
			calls   int
			waiting = make(chan struct{})
			ended   error
			endedIn time.Duration
		)
		handler := func(m *message.Message) error {
			mu.Lock()
			calls++
			first := calls == 1
			mu.Unlock()
			if !first {
				return nil
			}
			start := time.Now()
			close(waiting)
			<-m.Context().Done()
			mu.Lock()
			ended, endedIn = m.Context().Err(), time.Since(start)
			mu.Unlock()
			if !safeack.AssignmentEnded(m) {
				return errors.New("context ended, assignment did not")
			}
			return m.Context().Err()
		}
		const timeout = time.Minute
		mwRouter(t, member(), topic, handler, middleware.Timeout(timeout))
		c.ProduceN(t, topic, 1, 1, nil)
		select {
		case <-waiting:
		case <-time.After(mwWait):
			t.Fatal("record not delivered")
		}
		mwRouter(t, member(), topic, handler, middleware.Timeout(timeout))
		mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 1})
		mu.Lock()
		defer mu.Unlock()
		assert.ErrorIs(t, ended, context.Canceled)
		assert.Less(t, endedIn, timeout)
		assert.Equal(t, 2, calls, "handled again by the partition's next owner")
	})
}

// TestTelemetryOutcomes reports, per handler run, the record's position,
// the wait from delivery, the duration and the outcome.
func TestTelemetryOutcomes(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	var (
		mu    sync.Mutex
		calls = make(map[int64]int)
	)
	var events eventLog
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		mu.Lock()
		calls[k.o]++
		n := calls[k.o]
		mu.Unlock()
		switch {
		case k.o == 0:
			time.Sleep(20 * time.Millisecond) // handler work, measured
		case k.o == 1 && n == 1:
			return errors.New("transient")
		case k.o == 2:
			comp, err := safeack.CompletionFromCtx(m.Context())
			if err != nil {
				return err
			}
			go comp.Done()
		case k.o == 3 && n == 1:
			panic("boom") // recovered by the router, after Telemetry saw it
		case k.o == 4 && n == 1:
			m.Nack()
		}
		return nil
	}, safeack.Telemetry(events.hook), safeack.DeferredCompletion)

	c.ProduceN(t, topic, 1, 5, nil)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 5})

	type key struct {
		off     int64
		outcome safeack.Outcome
	}
	got := make(map[key]safeack.CompletionEvent)
	for _, e := range events.all() {
		assert.True(t, e.FromSafeack)
		assert.Equal(t, topic, e.Topic)
		assert.EqualValues(t, 0, e.Partition)
		assert.Equal(t, "h", e.Handler)
		assert.False(t, e.DeliveredAt.IsZero())
		assert.GreaterOrEqual(t, e.Wait, time.Duration(0))
		got[key{e.Offset, e.Outcome}] = e
	}
	assert.Len(t, events.all(), 8, "events: %v", events.all())
	if e, ok := got[key{0, safeack.OutcomeAck}]; assert.True(t, ok) {
		assert.GreaterOrEqual(t, e.Duration, 20*time.Millisecond)
	}
	if e, ok := got[key{1, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.EqualError(t, e.Err, "transient")
	}
	assert.Contains(t, got, key{1, safeack.OutcomeAck})
	assert.Contains(t, got, key{2, safeack.OutcomeDeferred})
	if e, ok := got[key{3, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.ErrorIs(t, e.Err, safeack.ErrHandlerPanicked)
	}
	assert.Contains(t, got, key{3, safeack.OutcomeAck})
	if e, ok := got[key{4, safeack.OutcomeNack}]; assert.True(t, ok) {
		assert.NoError(t, e.Err, "nacked by the handler itself")
	}
	assert.Contains(t, got, key{4, safeack.OutcomeAck})
	assert.Equal(t, "deferred", safeack.OutcomeDeferred.String())
}

// TestMiddlewareDeferredUnresolvedAtClose: a handle never resolved keeps
// its record pending, Close gives up on it after DrainTimeout, and no
// goroutine of the subscriber stays behind; resolving it afterwards is
// harmless. A handle resolved before its handler returned, whose handler
// outlives the drain, leaves no goroutine either.
func TestMiddlewareDeferredUnresolvedAtClose(t *testing.T) {
	t.Parallel()
	const drain = 300 * time.Millisecond
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = drain
	})
	var (
		mu      sync.Mutex
		handles = make(map[int64]*safeack.Completion)
		release = make(chan struct{})
	)
	mwRouter(t, sub, topic, func(m *message.Message) error {
		comp, err := safeack.CompletionFromCtx(m.Context())
		if err != nil {
			return err
		}
		mu.Lock()
		handles[comp.Offset()] = comp
		mu.Unlock()
		if comp.Offset() == 1 {
			comp.Done() // early: waits for the router's answer...
			<-release   // ...which comes after Close
		}
		return nil
	}, safeack.DeferredCompletion)
	c.ProduceN(t, topic, 1, 2, nil)
	kafkatest.WaitFor(t, mwWait, "both records pending", func() bool {
		ps, ok := statsOf(sub, topic, 0)
		return ok && ps.Deferred == 2 && ps.InFlight == 2 && ps.HasUnfinished && ps.OldestUnfinished == 0
	})

	start := time.Now()
	require.NoError(t, sub.Close())
	assert.Less(t, time.Since(start), drain+5*time.Second)
	kafkatest.WaitFor(t, mwWait, "no subscriber goroutine left", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "partition.(*Worker).await") &&
			!strings.Contains(stacks, "partition.(*Deferral).Resolve")
	})
	mu.Lock()
	handles[0].Done()
	handles[0].Fail(errors.New("late"))
	mu.Unlock()
	close(release)
	assert.LessOrEqual(t, c.CommittedOffsets(t, group, topic)[0].Offset, int64(0), "committed past an unresolved record")
}

// TestMiddlewareForeignMessages: with messages of another subscriber, the
// middleware works unchanged or refuses clearly, as documented.
func TestMiddlewareForeignMessages(t *testing.T) {
	t.Parallel()
	newMsg := func() *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		m.Metadata.Set("k", "v")
		return m
	}

	t.Run("refusals", func(t *testing.T) {
		m := newMsg()
		_, err := safeack.Defer(m)
		assert.ErrorIs(t, err, safeack.ErrNotSafeackMessage)
		_, err = safeack.CompletionFromCtx(m.Context())
		assert.ErrorIs(t, err, safeack.ErrNoDeferredCompletion)
		assert.False(t, safeack.AssignmentEnded(m))
	})
	t.Run("pass-through", func(t *testing.T) {
		m := newMsg()
		ran := 0
		h := func(m *message.Message) ([]*message.Message, error) { ran++; return nil, nil }
		_, err := safeack.SkipRevoked(safeack.KafkaMetadata(h))(m)
		require.NoError(t, err)
		assert.Equal(t, 1, ran)
		assert.Equal(t, message.Metadata{"k": "v"}, m.Metadata)
	})
	t.Run("telemetry", func(t *testing.T) {
		var events eventLog
		_, _ = safeack.Telemetry(events.hook)(func(m *message.Message) ([]*message.Message, error) {
			return nil, errors.New("x")
		})(newMsg())
		evs := events.all()
		require.Len(t, evs, 1)
		assert.False(t, evs[0].FromSafeack)
		assert.EqualValues(t, -1, evs[0].Partition)
		assert.EqualValues(t, -1, evs[0].Offset)
		assert.Equal(t, safeack.OutcomeNack, evs[0].Outcome)
	})
	t.Run("deferred", func(t *testing.T) {
		resolve := func(c *safeack.Completion, err error) {
			time.Sleep(10 * time.Millisecond) // resolved after the handler returned
			if err != nil {
				c.Fail(err)
				return
			}
			c.Done()
		}
		for _, want := range []error{nil, errors.New("write failed")} {
			m := newMsg()
			var took *safeack.Completion
			_, err := safeack.DeferredCompletion(func(m *message.Message) ([]*message.Message, error) {
				c, err := safeack.CompletionFromCtx(m.Context())
				if err != nil {
					return nil, err
				}
				again, _ := safeack.CompletionFromCtx(m.Context())
				if again != c {
					return nil, errors.New("second CompletionFromCtx gave another handle")
				}
				took = c
				assert.EqualValues(t, -1, c.Offset())
				assert.EqualValues(t, -1, c.Partition())
				go resolve(c, want)
				return nil, nil
			})(m)
			assert.Equal(t, want, err)
			took.Done() // harmless
		}

		// The message's context ends first.
		m := newMsg()
		ctx, cancel := context.WithCancel(context.Background())
		m.SetContext(ctx)
		_, err := safeack.DeferredCompletion(func(m *message.Message) ([]*message.Message, error) {
			if _, err := safeack.CompletionFromCtx(m.Context()); err != nil {
				return nil, err
			}
			cancel()
			return nil, nil
		})(m)
		assert.ErrorIs(t, err, context.Canceled)

		// Not taken: nothing to wait for.
		_, err = safeack.DeferredCompletion(func(*message.Message) ([]*message.Message, error) { return nil, nil })(newMsg())
		assert.NoError(t, err)
	})
}

// TestMiddlewareDeferAfterInstantAck: behind InstantAck, the message is
// answered before the handler runs, so its completion cannot be deferred.
func TestMiddlewareDeferAfterInstantAck(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	sub := newTestSubscriber(t, c, group, nil)
	errs := make(chan error, 1)
	mwRouter(t, sub, topic, func(m *message.Message) error {
		_, err := safeack.CompletionFromCtx(m.Context())
		errs <- err
		return nil
	}, middleware.InstantAck, safeack.DeferredCompletion)
	c.ProduceN(t, topic, 1, 1, nil)
	select {
	case err := <-errs:
		assert.ErrorIs(t, err, safeack.ErrAlreadyAnswered)
	case <-time.After(mwWait):
		t.Fatal("record not delivered")
	}
}

// TestKafkaMetadataOverwritesUpstream: KafkaMetadata describes the record
// that was delivered, whatever metadata arrived with it from upstream
// (watermill-kafka's DefaultMarshaler turns headers into metadata): a
// key-less record, which DefaultMarshaler publishes, carries no kafka_key
// of another record.
func TestKafkaMetadataOverwritesUpstream(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, kafkatest.Record{Partition: 0, Value: []byte("v"), Headers: map[string]string{
		safeack.MetadataTopic: "upstream-topic", safeack.MetadataOffset: "99", safeack.MetadataKey: "upstream-key",
	}})
	sub := newTestSubscriber(t, c, "", nil)
	var m *message.Message
	select {
	case m = <-mustSubscribe(t, sub, topic):
	case <-time.After(mwWait):
		t.Fatal("no message")
	}
	defer m.Ack()
	var got message.Metadata
	_, err := safeack.KafkaMetadata(func(m *message.Message) ([]*message.Message, error) {
		got = maps.Clone(m.Metadata)
		return nil, nil
	})(m)
	require.NoError(t, err)
	assert.Equal(t, topic, got.Get(safeack.MetadataTopic))
	assert.Equal(t, "0", got.Get(safeack.MetadataOffset))
	_, hasKey := got[safeack.MetadataKey]
	assert.False(t, hasKey, "a key-less record carries the kafka_key of an upstream record: %q", got.Get(safeack.MetadataKey))
}
