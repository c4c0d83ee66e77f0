package safeack_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// refuseBad is an Unmarshaler that refuses the records whose value is
// "bad".
type refuseBad struct{ kafka.DefaultMarshaler }

func (u refuseBad) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	if string(m.Value) == "bad" {
		return nil, errors.New("cannot read it")
	}
	return u.DefaultMarshaler.Unmarshal(m)
}

// TestShareSlowOnUnmarshalErrorKeepsThePollsLocks: an OnUnmarshalError
// that takes longer than the acquisition lock does not let the rest of
// its poll's locks expire: the poll's other records are handed out at
// once, once each, the refused record stays held (its lock renewed) and
// reaches OnUnmarshalError once; a second member gets nothing of it.
func TestShareSlowOnUnmarshalErrorKeepsThePollsLocks(t *testing.T) {
	t.Parallel()
	const lock = 2 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")}, kafkatest.Record{Value: []byte("a")},
		kafkatest.Record{Value: []byte("b")}, kafkatest.Record{Value: []byte("c")})
	var calls, returned atomic.Int64
	mod := func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Unmarshaler = refuseBad{}
		cfg.OnUnmarshalError = func(ctx context.Context, _ *sarama.ConsumerMessage, _ error) error {
			calls.Add(1)
			defer returned.Add(1)
			select {
			case <-time.After(3 * lock):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	first := newShareSub(t, c, group, mod)
	seenFirst := answerAll(subscribeShare(t, first, topic), (*message.Message).Ack)
	kafkatest.WaitFor(t, 20*time.Second, "OnUnmarshalError called", func() bool { return calls.Load() >= 1 })
	second := newShareSub(t, c, group, mod)
	seenSecond := answerAll(subscribeShare(t, second, topic), (*message.Message).Ack)
	kafkatest.WaitFor(t, 30*time.Second, "the first OnUnmarshalError returned", func() bool { return returned.Load() >= 1 })
	time.Sleep(2 * lock) // a record handed out late, or twice, would show by now
	for _, v := range []string{"a", "b", "c"} {
		assert.Equal(t, 1, seenFirst.count(v)+seenSecond.count(v), "record %s handled %d times by the first member, %d by the second", v, seenFirst.count(v), seenSecond.count(v))
	}
	assert.Equal(t, int64(1), calls.Load(), "OnUnmarshalError calls for the refused record")
	tot, _ := shareTotals(first)
	assert.Equal(t, uint64(4), tot.Accepted, "accepted by the first member: %+v", tot)
	assert.Zero(t, tot.AckErrors, "the broker refused acks: locks had expired")
}

// TestShareOnUnmarshalErrorFailingRejectsAtMaxDeliveries: a record whose
// OnUnmarshalError fails is released below MaxDeliveries and rejected at
// it, as a Nack is.
func TestShareOnUnmarshalErrorFailingRejectsAtMaxDeliveries(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	var calls atomic.Int64
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxDeliveries = 2
		cfg.Unmarshaler = refuseBad{}
		cfg.OnUnmarshalError = func(context.Context, *sarama.ConsumerMessage, error) error {
			calls.Add(1)
			return errors.New("dead-letter topic away")
		}
	})
	answerAll(subscribeShare(t, sub, topic), (*message.Message).Ack)
	kafkatest.WaitFor(t, 20*time.Second, "the record rejected, or OnUnmarshalError past MaxDeliveries", func() bool {
		tot, _ := shareTotals(sub)
		return tot.Rejected == 1 || calls.Load() > 2
	})
	time.Sleep(500 * time.Millisecond) // a delivery after the rejection would show
	tot, _ := shareTotals(sub)
	assert.Equal(t, int64(2), calls.Load(), "OnUnmarshalError calls with MaxDeliveries 2")
	assert.Equal(t, uint64(1), tot.Rejected, "%+v", tot)
	assert.Equal(t, uint64(1), tot.Released, "%+v", tot)
}

// TestShareCloseWithOnUnmarshalErrorWaiting: Close holds its bound
// (DrainTimeout, then the release and the leave) when an
// OnUnmarshalError waits on its context: the context ends with the drain.
func TestShareCloseWithOnUnmarshalErrorWaiting(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	var calls atomic.Int64
	giveUp := make(chan struct{}) // ends a wait the subscriber does not end
	defer close(giveUp)
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Unmarshaler = refuseBad{}
		cfg.OnUnmarshalError = func(ctx context.Context, _ *sarama.ConsumerMessage, _ error) error {
			calls.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-giveUp:
				return errors.New("test over")
			}
		}
	})
	answerAll(subscribeShare(t, sub, topic), (*message.Message).Ack)
	kafkatest.WaitFor(t, 20*time.Second, "OnUnmarshalError called", func() bool { return calls.Load() >= 1 })
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		_ = sub.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("Close still waiting after %v (DrainTimeout 500ms) on an OnUnmarshalError waiting on its context", time.Since(start))
	}
	took := time.Since(start)
	t.Logf("Close took %v", took)
	assert.Less(t, took, 5*time.Second)
	tot, inFlight := shareTotals(sub)
	assert.Equal(t, uint64(1), tot.Released, "%+v", tot)
	assert.Zero(t, inFlight)
}
