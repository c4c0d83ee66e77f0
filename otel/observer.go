package safeackotel

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack"
)

// Attribute keys of safeack's own, where the semantic conventions have
// none.
const (
	// OutcomeKey is what became of a delivery: ack, nack, skipped,
	// abandoned (safeack.Outcome's String).
	OutcomeKey = attribute.Key("safeack.outcome")
	// PreviousOffsetKey is, on a commit span's partition event, the
	// position this Observer last saw committed for the partition.
	PreviousOffsetKey = attribute.Key("safeack.commit.previous_offset")
	// TailSizeKey is the size in bytes of the completed tail in a commit's
	// metadata.
	TailSizeKey = attribute.Key("safeack.tail.size")
	// OutputsKey counts the messages produced in a transaction.
	OutputsKey = attribute.Key("safeack.transaction.outputs")
	// CommitOffsetKey is, on a delivery span's safeack.committed event,
	// the position committed: the offset of the next record to consume.
	CommitOffsetKey = attribute.Key("safeack.commit.offset")
	// FinalKey marks, on a commit span, the final commit of an ending
	// assignment (safeack.CommitEvent.Final).
	FinalKey = attribute.Key("safeack.commit.final")
	// SkipReasonKey tells the two series of safeack.records.skipped apart:
	// tail or revoked.
	SkipReasonKey = attribute.Key("safeack.skip.reason")
)

// Event names on the spans.
const (
	EventAck                = "safeack.ack"
	EventNack               = "safeack.nack"
	EventDeferred           = "safeack.deferred"
	EventSkipped            = "safeack.skipped"
	EventAbandoned          = "safeack.abandoned"
	EventPartitionCommitted = "safeack.partition.committed"
	// EventCommitted and EventNotCommitted end a delivery span held by
	// WithCommitEvents.
	EventCommitted    = "safeack.committed"
	EventNotCommitted = "safeack.not_committed"
)

// durationBuckets are the bucket boundaries the messaging semantic
// conventions advise for duration histograms, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Observer is a safeack.Observer that traces deliveries and commits with
// OpenTelemetry, and records their durations (see the package
// documentation). Set it in safeack.SubscriberConfig.Observer. One
// Observer may serve several Subscribers.
type Observer struct {
	cfg     config
	tracing atomic.Pointer[tracing]
	process metric.Float64Histogram
	commits metric.Float64Histogram

	// parts holds each partition's *partAttrs: read at every delivery,
	// by every partition's worker at once, and written once per
	// partition (a sync.Map reads without writing shared memory).
	parts    sync.Map
	mu       sync.Mutex
	previous map[partKey]int64 // last position seen committed
}

var _ safeack.Observer = (*Observer)(nil)

type partKey struct {
	group, topic string
	partition    int32
}

// partAttrs are the attributes of one partition's spans and measurements,
// made once.
type partAttrs struct {
	spanName     string
	span         []attribute.KeyValue
	ok, nack     []metric.RecordOption // one option each, made once
	partitionAtt attribute.KeyValue

	// WithCommitEvents: the acked deliveries waiting for a commit, and
	// the partition's assignment (counted up at each final commit) that
	// a delivery must belong to to wait.
	mu         sync.Mutex
	held       []*delivery
	assignment uint64
}

// NewObserver returns an Observer with the tracer and meter of the
// configured (or global) providers. It fails only when the meter refuses
// to create the duration histograms.
func NewObserver(opts ...Option) (*Observer, error) {
	o := &Observer{cfg: newConfig(opts), previous: map[partKey]int64{}}
	o.tracing.Store(newTracing(o.cfg.tp))
	meter := o.cfg.mp.Meter(ScopeName)
	var err error
	o.process, err = meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of processing operation: from hand-out to the message's answer."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, err
	}
	o.commits, err = meter.Float64Histogram("messaging.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of messaging operation initiated by a producer or consumer client: here the commits of completed prefixes."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, err
	}
	return o, nil
}

// baseAttrs are the attributes every span and measurement of a
// topic-partition carry.
func baseAttrs(group, topic string, partition int32) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.FormatInt(int64(partition), 10)),
	}
	if group != "" {
		kv = append(kv, semconv.MessagingConsumerGroupName(group))
	}
	return kv
}

func (o *Observer) partition(group, topic string, partition int32) *partAttrs {
	k := partKey{group, topic, partition}
	if pa, ok := o.parts.Load(k); ok {
		return pa.(*partAttrs)
	}
	base := baseAttrs(group, topic, partition)
	op := []attribute.KeyValue{semconv.MessagingOperationName("process"), semconv.MessagingOperationTypeProcess}
	span := append(append([]attribute.KeyValue{}, base...), op...)
	pa := &partAttrs{
		spanName:     "process " + topic,
		span:         span,
		ok:           []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(span...))},
		nack:         []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, span...), semconv.ErrorTypeKey.String("nack"))...))},
		partitionAtt: base[2],
	}
	actual, _ := o.parts.LoadOrStore(k, pa)
	return actual.(*partAttrs)
}

