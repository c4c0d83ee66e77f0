package safeackotel

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// Outputs is a Watermill handler middleware that carries the trace on to
// the messages a handler returns, so that their consumers can link to
// the work that produced them (a chain of routers then reads as linked
// traces). Each returned message gets a span of kind producer named
// "create <topic>" (messaging.operation.name and messaging.operation.type
// "create", messaging.system, messaging.destination.name: the topic the
// router publishes to, messaging.message.id: the Watermill UUID,
// messaging.message.body.size), as the semantic conventions give each
// message of a batch send; it is a child of the span in the returned
// message's context when it has one, else of the input's (its delivery
// span, see Observer). The span's context is written into the message's
// Metadata with the propagator (W3C traceparent with
// propagation.TraceContext), which the Kafka marshalers of safeack's
// TxnPublisher and watermill-kafka copy to record headers. The span ends
// at once: the send itself is the publisher's (in transactional mode,
// the transaction's commit span).
//
// Without an SDK installed no span starts; the span context of the output
// (or input) context, when valid, is still written, as OpenTelemetry's
// no-op tracer would pass it on.
//
// Add it inside TxnPublisher.Middleware, so that the size check there
// counts the headers it adds:
//
//	router.AddMiddleware(pub.Middleware, obs.Outputs)
func (o *Observer) Outputs(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil || len(out) == 0 {
			return out, err
		}
		topic := message.PublishTopicFromCtx(msg.Context())
		tr := o.currentTracing()
		prop := o.cfg.propagator()
		for _, m := range out {
			if m == nil {
				continue
			}
			parent := m.Context()
			if !trace.SpanContextFromContext(parent).IsValid() {
				parent = msg.Context()
			}
			if m.Metadata == nil {
				m.Metadata = message.Metadata{}
			}
			if tr.off {
				prop.Inject(parent, metadataCarrier(m.Metadata))
				continue
			}
			ctx, span := tr.tracer.Start(parent, createSpanName(topic), createSpan...)
			if span.IsRecording() {
				span.SetAttributes(createAttrs(topic, m)...)
			}
			prop.Inject(ctx, metadataCarrier(m.Metadata))
			span.End()
		}
		return out, nil
	}
}

// createSpan is the options every create span starts with, made once.
var createSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

func createSpanName(topic string) string {
	if topic == "" {
		return "create"
	}
	return "create " + topic
}

func createAttrs(topic string, m *message.Message) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationName("create"),
		semconv.MessagingOperationTypeCreate,
		semconv.MessagingMessageBodySize(len(m.Payload)),
	}
	if topic != "" {
		kv = append(kv, semconv.MessagingDestinationName(topic))
	}
	if m.UUID != "" {
		kv = append(kv, semconv.MessagingMessageID(m.UUID))
	}
	return kv
}

// metadataCarrier is a propagation.TextMapCarrier over a Watermill
// message's Metadata.
type metadataCarrier message.Metadata

var _ propagation.TextMapCarrier = metadataCarrier(nil)

func (c metadataCarrier) Get(key string) string { return c[key] }

func (c metadataCarrier) Set(key, value string) { c[key] = value }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
