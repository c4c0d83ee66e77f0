package safeackotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
)

// consumedMessages is the messaging conventions' counter of messages
// handed to the application.
const consumedMessages = "messaging.client.consumed.messages"

// RegisterMetrics creates, with the configured (or global) MeterProvider,
// observable instruments for the figures of sub's Stats and Totals, and
// registers one callback that reads both on each collection: the same
// figures the Prometheus collector of package metrics exports, from the same
// list. Gauges (safeack.offset.safe, safeack.offset.committed,
// safeack.records.blocked, safeack.oldest_unfinished.age,
// safeack.messages.in_flight, safeack.tail.size, safeack.lag, ...) describe
// the partitions sub owns at the collection, and safeack.unclaimed.time the
// partitions assigned to it that it does not consume (Unclaimed); counters
// (messaging.client.consumed.messages, safeack.records.completed,
// safeack.redeliveries, ...) come from Totals, so they never go down
// across reassignments. A figure a partition does not have yet (a committed
// offset not read back, no unfinished record) is left out. Unregister the
// returned Registration before dropping sub.
func RegisterMetrics(sub *safeack.Subscriber, opts ...Option) (metric.Registration, error) {
	cfg := newConfig(opts)
	meter := cfg.mp.Meter(ScopeName)
	group := sub.ConsumerGroup()

	owned, err := meter.Int64ObservableGauge(figures.Owned.OTel, metric.WithUnit(figures.Owned.Unit), metric.WithDescription(figures.Owned.Help))
	if err != nil {
		return nil, err
	}
	insts := []metric.Observable{owned}
	gauges, err := newGaugeSet(meter, figures.Gauges, &insts)
	if err != nil {
		return nil, err
	}
	unclaimed, err := newGaugeSet(meter, figures.UnclaimedGauges, &insts)
	if err != nil {
		return nil, err
	}
	counters, err := newCounterSet(meter, figures.Counters, &insts)
	if err != nil {
		return nil, err
	}

	var ownedAttrs []attribute.KeyValue
	ownedAttrs = append(ownedAttrs, semconv.MessagingSystemKafka)
	if group != "" {
		ownedAttrs = append(ownedAttrs, semconv.MessagingConsumerGroupName(group))
	}
	ownedOpt := metric.WithAttributeSet(attribute.NewSet(ownedAttrs...))

	return meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		stats := figures.Merged(figures.Views[figures.Partition](sub.Stats()))
		obs.ObserveInt64(owned, int64(len(stats)), ownedOpt)
		for i := range stats {
			s := &stats[i]
			gauges.observe(obs, s, baseAttrs(group, s.Topic, s.Partition))
		}
		for _, u := range figures.Views[figures.Unclaimed](sub.Unclaimed()) {
			unclaimed.observe(obs, &u, baseAttrs(group, u.Topic, u.Partition))
		}
		totals := figures.Views[figures.Totals](sub.Totals())
		for i := range totals {
			t := &totals[i]
			counters.observe(obs, t, baseAttrs(group, t.Topic, t.Partition))
		}
		return nil
	}, insts...)
}

// gaugeSet is the OpenTelemetry gauges of a list of figures, one each.
type gaugeSet[S any] struct {
	figs  []figures.Gauge[S]
	insts []gaugeInstrument
}

// newGaugeSet makes the gauges of figs, adding them to insts.
func newGaugeSet[S any](meter metric.Meter, figs []figures.Gauge[S], insts *[]metric.Observable) (gaugeSet[S], error) {
	g := gaugeSet[S]{figs: figs}
	for _, f := range figs {
		var gi gaugeInstrument
		var o metric.Observable
		var err error
		if f.Float {
			gi.fl, err = meter.Float64ObservableGauge(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(f.Help))
			o = gi.fl
		} else {
			gi.i, err = meter.Int64ObservableGauge(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(f.Help))
			o = gi.i
		}
		if err != nil {
			return g, err
		}
		g.insts = append(g.insts, gi)
		*insts = append(*insts, o)
	}
	return g, nil
}

// observe observes the figures s has, with attributes base.
func (g gaugeSet[S]) observe(obs metric.Observer, s *S, base []attribute.KeyValue) {
	at := metric.WithAttributeSet(attribute.NewSet(base...))
	for i, f := range g.figs {
		v, ok := f.Value(s)
		switch {
		case !ok:
		case f.Float:
			obs.ObserveFloat64(g.insts[i].fl, v, at)
		default:
			obs.ObserveInt64(g.insts[i].i, int64(v), at)
		}
	}
}

// gaugeInstrument is the OpenTelemetry gauge of one figure: a float or an
// int gauge, as the figure says.
type gaugeInstrument struct {
	i  metric.Int64ObservableGauge
	fl metric.Float64ObservableGauge
}

// counterSet is the OpenTelemetry counters of a list of figures: entries
// of one name (differing in reason or acknowledgement) share one.
type counterSet[S any] struct {
	figs  []figures.Counter[S]
	insts []counterInstrument
}

// counterInstrument is the OpenTelemetry counter of one figure: a float or
// an int counter, as the figure says.
type counterInstrument struct {
	i  metric.Int64ObservableCounter
	fl metric.Float64ObservableCounter
}

// newCounterSet makes the counters of figs, adding them to insts.
func newCounterSet[S any](meter metric.Meter, figs []figures.Counter[S], insts *[]metric.Observable) (counterSet[S], error) {
	c := counterSet[S]{figs: figs}
	made := map[string]counterInstrument{}
	for _, f := range figs {
		ci, ok := made[f.OTel]
		if !ok {
			help := f.Help
			if f.OTelHelp != "" {
				help = f.OTelHelp
			}
			var err error
			if f.Float {
				ci.fl, err = meter.Float64ObservableCounter(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(help))
				*insts = append(*insts, ci.fl)
			} else {
				ci.i, err = meter.Int64ObservableCounter(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(help))
				*insts = append(*insts, ci.i)
			}
			if err != nil {
				return c, err
			}
			made[f.OTel] = ci
		}
		c.insts = append(c.insts, ci)
	}
	return c, nil
}

// observe observes every figure of s, with attributes base and the
// entry's own.
func (c counterSet[S]) observe(obs metric.Observer, s *S, base []attribute.KeyValue) {
	var at metric.ObserveOption = metric.WithAttributeSet(attribute.NewSet(base...))
	with := func(kv attribute.KeyValue) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], kv)...))
	}
	for i, f := range c.figs {
		o := at
		switch {
		case f.Ack != "":
			o = with(ShareAckKey.String(f.Ack))
		case f.Reason != "":
			o = with(SkipReasonKey.String(f.Reason))
		case f.OTel == consumedMessages:
			// The conventions require the operation on this one.
			o = with(semconv.MessagingOperationName("process"))
		}
		if f.Float {
			obs.ObserveFloat64(c.insts[i].fl, f.Value(s), o)
		} else {
			obs.ObserveInt64(c.insts[i].i, int64(f.Value(s)), o)
		}
	}
}
