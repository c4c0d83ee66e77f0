package safeack_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareMaxInFlightAcrossMembers: MaxInFlight bounds the messages a
// Subscribe call hands out at once, whatever its members poll: three
// members taking four records each hand out four messages, no fifth until
// one is answered, and every record in the end.
func TestShareMaxInFlightAcrossMembers(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	const maxInFlight, n = 4, 40
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Members, cfg.MaxInFlight, cfg.MaxPollRecords = 3, maxInFlight, maxInFlight
	})
	msgs := subscribeShare(t, sub, topic)
	c.ProduceN(t, topic, 1, n, nil)

	held := make([]*message.Message, 0, maxInFlight)
	for len(held) < maxInFlight {
		select {
		case m := <-msgs:
			held = append(held, m)
		case <-time.After(20 * time.Second):
			t.Fatalf("got %d of %d messages", len(held), maxInFlight)
		}
	}
	select {
	case m := <-msgs:
		t.Fatalf("a message past MaxInFlight was handed out: %q", m.Payload)
	case <-time.After(300 * time.Millisecond):
	}
	_, inFlight := shareTotals(sub)
	require.Equal(t, maxInFlight, inFlight)

	// Answer them, then every later one, counting the messages unanswered.
	var unanswered concurrency
	unanswered.open.Store(maxInFlight)
	unanswered.most.Store(maxInFlight)
	ack := func(m *message.Message) {
		unanswered.end()
		m.Ack()
	}
	for _, m := range held {
		ack(m)
	}
	seen := newShareSeen()
	for i := range held {
		seen.add(held[i])
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			unanswered.begin()
			seen.add(m)
			go func() {
				time.Sleep(time.Millisecond)
				ack(m)
			}()
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "every record handled", func() bool { return seen.distinct() == n })
	require.LessOrEqual(t, unanswered.most.Load(), int32(maxInFlight), "messages unanswered at once")
	require.NoError(t, sub.Close())
	<-done
}

// TestShareSlowRecordDoesNotStallTheSubscription: with the defaults, a
// message its handler holds keeps its member from polling again (kgo
// accepts what a poll left unanswered at the next poll), but not the
// subscription: the other member keeps the handlers fed, and every other
// record is handled while the one stays held.
func TestShareSlowRecordDoesNotStallTheSubscription(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	sub := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, sub, topic)
	const n = 2_000
	c.ProduceN(t, topic, 1, n, nil)

	var mu sync.Mutex
	var slow *message.Message
	seen := newShareSeen()
	go func() {
		for m := range msgs {
			seen.add(m)
			mu.Lock()
			if slow == nil {
				slow = m // held until the end
				mu.Unlock()
				continue
			}
			mu.Unlock()
			m.Ack()
		}
	}()
	// Shorter than the acquisition lock (30 s): a record left waiting in
	// a member's client buffer, its lock not renewed, would come back
	// only after it (see TestShareRecordFetchedBetweenPollsKeepsItsLock).
	kafkatest.WaitFor(t, 20*time.Second, "every record but the held one handled", func() bool {
		return seen.distinct() >= n
	})
	mu.Lock()
	slow.Ack()
	mu.Unlock()
	kafkatest.WaitFor(t, 10*time.Second, "every record accepted", func() bool {
		tot, _ := shareTotals(sub)
		return tot.Accepted == n
	})
	require.Equal(t, n, seen.total(), "no record handed out twice")
}

// TestShareBatchOptimizedTakesWholeBatches: with AcquireMode
// ShareAcquireBatchOptimized the broker may acquire a whole stored batch
// for a fetch that asked for fewer records; the member takes and hands
// out all of it, within MaxInFlight, with handlers slow enough that the
// batch outlasts the acquisition lock. No lock runs out: the records
// handed out are renewed, as are those the handlers will take within the
// next half lock at their pace, and the rest are given back (released,
// issue 42) rather than left to lapse; each record is handed out and
// accepted once. (The embedded broker acquires only what was asked for:
// there nothing waits long enough to be given back.)
func TestShareBatchOptimizedTakesWholeBatches(t *testing.T) {
	t.Parallel()
	// A lock long enough for a renewal, sent at half of it, to reach a
	// loaded broker in time; 4 s of work outlasts it.
	const lock = 3 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	const n, maxInFlight, work = 320, 8, 100 * time.Millisecond
	c.ProduceN(t, topic, 1, n, nil) // one stored batch
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.AcquireMode = safeack.ShareAcquireBatchOptimized
		cfg.MaxInFlight, cfg.MaxPollRecords = maxInFlight, maxInFlight
	})
	var held concurrency
	seen := newShareSeen()
	msgs := subscribeShare(t, sub, topic)
	go func() {
		for m := range msgs {
			held.begin()
			seen.add(m)
			go func() {
				time.Sleep(work)
				held.end()
				m.Ack()
			}()
		}
	}()
	kafkatest.WaitFor(t, 60*time.Second, "every record handled", func() bool { return seen.distinct() == n })
	kafkatest.WaitFor(t, 10*time.Second, "every record accepted", func() bool {
		tot, _ := shareTotals(sub)
		return tot.Accepted >= n
	})
	tot, _ := shareTotals(sub)
	t.Logf("%+v", tot)
	require.Equal(t, n, seen.total(), "no record handed out twice")
	require.LessOrEqual(t, held.most.Load(), int32(maxInFlight), "messages unanswered at once")
	require.Equal(t, tot.GivenBack, tot.Released, "records released other than those given back")
	require.LessOrEqual(t, tot.Redelivered, tot.GivenBack, "records delivered again that were not given back: their locks ran out")
	require.Zero(t, tot.AckErrors, "acknowledgements refused: locks ran out")
}

