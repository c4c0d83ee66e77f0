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
// the partitions sub owns at the collection; counters
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
	type gauge struct {
		f    *figures.Gauge
		inst gaugeInstrument
	}
	gauges := make([]gauge, len(figures.Gauges))
	for i := range figures.Gauges {
		f := &figures.Gauges[i]
		inst, o, err := newGaugeInstrument(meter, f.OTel, f.Unit, f.Help, f.Float)
		if err != nil {
			return nil, err
		}
		gauges[i] = gauge{f: f, inst: inst}
		insts = append(insts, o)
	}
	type counter struct {
		f  *figures.Counter
		i  metric.Int64ObservableCounter
		fl metric.Float64ObservableCounter
	}
	counters := make([]counter, len(figures.Counters))
	made := map[string]counter{} // entries of one name (reasons) share an instrument
	for i := range figures.Counters {
		f := &figures.Counters[i]
		c, ok := made[f.OTel]
		if !ok {
			if f.Float {
				c.fl, err = meter.Float64ObservableCounter(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(f.Help))
				insts = append(insts, c.fl)
			} else {
				c.i, err = meter.Int64ObservableCounter(f.OTel, metric.WithUnit(f.Unit), metric.WithDescription(f.Help))
				insts = append(insts, c.i)
			}
			if err != nil {
				return nil, err
			}
			made[f.OTel] = c
		}
		c.f = f
		counters[i] = c
	}

	var ownedAttrs []attribute.KeyValue
	ownedAttrs = append(ownedAttrs, semconv.MessagingSystemKafka)
	if group != "" {
		ownedAttrs = append(ownedAttrs, semconv.MessagingConsumerGroupName(group))
	}
	ownedOpt := metric.WithAttributeSet(attribute.NewSet(ownedAttrs...))

	return meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		stats := figures.Merged(sub.Stats())
		obs.ObserveInt64(owned, int64(len(stats)), ownedOpt)
		for i := range stats {
			s := &stats[i]
			at := metric.WithAttributeSet(attribute.NewSet(baseAttrs(group, s.Topic, s.Partition)...))
			for _, g := range gauges {
				if v, ok := g.f.Value(s); ok {
					g.inst.observe(obs, v, at)
				}
			}
		}
		totals := sub.Totals()
		for i := range totals {
			t := &totals[i]
			base := baseAttrs(group, t.Topic, t.Partition)
			at := metric.WithAttributeSet(attribute.NewSet(base...))
			for _, c := range counters {
				o := at
				switch {
				case c.f.Reason != "":
					o = metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], SkipReasonKey.String(c.f.Reason))...))
				case c.f.OTel == consumedMessages:
					// The conventions require the operation on this one.
					o = metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], semconv.MessagingOperationName("process"))...))
				}
				if c.f.Float {
					obs.ObserveFloat64(c.fl, c.f.Value(t), o)
				} else {
					obs.ObserveInt64(c.i, int64(c.f.Value(t)), o)
				}
			}
		}
		return nil
	}, insts...)
}

// gaugeInstrument is the OpenTelemetry gauge of one figure: a float or an
// int gauge, as the figure says.
type gaugeInstrument struct {
	i  metric.Int64ObservableGauge
	fl metric.Float64ObservableGauge
}

func newGaugeInstrument(meter metric.Meter, name, unit, help string, float bool) (gaugeInstrument, metric.Observable, error) {
	if float {
		fl, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(help))
		return gaugeInstrument{fl: fl}, fl, err
	}
	i, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(help))
	return gaugeInstrument{i: i}, i, err
}

func (g gaugeInstrument) observe(obs metric.Observer, v float64, at metric.ObserveOption) {
	if g.fl != nil {
		obs.ObserveFloat64(g.fl, v, at)
		return
	}
	obs.ObserveInt64(g.i, int64(v), at)
}
