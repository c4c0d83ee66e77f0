package safeackotel_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/figures"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
	safeackotel "github.com/safeack/safeack/otel"
)

func testLogger() watermill.LoggerAdapter { return safeacktest.Logger() }

// telemetry is an SDK tracer and meter provider that keep what they record.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

func (tel *telemetry) options() []safeackotel.Option {
	return []safeackotel.Option{
		safeackotel.WithTracerProvider(tel.tp),
		safeackotel.WithMeterProvider(tel.mp),
		safeackotel.WithPropagator(propagation.TraceContext{}),
	}
}

func (tel *telemetry) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// subscribe makes a subscriber of group observed by tel (newSubscriber)
// and subscribes it to topic until the test ends.
func (tel *telemetry) subscribe(t *testing.T, c *kafkatest.Cluster, group, topic string) <-chan *message.Message {
	t.Helper()
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(t, c, group, obs)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func newSubscriber(t *testing.T, c *kafkatest.Cluster, group string, obs safeack.Observer) *safeack.Subscriber {
	t.Helper()
	return safeacktest.NewSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Observer = obs })
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		out[kv.Key] = kv.Value
	}
	return out
}

type po struct {
	p int32
	o int64
}

func offsetOf(m *message.Message) po {
	p, _ := safeack.MessagePartitionFromCtx(m.Context())
	o, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
	return po{p, o}
}

