package safeack

import (
	"context"
	"fmt"
	"hash/maphash"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// newBenchWorker returns a partition worker with no Kafka behind it: the
// record path from an accepted record to its completion, as the run loop
// drives it, can then be measured alone.
func newBenchWorker(b *testing.B, ordering Ordering) *partitionWorker {
	cfg := SubscriberConfig{Brokers: []string{"unused:9092"}, Ordering: ordering, MaxInFlight: 1}.withDefaults()
	s := &Subscriber{cfg: cfg, logger: watermill.NopLogger{}, closing: make(chan struct{})}
	sub := &subscription{s: s, cfg: &s.cfg, logger: s.logger, topic: "bench", tokens: make(chan struct{}, 1), seed: maphash.MakeSeed()}
	w, err := newPartitionWorker(sub, context.Background(), nil, "bench", 0, startPosition{resolved: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.cancel)
	return w
}

// BenchmarkRecordPath measures one record through the worker without a
// broker: accept (tracker offer, unmarshal, ordering gate, message
// context), hand-out bookkeeping, the ack goroutine, completion and the
// mark. It is the subscriber's own cost per record on top of Sarama and the
// handler.
func BenchmarkRecordPath(b *testing.B) {
	for _, ordering := range []Ordering{Unordered, OrderByKey, OrderByPartition} {
		b.Run(ordering.String(), func(b *testing.B) {
			w := newBenchWorker(b, ordering)
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
				w.sub.tokens <- struct{}{}
				w.next = w.takeReady()
				r := w.next
				w.sent()
				r.wm.Ack()
				for w.inFlightNow() > 0 {
					<-w.wake // the ack goroutine completes the record and pokes
				}
				w.markIfAdvanced(true)
			}
		})
	}
}

func (w *partitionWorker) inFlightNow() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inFlight
}
