package safeack_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestSubscriberCloseWhileHandlersRun closes a subscriber while handlers
// hold messages: their contexts stay alive through the drain and are
// cancelled when it gives up, Close returns within DrainTimeout plus a
// margin, the output channel closes, a later Ack does nothing, Close may be
// called concurrently and again, and the final commit is exactly the
// completed prefix at close time. Held handlers that finish during the
// drain (finishing-during-drain) do so with their contexts alive, Close
// returns without waiting out DrainTimeout, and their acks are committed.
func TestSubscriberCloseWhileHandlersRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		autoCommit bool
		finish     bool // held handlers finish, and ack, once the drain started
		protocol   safeack.GroupProtocol
	}{
		{name: "auto-commit", autoCommit: true},
		{name: "manual-commit", autoCommit: false},
		{name: "finishing-during-drain", autoCommit: true, finish: true},
		{name: "finishing-during-drain-manual-commit", autoCommit: false, finish: true},
		{name: "consumer-protocol", protocol: safeack.GroupProtocolConsumer},
		{name: "consumer-protocol-finishing-during-drain", finish: true, protocol: safeack.GroupProtocolConsumer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := tc.protocol
			if p == safeack.GroupProtocolClassic {
				p = envGroupProtocol
			}
			testCloseWhileHandlersRun(t, p, tc.autoCommit, tc.finish)
		})
	}
}

func testCloseWhileHandlersRun(t *testing.T, p safeack.GroupProtocol, autoCommit, finish bool) {
	const (
		partitions   = 2
		perPartition = 50
		holdAt       = 20
		margin       = 3 * time.Second
		finishIn     = 150 * time.Millisecond // a held handler's work left at Close
	)
	drainTimeout := 700 * time.Millisecond
	if finish {
		// Long, so that a Close that waited it out cannot be mistaken for
		// a slow one.
		drainTimeout = 4 * time.Second
	}
	c, topic, group := kafkatest.StartTopic(t, partitions)
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)

	acks, watch := watchCommits(t, c, group, topic)
	sub := newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = 20
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = drainTimeout
		cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = autoCommit
	})
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	hold := newHolder(po{0, holdAt}, po{1, holdAt})
	var handlersWG sync.WaitGroup
	handlersWG.Add(partitions)
	var liveMu sync.Mutex
	var deadAtFinish []po // held handlers whose context ended before they finished
	outputClosed := handleAll(msgs, func(m *message.Message) {
		if !hold.take(m) {
			acks.ack(m)
			return
		}
		defer handlersWG.Done()
		if !finish {
			<-m.Context().Done() // the handler runs until the drain gives up
			return
		}
		// The handler is still working when Close starts, and finishes
		// well within DrainTimeout.
		for !safeack.AssignmentEnded(m) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(finishIn)
		if m.Context().Err() != nil {
			k, _ := msgPO(m)
			liveMu.Lock()
			deadAtFinish = append(deadAtFinish, k)
			liveMu.Unlock()
		}
		acks.ack(m)
	})

	// Everything but the held records is acked and committed as far as
	// the completed prefix allows.
	kafkatest.WaitFor(t, 20*time.Second, "every record but the held ones to be acked", func() bool {
		return len(acks.missing(c, topic)) == partitions && hold.count() == partitions
	})
	want := map[int32]int64{0: holdAt, 1: holdAt}
	watch.waitCommitted(t, want, 10*time.Second)
	// The worker takes an ack a moment after the handler's acks.ack
	// returned, and the commit at holdAt can come before the last acks
	// past it: wait for those to be taken.
	for p := int32(0); p < partitions; p++ {
		kafkatest.WaitFor(t, 5*time.Second, fmt.Sprintf("partition %d to have only its held record in flight", p), func() bool {
			ps, ok := statsOf(sub, topic, p)
			return ok && ps.InFlight == 1
		})
		ps, ok := statsOf(sub, topic, p)
		require.True(t, ok)
		require.Equal(t, int64(holdAt), ps.SafeOffset)
		require.Equal(t, 1, ps.InFlight)
	}

	// Close twice at once while the handlers hold their messages.
	start := time.Now()
	closed := make(chan error, 2)
	for range 2 {
		go func() { closed <- sub.Close() }()
	}
	handlersDone := make(chan struct{})
	go func() { handlersWG.Wait(); close(handlersDone) }()
	select {
	case <-handlersDone:
	case <-time.After(drainTimeout + margin):
		t.Fatal("the held handlers did not end: Close did not cancel their contexts")
	}
	for range 2 {
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(drainTimeout + margin):
			t.Fatalf("Close did not return within DrainTimeout %v + %v", drainTimeout, margin)
		}
	}
	took := time.Since(start)
	t.Logf("Close returned after %v", took.Round(time.Millisecond))
	if finish {
		require.Empty(t, deadAtFinish, "held handlers found their context cancelled while the drain still waited for them")
		require.Less(t, took, drainTimeout, "Close waited out DrainTimeout although every handler had finished")
	} else {
		// It waited for the held acks up to DrainTimeout.
		require.GreaterOrEqual(t, took, drainTimeout, "Close returned before DrainTimeout with messages unacked")
	}
	for k, h := range hold.all() {
		require.Error(t, h.m.Context().Err(), "the context of held %v outlived Close", k)
	}
	select {
	case <-outputClosed:
	case <-time.After(time.Second):
		t.Fatal("the output channel is still open after Close returned")
	}
	require.Empty(t, sub.Stats(), "partitions still listed after Close")

	// Late acks do nothing; Close again is fine; Subscribe is refused.
	for k, h := range hold.all() {
		if !finish {
			require.NotPanics(t, func() { acks.ackLate(h.m) }, "late ack of %v", k)
		}
	}
	require.NoError(t, sub.Close())
	_, err = sub.Subscribe(context.Background(), topic)
	require.ErrorIs(t, err, safeack.ErrSubscriberClosed)

	// The final commit is the completed prefix at close time.
	if finish {
		want = map[int32]int64{0: perPartition, 1: perPartition}
	}
	require.Equal(t, want, watch.committed(t), "committed offsets after Close")
	require.Positive(t, watch.check(t), "no commit observed")
}

