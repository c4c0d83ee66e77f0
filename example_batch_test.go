package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// Batch hands a router handler's messages to a function in batches, for
// example to write them into a database in one transaction each. A message
// is acked only once its batch returned, so the committed offset never
// passes a record whose row is not written. Here the function refuses
// event-3 once: only event-3 is retried (by middleware.Retry, per
// message), alone in a later batch; the others are acked.
func ExampleBatch() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "events"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cluster.ListenAddrs(), Marshaler: kafka.DefaultMarshaler{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		if err := pub.Publish("events", message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "event-%d", i))); err != nil {
			log.Fatal(err)
		}
	}
	_ = pub.Close()

	saramaCfg := safeack.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               cluster.ListenAddrs(),
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         "writer",
		Ordering:              safeack.Unordered, // a batch may hold records of any key
		MaxInFlight:           4,                 // bounds the batches too: a waiting message holds a slot
		OverwriteSaramaConfig: saramaCfg,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond}.Middleware)

	refused := false
	batches := make(chan string, 10)
	router.AddConsumerHandler("write", "events", sub, safeack.Batch(
		safeack.BatchConfig{MaxSize: 100, MaxWait: 50 * time.Millisecond},
		func(ctx context.Context, msgs []*message.Message) error {
			var payloads []string
			var failed safeack.BatchError
			for _, m := range msgs {
				payloads = append(payloads, string(m.Payload))
				if string(m.Payload) == "event-3" && !refused { // one batch runs at a time
					refused = true
					failed.Fail(m, errors.New("constraint violated"))
				}
			}
			slices.Sort(payloads) // the handlers joined the batch in any order
			batches <- fmt.Sprintf("batch of %d: %s", len(msgs), strings.Join(payloads, " "))
			if failed.Len() > 0 {
				return &failed // event-3's handler returns its error; the others return nil
			}
			return nil // one transaction for all of them, committed here
		}))
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close()

	for range 2 {
		select {
		case b := <-batches:
			fmt.Println(b)
		case <-time.After(30 * time.Second):
			log.Fatal("no batch within 30 s")
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st := sub.Stats(); len(st) == 1 && st[0].SafeOffset == 4 {
			fmt.Println("safe to resume from offset", st[0].SafeOffset)
			break
		}
	}
	// Output:
	// batch of 4: event-1 event-2 event-3 event-4
	// batch of 1: event-3
	// safe to resume from offset 4
}
