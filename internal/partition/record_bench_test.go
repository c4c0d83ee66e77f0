package partition

import (
	"context"
	"fmt"
	"hash/maphash"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// newBenchWorker returns a worker with no Kafka behind it: the record path
// from an accepted record to its completion, as the run loop drives it, can
// then be measured alone.
func newBenchWorker(b *testing.B, ordering Ordering) *Worker {
	cfg := &Config{
		Ordering:    ordering,
		Seed:        maphash.MakeSeed(),
		Unmarshaler: kafka.DefaultMarshaler{},
		MaxPending:  10_000,
		Logger:      watermill.NopLogger{},
	}
	pool := NewPool(make(chan *message.Message), 1)
	w, err := New(context.Background(), cfg, pool, Assignment{Topic: "bench", Start: Start{Resolved: true}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.End)
	return w
}

// BenchmarkRecordPath measures one record through the worker without a
// broker: accept (tracker offer, unmarshal, ordering gate), hand-out
// bookkeeping and the message context, the answer's goroutine, completion
// and the mark. It is the subscriber's own cost per record on top of
// Sarama and the handler.
func BenchmarkRecordPath(b *testing.B) {
	for _, ordering := range []struct {
		name string
		o    Ordering
	}{{"unordered", Unordered}, {"by-key", ByKey}, {"by-partition", ByPartition}} {
		b.Run(ordering.name, func(b *testing.B) {
			w := newBenchWorker(b, ordering.o)
			keys := make([][]byte, 1000)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "key-%d", i)
			}
			value := make([]byte, 100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				m := &sarama.ConsumerMessage{Topic: "bench", Offset: int64(i), Key: keys[i%len(keys)], Value: value, Timestamp: time.Unix(0, 0)}
				w.accept(m)
				w.pool.tokens <- struct{}{}
				w.next = w.takeReady()
				dv := w.next
				w.handedOver()
				dv.msg.Ack()
				for w.inFlightNow() > 0 {
					<-w.wakeups // the answer's goroutine completes the record and wakes run
				}
				w.markIfAdvanced(true)
			}
		})
	}
}

func (w *Worker) inFlightNow() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inFlight
}
