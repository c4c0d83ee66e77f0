package safeack_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestDeferredByKeyFailKeepsOrder defers every record under OrderByKey
// and resolves it later from another goroutine, failing the first
// resolution of a third of them: a record of a key does not start while an
// earlier one of that key is unresolved (deferred work counts as running),
// starts are in offset order per key, and every record is completed and
// committed.
func TestDeferredByKeyFailKeepsOrder(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2)
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

// TestMiddlewareDeferredOutOfOrder defers every record of a partition and
// resolves the handles out of order: the completed prefix, and every
// commit the broker sees, only ever passes records whose handle reported
// Done, although the router acked them all at once.
func TestMiddlewareDeferredOutOfOrder(t *testing.T) {
	t.Parallel()
	const n = 8
	c, topic, group := kafkatest.StartTopic(t, 1)
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
	c, topic, group := kafkatest.StartTopic(t, 1)
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
	// Record 1 was acked long before, but the worker takes the ack a
	// moment after the router gave it: only its completion says it is no
	// longer in flight.
	waitCompleted(t, sub, topic, 0, 1, mwWait, "record 1 completed")
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
	skipOnConsumerProtocol(t, "it expects a member joining to take the partition of a one-partition topic (an eager rebalance)")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	commits := c.ObserveCommits(t)
	member := unorderedMember(t, c, group, 300*time.Millisecond)

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

// TestMiddlewareDeferredUnresolvedAtClose: a handle never resolved keeps
// its record pending, Close gives up on it after DrainTimeout, and no
// goroutine of the subscriber stays behind; resolving it afterwards is
// harmless. A handle resolved before its handler returned, whose handler
// outlives the drain, leaves no goroutine either.
func TestMiddlewareDeferredUnresolvedAtClose(t *testing.T) {
	t.Parallel()
	const drain = 300 * time.Millisecond
	c, topic, group := kafkatest.StartTopic(t, 1)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = drain
	})
	var (
		mu      sync.Mutex
		handles = make(map[int64]*safeack.Completion)
		release = make(chan struct{})
	)
	// Other tests run subscribers in this process at the same time: the
	// goroutines checked below are this router's and its subscription's,
	// told apart by the scope's label.
	scope := newGoroutineScope(t)
	scope.inScope(func() {
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
	})
	c.ProduceN(t, topic, 1, 2, nil)
	kafkatest.WaitFor(t, mwWait, "both records pending", func() bool {
		ps, ok := statsOf(sub, topic, 0)
		return ok && ps.Deferred == 2 && ps.InFlight == 2 && ps.HasUnfinished && ps.OldestUnfinished == 0
	})

	// The check below is not vacuous: offset 1's answer is awaited now.
	require.NotEmpty(t, scope.in("partition.(*Worker).await"), "no goroutine of this test awaits offset 1's answer")

	start := time.Now()
	require.NoError(t, sub.Close())
	assert.Less(t, time.Since(start), drain+5*time.Second)
	var left []string
	if !kafkatest.Poll(mwWait, 10*time.Millisecond, func() bool {
		left = scope.in("partition.(*Worker).await", "partition.(*Deferral).Resolve")
		return len(left) == 0
	}) {
		t.Fatalf("%v after Close, goroutines of this subscriber still wait for a record's answer; their stacks: %s",
			mwWait, writeArtifact(t, "goroutines-left", strings.Join(left, "\n\n")))
	}
	mu.Lock()
	handles[0].Done()
	handles[0].Fail(errors.New("late"))
	mu.Unlock()
	close(release)
	assert.LessOrEqual(t, c.CommittedOffsets(t, group, topic)[0].Offset, int64(0), "committed past an unresolved record")
}

// TestMiddlewareDeferAfterInstantAck: behind InstantAck, the message is
// answered before the handler runs, so its completion cannot be deferred.
func TestMiddlewareDeferAfterInstantAck(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
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

// TestDeferredFailedAtOnceDeferredAgain: every record's first delivery is
// deferred and failed before the handler returns, so with NoSleep the
// router's Ack redelivers it at once; the redelivery is deferred again
// and resolved later. Each delivery's ack is judged by that delivery's own
// deferral, whatever the record's next delivery did: every record
// completes once (nothing counted out of flight twice), and no commit
// passes a record before its second Completion reported Done.
func TestDeferredFailedAtOnceDeferredAgain(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 2, 400
	c, topic, group := kafkatest.StartTopic(t, partitions)
	commits := c.ObserveCommits(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 64
		cfg.NackResendSleep = safeack.NoSleep
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	var (
		mu    sync.Mutex
		tries = map[po]int{}
		done  = newDoneLog()
	)
	mwRouter(t, sub, topic, func(m *message.Message) error {
		k := mwOffset(t, m)
		comp, err := safeack.Defer(m)
		if err != nil {
			return err
		}
		mu.Lock()
		tries[k]++
		first := tries[k] == 1
		mu.Unlock()
		if first {
			comp.Fail(errors.New("write failed")) // takes effect with the router's Ack
			return nil
		}
		go func() {
			randomDelay(2 * time.Millisecond)
			done.done(k)
			comp.Done()
		}()
		return nil
	})
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	want := c.HighWaterMarks(t, topic)
	mwWaitCommitted(t, c, group, topic, want)
	for p := range int32(partitions) {
		kafkatest.WaitFor(t, mwWait, fmt.Sprintf("partition %d: nothing in flight", p), func() bool {
			ps, ok := statsOf(sub, topic, p)
			return ok && ps.InFlight <= 0
		})
		ps, _ := statsOf(sub, topic, p)
		assert.Zero(t, ps.InFlight, "partition %d: records counted out of flight twice", p)
		assert.EqualValues(t, want[p], ps.Completed, "partition %d completions", p)
		assert.EqualValues(t, want[p], ps.Redeliveries, "partition %d redeliveries", p)
	}
	mwCheckCommits(t, commits, group, topic, done)
}
