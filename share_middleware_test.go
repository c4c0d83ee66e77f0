package safeack_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareDeferredCompletion: behind DeferredCompletion, a handler that
// takes its Completion and returns frees the router, but its record stays
// in flight until Done, which accepts it; Fail releases it, and it comes
// back with its delivery count one higher.
func TestShareDeferredCompletion(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	sub := newShareSub(t, c, c.NewGroup(t), nil)
	seen := newShareSeen()
	var later atomic.Pointer[safeack.Completion]
	mwRouter(t, sub, topic, func(msg *message.Message) error {
		seen.add(msg)
		comp, err := safeack.CompletionFromCtx(msg.Context())
		if err != nil {
			return err
		}
		switch v := string(msg.Payload); {
		case v == "later":
			later.Store(comp)
		case v == "fail" && seen.count(v) == 1:
			go comp.Fail(errors.New("writer failed"))
		default:
			go comp.Done()
		}
		return nil
	}, safeack.DeferredCompletion)
	// An unresolved Completion holds its member's next poll (kgo accepts
	// at a poll what the last one left unanswered): one record at a time.
	c.Produce(t, topic, kafkatest.Record{Value: []byte("later")})
	kafkatest.WaitFor(t, mwWait, "later taken, still in flight after its handler returned", func() bool {
		_, inFlight := shareTotals(sub)
		return later.Load() != nil && inFlight == 1
	})
	tot, _ := shareTotals(sub)
	assert.Zero(t, tot.Accepted)
	comp := later.Load()
	assert.Equal(t, int64(0), comp.Offset())
	assert.Equal(t, int32(0), comp.Partition())
	comp.Done()
	kafkatest.WaitFor(t, mwWait, "later accepted", func() bool {
		tot, inFlight := shareTotals(sub)
		return tot.Accepted == 1 && inFlight == 0
	})

	c.Produce(t, topic, kafkatest.Record{Value: []byte("fail")})
	kafkatest.WaitFor(t, mwWait, "fail released, delivered again and accepted", func() bool {
		tot, inFlight := shareTotals(sub)
		return tot.Accepted == 2 && tot.Released == 1 && inFlight == 0 && tot.Deferred == 3
	})
	assert.Equal(t, []int32{1, 2}, seen.deliveryCounts("fail"))
	assert.Equal(t, 1, seen.count("later"))
}

// TestSharePoisonQueueAndRejectPoison: a record failing every retry is
// dead-lettered by safeack.PoisonQueue and then accepted, or rejected by
// RejectPoison; either way it is never delivered again, while the good
// records beside it are accepted.
func TestSharePoisonQueueAndRejectPoison(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond}

	for _, mode := range []string{"dead-letter", "reject"} {
		t.Run(mode, func(t *testing.T) {
			topic := c.NewTopic(t, 1)
			sub := newShareSub(t, c, c.NewGroup(t), nil)
			dlq := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, testLogger())
			t.Cleanup(func() { _ = dlq.Close() })
			var outer message.HandlerMiddleware = safeack.RejectPoison
			if mode == "dead-letter" {
				pq, err := safeack.PoisonQueue(dlq, "dlq")
				require.NoError(t, err)
				outer = pq
			}
			seen := newShareSeen()
			mwRouter(t, sub, topic, func(msg *message.Message) error {
				seen.add(msg)
				if string(msg.Payload) == "bad" {
					return errors.New("cannot handle")
				}
				return nil
			}, outer, retry.Middleware)
			c.Produce(t, topic, kafkatest.Record{Value: []byte("good-1")}, kafkatest.Record{Value: []byte("bad")}, kafkatest.Record{Value: []byte("good-2")})

			kafkatest.WaitFor(t, mwWait, "every record answered", func() bool {
				tot, _ := shareTotals(sub)
				return tot.Accepted+tot.Rejected == 3
			})
			tot, _ := shareTotals(sub)
			if mode == "dead-letter" {
				assert.Equal(t, uint64(3), tot.Accepted)
				assert.Equal(t, uint64(1), tot.DeadLettered, "dead letters counted")
				dead, err := dlq.Subscribe(context.Background(), "dlq")
				require.NoError(t, err)
				select {
				case m := <-dead:
					assert.Equal(t, "bad", string(m.Payload))
					m.Ack()
				case <-time.After(mwWait):
					t.Fatal("nothing dead-lettered")
				}
			} else {
				assert.Equal(t, uint64(2), tot.Accepted)
				assert.Equal(t, uint64(1), tot.Rejected)
			}
			// Delivered once, handled twice (one retry): never again.
			c.Produce(t, topic, kafkatest.Record{Value: []byte("sentinel")})
			kafkatest.WaitFor(t, mwWait, "the sentinel", func() bool { return seen.count("sentinel") == 1 })
			assert.Equal(t, []int32{1, 1}, seen.deliveryCounts("bad"))
			assert.Zero(t, tot.Released)
		})
	}
}

// TestShareDeadLetterAtMaxDeliveries: with DeadLetter set, a record nacked
// at its MaxDeliveries-th delivery is handed to DeadLetter and accepted;
// when DeadLetter fails it is tried again while the record is held (a
// release could have the broker archive it at its delivery limit).
func TestShareDeadLetterAtMaxDeliveries(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	var mu sync.Mutex
	var dead []int32
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxDeliveries = 2
		cfg.DeadLetter = func(ctx context.Context, msg *message.Message) error {
			dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, dc)
			if len(dead) == 1 {
				return errors.New("dead-letter topic away")
			}
			return nil
		}
	})
	msgs := subscribeShare(t, sub, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	seen := answerAll(msgs, (*message.Message).Nack)
	kafkatest.WaitFor(t, mwWait, "dead-lettered and accepted", func() bool {
		tot, _ := shareTotals(sub)
		return tot.DeadLettered == 1 && tot.Accepted == 1
	})
	mu.Lock()
	assert.Equal(t, []int32{2, 2}, dead, "delivery counts at DeadLetter")
	mu.Unlock()
	assert.Equal(t, []int32{1, 2}, seen.deliveryCounts("bad"))
}
