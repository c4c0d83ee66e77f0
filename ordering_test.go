package safeack_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// newOrderingSubscriber builds a subscriber on cluster for one topic.
func newOrderingSubscriber(t *testing.T, cluster *kafkatest.Cluster, group string, ordering safeack.Ordering, maxInFlight int) *safeack.Subscriber {
	t.Helper()
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               cluster.Brokers(),
		OverwriteSaramaConfig: cluster.SaramaConfig(),
		ConsumerGroup:         group,
		Ordering:              ordering,
		MaxInFlight:           maxInFlight,
		NackResendSleep:       time.Millisecond,
		DrainTimeout:          2 * time.Second,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// keyTracker checks, per key, that handling never overlaps and that starts
// come in offset order (a redelivery repeats its offset, never goes back).
type keyTracker struct {
	mu         sync.Mutex
	running    map[string]int
	lastStart  map[string]int64
	concurrent int
	peak       int
	violations []string
}

func newKeyTracker() *keyTracker {
	return &keyTracker{running: map[string]int{}, lastStart: map[string]int64{}}
}

func (k *keyTracker) start(key string, offset int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running[key] > 0 {
		k.violations = append(k.violations, fmt.Sprintf("key %q: offset %d started while another record of the key runs", key, offset))
	}
	if last, ok := k.lastStart[key]; ok && offset < last {
		k.violations = append(k.violations, fmt.Sprintf("key %q: offset %d started after offset %d", key, offset, last))
	}
	k.running[key]++
	k.lastStart[key] = offset
	k.concurrent++
	k.peak = max(k.peak, k.concurrent)
}

func (k *keyTracker) end(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.running[key]--
	k.concurrent--
}

// consumeByKey runs handlers for n records with random latencies and
// random nacks, and returns the tracker once every record was acked.
func consumeByKey(t *testing.T, keys, n int) *keyTracker {
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	cluster.ProduceN(t, topic, 1, n, func(i int) string { return fmt.Sprintf("key-%d", i%keys) })

	sub := newOrderingSubscriber(t, cluster, cluster.NewGroup(t), safeack.OrderByKey, 32)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	kt := newKeyTracker()
	var acked sync.Map
	var ackedCount atomic.Int64
	rng := rand.New(rand.NewPCG(uint64(keys), uint64(n)))
	var rngMu sync.Mutex
	draw := func() (time.Duration, bool) {
		rngMu.Lock()
		defer rngMu.Unlock()
		return time.Duration(rng.IntN(3000)) * time.Microsecond, rng.IntN(10) == 0
	}
	go func() {
		for msg := range msgs {
			go func(msg *message.Message) {
				key, _ := safeack.MessageKeyFromCtx(msg.Context())
				offset, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
				kt.start(string(key), offset)
				d, nack := draw()
				time.Sleep(d) // simulated work
				kt.end(string(key))
				if nack {
					msg.Nack()
					return
				}
				if _, dup := acked.LoadOrStore(offset, true); !dup {
					ackedCount.Add(1)
				}
				msg.Ack()
			}(msg)
		}
	}()
	kafkatest.WaitFor(t, 60*time.Second, "every record acked", func() bool { return ackedCount.Load() == int64(n) })
	return kt
}

func TestOrderByKeyNeverOverlapsAndStartsInOrder(t *testing.T) {
	t.Parallel()
	for _, keys := range []int{1, 16} {
		t.Run(fmt.Sprintf("keys=%d", keys), func(t *testing.T) {
			kt := consumeByKey(t, keys, 600)
			kt.mu.Lock()
			defer kt.mu.Unlock()
			require.Empty(t, kt.violations)
			if keys == 1 {
				require.Equal(t, 1, kt.peak, "one key must never run two records at once")
			} else {
				// Concurrency (and so throughput for IO-bound work) grows
				// with the number of keys.
				require.Greater(t, kt.peak, 1, "different keys must run side by side")
			}
		})
	}
}

// TestOrderByKeySlowKeyDoesNotBlockOthers holds the first record of key A
// while every record of key B, behind it in the same partition, completes.
func TestOrderByKeySlowKeyDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	recs := []kafkatest.Record{{Key: []byte("A"), Value: []byte("a0")}}
	for i := range 50 {
		recs = append(recs, kafkatest.Record{Key: []byte("B"), Value: fmt.Appendf(nil, "b%d", i)})
	}
	recs = append(recs, kafkatest.Record{Key: []byte("A"), Value: []byte("a1")})
	cluster.Produce(t, topic, recs...)

	sub := newOrderingSubscriber(t, cluster, cluster.NewGroup(t), safeack.OrderByKey, 8)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	release := make(chan struct{})
	var bDone, aDone atomic.Int64
	go func() {
		for msg := range msgs {
			go func(msg *message.Message) {
				key, _ := safeack.MessageKeyFromCtx(msg.Context())
				if string(key) == "A" {
					if string(msg.Payload) == "a0" {
						<-release
					}
					aDone.Add(1)
				} else {
					bDone.Add(1)
				}
				msg.Ack()
			}(msg)
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "all of key B handled while A is held", func() bool { return bDone.Load() == 50 })
	require.Zero(t, aDone.Load(), "the second record of A must wait for the first")
	close(release)
	kafkatest.WaitFor(t, 20*time.Second, "key A finishes", func() bool { return aDone.Load() == 2 })
}

// TestOrderByPartitionOneAtATime checks that partition mode never hands
// out a second message of a partition before the first is answered.
func TestOrderByPartitionOneAtATime(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 2)
	const n = 200
	cluster.ProduceN(t, topic, 2, n, func(i int) string { return fmt.Sprint(i) })

	sub := newOrderingSubscriber(t, cluster, cluster.NewGroup(t), safeack.OrderByPartition, 16)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	var mu sync.Mutex
	running := map[int32]int{}
	last := map[int32]int64{}
	var violations []string
	var done atomic.Int64
	go func() {
		for msg := range msgs {
			go func(msg *message.Message) {
				p, _ := safeack.MessagePartitionFromCtx(msg.Context())
				off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
				mu.Lock()
				if running[p] > 0 {
					violations = append(violations, fmt.Sprintf("partition %d: offset %d while another runs", p, off))
				}
				if l, ok := last[p]; ok && off <= l {
					violations = append(violations, fmt.Sprintf("partition %d: offset %d after %d", p, off, l))
				}
				running[p]++
				last[p] = off
				mu.Unlock()
				time.Sleep(100 * time.Microsecond) // simulated work
				mu.Lock()
				running[p]--
				mu.Unlock()
				done.Add(1)
				msg.Ack()
			}(msg)
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "every record handled", func() bool { return done.Load() == n })
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, violations)
}