// TestSubscriberContextCancelClosesChannel cancels the context given to
// Subscribe: that output channel closes (after the held message's context
// is cancelled and the drain ends), what was acked is committed, another
// subscription of the same Subscriber goes on, and the Subscriber can still
// be closed.
func TestSubscriberContextCancelClosesChannel(t *testing.T) {
	t.Parallel()
	const drainTimeout = 500 * time.Millisecond
	c, topic, group := kafkatest.StartTopic(t, 2)
	c.ProduceN(t, topic, 2, 40, nil)

	acks, watch := watchCommits(t, c, group, topic)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.DrainTimeout = drainTimeout
		cfg.Ordering = safeack.Unordered
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	hold := newHolder(po{1, 5})
	// The second subscription below joins the same group and may move the
	// held record to a new assignment: hold its redeliveries too.
	hold.always = true
	outputClosed := handleAll(msgs, func(m *message.Message) {
		if !hold.take(m) {
			acks.ack(m)
		}
	})
	// A second subscription of the same Subscriber, to another topic, with
	// its own context: it must outlive the first.
	topic2 := c.NewTopic(t, 1)
	acks2 := newAckLog()
	msgs2, err := sub.Subscribe(context.Background(), topic2)
	require.NoError(t, err)
	output2Closed := handleAll(msgs2, acks2.ack)
	c.ProduceN(t, topic2, 1, 5, nil)

	if !waitCond(20*time.Second, func() bool {
		return len(acks.missing(c, topic)) == 1 && hold.count() == 1 && len(acks2.missing(c, topic2)) == 0
	}) {
		t.Fatalf("timed out: missing on the first topic %v (held %d), on the second %v; stats %+v",
			acks.missing(c, topic), hold.count(), acks2.missing(c, topic2), sub.Stats())
	}
	watch.waitCommitted(t, map[int32]int64{0: 20, 1: 5}, 10*time.Second)

	cancel()
	select {
	case <-outputClosed:
	case <-time.After(drainTimeout + 5*time.Second):
		t.Fatalf("cancelling the Subscribe context did not close the output channel; goroutines (where the subscription's end waits): %s",
			dumpGoroutines(t))
	}
	require.Error(t, hold.all()[po{1, 5}].m.Context().Err(), "the held message's context outlived its subscription")
	for _, ps := range sub.Stats() {
		require.NotEqual(t, topic, ps.Topic, "partition %d of the cancelled subscription still listed", ps.Partition)
	}

	// The other subscription goes on.
	select {
	case <-output2Closed:
		t.Fatal("cancelling one Subscribe context closed another subscription's channel")
	default:
	}
	c.ProduceN(t, topic2, 1, 5, nil)
	acks2.waitAllAcked(t, c, topic2, 20*time.Second)

	closeDone := make(chan error, 1)
	go func() { closeDone <- sub.Close() }()
	select {
	case err := <-closeDone:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after the Subscribe context was cancelled")
	}
	select {
	case <-output2Closed:
	case <-time.After(time.Second):
		t.Fatal("Close left the other subscription's channel open")
	}
	require.Empty(t, sub.Stats())
	require.Equal(t, map[int32]int64{0: 20, 1: 5}, watch.committed(t))
	require.Positive(t, watch.check(t))
}

// TestRouterCloseHandlersIgnoreContext closes a router whose handlers
// block on a few records and ignore their context. Close returns (the
// subscriber's drain gives up, the router's CloseTimeout passes), the
// commit stays below the blocked records, their late acks change nothing,
// and the next member of the group handles them.
func TestRouterCloseHandlersIgnoreContext(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c, topic, group, acks, watch := startWatched(t, partitions)
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
	// The router closes its subscribers without waiting for them past its
	// CloseTimeout; the subscriber's own Close returns once its drain gave
	// up and every message context is cancelled (on a loaded machine,
	// after the router's Close returned: the blocked handlers, released
	// then, were not late).
	require.NoError(t, sub.Close())
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
