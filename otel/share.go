package safeackotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
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
// safeack.share.lock_renewals. Every series carries messaging.system,
// messaging.destination.name, messaging.destination.partition.id and
// messaging.consumer.group.name (the share group), for every partition
// sub received records of. Unregister the returned Registration before
// dropping sub.
func RegisterShareMetrics(sub *safeack.ShareSubscriber, opts ...Option) (metric.Registration, error) {
	cfg := newConfig(opts)
	meter := cfg.mp.Meter(ScopeName)
	group := sub.ShareGroup()

	var insts []metric.Observable
	type gauge struct {
		f    *figures.ShareGauge
		inst gaugeInstrument
	}
	gauges := make([]gauge, len(figures.ShareGauges))
	var err error
	for i := range figures.ShareGauges {
		f := &figures.ShareGauges[i]
		inst, o, err := newGaugeInstrument(meter, f.OTel, f.Unit, f.Help, f.Float)
		if err != nil {
			return nil, err
		}
		gauges[i] = gauge{f: f, inst: inst}
		insts = append(insts, o)
	}
	type counter struct {
		f *figures.ShareCounter
		i metric.Int64ObservableCounter
	}
	counters := make([]counter, len(figures.ShareCounters))
	made := map[string]metric.Int64ObservableCounter{} // entries of one name (ack, reason) share an instrument
	for i := range figures.ShareCounters {
		f := &figures.ShareCounters[i]
		inst, ok := made[f.OTel]
		if !ok {
			help := f.Help
			if f.Ack != "" {
				help = "Records acknowledged, by acknowledgement (safeack.share.ack): accept, release (delivered again) or reject (archived)."
			}
			inst, err = meter.Int64ObservableCounter(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(help))
			if err != nil {
				return nil, err
			}
			insts = append(insts, inst)
			made[f.OTel] = inst
		}
		counters[i] = counter{f: f, i: inst}
	}

	return meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		stats := sub.Stats()
		for i := range stats {
			s := &stats[i]
			base := baseAttrs(group, s.Topic, s.Partition)
			at := metric.WithAttributeSet(attribute.NewSet(base...))
			for _, g := range gauges {
				if v, ok := g.f.Value(s); ok {
					g.inst.observe(obs, v, at)
				}
			}
			for _, c := range counters {
				o := at
				switch {
				case c.f.Ack != "":
					o = metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], ShareAckKey.String(c.f.Ack))...))
				case c.f.Reason != "":
					o = metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], SkipReasonKey.String(c.f.Reason))...))
				case c.f.OTel == consumedMessages:
					// The conventions require the operation on this one.
					o = metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], semconv.MessagingOperationName("process"))...))
				}
				obs.ObserveInt64(c.i, int64(c.f.Value(s)), o)
			}
		}
		return nil
	}, insts...)
}
