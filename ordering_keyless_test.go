package safeack_test

import (
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

// keylessRecords returns n key-less records, alternating a null key (what
// watermill-kafka's DefaultMarshaler produces) and an empty one, and, when
// keyed, a record with a key of its own after each.
func keylessRecords(n int, keyed bool) []kafkatest.Record {
	var recs []kafkatest.Record
	for i := range n {
		r := kafkatest.Record{Value: fmt.Appendf(nil, "nokey-%d", i)}
		if i%2 == 1 {
			r.Key = []byte{}
		}
		recs = append(recs, r)
		if keyed {
			recs = append(recs, kafkatest.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "keyed-%d", i)})
		}
	}
	return recs
}

// TestOrderByKeyKeylessOneAtATime checks that under the default Ordering
// key-less records of a partition never overlap and start in offset order,
// as in watermill-kafka, while keyed records beside them still run
// concurrently.
func TestOrderByKeyKeylessOneAtATime(t *testing.T) {
	t.Parallel()
	const n = 20

	// Ordering is left unset: the default is what a user moving from
	// watermill-kafka gets.
	_, _, msgs := subscribeKeyless(t, n, true)

	keyless, keyed := newKeyTracker(), newKeyTracker()
	var done atomic.Int64
	handleAll(msgs, func(m *message.Message) {
		key, _ := safeack.MessageKeyFromCtx(m.Context())
		offset, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		kt := keyed
		if len(key) == 0 {
			kt = keyless
		}
		kt.start(string(key), offset)
		time.Sleep(30 * time.Millisecond) // simulated slow work
		kt.end(string(key))
		done.Add(1)
		m.Ack()
	})
	kafkatest.WaitFor(t, 30*time.Second, "every record handled", func() bool { return done.Load() == 2*n })

	keyless.mu.Lock()
	defer keyless.mu.Unlock()
	keyed.mu.Lock()
	defer keyed.mu.Unlock()
	require.Empty(t, keyless.violations)
	require.Equal(t, 1, keyless.peak, "key-less records must run one at a time")
	require.Greater(t, keyed.peak, 1, "records with distinct keys must still run side by side")
}

// TestOrderingKeyEmptyIsKeyless checks that records an OrderingKey gives
// an empty key are ordered like key-less ones, whatever their Kafka key.
func TestOrderingKeyEmptyIsKeyless(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	const n = 20
	c.ProduceN(t, topic, 1, n, func(i int) string { return fmt.Sprintf("distinct-%d", i) })

	sub := newTestSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = 32
		cfg.OrderingKey = func(*sarama.ConsumerMessage) []byte { return nil }
	})
	msgs := mustSubscribe(t, sub, topic)

	kt := newKeyTracker()
	var done atomic.Int64
	handleAll(msgs, func(m *message.Message) {
		offset, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		kt.start("", offset)
		time.Sleep(20 * time.Millisecond) // simulated slow work
		kt.end("")
		done.Add(1)
		m.Ack()
	})
	kafkatest.WaitFor(t, 30*time.Second, "every record handled", func() bool { return done.Load() == n })
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Empty(t, kt.violations)
	require.Equal(t, 1, kt.peak)
}

// TestUnorderedRunsKeylessConcurrently: Unordered is the explicit way to
// run key-less records side by side.
func TestUnorderedRunsKeylessConcurrently(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	const n = 20
	c.Produce(t, topic, keylessRecords(n, false)...)

	sub := newTestSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = n
		cfg.Ordering = safeack.Unordered
	})
	msgs := mustSubscribe(t, sub, topic)

	// Hold every message until all are out at once.
	var held []*message.Message
	deadline := time.After(20 * time.Second)
	for len(held) < n {
		select {
		case m := <-msgs:
			held = append(held, m)
		case <-deadline:
			t.Fatalf("only %d of %d key-less messages were handed out at once", len(held), n)
		}
	}
	for _, m := range held {
		m.Ack()
	}
}

// TestOrderByKeyKeylessReadAhead checks how far a partition reads ahead
// behind a key-less record that does not finish: in a stream of key-less
// records only a few more are taken (as in partition mode: reading further
// would only hold memory), while keyed records behind it are still taken
// and handled.
func TestOrderByKeyKeylessReadAhead(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			t.Parallel()
			const n = 200
			topic, sub, msgs := subscribeKeyless(t, n, keyed)

			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			var keyedDone, keylessStarted atomic.Int64
			handleAll(msgs, func(m *message.Message) {
				key, _ := safeack.MessageKeyFromCtx(m.Context())
				if len(key) == 0 {
					keylessStarted.Add(1)
					<-release // the first key-less record holds its lane
				} else {
					keyedDone.Add(1)
				}
				m.Ack()
			})

			if keyed {
				kafkatest.WaitFor(t, 20*time.Second, "every keyed record handled behind the held key-less one",
					func() bool { return keyedDone.Load() == n })
			} else {
				kafkatest.WaitFor(t, 20*time.Second, "the key-less lane to fill", func() bool {
					s, ok := statsOf(sub, topic, 0)
					return ok && s.WaitingForKey > 0
				})
				// Sample for a while: the partition must stop taking
				// records at the read-ahead bound, not run to
				// MaxPendingPerPartition.
				most := 0
				for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					s, _ := statsOf(sub, topic, 0)
					most = max(most, s.Retained)
				}
				require.LessOrEqual(t, most, 20, "records held behind a held key-less record")
			}
			require.Equal(t, int64(1), keylessStarted.Load(), "only the first key-less record may start")
			once.Do(func() { close(release) })
		})
	}
}

// subscribeKeyless produces keylessRecords(n, keyed) to a new topic of one
// partition and subscribes a member of a new group to it, on the default
// Ordering (what a user moving from watermill-kafka gets) with MaxInFlight
// 32.
func subscribeKeyless(t *testing.T, n int, keyed bool) (string, *safeack.Subscriber, <-chan *message.Message) {
	t.Helper()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, keylessRecords(n, keyed)...)
	sub := newTestSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = 32 })
	return topic, sub, mustSubscribe(t, sub, topic)
}
