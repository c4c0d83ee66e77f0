package safeackotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
)

// Attribute keys and the event of a ShareSubscriber's deliveries (share
// groups, KIP-932), where the semantic conventions have none.
const (
	// DeliveryCountKey is, on a share delivery's span, the record's share
	// group delivery count (1 at its first delivery), as
	// messaging.servicebus.message.delivery_count is for Service Bus.
	DeliveryCountKey = attribute.Key("safeack.share.delivery_count")
	// ShareAckKey is the acknowledgement sent for a share delivery's
	// record: accept, release or reject (safeack.ShareAck's String). On
	// the instrument safeack.share.acknowledgements it tells the three
	// series apart.
	ShareAckKey = attribute.Key("safeack.share.ack")
	// ShareReasonKey is why that acknowledgement was sent: answer, poison,
	// max_deliveries, dead_lettered, dead_letter_failed, closing
	// (safeack.ShareAckReason's String).
	ShareReasonKey = attribute.Key("safeack.share.reason")

	// EventShareAcknowledged ends a share delivery's span once the broker
	// answered its acknowledgement (or the member left), with ShareAckKey
	// and ShareReasonKey.
	EventShareAcknowledged = "safeack.share.acknowledged"
)

// shareDelivered wraps the DeliveryObserver of a ShareSubscriber's
// delivery (d.DeliveryCount > 0): its span ends when the broker answered
// the acknowledgement, not at the answer.
func shareDelivered(dv *delivery, d safeack.Delivery) safeack.DeliveryObserver {
	dv.addAttrs(DeliveryCountKey.Int(int(d.DeliveryCount)))
	return &shareDelivery{dv}
}

// shareDelivery is the DeliveryObserver of one delivery of a
// ShareSubscriber.
type shareDelivery struct{ *delivery }

var _ safeack.ShareDeliveryObserver = (*shareDelivery)(nil)

// Answered adds the outcome's event and records the processing duration,
// as for a Subscriber's delivery; the span stays open for Acknowledged.
func (s *shareDelivery) Answered(out safeack.Outcome, err error) {
	if s.answer(out, err) {
		s.addAttrs(OutcomeKey.String(out.String()))
	}
}

// Acknowledged adds the acknowledgement's event and ends the span; a
// refused or unconfirmed acknowledgement sets the span's status to Error.
func (s *shareDelivery) Acknowledged(a safeack.ShareAcknowledgement) {
	span := s.span
	if span.IsRecording() {
		kv := []attribute.KeyValue{ShareAckKey.String(a.Ack.String()), ShareReasonKey.String(a.Reason.String())}
		s.setAttrs(kv...)
		span.AddEvent(EventShareAcknowledged, trace.WithAttributes(kv...))
	}
	if a.Err != nil {
		span.RecordError(a.Err)
		span.SetStatus(codes.Error, a.Err.Error())
	}
	span.End()
}

// RegisterShareMetrics creates, with the configured (or global)
// MeterProvider, observable instruments for the figures of sub's Stats,
// and registers one callback that reads them on each collection: the same
// figures, from the same list, that the Prometheus ShareCollector of
// package metrics exports. Gauges: safeack.messages.in_flight,
// safeack.offset.oldest_unfinished (absent when nothing is in flight),
// safeack.oldest_unfinished.age and safeack.share.delivery_count.max.
// Counters, since sub was made: messaging.client.consumed.messages
// (records received, redeliveries included), safeack.unmarshal_failures,
// safeack.completions.deferred, safeack.share.acknowledgements (one
// series per safeack.share.ack: accept, release, reject),
// safeack.share.records.dead_lettered,
// safeack.share.records.released_at_close,
// safeack.share.records.redelivered, safeack.share.ack_errors,
// safeack.records.skipped (safeack.skip.reason "closing") and
// safeack.share.lock_renewals and safeack.share.records.given_back. Every series carries messaging.system,
// messaging.destination.name, messaging.destination.partition.id and
// messaging.consumer.group.name (the share group), for every partition
// sub received records of. Unregister the returned Registration before
// dropping sub.
func RegisterShareMetrics(sub *safeack.ShareSubscriber, opts ...Option) (metric.Registration, error) {
	cfg := newConfig(opts)
	meter := cfg.mp.Meter(ScopeName)
	group := sub.ShareGroup()

	var insts []metric.Observable
	gauges, err := newGaugeSet(meter, figures.ShareGauges, &insts)
	if err != nil {
		return nil, err
	}
	counters, err := newCounterSet(meter, figures.ShareCounters, &insts)
	if err != nil {
		return nil, err
	}

	return meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		stats := figures.Views[figures.Share](sub.Stats())
		for i := range stats {
			s := &stats[i]
			base := baseAttrs(group, s.Topic, s.Partition)
			gauges.observe(obs, s, base)
			counters.observe(obs, s, base)
		}
		return nil
	}, insts...)
}
