package safeackotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/safeack/safeack"
	safeackotel "github.com/safeack/safeack/otel"
)

// producerParent is a traceparent header of a sampled producer span.
const producerParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func tracedDelivery() safeack.Delivery {
	return safeack.Delivery{Group: "g", Record: &sarama.ConsumerMessage{Topic: "t", Partition: 1, Offset: 7,
		Value: []byte("v"), Headers: []*sarama.RecordHeader{{Key: []byte("traceparent"), Value: []byte(producerParent)}}}}
}

// TestNoSDKCostsNothing: with no SDK installed (the global providers as
// they are until otel.SetTracerProvider, or a no-op provider given) a
// delivery starts no span: Delivered hands the context back as it came,
// observes nothing and allocates nothing. Once the application sets a
// global TracerProvider, the same Observer's deliveries get spans.
//
// It sets the global TracerProvider: it must not run in parallel with a
// test that needs the global one unset (none does).
func TestNoSDKCostsNothing(t *testing.T) {
	d := tracedDelivery()
	providers := []struct {
		name string
		opts []safeackotel.Option
	}{
		{"global unset", nil},
		{"noop", []safeackotel.Option{safeackotel.WithTracerProvider(noop.NewTracerProvider())}},
		//lint:ignore SA1019 the deprecated constructor still exists and applications still call it
		{"deprecated noop", []safeackotel.Option{safeackotel.WithTracerProvider(trace.NewNoopTracerProvider())}},
	}
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			obs, err := safeackotel.NewObserver(p.opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var got context.Context
			var do safeack.DeliveryObserver
			allocs := testing.AllocsPerRun(100, func() { got, do = obs.Delivered(ctx, d) })
			if got != ctx || do != nil {
				t.Fatalf("Delivered returned a new context (%v) or an observer (%v) without an SDK", got != ctx, do)
			}
			if allocs != 0 {
				t.Fatalf("Delivered allocated %.0f times per delivery without an SDK", allocs)
			}
		})
	}

	t.Run("producer as parent kept without SDK", func(t *testing.T) {
		obs, err := safeackotel.NewObserver(safeackotel.WithProducerAsParent(),
			safeackotel.WithPropagator(propagation.TraceContext{}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, _ := obs.Delivered(context.Background(), d)
		if got := trace.SpanContextFromContext(ctx).TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Fatalf("handler context's trace id %q, want the producer's", got)
		}
	})

	t.Run("global set after NewObserver", func(t *testing.T) {
		obs, err := safeackotel.NewObserver(safeackotel.WithPropagator(propagation.TraceContext{}))
		if err != nil {
			t.Fatal(err)
		}
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		otel.SetTracerProvider(tp)

		ctx, do := obs.Delivered(context.Background(), d)
		if !trace.SpanFromContext(ctx).IsRecording() || do == nil {
			t.Fatal("no recording span in the handler's context once an SDK was set")
		}
		do.Answered(safeack.OutcomeAck, nil)
		ended := rec.Ended()
		if len(ended) != 1 || ended[0].Name() != "process t" {
			t.Fatalf("ended spans %v, want one process span", ended)
		}
		if links := ended[0].Links(); len(links) != 1 || links[0].SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Fatalf("span links %v, want the producer's span", links)
		}
	})
}

// TestCommitEventsEndSpansAtTheirCommit drives an Observer made
// WithCommitEvents as a subscriber would: deliveries of offsets 5, 6 and 7
// (7 acked before 6), a commit at 6, a final commit at 6 (6 was acked, but
// the assignment ended before a commit covered it), and an ack after the
// final commit. Each delivery span must end at the commit that covers its
// record with a safeack.committed event naming the position, or at the
// final commit with safeack.not_committed; none may end at its ack.
func TestCommitEventsEndSpansAtTheirCommit(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := safeackotel.NewObserver(safeackotel.WithTracerProvider(tp), safeackotel.WithCommitEvents())
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(offset int64) safeack.DeliveryObserver {
		d := tracedDelivery()
		d.Record.Offset = offset
		_, do := obs.Delivered(context.Background(), d)
		return do
	}
	d5, d6, d7 := deliver(5), deliver(6), deliver(7)
	d5.Answered(safeack.OutcomeAck, nil)
	d7.Answered(safeack.OutcomeAck, nil)
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans ended at their ack, want them held until a commit", n)
	}
	commit := func(offset int64, final bool) {
		obs.Committed(safeack.CommitEvent{Topic: "t", Group: "g", Start: time.Now(), Final: final,
			Partitions: []safeack.CommittedPartition{{Partition: 1, Offset: offset}}})
	}
	commit(6, false)
	d6.Answered(safeack.OutcomeAck, nil)
	d8 := deliver(8)
	commit(6, true)
	d8.Answered(safeack.OutcomeAck, nil) // after its assignment's final commit: ends at once
	// The partition assigned again: a new delivery waits for a commit of
	// the new assignment.
	d9 := deliver(9)
	d9.Answered(safeack.OutcomeAck, nil)
	commit(10, false)

	want := map[int64]string{5: "safeack.committed", 6: "safeack.not_committed", 7: "safeack.not_committed",
		8: "safeack.not_committed", 9: "safeack.committed"}
	got := map[int64]string{}
	for _, s := range rec.Ended() {
		if s.Name() != "process t" {
			continue
		}
		var off int64
		for _, kv := range s.Attributes() {
			if kv.Key == "messaging.kafka.offset" {
				off = kv.Value.AsInt64()
			}
		}
		events := s.Events()
		last := events[len(events)-1]
		got[off] = last.Name
		if last.Name == safeackotel.EventCommitted {
			if a := attrs(last.Attributes); a[safeackotel.CommitOffsetKey].AsInt64() != map[int64]int64{5: 6, 9: 10}[off] {
				t.Errorf("offset %d: committed event says position %v", off, a[safeackotel.CommitOffsetKey])
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("last event of each delivery span %v, want %v", got, want)
	}
}
