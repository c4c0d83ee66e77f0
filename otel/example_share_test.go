package safeackotel_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/safeack/safeack"
	safeackotel "github.com/safeack/safeack/otel"
)

// ExampleRegisterShareMetrics traces a ShareSubscriber's deliveries (a
// span each, ended once the broker answered its acknowledgement) and
// exports the figures of its Stats as OpenTelemetry instruments. A share
// group commits nothing: there are no commit spans.
func ExampleRegisterShareMetrics() {
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider()
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}()

	obs, err := safeackotel.NewObserver()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:    []string{"localhost:9092"},
		ShareGroup: "thumbnails",
		Observer:   obs, // the same Observer type as a Subscriber's
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	reg, err := safeackotel.RegisterShareMetrics(sub) // accepted/released/rejected, in flight, delivery counts...
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("resize", "images", sub, func(msg *message.Message) error {
		_, span := otel.Tracer("thumbnails").Start(msg.Context(), "resize")
		defer span.End()
		return nil
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
