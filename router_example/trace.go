package main

import (
	"context"
	"fmt"
	"io"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/safeack/safeack"
	safeackotel "github.com/safeack/safeack/otel"
)

// tracing is the example's OpenTelemetry set-up: with -trace-stdout an SDK
// tracer provider that prints every span as JSON, else nothing (a no-op
// tracer: the example exports no traces by default and needs no collector).
type tracing struct {
	tp     *sdktrace.TracerProvider // nil: not tracing
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func newTracing(out io.Writer) (*tracing, error) {
	if out == nil {
		return &tracing{tracer: noop.NewTracerProvider().Tracer(""), prop: propagation.TraceContext{}}, nil
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(out))
	if err != nil {
		return nil, fmt.Errorf("stdout trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	return &tracing{tp: tp, tracer: tp.Tracer("router_example"), prop: propagation.TraceContext{}}, nil
}

// observer is the Subscriber's Observer: a span per delivery and commit,
// linked to the producer's span; nil when not tracing.
func (t *tracing) observer() (*safeackotel.Observer, error) {
	if t.tp == nil {
		return nil, nil
	}
	return safeackotel.NewObserver(safeackotel.WithTracerProvider(t.tp), safeackotel.WithPropagator(t.prop))
}

// produced starts and ends the span of a record sent, and puts its context
// in the record's headers (W3C traceparent) for the consumer to link to.
func (t *tracing) produced(pm *sarama.ProducerMessage) {
	if t.tp == nil {
		return
	}
	ctx, span := t.tracer.Start(context.Background(), "send "+pm.Topic, trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	h := propagation.MapCarrier{}
	t.prop.Inject(ctx, h)
	for k, v := range h {
		pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
}

// handling starts the handler's span under the delivery's (in ctx); end
// it with the handler's error.
func (t *tracing) handling(ctx context.Context) func(error) {
	_, span := t.tracer.Start(ctx, "handle order")
	return func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// shutdown flushes the spans not printed yet.
func (t *tracing) shutdown(ctx context.Context) {
	if t.tp != nil {
		_ = t.tp.Shutdown(ctx)
	}
}

// observerOrNil keeps a nil *Observer from becoming a non-nil
// safeack.Observer.
func observerOrNil(o *safeackotel.Observer) safeack.Observer {
	if o == nil {
		return nil
	}
	return o
}
