// Package safeackotel exports a safeack Subscriber's work to OpenTelemetry:
// a span per delivery and per commit (an Observer), and the figures the
// Prometheus collector in package metrics exports, as observable
// instruments (RegisterMetrics). It uses the OpenTelemetry API only: the
// application chooses the SDK and the exporters, and until it installs
// providers (otel.SetTracerProvider, otel.SetMeterProvider, or the options
// here) everything goes to OpenTelemetry's no-op implementations.
//
//	obs, err := safeackotel.NewObserver()
//	...
//	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
//		...
//		Observer: obs,
//	}, logger)
//	...
//	reg, err := safeackotel.RegisterMetrics(sub)
//	defer reg.Unregister()
//
// # Traces
//
// Every delivery of a record (a redelivery after a nack is a new one) gets
// a span of kind consumer named "process <topic>", following the
// OpenTelemetry semantic conventions for messaging: messaging.system
// "kafka", messaging.operation.name and messaging.operation.type
// "process", messaging.destination.name, messaging.destination.partition.id,
// messaging.consumer.group.name, messaging.kafka.offset,
// messaging.kafka.message.key (when the key is valid UTF-8),
// messaging.kafka.message.tombstone, messaging.message.id (the Watermill
// UUID) and messaging.message.body.size. The producer's span context is
// read from the record headers with the propagator (W3C traceparent with
// propagation.TraceContext) and the span is linked to it, as the
// conventions advise for consumers; WithProducerAsParent makes it the
// span's parent instead. The span is in the message's context, so the
// spans a handler starts from msg.Context() nest under it.
//
// The span starts when the message is handed out and ends when it is
// answered, with an event (safeack.ack, safeack.nack, safeack.skipped,
// safeack.abandoned) and the attribute safeack.outcome. A nack sets the
// span's status to Error. A deferred completion (safeack.Defer) adds a
// safeack.deferred event when the handler defers it and ends the span when
// the Completion is resolved (or the router nacks the delivery); if the
// assignment ends first, that span is never ended (and so never
// exported). Attributes and the producer link are added only to spans
// that record (sampled, with an SDK installed), so a sampler sees the
// span's name and kind (and, with WithProducerAsParent, its parent).
//
// Every commit of the commit loop that sends a new position gets a span of
// kind client named "commit <topic>" (messaging.operation.name "commit",
// messaging.operation.type "settle"), from when it was sent until the
// broker answered, with one safeack.partition.committed event per partition:
// messaging.destination.partition.id, messaging.kafka.offset (the position
// committed: the next offset to consume), safeack.commit.previous_offset
// (the last position this Observer saw committed, when known) and
// safeack.tail.size (bytes of completed tail in the metadata). A commit the
// read-back did not find has status Error. A record's delivery span has
// ended by the time its offset is committed: the commit that covers offset
// o of a partition is the first whose event for that partition has
// messaging.kafka.offset above o. In transactional mode each transaction is
// such a span, named "commit_transaction <topic>", with
// safeack.transaction.outputs.
//
// The final commit of an ending assignment (a revocation, Close) is such a
// span too, with safeack.commit.final true, listing each partition whose
// assignment ended with the last position tried: one span for the
// positions the group coordinator holds, read back until it did, and one
// with status Error (safeack.ErrCommitNotConfirmed) for those it did not
// hold in time, whose records after the held position the partition's next
// owner hands out again. In transactional mode the drain's transaction is
// a span of its own; the final span follows it, as the claim gives the
// partition up, with the position the group holds from the assignment (or
// one no transaction committed, with status Error).
//
// # Outputs
//
// Observer.Outputs, a handler middleware, gives each message a handler
// returns a "create <topic>" span (kind producer) and writes its context
// into the message's Metadata, which the Kafka marshalers copy to record
// headers: the consumers of the outputs link to it.
//
// # Metrics
//
// With a MeterProvider, NewObserver's Observer also records the
// histograms messaging.process.duration (seconds from hand-out to answer)
// and messaging.client.operation.duration (seconds a commit took, with
// messaging.operation.name "commit"). RegisterMetrics exports, on each
// collection, the figures of Stats (gauges of the partitions owned now) and
// Totals (counters, monotonic across reassignments) that the Prometheus
// collector exports, under OpenTelemetry names (listed in
// docs/operations.md). Their attributes are messaging.system,
// messaging.destination.name, messaging.destination.partition.id and
// messaging.consumer.group.name.
//
// # Share groups
//
// A ShareSubscriber's deliveries (safeack.ShareSubscriberConfig.Observer)
// get the same spans, plus safeack.share.delivery_count; they end once the
// broker answered the acknowledgement (see share.go). There are no commit
// spans for share groups, and RegisterShareMetrics exports a
// ShareSubscriber's figures.
package safeackotel

import (
	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/safeack/safeack/otel"

// Option configures NewObserver and RegisterMetrics.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	globalTP bool // tp is otel.GetTracerProvider(), read again at each delivery
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	asParent bool
	hold     bool // WithCommitEvents
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp, c.globalTP = otel.GetTracerProvider(), true
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	return c
}

// propagator is the configured propagator, or the global one as it is
// now (it may be set after NewObserver).
func (c *config) propagator() propagation.TextMapPropagator {
	if c.prop != nil {
		return c.prop
	}
	return otel.GetTextMapPropagator()
}

// WithTracerProvider sets the TracerProvider. Default: the global one
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the MeterProvider. Default: the global one
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets the propagator that reads the producer's context
// from the record headers. Default: the global one
// (otel.GetTextMapPropagator), read at each delivery.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithProducerAsParent makes the producer's span context, read from the
// record headers, the parent of the delivery span instead of a link, so
// that a trace viewer shows consumer work inside the producer's trace (as
// otelsarama does). A record without one gets a root span.
func WithProducerAsParent() Option {
	return func(c *config) { c.asParent = true }
}

// WithCommitEvents keeps the span of each delivery its handler acked open
// until a commit covers the record, adds a safeack.committed event to it
// then (safeack.commit.offset: the position committed) and ends it, so
// that a record's own span tells when its work became safe from
// redelivery. When the assignment ends first (a revocation, Close) the
// span ends at its final commit, with safeack.not_committed if that did
// not cover the record: the partition's next owner hands it out again.
// The span's duration is then from hand-out to commit; the
// messaging.process.duration histogram still ends at the ack.
//
// Only with a consumer group (nothing is committed without one), and only
// spans that record: each held span stays in memory until its commit,
// about a commit interval of acked records (more behind a record still in
// work), which for every span of a fast subscriber is a lot: sample.
func WithCommitEvents() Option {
	return func(c *config) { c.hold = true }
}

// headers is a propagation.TextMapCarrier over a consumed record's
// headers. Set does nothing: the record is consumed, not produced.
type headers []*sarama.RecordHeader

var _ propagation.TextMapCarrier = headers(nil)

func (h headers) Get(key string) string {
	for _, r := range h {
		if r != nil && string(r.Key) == key {
			return string(r.Value)
		}
	}
	return ""
}

func (h headers) Set(string, string) {}

func (h headers) Keys() []string {
	out := make([]string, 0, len(h))
	for _, r := range h {
		if r != nil {
			out = append(out, string(r.Key))
		}
	}
	return out
}
