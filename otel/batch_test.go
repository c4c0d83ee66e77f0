package safeackotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	safeackotel "github.com/safeack/safeack/otel"
)

// TestBatchSpanLinksItsMessages: a batch function wrapped with
// Observer.Batch runs in one "process <topic>" span counting its messages
// and linked to each message's delivery span, and the function's context
// carries that span.
func TestBatchSpanLinksItsMessages(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	c, topic, group := kafkatest.StartTopic(t, 1)
	c.ProduceN(t, topic, 1, 6, nil)
	inBatch := make(chan trace.SpanContext, 1)
	b, err := safeack.NewBatcher(safeack.BatchConfig{MaxSize: 6, MaxWait: time.Minute}, obs.Batch(func(ctx context.Context, msgs []*message.Message) error {
		inBatch <- trace.SpanContextFromContext(ctx)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	h := b.Handler()
	msgs := tel.subscribe(t, c, group, topic)
	delivered := map[trace.SpanID]bool{}
	for range 6 {
		select {
		case m := <-msgs:
			delivered[trace.SpanContextFromContext(m.Context()).SpanID()] = true
			go func() {
				if h(m) == nil {
					m.Ack()
				} else {
					m.Nack()
				}
			}()
		case <-time.After(30 * time.Second):
			t.Fatal("fewer than 6 messages delivered")
		}
	}
	var sc trace.SpanContext
	select {
	case sc = <-inBatch:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch did not run")
	}
	kafkatest.WaitFor(t, 30*time.Second, "the batch span to end", func() bool {
		for _, s := range tel.spans.Ended() {
			if s.SpanContext().SpanID() == sc.SpanID() {
				return true
			}
		}
		return false
	})
	for _, s := range tel.spans.Ended() {
		if s.SpanContext().SpanID() != sc.SpanID() {
			continue
		}
		if s.Name() != "process "+topic || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("batch span %q of kind %v, want %q, consumer", s.Name(), s.SpanKind(), "process "+topic)
		}
		if n := attrs(s.Attributes())["messaging.batch.message_count"].AsInt64(); n != 6 {
			t.Errorf("messaging.batch.message_count %d, want 6", n)
		}
		linked := map[trace.SpanID]bool{}
		for _, l := range s.Links() {
			linked[l.SpanContext.SpanID()] = true
		}
		if len(linked) != 6 || len(delivered) != 6 {
			t.Fatalf("%d links to %d delivered messages' spans, want 6", len(linked), len(delivered))
		}
		for id := range delivered {
			if !linked[id] {
				t.Errorf("no link to delivery span %v", id)
			}
		}
	}
}
