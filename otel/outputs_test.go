package safeackotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
	safeackotel "github.com/safeack/safeack/otel"
)

// traceparentOf is the span context a message's Metadata carries.
func traceparentOf(m *message.Message) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(m.Metadata))
	return trace.SpanContextFromContext(ctx)
}

// TestOutputsCarryTraceContext runs Outputs around a handler, without a
// router: each returned message gets a create span, a child of the span in
// its own context when it has one (the second output's, a span the
// handler started) and of the input's otherwise, and that span's context
// in its Metadata. A handler's error passes through with its messages
// untouched.
func TestOutputsCarryTraceContext(t *testing.T) {
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	tracer := tel.tp.Tracer("test")
	inCtx, inSpan := tracer.Start(context.Background(), "process in")
	defer inSpan.End()
	input := message.NewMessage(watermill.NewUUID(), []byte("in"))
	input.SetContext(inCtx)

	var handlerSpan trace.Span
	h := obs.Outputs(func(msg *message.Message) ([]*message.Message, error) {
		plain := message.NewMessage(watermill.NewUUID(), []byte("plain"))
		own := message.NewMessage(watermill.NewUUID(), []byte("own"))
		ctx, span := tracer.Start(msg.Context(), "handler work")
		handlerSpan = span
		span.End()
		own.SetContext(ctx)
		return []*message.Message{plain, own}, nil
	})
	out, err := h(input)
	if err != nil {
		t.Fatal(err)
	}
	creates := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		if s.Name() == "create" {
			creates[s.SpanContext().SpanID()] = s
		}
	}
	if len(creates) != 2 {
		t.Fatalf("%d create spans; want one per output (2)", len(creates))
	}
	for i, parent := range []trace.SpanContext{inSpan.SpanContext(), handlerSpan.SpanContext()} {
		sc := traceparentOf(out[i])
		s, ok := creates[sc.SpanID()]
		if !ok {
			t.Fatalf("output %d carries %v, no create span's context", i, sc)
		}
		if s.Parent().SpanID() != parent.SpanID() || s.SpanContext().TraceID() != parent.TraceID() {
			t.Errorf("output %d: create span's parent %v; want %v", i, s.Parent(), parent)
		}
		a := attrs(s.Attributes())
		if s.SpanKind() != trace.SpanKindProducer || a["messaging.operation.type"].AsString() != "create" ||
			a["messaging.message.id"].AsString() != out[i].UUID || a["messaging.system"].AsString() != "kafka" {
			t.Errorf("output %d: create span kind %v, attributes %v", i, s.SpanKind(), a)
		}
	}

	failed := errors.New("refused")
	kept := message.NewMessage(watermill.NewUUID(), nil)
	out, err = obs.Outputs(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{kept}, failed
	})(input)
	if !errors.Is(err, failed) || len(out) != 1 || len(kept.Metadata) != 0 {
		t.Errorf("a failing handler's outputs: %d, metadata %v, err %v; want them untouched and the error", len(out), kept.Metadata, err)
	}
}

// TestOutputsWithoutSDK: with a no-op TracerProvider no span starts, and
// the input's span context (here the producer's, read from the headers
// with WithProducerAsParent) is passed on as it is.
func TestOutputsWithoutSDK(t *testing.T) {
	obs, err := safeackotel.NewObserver(safeackotel.WithTracerProvider(noop.NewTracerProvider()),
		safeackotel.WithPropagator(propagation.TraceContext{}), safeackotel.WithProducerAsParent())
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := obs.Delivered(context.Background(), tracedDelivery())
	input := message.NewMessage(watermill.NewUUID(), nil)
	input.SetContext(ctx)
	out, err := obs.Outputs(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
	})(input)
	if err != nil {
		t.Fatal(err)
	}
	want := trace.SpanContextFromContext(ctx)
	if got := traceparentOf(out[0]); !want.IsValid() || !got.Equal(want.WithRemote(true)) {
		t.Errorf("output carries %v; want the input's %v", got, want)
	}
}

// TestOutputsLinkTheNextStage runs a transactional router with Outputs
// whose outputs a second Subscriber consumes, both observed: each
// delivery span of the second stage links to the create span of the
// output it consumes, and that span is a child of the first stage's
// delivery span of the input: the trace goes on across the pipeline.
func TestOutputsLinkTheNextStage(t *testing.T) {
	c := kafkatest.Start(t)
	in, out := c.NewTopic(t, 1), c.NewTopic(t, 1)
	group := c.NewGroup(t)
	const records = 3
	c.ProduceN(t, in, 1, records, nil)
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(tel.options()...)
	if err != nil {
		t.Fatal(err)
	}
	sub, pub, err := safeack.NewTxnSubscriber(safeacktest.Config(c, group, func(cfg *safeack.SubscriberConfig) { cfg.Observer = obs }),
		safeack.TxnConfig{TransactionalID: "otel-" + group, CommitInterval: 50 * time.Millisecond, OverwriteSaramaConfig: c.SaramaConfig()},
		testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(pub.Middleware, obs.Outputs)
	router.AddHandler("transform", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	defer func() {
		_ = router.Close()
		<-done
	}()

	next := safeacktest.NewSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.Observer = obs
		cfg.OverwriteSaramaConfig.Consumer.IsolationLevel = sarama.ReadCommitted
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := next.Subscribe(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	received := map[trace.SpanID]string{} // the consumed output's traceparent span -> its UUID
	for range records {
		select {
		case m := <-msgs:
			received[traceparentOf(m).SpanID()] = m.UUID
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d outputs consumed", len(received), records)
		}
	}

	spans := func(name string) map[trace.SpanID]sdktrace.ReadOnlySpan {
		byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, s := range tel.spans.Ended() {
			if s.Name() == name {
				byID[s.SpanContext().SpanID()] = s
			}
		}
		return byID
	}
	kafkatest.WaitFor(t, 10*time.Second, "the second stage's delivery spans to end", func() bool {
		return len(spans("process "+out)) == records
	})
	creates, firstStage := spans("create "+out), spans("process "+in)
	for _, s := range spans("process " + out) {
		if len(s.Links()) != 1 {
			t.Fatalf("second-stage delivery span has %d links; want 1", len(s.Links()))
		}
		linked := s.Links()[0].SpanContext
		create, ok := creates[linked.SpanID()]
		if !ok {
			t.Fatalf("second-stage delivery links to %v, no create span", linked)
		}
		if _, ok := received[linked.SpanID()]; !ok {
			t.Errorf("create span %v is not the one a consumed output carried", linked.SpanID())
		}
		if attrs(create.Attributes())["messaging.message.id"].AsString() != received[linked.SpanID()] {
			t.Errorf("create span names message %v; the output consumed was %s",
				attrs(create.Attributes())["messaging.message.id"], received[linked.SpanID()])
		}
		if _, ok := firstStage[create.Parent().SpanID()]; !ok {
			t.Errorf("create span's parent %v is no first-stage delivery span", create.Parent())
		}
	}
}
