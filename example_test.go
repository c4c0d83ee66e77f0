package safeack_test

import (
	"context"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/safeack/safeack"
)

// A router handler on safeack runs up to MaxInFlight messages at once.
// Under the default OrderByKey, records with the same Kafka key run one at
// a time, and records without a key (what kafka.DefaultMarshaler
// publishes) one at a time per partition, as in watermill-kafka: publish
// with kafka.NewWithPartitioningMarshaler to give records keys, or choose
// Unordered, to run them concurrently. The router acks when the handler
// returns; safeack commits only past records whose handlers all returned.
func ExampleNewSubscriber() {
	logger := watermill.NewStdLogger(false, false)
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:       []string{"localhost:9092"},
		Unmarshaler:   kafka.DefaultMarshaler{},
		ConsumerGroup: "billing",
		MaxInFlight:   128,
		Ordering:      safeack.OrderByKey,
	}, logger)
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Logger: logger}.Middleware,
		middleware.Recoverer, // inside Retry: a panic is retried like an error
	)
	router.AddConsumerHandler("charge", "payments", sub, func(msg *message.Message) error {
		partition, _ := safeack.MessagePartitionFromCtx(msg.Context())
		offset, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
		log.Printf("charging %s from %d@%d", msg.UUID, partition, offset)
		return nil // the router acks: the record is complete
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// Stats tells, per partition, why the committed offset is where it is.
func ExampleSubscriber_Stats() {
	var sub *safeack.Subscriber // from NewSubscriber
	for _, p := range sub.Stats() {
		log.Printf("%s/%d safe=%d confirmed=%d blocked=%d oldest unfinished=%d (%v)",
			p.Topic, p.Partition, p.SafeOffset, p.ConfirmedOffset, p.Blocked, p.OldestUnfinished, p.OldestUnfinishedAge)
	}
}