// TestShareRecordAfterLongIdleHandedOut: a member that polled in vain for
// longer than the acquisition lock (its fetches long-polling, one after
// another) hands out the record that finally arrives, at its first
// delivery: the lock is counted from the fetch that brought it, not from
// when the poll began.
func TestShareRecordAfterLongIdleHandedOut(t *testing.T) {
	t.Parallel()
	const lock = 2 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	sub := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, sub, topic)
	require.NoError(t, sub.WaitReady(context.Background()))
	time.Sleep(lock * 3 / 2) // the members poll in vain meanwhile: the condition under test is time passing
	c.Produce(t, topic, kafkatest.Record{Value: []byte("late")})
	m := receive(t, msgs, 30*time.Second, "the record")
	dc, _ := safeack.MessageDeliveryCountFromCtx(m.Context())
	require.Equal(t, int32(1), dc, "the record was released before it was handed out")
	m.Ack()
	tot, _ := shareTotals(sub)
	require.Zero(t, tot.Released, "records released as if their locks had ended")
}

// TestShareRecordFetchedBetweenPollsKeepsItsLock: kgo may send a share
// fetch just after a poll returned (its strict pull mode reads "a poll is
// active" a moment late), so a record can be acquired and buffered while
// the member's handlers still hold the poll's messages. The member cannot
// poll it (a poll accepts the previous poll's unanswered records): it
// hands that record out as soon as a handler is free, renewing its lock
// meanwhile, rather than leave it until its slowest handler is done. The
// test widens kgo's window with a hook that slows the poll's return, so
// that the stray fetch happens. The lock is 4 s, so that a renewal sent
// at half of it still reaches a broker on a loaded machine in time (with
// 2 s, a CI run of four suites at once on two cores once had the broker
// refuse the renewals: INVALID_RECORD_STATE).
func TestShareRecordFetchedBetweenPollsKeepsItsLock(t *testing.T) {
	t.Parallel()
	const lock = 4 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	stray := &strayFetchHook{delay: 50 * time.Millisecond}
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Members, cfg.MaxInFlight, cfg.MaxPollRecords = 1, 2, 1
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.WithHooks(stray))
	})
	msgs := subscribeShare(t, sub, topic)
	require.NoError(t, sub.WaitReady(context.Background()))

	c.Produce(t, topic, kafkatest.Record{Value: []byte("first")})
	first := receive(t, msgs, 30*time.Second, "the first record")
	// The member's next fetch went out as its poll returned: it waits at
	// the broker for this record. The member itself polls again only once
	// first is answered.
	c.Produce(t, topic, kafkatest.Record{Value: []byte("second")})
	second := receive(t, msgs, 10*time.Second, "the second record, while the first is held")
	assert.Equal(t, "second", string(second.Payload))
	dc, _ := safeack.MessageDeliveryCountFromCtx(second.Context())
	assert.Equal(t, int32(1), dc, "the second record's delivery count")

	time.Sleep(lock * 2) // the condition under test: both locks would have ended twice
	first.Ack()
	second.Ack()
	kafkatest.WaitFor(t, 10*time.Second, "both records accepted", func() bool {
		tot, _ := shareTotals(sub)
		return tot.Accepted == 2
	})
	tot, _ := shareTotals(sub)
	assert.Zero(t, tot.Released, "records released as if their locks had ended")
	assert.Zero(t, tot.AckErrors, "acknowledgements given after a lock ended")
	assert.Zero(t, tot.Redelivered, "records delivered again")
	select {
	case m := <-msgs:
		t.Fatalf("record %s delivered again (delivery count %v)", m.Payload, m.Metadata)
	case <-time.After(lock):
	}
}

// strayFetchHook counts the records kgo buffers and slows each poll's
// return (kgo runs OnFetchRecordUnbuffered inside PollRecords), widening
// the moment in which kgo grants a fetch after the poll took its records.
type strayFetchHook struct {
	delay    time.Duration
	buffered atomic.Int32
}

func (h *strayFetchHook) OnFetchRecordBuffered(*kgo.Record) { h.buffered.Add(1) }

func (h *strayFetchHook) OnFetchRecordUnbuffered(_ *kgo.Record, polled bool) {
	if polled {
		time.Sleep(h.delay)
	}
}