// consumerSpan is the options every delivery span starts with, made once:
// an option built per delivery costs an allocation.
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// Delivered starts the delivery's span (see the package documentation).
// The attributes and the link to the producer are added only to a span
// that records (sampled, with an SDK installed): a sampler sees the span's
// name and kind and, with WithProducerAsParent, its parent.
func (o *Observer) Delivered(ctx context.Context, d safeack.Delivery) (context.Context, safeack.DeliveryObserver) {
	rec := d.Record
	if o.cfg.asParent && len(rec.Headers) > 0 {
		// Kept in the handler's context even without tracing: logs can
		// still name the producer's trace.
		if producer := o.producer(rec.Headers); producer.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
		}
	}
	tr := o.currentTracing()
	if tr.off && !o.process.Enabled(ctx) {
		return ctx, nil
	}
	pa := o.partition(d.Group, rec.Topic, rec.Partition)
	if tr.off {
		return ctx, &delivery{o: o, span: noSpan, start: time.Now(), pa: pa}
	}
	ctx, span := tr.tracer.Start(ctx, pa.spanName, consumerSpan...)
	if !span.IsRecording() && !o.process.Enabled(ctx) {
		// Nothing to record at the answer: a span that does not record
		// needs no End, and the histogram takes nothing (no SDK
		// installed, or a view drops it).
		return ctx, nil
	}
	dv := &delivery{o: o, span: span, start: time.Now(), pa: pa, offset: rec.Offset}
	if span.IsRecording() {
		dv.attrs = recordAttrs(pa, rec, d)
		if !o.cfg.asParent && len(rec.Headers) > 0 {
			if producer := o.producer(rec.Headers); producer.IsValid() {
				span.AddLink(trace.Link{SpanContext: producer})
			}
		}
	}
	if d.DeliveryCount > 0 {
		return ctx, shareDelivered(dv, d) // a share group: nothing is committed (share.go)
	}
	if o.cfg.hold && d.Group != "" && span.IsRecording() {
		dv.hold = true
		pa.mu.Lock()
		dv.assignment = pa.assignment
		pa.mu.Unlock()
	}
	return ctx, dv
}

// recordAttrs are the attributes of a recording delivery span, with room
// for those its answer adds (see delivery.attrs).
func recordAttrs(pa *partAttrs, rec *sarama.ConsumerMessage, d safeack.Delivery) []attribute.KeyValue {
	room := len(pa.span) + 5 + 1 // the record's, the outcome
	if d.DeliveryCount > 0 {
		room += 3 // delivery count, acknowledgement and its reason (share.go)
	}
	attrs := make([]attribute.KeyValue, 0, room)
	attrs = append(attrs, pa.span...)
	attrs = append(attrs, semconv.MessagingKafkaOffset(int(rec.Offset)), semconv.MessagingMessageBodySize(len(rec.Value)))
	if rec.Value == nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageTombstone(true))
	}
	if len(rec.Key) > 0 && utf8.Valid(rec.Key) {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(rec.Key)))
	}
	if d.Message != nil && d.Message.UUID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(d.Message.UUID))
	}
	return attrs
}

// noSpan is the span of a delivery without tracing: a no-op span that
// takes no allocation.
var noSpan = trace.SpanFromContext(context.Background())

// producer returns the span context the propagator finds in a record's
// headers.
func (o *Observer) producer(h []*sarama.RecordHeader) trace.SpanContext {
	return trace.SpanContextFromContext(o.cfg.propagator().Extract(context.Background(), headers(h)))
}

// delivery is the DeliveryObserver of one delivery.
type delivery struct {
	o          *Observer
	span       trace.Span
	start      time.Time
	pa         *partAttrs
	offset     int64
	hold       bool   // WithCommitEvents: an ack waits for its commit
	assignment uint64 // the partition's assignment when delivered
	// attrs are a recording span's attributes, given to it in one call
	// once it is answered (nil: given, or the span does not record). Each
	// SetAttributes grows the span's own slice: two calls cost an
	// allocation and a copy of every attribute more.
	attrs []attribute.KeyValue
}

// addAttrs adds kv to the attributes the span is to get.
func (d *delivery) addAttrs(kv ...attribute.KeyValue) {
	if d.attrs != nil {
		d.attrs = append(d.attrs, kv...)
	}
}

// setAttrs gives the span its attributes with kv.
func (d *delivery) setAttrs(kv ...attribute.KeyValue) {
	if d.attrs != nil {
		d.span.SetAttributes(append(d.attrs, kv...)...)
		d.attrs = nil
	}
}