// TestUnorderedRunsSameKeyConcurrently checks that unordered mode does not
// serialize records that share a key.
func TestUnorderedRunsSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	cluster.ProduceN(t, topic, 1, 20, func(int) string { return "same" })

	sub := newOrderingSubscriber(t, cluster, cluster.NewGroup(t), safeack.Unordered, 20)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	// Hold every message until all 20 are out at once: only possible when
	// records of one key run side by side.
	var held []*message.Message
	deadline := time.After(20 * time.Second)
	for len(held) < 20 {
		select {
		case msg := <-msgs:
			held = append(held, msg)
		case <-deadline:
			t.Fatalf("only %d of 20 same-key messages were handed out at once", len(held))
		}
	}
	for _, msg := range held {
		msg.Ack()
	}
}

// TestOrderingKeyFunction orders by a header instead of the Kafka key:
// records with distinct Kafka keys but one header value never overlap.
func TestOrderingKeyFunction(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	const n = 60
	recs := make([]kafkatest.Record, n)
	for i := range recs {
		recs[i] = kafkatest.Record{
			Key:     fmt.Appendf(nil, "unique-%d", i),
			Value:   fmt.Appendf(nil, "%d", i),
			Headers: map[string]string{"account": fmt.Sprintf("acct-%d", i%3)},
		}
	}
	cluster.Produce(t, topic, recs...)

	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               cluster.Brokers(),
		OverwriteSaramaConfig: cluster.SaramaConfig(),
		ConsumerGroup:         cluster.NewGroup(t),
		MaxInFlight:           16,
		OrderingKey: func(m *sarama.ConsumerMessage) []byte {
			for _, h := range m.Headers {
				if string(h.Key) == "account" {
					return h.Value
				}
			}
			return nil
		},
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	kt := newKeyTracker()
	var done atomic.Int64
	go func() {
		for msg := range msgs {
			go func(msg *message.Message) {
				account := msg.Metadata.Get("account")
				offset, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
				kt.start(account, offset)
				time.Sleep(time.Millisecond) // simulated work
				kt.end(account)
				done.Add(1)
				msg.Ack()
			}(msg)
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "every record handled", func() bool { return done.Load() == n })
	kt.mu.Lock()
	defer kt.mu.Unlock()
	require.Empty(t, kt.violations)
	require.Greater(t, kt.peak, 1, "different accounts must run side by side")
	require.LessOrEqual(t, kt.peak, 3, "one account at a time: at most three accounts run")
}
