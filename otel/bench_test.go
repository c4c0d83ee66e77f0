package safeackotel_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	safeackotel "github.com/safeack/safeack/otel"
)

// BenchmarkZeroWork consumes b.N records (produced beforehand, with a
// traceparent header each, on 4 partitions of the embedded broker) with
// handlers that ack at once, and reports records per second and
// allocations per record (the embedded broker runs in the process, so its
// allocations count too: compare the variants, not the absolute figure).
// Variants: no Observer (bare); the Observer over OpenTelemetry's global
// providers with nothing installed (otel-noop); RegisterMetrics alone on an
// SDK MeterProvider (metrics-only); the Observer over the SDK sampling 1%
// of the spans (otel-sdk-1pct) and every span (otel-sdk), exported in
// batches to a discarding exporter, with its histograms and RegisterMetrics
// on a ManualReader. cpu-µs/rec is the process's CPU time (user and
// system) per record, steadier than rec/s on a shared machine. Run with a
// fixed count, e.g.
//
//	go test -run '^$' -bench ZeroWork -benchtime 100000x ./otel/
func BenchmarkZeroWork(b *testing.B) {
	variants := []benchVariant{
		{"bare", func(*testing.B) (safeack.Observer, func(*safeack.Subscriber)) { return nil, nil }},
		{"otel-noop", func(b *testing.B) (safeack.Observer, func(*safeack.Subscriber)) {
			obs, err := safeackotel.NewObserver(safeackotel.WithPropagator(propagation.TraceContext{}))
			if err != nil {
				b.Fatal(err)
			}
			return obs, nil
		}},
		{"metrics-only", func(b *testing.B) (safeack.Observer, func(*safeack.Subscriber)) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			return nil, func(sub *safeack.Subscriber) {
				reg, err := safeackotel.RegisterMetrics(sub, safeackotel.WithMeterProvider(mp))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = reg.Unregister() })
			}
		}},
		{"otel-sdk-1pct", sdkVariant(sdktrace.TraceIDRatioBased(0.01))},
		{"otel-sdk", sdkVariant(sdktrace.AlwaysSample())},
	}
	benchZeroWork(b, variants)
}

// sdkVariant is the Observer over the SDK with sampler, its histograms and
// RegisterMetrics on a ManualReader.
func sdkVariant(sampler sdktrace.Sampler) func(b *testing.B) (safeack.Observer, func(*safeack.Subscriber)) {
	return func(b *testing.B) (safeack.Observer, func(*safeack.Subscriber)) {
		tp, mp := sdkProviders(b, sampler)
		opts := []safeackotel.Option{safeackotel.WithTracerProvider(tp), safeackotel.WithMeterProvider(mp),
			safeackotel.WithPropagator(propagation.TraceContext{})}
		obs, err := safeackotel.NewObserver(opts...)
		if err != nil {
			b.Fatal(err)
		}
		return obs, func(sub *safeack.Subscriber) {
			reg, err := safeackotel.RegisterMetrics(sub, opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = reg.Unregister() })
		}
	}
}

// cpuTime is the CPU time the process used so far (user and system): on a
// shared machine it varies less with other load than the wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type benchVariant struct {
	name  string
	setup func(b *testing.B) (safeack.Observer, func(*safeack.Subscriber))
}

func benchZeroWork(b *testing.B, variants []benchVariant) {
	c := kafkatest.Start(b)
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
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
			obs, register := v.setup(b)
			sc := c.SaramaConfig()
			sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
				Brokers:               c.Brokers(),
				OverwriteSaramaConfig: sc,
				ConsumerGroup:         c.NewGroup(b),
				Ordering:              safeack.Unordered,
				Observer:              obs,
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

// BenchmarkDelivered is what the Observer adds to one delivery that is
// acked (Delivered, then Answered), without a subscriber around it, for
// each set-up of BenchmarkZeroWork.
func BenchmarkDelivered(b *testing.B) {
	for _, v := range []struct {
		name string
		opts func(b *testing.B) []safeackotel.Option
	}{
		{"otel-noop", func(*testing.B) []safeackotel.Option { return nil }},
		{"otel-sdk-1pct", sdkOptions(sdktrace.TraceIDRatioBased(0.01))},
		{"otel-sdk", sdkOptions(sdktrace.AlwaysSample())},
	} {
		b.Run(v.name, func(b *testing.B) {
			obs, err := safeackotel.NewObserver(append(v.opts(b), safeackotel.WithPropagator(propagation.TraceContext{}))...)
			if err != nil {
				b.Fatal(err)
			}
			d := tracedDelivery()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, do := obs.Delivered(ctx, d); do != nil {
					do.Answered(safeack.OutcomeAck, nil)
				}
			}
		})
	}
}

// BenchmarkSDKFloor is what OpenTelemetry's SDK itself costs a delivery
// that gets a span and a duration measurement, whoever instruments it: a
// consumer span started (with its context) and ended, and one histogram
// measurement with a pre-built attribute set, for the samplers of
// BenchmarkDelivered. BenchmarkDelivered minus this is what the Observer
// adds to OpenTelemetry's own work.
func BenchmarkSDKFloor(b *testing.B) {
	for _, v := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"sdk-1pct", sdktrace.TraceIDRatioBased(0.01)},
		{"sdk", sdktrace.AlwaysSample()},
	} {
		b.Run(v.name, func(b *testing.B) {
			tp, mp := sdkProviders(b, v.sampler)
			tracer := tp.Tracer("floor")
			hist, err := mp.Meter("floor").Float64Histogram("floor.duration")
			if err != nil {
				b.Fatal(err)
			}
			set := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("messaging.destination.name", "t")))}
			kind := trace.WithSpanKind(trace.SpanKindConsumer)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				_, span := tracer.Start(ctx, "process t", kind)
				span.End()
				hist.Record(ctx, time.Since(start).Seconds(), set...)
			}
		})
	}
}

// sdkOptions are the tracer and meter providers of the SDK, as in
// sdkVariant.
func sdkOptions(sampler sdktrace.Sampler) func(b *testing.B) []safeackotel.Option {
	return func(b *testing.B) []safeackotel.Option {
		tp, mp := sdkProviders(b, sampler)
		return []safeackotel.Option{safeackotel.WithTracerProvider(tp), safeackotel.WithMeterProvider(mp)}
	}
}

// sdkProviders are an SDK TracerProvider with sampler, exporting in
// batches to a discarding exporter, and an SDK MeterProvider with a
// ManualReader, shut down when b ends.
func sdkProviders(b *testing.B, sampler sdktrace.Sampler) (*sdktrace.TracerProvider, *sdkmetric.MeterProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return tp, mp
}

// ackAll consumes b.N records of topic from sub, acking each at once, and
// reports the rate and the process's CPU time per record: the timed part
// of the zero-work benchmarks.
func ackAll(b *testing.B, sub message.Subscriber, topic string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		n := 0
		for m := range msgs {
			m.Ack()
			if n++; n == b.N {
				close(done)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("records not all delivered")
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rec/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/rec")
}
