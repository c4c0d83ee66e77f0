package safeackotel

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
)

// Batch wraps a batch function of safeack.Batch (or NewBatcher) so that
// each call runs in a span of kind consumer named "process <topic>" (or
// "process" when the batch holds several topics) with
// messaging.batch.message_count, linked to each message's delivery span
// (see Observer: a batch has many parents, so it links to them rather than
// being a child of one). The batch function's context carries the span,
// for the database client's spans to nest under. An error sets the span's
// status; a panic too, and goes on to the Batcher, which fails the batch.
// Without an SDK installed fn runs as it is.
//
//	safeack.Batch(cfg, obs.Batch(write))
func (o *Observer) Batch(fn safeack.BatchFunc) safeack.BatchFunc {
	return func(ctx context.Context, msgs []*message.Message) (err error) {
		tr := o.currentTracing()
		if tr.off {
			return fn(ctx, msgs)
		}
		topic, one := batchTopic(msgs)
		name := "process"
		attrs := []attribute.KeyValue{
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingBatchMessageCount(len(msgs)),
		}
		if one {
			name += " " + topic
			attrs = append(attrs, semconv.MessagingDestinationName(topic))
		}
		links := make([]trace.Link, 0, len(msgs))
		for _, m := range msgs {
			if sc := trace.SpanContextFromContext(m.Context()); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		ctx, span := tr.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...), trace.WithLinks(links...))
		returned := false
		defer func() {
			switch {
			case !returned:
				p := recover()
				span.SetStatus(codes.Error, fmt.Sprint("panic: ", p))
				span.End()
				panic(p) // on to the Batcher, which fails the batch
			case err != nil:
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				span.End()
			default:
				span.End()
			}
		}()
		err = fn(ctx, msgs)
		returned = true
		return err
	}
}

// batchTopic returns the topic of msgs when they share one.
func batchTopic(msgs []*message.Message) (string, bool) {
	topic := ""
	for i, m := range msgs {
		t, ok := safeack.MessageTopicFromCtx(m.Context())
		if !ok || (i > 0 && t != topic) {
			return "", false
		}
		topic = t
	}
	return topic, topic != ""
}
