package safeackotel_test

import (
	"context"
	"testing"

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
		{"deprecated noop", []safeackotel.Option{safeackotel.WithTracerProvider(trace.NewNoopTracerProvider())}}, //nolint:staticcheck // the deprecated one still exists and is used
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
