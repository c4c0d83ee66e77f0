package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// The router harness the middleware tests share (each middleware's tests
// live in its own test file: deferred_completion_test.go,
// skip_revoked_test.go, poison_queue_test.go, telemetry_test.go,
// kafka_metadata_test.go) and the tests of the recommended chain with
// Watermill's own middleware, each on a real Watermill router with the
// subscriber on the test broker.

const mwWait = 15 * time.Second // deadline of every wait in these tests

// mwRouter runs a router with one consumer handler named "h" on sub and
// closes it at the end of the test (which closes sub).
func mwRouter(t *testing.T, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, keptLogger(t))
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

// callCount counts a handler's calls.
type callCount struct {
	mu    sync.Mutex
	calls int
}

// first counts a call and tells whether it is the first.
func (c *callCount) first() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return c.calls == 1
}

// n returns the calls counted.
func (c *callCount) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// unorderedMember returns a constructor of Unordered members of group
// with the given DrainTimeout.
func unorderedMember(t *testing.T, c *kafkatest.Cluster, group string, drain time.Duration) func() *safeack.Subscriber {
	return func() *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = drain
		})
	}
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

// TestMiddlewareRecoverer: a panicking handler (behind middleware.Recoverer)
// nacks, the record is redelivered, and the partition keeps flowing even
// in partition order.
func TestMiddlewareRecoverer(t *testing.T) {
	t.Parallel()
	const n = 5
	c, topic, group := kafkatest.StartTopic(t, 1)
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
		c, topic, group := kafkatest.StartTopic(t, 1)
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
		var (
			mu    sync.Mutex
			calls callCount
			errs  []error
		)
		mwRouter(t, sub, topic, func(m *message.Message) error {
			if !calls.first() {
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
		assert.Equal(t, 2, calls.n())
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], context.DeadlineExceeded)
	})
	t.Run("revoked", func(t *testing.T) {
		skipOnConsumerProtocol(t, "it expects a member joining to take the partition of a one-partition topic (an eager rebalance)")
		t.Parallel()
		c, topic, group := kafkatest.StartTopic(t, 1)
		member := func() *safeack.Subscriber {
			return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
		}
		var (
			mu      sync.Mutex
			calls   callCount
			waiting = make(chan struct{})
			ended   error
			endedIn time.Duration
		)
		handler := func(m *message.Message) error {
			if !calls.first() {
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
		assert.Equal(t, 2, calls.n(), "handled again by the partition's next owner")
	})
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