// TestTracesFollowRecords produces records under producer spans, consumes
// them through a Subscriber with the Observer (one nacked once, one held
// back until the end), and reads the recorded spans: one process span per
// delivery with the messaging attributes, linked to its producer's span,
// a handler span nested under it, ack and nack events, and commit spans whose
// last positions are the partitions' ends.
func TestTracesFollowRecords(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 2)
	tel := newTelemetry(t)
	tracer := tel.tp.Tracer("test")

	// Each record carries the traceparent of its own producer span.
	const perPartition = 4
	producers := map[po]trace.SpanContext{}
	var recs []kafkatest.Record
	for p := int32(0); p < 2; p++ {
		for i := 0; i < perPartition; i++ {
			ctx, span := tracer.Start(context.Background(), "produce")
			h := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(ctx, h)
			span.End()
			recs = append(recs, kafkatest.Record{Partition: p, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v"), Headers: h})
			producers[po{p, int64(i)}] = span.SpanContext()
		}
	}
	c.Produce(t, topic, recs...)

	msgs := tel.subscribe(t, c, group, topic)
	nackOnce := po{0, 1}
	var mu sync.Mutex
	handlerParent := map[trace.SpanID]po{} // process span → its record, from the handler's span
	go func() {
		nacked := false
		for m := range msgs {
			k := offsetOf(m)
			_, span := tracer.Start(m.Context(), "handle")
			span.End()
			mu.Lock()
			handlerParent[span.(sdktrace.ReadOnlySpan).Parent().SpanID()] = k
			mu.Unlock()
			if k == nackOnce && !nacked {
				nacked = true
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()

	// Wait for both partitions to be committed at their ends and for a
	// commit span that says so.
	committedAt := func() map[int32]int64 {
		out := map[int32]int64{}
		for _, s := range tel.spans.Ended() {
			if s.Name() != "commit "+topic || s.Status().Code == codes.Error {
				continue
			}
			for _, e := range s.Events() {
				a := attrs(e.Attributes)
				p, _ := strconv.Atoi(a["messaging.destination.partition.id"].AsString())
				out[int32(p)] = max(out[int32(p)], a["messaging.kafka.offset"].AsInt64())
			}
		}
		return out
	}
	kafkatest.WaitFor(t, 30*time.Second, "commit spans at both partitions' ends", func() bool {
		at := committedAt()
		return at[0] == perPartition && at[1] == perPartition
	})

	process := map[po][]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		if s.Name() != "process "+topic {
			continue
		}
		a := attrs(s.Attributes())
		k := po{0, a["messaging.kafka.offset"].AsInt64()}
		p, err := strconv.Atoi(a["messaging.destination.partition.id"].AsString())
		if err != nil {
			t.Fatalf("span %v: partition id %v", s.Name(), a["messaging.destination.partition.id"])
		}
		k.p = int32(p)
		process[k] = append(process[k], s)
		want := map[attribute.Key]string{
			"messaging.system":              "kafka",
			"messaging.operation.name":      "process",
			"messaging.operation.type":      "process",
			"messaging.destination.name":    topic,
			"messaging.consumer.group.name": group,
			"messaging.kafka.message.key":   fmt.Sprintf("k%d", k.o),
		}
		for key, v := range want {
			if got := a[key].AsString(); got != v {
				t.Errorf("%v: %s = %q; want %q", k, key, got, v)
			}
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("%v: kind %v", k, s.SpanKind())
		}
		if s.Parent().IsValid() {
			t.Errorf("%v: has parent %v; the producer is a link", k, s.Parent())
		}
		if links := s.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != producers[k].TraceID() ||
			links[0].SpanContext.SpanID() != producers[k].SpanID() || !links[0].SpanContext.IsRemote() {
			t.Errorf("%v: links %+v; want the producer's span %v", k, links, producers[k])
		}
	}
	if len(process) != 2*perPartition {
		t.Fatalf("process spans for %d records; want %d", len(process), 2*perPartition)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, spans := range process {
		wantN := 1
		if k == nackOnce {
			wantN = 2
		}
		if len(spans) != wantN {
			t.Fatalf("%v: %d process spans; want %d", k, len(spans), wantN)
		}
		for i, s := range spans {
			if got, ok := handlerParent[s.SpanContext().SpanID()]; !ok || got != k {
				t.Errorf("%v: no handler span nested under delivery %d (%v)", k, i, got)
			}
			event, status, outcome := safeackotel.EventAck, codes.Unset, "ack"
			if k == nackOnce && i == 0 {
				event, status, outcome = safeackotel.EventNack, codes.Error, "nack"
			}
			if ev := s.Events(); len(ev) != 1 || ev[0].Name != event {
				t.Errorf("%v delivery %d: events %+v; want %s", k, i, ev, event)
			}
			if s.Status().Code != status {
				t.Errorf("%v delivery %d: status %v; want %v", k, i, s.Status(), status)
			}
			if got := attrs(s.Attributes())[safeackotel.OutcomeKey].AsString(); got != outcome {
				t.Errorf("%v delivery %d: outcome %q; want %q", k, i, got, outcome)
			}
		}
	}

	// Commit spans: kind client, settle, with the group; offsets only go up.
	for _, s := range tel.spans.Ended() {
		if s.Name() != "commit "+topic {
			continue
		}
		a := attrs(s.Attributes())
		if a["messaging.operation.type"].AsString() != "settle" || a["messaging.operation.name"].AsString() != "commit" ||
			a["messaging.consumer.group.name"].AsString() != group || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("commit span %v attributes %v kind %v", s.SpanContext().SpanID(), s.Attributes(), s.SpanKind())
		}
		for _, e := range s.Events() {
			ea := attrs(e.Attributes)
			if prev, ok := ea[safeackotel.PreviousOffsetKey]; ok && prev.AsInt64() >= ea["messaging.kafka.offset"].AsInt64() {
				t.Errorf("commit event %v: previous offset not below the committed one", e.Attributes)
			}
		}
	}

	// The duration histograms: one measurement per answered delivery, one
	// nack among them; at least one commit. A commit's duration is
	// recorded just after its span ends: the commit span waited for above
	// may be the only one, its duration not yet recorded.
	var processN, nackN, commitN uint64
	kafkatest.WaitFor(t, 10*time.Second, "a commit duration recorded", func() bool {
		processN, nackN, commitN = 0, 0, 0
		for _, sm := range tel.collect(t).ScopeMetrics {
			for _, m := range sm.Metrics {
				h, ok := m.Data.(metricdata.Histogram[float64])
				if !ok {
					continue
				}
				for _, dp := range h.DataPoints {
					switch m.Name {
					case "messaging.process.duration":
						processN += dp.Count
						if v, ok := dp.Attributes.Value("error.type"); ok && v.AsString() == "nack" {
							nackN += dp.Count
						}
					case "messaging.client.operation.duration":
						commitN += dp.Count
					}
				}
			}
		}
		return commitN > 0
	})
	if processN != 2*perPartition+1 || nackN != 1 || commitN == 0 {
		t.Errorf("histograms: %d process (want %d), %d nacked (want 1), %d commits", processN, 2*perPartition+1, nackN, commitN)
	}
}

// TestMetricsMatchStats holds a record unacked behind completed ones and
// nacks another once, then reads every instrument RegisterMetrics made and
// compares it with the Subscriber's Stats and Totals of the same moment.
func TestMetricsMatchStats(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 2)
	tel := newTelemetry(t)
	const perPartition = 6
	c.ProduceN(t, topic, 2, 2*perPartition, nil)

	sub := newSubscriber(t, c, group, nil)
	reg, err := safeackotel.RegisterMetrics(sub, tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	hold, nackOnce := po{0, 2}, po{1, 3}
	var held []*message.Message
	var mu sync.Mutex
	go func() {
		nacked := false
		for m := range msgs {
			switch k := offsetOf(m); {
			case k == hold:
				mu.Lock()
				held = append(held, m)
				mu.Unlock()
			case k == nackOnce && !nacked:
				nacked = true
				m.Nack()
			default:
				m.Ack()
			}
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range held {
			m.Ack()
		}
	}()

	kafkatest.WaitFor(t, 30*time.Second, "partitions to settle with the held record", func() bool {
		stats := sub.Stats()
		if len(stats) != 2 {
			return false
		}
		for _, s := range stats {
			if s.Delivered != perPartition || s.HighWaterMark != perPartition || s.ConfirmedOffset != s.SafeOffset || s.ConfirmedOffset < 0 {
				return false
			}
		}
		return stats[0].SafeOffset == hold.o && stats[0].InFlight == 1 && stats[1].SafeOffset == perPartition
	})
	// The commit loop encodes the completed tail behind the held record at
	// its next interval after the completions (Stats' TailBytes), then
	// commits it: once the group holds a tail of every record after the
	// held one, Stats no longer moves.
	kafkatest.WaitFor(t, 10*time.Second, "the group to hold the completed tail behind the held record", func() bool {
		co := c.CommittedOffsets(t, group, topic)[0]
		tail, err := frontier.DecodeTail(co.Metadata, co.Offset)
		if err != nil || co.Offset != hold.o {
			return false
		}
		for o := hold.o + 1; o < perPartition; o++ {
			if !tail.Contains(o) {
				return false
			}
		}
		return true
	})

	stats := figures.Merged(figures.Views[figures.Partition](sub.Stats()))
	totals := figures.Views[figures.Totals](sub.Totals())
	rm := tel.collect(t)
	after := sub.Stats()
	for i := range after {
		if after[i].SafeOffset != stats[i].SafeOffset || after[i].TailBytes != stats[i].TailBytes || after[i].ConfirmedOffset != stats[i].ConfirmedOffset {
			t.Fatalf("stats moved during the collection: %+v then %+v", stats[i], after[i])
		}
	}

	// Index what was collected by instrument, partition and reason.
	type key struct {
		name, partition, reason string
	}
	got := map[key]float64{}
	units := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			units[m.Name] = m.Unit
			add := func(set attribute.Set, v float64) {
				var k key
				k.name = m.Name
				if p, ok := set.Value("messaging.destination.partition.id"); ok {
					k.partition = p.AsString()
					if d, _ := set.Value("messaging.destination.name"); d.AsString() != topic {
						t.Errorf("%s: destination %q", m.Name, d.AsString())
					}
				}
				if g, _ := set.Value("messaging.consumer.group.name"); g.AsString() != group {
					t.Errorf("%s: group %q", m.Name, g.AsString())
				}
				if r, ok := set.Value(safeackotel.SkipReasonKey); ok {
					k.reason = r.AsString()
				}
				got[k] = v
			}
			eachPoint(t, m, add)
		}
	}

	if v := got[key{name: figures.Owned.OTel}]; v != 2 {
		t.Errorf("%s = %v; want 2", figures.Owned.OTel, v)
	}
	for i := range stats {
		s := &stats[i]
		p := strconv.Itoa(int(s.Partition))
		for _, g := range figures.Gauges {
			want, ok := g.Value(s)
			v, found := got[key{name: g.OTel, partition: p}]
			switch {
			case ok != found:
				t.Errorf("partition %s: %s present %v; want %v", p, g.OTel, found, ok)
			case g.OTel == "safeack.oldest_unfinished.age":
				if s.HasUnfinished && (v <= 0 || v > want+5) || !s.HasUnfinished && v != 0 {
					t.Errorf("partition %s: %s = %v; Stats said %v just before", p, g.OTel, v, want)
				}
			case g.Float && ok && (v-want > 1e-6 || want-v > 1e-6), !g.Float && ok && v != want:
				t.Errorf("partition %s: %s = %v; want %v", p, g.OTel, v, want)
			}
			if units[g.OTel] != g.Unit {
				t.Errorf("%s: unit %q; want %q", g.OTel, units[g.OTel], g.Unit)
			}
		}
	}
	for i := range totals {
		tt := &totals[i]
		p := strconv.Itoa(int(tt.Partition))
		for _, f := range figures.Counters {
			v, found := got[key{name: f.OTel, partition: p, reason: f.Reason}]
			if want := f.Value(tt); !found || v != want && f.OTel != "safeack.paused.time" {
				t.Errorf("partition %s: %s{%s} = %v (found %v); want %v", p, f.OTel, f.Reason, v, found, want)
			}
		}
	}
	// The figures this test set up, named.
	for _, c := range []struct {
		k    key
		want float64
	}{
		{key{name: "safeack.offset.safe", partition: "0"}, 2},
		{key{name: "safeack.offset.committed", partition: "0"}, 2},
		{key{name: "safeack.records.blocked", partition: "0"}, perPartition - 3},
		{key{name: "safeack.messages.in_flight", partition: "0"}, 1},
		{key{name: "safeack.lag", partition: "0"}, perPartition - 2},
		{key{name: "safeack.redeliveries", partition: "1"}, 1},
		{key{name: "messaging.client.consumed.messages", partition: "1"}, perPartition},
		{key{name: "safeack.records.completed", partition: "0"}, perPartition - 1},
	} {
		if got[c.k] != c.want {
			t.Errorf("%+v = %v; want %v", c.k, got[c.k], c.want)
		}
	}
	if got[key{name: "safeack.tail.size", partition: "0"}] <= 0 {
		t.Errorf("partition 0 tail size %v; want the encoded tail of the blocked records", got[key{name: "safeack.tail.size", partition: "0"}])
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
}

// TestDeferredAndTransactionSpans runs a transactional Subscriber whose
// handler defers one record's completion (failing it once, then completing
// it) and produces an output per record: the deferred delivery's span
// carries the deferred event and ends with the resolution (nack with the
// error, then ack on the redelivery), and every transaction is a
// commit_transaction span with its outputs and the partitions' positions.
func TestDeferredAndTransactionSpans(t *testing.T) {
	c := kafkatest.Start(t)
	in, out := c.NewTopic(t, 2), c.NewTopic(t, 2)
	group := c.NewGroup(t)
	const perPartition = 3
	c.ProduceN(t, in, 2, 2*perPartition, nil)
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	pc := c.SaramaConfig()
	pc.Producer.Partitioner = sarama.NewHashPartitioner
	sub, pub, err := safeack.NewTxnSubscriber(safeacktest.Config(c, group, func(cfg *safeack.SubscriberConfig) { cfg.Observer = obs }), safeack.TxnConfig{
		TransactionalID:       "otel-" + group,
		CommitInterval:        50 * time.Millisecond,
		OverwriteSaramaConfig: pc,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(pub.Middleware)
	deferred := po{1, 1}
	var failed sync.Once
	router.AddHandler("transform", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		if offsetOf(msg) == deferred {
			comp, err := safeack.Defer(msg)
			if err != nil {
				return nil, err
			}
			first := false
			failed.Do(func() { first = true })
			go func() {
				if first {
					comp.Fail(errors.New("downstream refused"))
				} else {
					comp.Done()
				}
			}()
			return nil, nil
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	defer func() {
		_ = router.Close()
		<-done
	}()

	txnAt := func() (at map[int32]int64, outputs int64) {
		at = map[int32]int64{}
		for _, s := range tel.spans.Ended() {
			if s.Name() != "commit_transaction "+in || s.Status().Code == codes.Error {
				continue
			}
			outputs += attrs(s.Attributes())[safeackotel.OutputsKey].AsInt64()
			for _, e := range s.Events() {
				a := attrs(e.Attributes)
				p, _ := strconv.Atoi(a["messaging.destination.partition.id"].AsString())
				at[int32(p)] = max(at[int32(p)], a["messaging.kafka.offset"].AsInt64())
			}
		}
		return at, outputs
	}
	kafkatest.WaitFor(t, 30*time.Second, "transactions committing both partitions' ends", func() bool {
		at, _ := txnAt()
		return at[0] == perPartition && at[1] == perPartition
	})
	if _, outputs := txnAt(); outputs != 2*perPartition-1 {
		t.Errorf("transactions carried %d outputs; want %d", outputs, 2*perPartition-1)
	}

	var deliveries []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		a := attrs(s.Attributes())
		if s.Name() == "process "+in && a["messaging.destination.partition.id"].AsString() == "1" && a["messaging.kafka.offset"].AsInt64() == deferred.o {
			deliveries = append(deliveries, s)
		}
	}
	if len(deliveries) != 2 {
		t.Fatalf("%d delivery spans of the deferred record; want 2 (failed, then done)", len(deliveries))
	}
	names := func(s sdktrace.ReadOnlySpan) (out []string) {
		for _, e := range s.Events() {
			out = append(out, e.Name)
		}
		return out
	}
	if ev := names(deliveries[0]); len(ev) != 3 || ev[0] != safeackotel.EventDeferred || ev[1] != safeackotel.EventNack || ev[2] != "exception" ||
		deliveries[0].Status().Code != codes.Error || deliveries[0].Status().Description != "downstream refused" {
		t.Errorf("first delivery: events %v, status %+v; want deferred, nack and the error", ev, deliveries[0].Status())
	}
	if ev := names(deliveries[1]); len(ev) != 2 || ev[0] != safeackotel.EventDeferred || ev[1] != safeackotel.EventAck {
		t.Errorf("second delivery: events %v; want deferred then ack", ev)
	}
}

// TestRefusedCommitSpan has the embedded broker refuse the group's first
// commits past the start: their commit spans carry the error (the
// read-back found the coordinator below what was sent), and the commit
// that takes afterwards has an unset status and the partition's end.
func TestRefusedCommitSpan(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	const records = 3
	c.ProduceN(t, topic, 1, records, nil)
	// The pinned start (offset 0) goes through.
	refused := c.RefuseCommits(group, kerr.CoordinatorLoadInProgress.Code, 2, func(rp kmsg.OffsetCommitRequestTopicPartition) bool { return rp.Offset > 0 })

	tel := newTelemetry(t)
	msgs := tel.subscribe(t, c, group, topic)
	go func() {
		for m := range msgs {
			m.Ack()
		}
	}()
	var failed, took []sdktrace.ReadOnlySpan
	kafkatest.WaitFor(t, 30*time.Second, "a commit span at the end after refused ones", func() bool {
		failed, took = nil, nil
		for _, s := range tel.spans.Ended() {
			if s.Name() != "commit "+topic {
				continue
			}
			if s.Status().Code == codes.Error {
				failed = append(failed, s)
				continue
			}
			for _, e := range s.Events() {
				if attrs(e.Attributes)["messaging.kafka.offset"].AsInt64() == records {
					took = append(took, s)
				}
			}
		}
		return len(took) > 0
	})
	if refused.Load() != 2 || len(failed) < 2 {
		t.Fatalf("%d commits refused, %d commit spans with an error; want 2 and at least 2", refused.Load(), len(failed))
	}
	for _, s := range failed {
		if !strings.Contains(s.Status().Description, safeack.ErrCommitNotConfirmed.Error()) {
			t.Errorf("refused commit's status %q; want it to say %q", s.Status().Description, safeack.ErrCommitNotConfirmed)
		}
		if s.StartTime().After(took[0].StartTime()) {
			t.Errorf("a refused commit span after the one that took")
		}
	}
}

// eachPoint calls add with the attributes and value of each data point of
// a gauge or a sum (int64 or float64) in m; a sum must be monotonic.
func eachPoint(t *testing.T, m metricdata.Metrics, add func(attribute.Set, float64)) {
	t.Helper()
	switch d := m.Data.(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes, float64(dp.Value))
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes, dp.Value)
		}
	case metricdata.Sum[int64]:
		if !d.IsMonotonic {
			t.Errorf("%s is not monotonic", m.Name)
		}
		for _, dp := range d.DataPoints {
			add(dp.Attributes, float64(dp.Value))
		}
	case metricdata.Sum[float64]:
		if !d.IsMonotonic {
			t.Errorf("%s is not monotonic", m.Name)
		}
		for _, dp := range d.DataPoints {
			add(dp.Attributes, dp.Value)
		}
	}
}

// TestMetricsCountDeadLetters: a record safeack.PoisonQueue publishes to a
// dead-letter topic is counted in safeack.records.dead_lettered.
func TestMetricsCountDeadLetters(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 1)
	tel := newTelemetry(t)
	sub := newSubscriber(t, c, group, nil)
	reg, err := safeackotel.RegisterMetrics(sub, tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	safeacktest.DeadLetterOne(t, c, sub, topic)
	found := false
	for _, sm := range tel.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "safeack.records.dead_lettered" {
				continue
			}
			eachPoint(t, m, func(_ attribute.Set, v float64) {
				found = true
				if v != 1 {
					t.Errorf("safeack.records.dead_lettered = %v; want 1", v)
				}
			})
		}
	}
	if !found {
		t.Error("no safeack.records.dead_lettered data point")
	}
}
