package safeackotel_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/figures"
	"github.com/safeack/safeack/internal/kafkatest"
	safeackotel "github.com/safeack/safeack/otel"
)

// startShare starts a broker that serves share groups (skipping the test
// on a real cluster that does not) and a ShareSubscriber of a new group on
// a new topic of partitions, observed by obs (nil: none), subscribed until
// the test ends.
func startShare(t *testing.T, partitions int, obs safeack.Observer, mod func(*safeack.ShareSubscriberConfig)) (*kafkatest.Cluster, string, *safeack.ShareSubscriber, func() <-chan *message.Message) {
	t.Helper()
	c := kafkatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := safeack.CheckShareGroups(ctx, c.Brokers()); errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		t.Skipf("%v: needs Kafka 4.2+ with share groups enabled", err)
	} else if err != nil {
		t.Fatal(err)
	}
	topic := c.NewTopic(t, partitions)
	cfg := safeack.ShareSubscriberConfig{
		Brokers:       c.Brokers(),
		ShareGroup:    c.NewGroup(t),
		InitialOffset: sarama.OffsetOldest,
		DrainTimeout:  500 * time.Millisecond,
		MaxInFlight:   16,
		Observer:      obs,
	}
	if mod != nil {
		mod(&cfg)
	}
	sub, err := safeack.NewShareSubscriber(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	subscribe := func() <-chan *message.Message {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	return c, topic, sub, subscribe
}

func shareTotal(sub *safeack.ShareSubscriber) (accepted, released, rejected uint64) {
	for _, s := range sub.Stats() {
		accepted += s.Accepted
		released += s.Released
		rejected += s.Rejected
	}
	return accepted, released, rejected
}

func eventNames(s sdktrace.ReadOnlySpan) (out []string) {
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// processSpans returns the ended delivery spans of topic by partition and
// offset, in delivery count order (a released delivery's span may end
// after the next delivery's: the broker answers the release with the
// fetch that hands the record out again).
func processSpans(tel *telemetry, topic string) map[po][]sdktrace.ReadOnlySpan {
	out := map[po][]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		if s.Name() != "process "+topic {
			continue
		}
		a := attrs(s.Attributes())
		p, _ := strconv.Atoi(a["messaging.destination.partition.id"].AsString())
		k := po{int32(p), a["messaging.kafka.offset"].AsInt64()}
		out[k] = append(out[k], s)
	}
	for _, spans := range out {
		slices.SortStableFunc(spans, func(a, b sdktrace.ReadOnlySpan) int {
			return cmp.Compare(attrs(a.Attributes())[safeackotel.DeliveryCountKey].AsInt64(), attrs(b.Attributes())[safeackotel.DeliveryCountKey].AsInt64())
		})
	}
	return out
}

// TestShareTracesAndMetrics consumes records produced under producer spans
// through a ShareSubscriber with the Observer and RegisterShareMetrics (one
// record nacked once: released, then accepted at its second delivery),
// and reads what was recorded: one process span per delivery, linked to
// its producer's span, with the share group, the delivery count and a
// handler span nested under it, ended by the broker's answer to its
// acknowledgement (accept, or release for the nacked delivery); the
// instruments equal the ShareSubscriber's Stats of the same moment, figure
// by figure, with the share group as messaging.consumer.group.name.
func TestShareTracesAndMetrics(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	c, topic, sub, subscribe := startShare(t, 2, obs, nil)
	group := sub.ShareGroup()
	reg, err := safeackotel.RegisterShareMetrics(sub, tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	tracer := tel.tp.Tracer("test")
	const perPartition = 3
	producers := map[po]trace.SpanContext{}
	var recs []kafkatest.Record
	for p := int32(0); p < 2; p++ {
		for i := 0; i < perPartition; i++ {
			ctx, span := tracer.Start(context.Background(), "produce")
			h := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(ctx, h)
			span.End()
			recs = append(recs, kafkatest.Record{Partition: p, Value: []byte(fmt.Sprintf("v%d-%d", p, i)), Headers: h})
			producers[po{p, int64(i)}] = span.SpanContext()
		}
	}
	c.Produce(t, topic, recs...)

	msgs := subscribe()
	nackOnce := po{1, 1}
	var mu sync.Mutex
	handlerParent := map[trace.SpanID]po{}
	go func() {
		for m := range msgs {
			k := offsetOf(m)
			_, span := tracer.Start(m.Context(), "handle")
			span.End()
			mu.Lock()
			handlerParent[span.(sdktrace.ReadOnlySpan).Parent().SpanID()] = k
			mu.Unlock()
			if dc, _ := safeack.MessageDeliveryCountFromCtx(m.Context()); k == nackOnce && dc == 1 {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()

	const deliveries = 2*perPartition + 1
	var process map[po][]sdktrace.ReadOnlySpan
	kafkatest.WaitFor(t, 30*time.Second, "every delivery's span ended", func() bool {
		process = processSpans(tel, topic)
		n := 0
		for _, s := range process {
			n += len(s)
		}
		return n == deliveries
	})
	// A delivery is counted (Stats) just after its acknowledgement was
	// given to the client, its span ends at the broker's answer: the two
	// are not ordered.
	var accepted, released uint64
	kafkatest.WaitFor(t, 10*time.Second, "every acknowledgement counted", func() bool {
		accepted, released, _ = shareTotal(sub)
		return accepted+released >= deliveries
	})
	if accepted != 2*perPartition || released != 1 {
		t.Fatalf("accepted %d, released %d; want %d and 1", accepted, released, 2*perPartition)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, spans := range process {
		want := 1
		if k == nackOnce {
			want = 2
		}
		if len(spans) != want {
			t.Fatalf("%v: %d spans; want %d", k, len(spans), want)
		}
		for i, s := range spans {
			a := attrs(s.Attributes())
			dc := int64(i + 1)
			for key, v := range map[attribute.Key]string{
				"messaging.system":              "kafka",
				"messaging.operation.name":      "process",
				"messaging.destination.name":    topic,
				"messaging.consumer.group.name": group,
			} {
				if got := a[key].AsString(); got != v {
					t.Errorf("%v: %s = %q; want %q", k, key, got, v)
				}
			}
			if got := a[safeackotel.DeliveryCountKey].AsInt64(); got != dc {
				t.Errorf("%v delivery %d: delivery count %d", k, i, got)
			}
			if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != producers[k].SpanID() {
				t.Errorf("%v: links %+v; want the producer's span", k, links)
			}
			if got, ok := handlerParent[s.SpanContext().SpanID()]; !ok || got != k {
				t.Errorf("%v delivery %d: no handler span under it", k, i)
			}
			event, ack, status := safeackotel.EventAck, "accept", codes.Unset
			if k == nackOnce && i == 0 {
				event, ack, status = safeackotel.EventNack, "release", codes.Error
			}
			if ev := eventNames(s); len(ev) != 2 || ev[0] != event || ev[1] != safeackotel.EventShareAcknowledged {
				t.Errorf("%v delivery %d: events %v; want %s then %s", k, i, ev, event, safeackotel.EventShareAcknowledged)
			}
			if a[safeackotel.ShareAckKey].AsString() != ack || a[safeackotel.ShareReasonKey].AsString() != "answer" || s.Status().Code != status {
				t.Errorf("%v delivery %d: ack %v reason %v status %v; want %s, answer, %v", k, i,
					a[safeackotel.ShareAckKey], a[safeackotel.ShareReasonKey], s.Status(), ack, status)
			}
		}
	}
	// Nothing is committed in a share group.
	for _, s := range tel.spans.Ended() {
		if s.Name() == "commit "+topic {
			t.Errorf("a commit span for a share group")
		}
	}

	stats := figures.Views[figures.Share](sub.Stats())
	rm := tel.collect(t)
	type key struct{ name, partition, ack, reason string }
	got := map[key]float64{}
	var processN uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			add := func(set attribute.Set, v float64) {
				k := key{name: m.Name}
				if p, ok := set.Value("messaging.destination.partition.id"); ok {
					k.partition = p.AsString()
				}
				if g, _ := set.Value("messaging.consumer.group.name"); g.AsString() != group {
					t.Errorf("%s: group %q; want %q", m.Name, g.AsString(), group)
				}
				if a, ok := set.Value(safeackotel.ShareAckKey); ok {
					k.ack = a.AsString()
				}
				if r, ok := set.Value(safeackotel.SkipReasonKey); ok {
					k.reason = r.AsString()
				}
				got[k] = v
			}
			eachPoint(t, m, add)
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "messaging.process.duration" {
				for _, dp := range d.DataPoints {
					processN += dp.Count
				}
			}
		}
	}
	if len(stats) != 2 {
		t.Fatalf("stats of %d partitions; want 2", len(stats))
	}
	for i := range stats {
		s := &stats[i]
		p := strconv.Itoa(int(s.Partition))
		for _, g := range figures.ShareGauges {
			want, ok := g.Value(s)
			v, found := got[key{name: g.OTel, partition: p}]
			if ok != found || ok && v != want {
				t.Errorf("partition %s: %s = %v (found %v); want %v (present %v)", p, g.OTel, v, found, want, ok)
			}
		}
		for _, f := range figures.ShareCounters {
			v, found := got[key{name: f.OTel, partition: p, ack: f.Ack, reason: f.Reason}]
			if want := f.Value(s); !found || v != want {
				t.Errorf("partition %s: %s{%s%s} = %v (found %v); want %v", p, f.OTel, f.Ack, f.Reason, v, found, want)
			}
		}
	}
	for k, want := range map[key]float64{
		{name: "safeack.share.acknowledgements", partition: "0", ack: "accept"}:  perPartition,
		{name: "safeack.share.acknowledgements", partition: "1", ack: "accept"}:  perPartition,
		{name: "safeack.share.acknowledgements", partition: "1", ack: "release"}: 1,
		{name: "safeack.share.records.redelivered", partition: "1"}:              1,
		{name: "messaging.client.consumed.messages", partition: "1"}:             perPartition + 1,
		{name: "safeack.share.delivery_count.max", partition: "1"}:               2,
		{name: "safeack.messages.in_flight", partition: "0"}:                     0,
	} {
		if got[k] != want {
			t.Errorf("%+v = %v; want %v", k, got[k], want)
		}
	}
	if processN != deliveries {
		t.Errorf("messaging.process.duration counted %d answers; want %d", processN, deliveries)
	}
}

// TestShareObserverMaxDeliveries: a record nacked at every delivery, with
// MaxDeliveries 2, is released at its first delivery and rejected at its
// second (the delivery limit): two spans, the second with the reject
// acknowledgement and reason max_deliveries, and no third delivery.
func TestShareObserverMaxDeliveries(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	c, topic, sub, subscribe := startShare(t, 1, obs, func(cfg *safeack.ShareSubscriberConfig) { cfg.MaxDeliveries = 2 })
	c.Produce(t, topic, kafkatest.Record{Value: []byte("poison")}, kafkatest.Record{Value: []byte("fine")})
	msgs := subscribe()
	go func() {
		for m := range msgs {
			if string(m.Payload) == "poison" {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	var spans []sdktrace.ReadOnlySpan
	kafkatest.WaitFor(t, 30*time.Second, "the poison record rejected and its spans ended", func() bool {
		spans = processSpans(tel, topic)[po{0, 0}]
		_, _, rejected := shareTotal(sub)
		return rejected == 1 && len(spans) == 2
	})
	for i, want := range []struct {
		ack, reason string
		dc          int64
	}{{"release", "answer", 1}, {"reject", "max_deliveries", 2}} {
		a := attrs(spans[i].Attributes())
		if a[safeackotel.ShareAckKey].AsString() != want.ack || a[safeackotel.ShareReasonKey].AsString() != want.reason ||
			a[safeackotel.DeliveryCountKey].AsInt64() != want.dc || a[safeackotel.OutcomeKey].AsString() != "nack" {
			t.Errorf("delivery %d: ack %v, reason %v, delivery count %v, outcome %v; want %s, %s, %d, nack", i,
				a[safeackotel.ShareAckKey], a[safeackotel.ShareReasonKey], a[safeackotel.DeliveryCountKey], a[safeackotel.OutcomeKey],
				want.ack, want.reason, want.dc)
		}
		if ev := eventNames(spans[i]); len(ev) != 2 || ev[0] != safeackotel.EventNack || ev[1] != safeackotel.EventShareAcknowledged {
			t.Errorf("delivery %d: events %v", i, ev)
		}
		if spans[i].Status().Code != codes.Error {
			t.Errorf("delivery %d: status %v; want Error", i, spans[i].Status())
		}
	}
	// A rejected record is archived: no third delivery, even once a
	// record produced after the rejection was delivered and answered.
	c.Produce(t, topic, kafkatest.Record{Value: []byte("later")})
	kafkatest.WaitFor(t, 30*time.Second, "the later record's span", func() bool { return len(processSpans(tel, topic)[po{0, 2}]) == 1 })
	if n := len(processSpans(tel, topic)[po{0, 0}]); n != 2 {
		t.Errorf("%d deliveries of the rejected record; want 2", n)
	}
}