// answer adds the outcome's event and, for an ack or a nack, records the
// processing duration. It reports false for a deferral: the delivery is
// answered once it is resolved.
func (d *delivery) answer(out safeack.Outcome, err error) bool {
	// The span and its events take the SDK's own timestamps: passing one
	// costs an allocation per option.
	switch out {
	case safeack.OutcomeDeferred:
		d.span.AddEvent(EventDeferred)
		return false
	case safeack.OutcomeAck:
		d.span.AddEvent(EventAck)
		d.o.process.Record(context.Background(), time.Since(d.start).Seconds(), d.pa.ok...)
	case safeack.OutcomeNack:
		d.span.AddEvent(EventNack)
		desc := "nacked"
		if err != nil {
			d.span.RecordError(err)
			desc = err.Error()
		}
		d.span.SetStatus(codes.Error, desc)
		d.o.process.Record(context.Background(), time.Since(d.start).Seconds(), d.pa.nack...)
	case safeack.OutcomeSkipped:
		d.span.AddEvent(EventSkipped)
	case safeack.OutcomeAbandoned:
		d.span.AddEvent(EventAbandoned)
	}
	return true
}

// Answered adds the outcome's event and ends the span (a deferred
// completion: once resolved).
func (d *delivery) Answered(out safeack.Outcome, err error) {
	if !d.answer(out, err) {
		return
	}
	d.setAttrs(OutcomeKey.String(out.String()))
	if out == safeack.OutcomeAck && d.hold {
		pa := d.pa
		pa.mu.Lock()
		if d.assignment == pa.assignment {
			pa.held = append(pa.held, d)
			pa.mu.Unlock()
			return
		}
		pa.mu.Unlock()
		// Acked after its assignment's final commit: no commit of it
		// covers the record.
		d.span.AddEvent(EventNotCommitted)
	}
	d.span.End()
}

// settle ends the held spans of the partition that p covers, with a
// safeack.committed event at end; with final (the assignment is over),
// the others too, with safeack.not_committed.
func (pa *partAttrs) settle(p safeack.CommittedPartition, ok, final bool, end time.Time) {
	pa.mu.Lock()
	var done []*delivery
	kept := pa.held[:0]
	for _, d := range pa.held {
		if ok && p.Covers(d.offset) || final {
			done = append(done, d)
		} else {
			kept = append(kept, d)
		}
	}
	clear(pa.held[len(kept):])
	pa.held = kept
	if final {
		pa.assignment++
	}
	pa.mu.Unlock()
	if len(done) == 0 {
		return
	}
	at := trace.WithTimestamp(end)
	committed := trace.WithAttributes(CommitOffsetKey.Int64(p.Offset))
	for _, d := range done {
		if ok && p.Covers(d.offset) {
			d.span.AddEvent(EventCommitted, at, committed)
		} else {
			d.span.AddEvent(EventNotCommitted, at)
		}
		d.span.End(at)
	}
}

// Committed records a span for the commit (see the package documentation)
// and its duration.
func (o *Observer) Committed(ev safeack.CommitEvent) {
	op, name := "commit", "commit "+ev.Topic
	if ev.Transactional {
		name = "commit_transaction " + ev.Topic
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingDestinationName(ev.Topic),
		semconv.MessagingOperationName(op),
		semconv.MessagingOperationTypeSettle,
	}
	if ev.Group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(ev.Group))
	}
	spanAttrs := attrs[:len(attrs):len(attrs)]
	if ev.Transactional {
		spanAttrs = append(spanAttrs, OutputsKey.Int(ev.Outputs))
	}
	if ev.Final {
		spanAttrs = append(spanAttrs, FinalKey.Bool(true))
	}
	_, span := o.currentTracing().tracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(ev.Start), trace.WithAttributes(spanAttrs...))
	end := ev.Start.Add(ev.Duration)
	o.mu.Lock()
	for _, p := range ev.Partitions {
		k := partKey{ev.Group, ev.Topic, p.Partition}
		pattrs := []attribute.KeyValue{
			semconv.MessagingDestinationPartitionID(strconv.FormatInt(int64(p.Partition), 10)),
			semconv.MessagingKafkaOffset(int(p.Offset)),
			TailSizeKey.Int(p.TailBytes),
		}
		if prev, ok := o.previous[k]; ok {
			pattrs = append(pattrs, PreviousOffsetKey.Int64(prev))
		}
		span.AddEvent(EventPartitionCommitted, trace.WithTimestamp(end), trace.WithAttributes(pattrs...))
		if ev.Err == nil {
			o.previous[k] = p.Offset
		}
	}
	o.mu.Unlock()
	if o.cfg.hold {
		for _, p := range ev.Partitions {
			o.partition(ev.Group, ev.Topic, p.Partition).settle(p, ev.Err == nil, ev.Final, end)
		}
	}
	mattrs := attrs
	if ev.Err != nil {
		span.RecordError(ev.Err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, ev.Err.Error())
		mattrs = append(mattrs[:len(mattrs):len(mattrs)], semconv.ErrorTypeKey.String("_OTHER"))
	}
	span.End(trace.WithTimestamp(end))
	o.commits.Record(context.Background(), ev.Duration.Seconds(), metric.WithAttributes(mattrs...))
}
