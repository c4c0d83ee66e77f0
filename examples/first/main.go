package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	brokers := cmp.Or(os.Getenv("SAFEACK_KAFKA_BROKERS"), os.Getenv("KAFKA_BROKERS"), "localhost:9092")
	saramaConfig := safeack.DefaultSaramaSubscriberConfig()
	// A new group starts at the oldest record, so orders produced before the
	// first run are billed too (Sarama's default, OffsetNewest, skips them).
	saramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               strings.Split(brokers, ","),
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         "billing",
		OverwriteSaramaConfig: saramaConfig,
		MaxInFlight:           64, // handlers at once; records of one key (key-less: of one partition) in order
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("bill", "orders", sub, func(msg *message.Message) error {
		log.Printf("billing order %s", msg.Payload)
		return nil // the ack: safeack commits past a record once it and all before it are acked
	})
	// SIGINT or SIGTERM ends Run: the router closes sub, which drains and commits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
