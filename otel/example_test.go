package safeackotel_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/safeack/safeack"
	safeackotel "github.com/safeack/safeack/otel"
)

// ExampleNewObserver traces a Subscriber's deliveries and commits and
// exports its figures as OpenTelemetry instruments. The providers are the
// application's: here SDK providers without exporters (add yours, e.g.
// OTLP, with sdktrace.WithBatcher and sdkmetric.WithReader).
func ExampleNewObserver() {
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider()
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.TraceContext{}) // reads the producers' traceparent headers
	defer func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}()

	obs, err := safeackotel.NewObserver()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:       []string{"localhost:9092"},
		ConsumerGroup: "billing",
		Observer:      obs, // a span per delivery and per commit
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	reg, err := safeackotel.RegisterMetrics(sub) // the figures of Stats and Totals
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("bill", "orders", sub, func(msg *message.Message) error {
		// The handler's spans nest under the delivery's "process orders" span.
		_, span := otel.Tracer("billing").Start(msg.Context(), "charge card")
		defer span.End()
		return nil
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// ExampleObserver_Outputs carries the trace from a transactional
// router's inputs to its outputs: their consumers link to the create
// span each output gets, a child of the input's delivery span.
func ExampleObserver_Outputs() {
	obs, err := safeackotel.NewObserver() // the global providers and propagator
	if err != nil {
		log.Fatal(err)
	}
	sub, pub, err := safeack.NewTxnSubscriber(safeack.SubscriberConfig{
		Brokers:       []string{"localhost:9092"},
		ConsumerGroup: "enricher",
		Observer:      obs,
	}, safeack.TxnConfig{TransactionalID: "enricher-1"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Outputs inside pub.Middleware: its size check counts the headers
	// Outputs adds.
	router.AddMiddleware(pub.Middleware, obs.Outputs)
	router.AddHandler("enrich", "orders", sub, "orders-enriched", pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
