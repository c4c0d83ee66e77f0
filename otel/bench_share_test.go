package safeackotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	safeackotel "github.com/safeack/safeack/otel"
)

// BenchmarkShareZeroWork consumes b.N records (produced beforehand, with a
// traceparent header each, on 4 partitions of the embedded broker) through
// a ShareSubscriber whose handlers ack at once, and reports records per
// second, CPU time and allocations per record (the broker runs in the
// process: compare the variants, not the absolute figures). Variants: no
// Observer (bare); the Observer over OpenTelemetry's global providers with
// nothing installed (otel-noop); the Observer over the SDK sampling every
// span, exported in batches to a discarding exporter, with its histograms
// and RegisterShareMetrics on a ManualReader (otel-sdk). Each variant runs
// shareBenchRounds times, alternated with the others. Run with a fixed
// count, e.g.
//
//	go test -run '^$' -bench ShareZeroWork -benchtime 20000x ./otel/
func BenchmarkShareZeroWork(b *testing.B) {
	c := kafkatest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := safeack.CheckShareGroups(ctx, c.Brokers()); errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		b.Skipf("%v", err)
	}
	variants := []struct {
		name  string
		setup func(b *testing.B) (safeack.Observer, func(*safeack.ShareSubscriber))
	}{
		{"bare", func(*testing.B) (safeack.Observer, func(*safeack.ShareSubscriber)) { return nil, nil }},
		{"otel-noop", func(b *testing.B) (safeack.Observer, func(*safeack.ShareSubscriber)) {
			obs, err := safeackotel.NewObserver(safeackotel.WithPropagator(propagation.TraceContext{}))
			if err != nil {
				b.Fatal(err)
			}
			return obs, nil
		}},
		{"otel-sdk", func(b *testing.B) (safeack.Observer, func(*safeack.ShareSubscriber)) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
				sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			b.Cleanup(func() {
				_ = tp.Shutdown(context.Background())
				_ = mp.Shutdown(context.Background())
			})
			opts := []safeackotel.Option{safeackotel.WithTracerProvider(tp), safeackotel.WithMeterProvider(mp),
				safeackotel.WithPropagator(propagation.TraceContext{})}
			obs, err := safeackotel.NewObserver(opts...)
			if err != nil {
				b.Fatal(err)
			}
			return obs, func(sub *safeack.ShareSubscriber) {
				reg, err := safeackotel.RegisterShareMetrics(sub, opts...)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = reg.Unregister() })
			}
		}},
	}
	// Rounds alternate the variants (bare, otel-noop, otel-sdk, bare#01,
	// ...), so that a change of the machine's load hits them alike;
	// -count would run each variant's runs back to back.
	for range shareBenchRounds {
		for _, v := range variants {
			shareZeroWork(b, c, v.name, v.setup)
		}
	}
}

// shareBenchRounds is how many times BenchmarkShareZeroWork runs each
// variant.
const shareBenchRounds = 3

func shareZeroWork(b *testing.B, c *kafkatest.Cluster, name string, setup func(b *testing.B) (safeack.Observer, func(*safeack.ShareSubscriber))) {
	{
		b.Run(name, func(b *testing.B) {
			const partitions = 4
			topic := c.NewTopic(b, partitions)
			recs := make([]kafkatest.Record, b.N)
			tp := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
			for i := range recs {
				recs[i] = kafkatest.Record{Partition: int32(i % partitions), Value: []byte("v"), Headers: tp}
			}
			for i := 0; i < len(recs); i += 5000 {
				c.Produce(b, topic, recs[i:min(i+5000, len(recs))]...)
			}
			obs, register := setup(b)
			sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
				Brokers:       c.Brokers(),
				ShareGroup:    c.NewGroup(b),
				InitialOffset: sarama.OffsetOldest,
				Observer:      obs,
			}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = sub.Close() }()
			if register != nil {
				register(sub)
			}
			ackAll(b, sub, topic)
		})
	}
}
