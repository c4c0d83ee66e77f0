package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// A watermill-kafka application moved to safeack: the publisher, the
// marshaler and the router stay; only the subscriber's constructor changes.
// Sarama's defaults (OffsetNewest) are kept, so records are published once
// the subscriber is ready. A record that keeps failing is retried, then
// dead-lettered.
func Example_fromWatermillKafka() {
	// An in-process broker. kfake creates no topic on first use: seed the
	// dead-letter topic too.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(4, "orders"), kfake.SeedTopics(1, "orders.dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// Was: kafka.NewSubscriber(kafka.SubscriberConfig{...}, logger).
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:       brokers,
		Unmarshaler:   kafka.DefaultMarshaler{},
		ConsumerGroup: "billing",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Reads the dead-letter topic back, for this example.
	dlqSub, err := safeack.NewSubscriber(safeack.SubscriberConfig{Brokers: brokers, ConsumerGroup: "dlq-audit"}, nil)
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	poisonQueue, err := safeack.PoisonQueue(pub, "orders.dlq") // not middleware.PoisonQueue: see docs/middleware.md
	if err != nil {
		log.Fatal(err)
	}

	const orders = 100
	var mu sync.Mutex
	handled, deadLettered := map[int]bool{}, map[int]bool{}
	billing := router.AddConsumerHandler("billing", "orders", sub, func(msg *message.Message) error {
		n, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return err
		}
		if n%10 == 7 {
			return errors.New("no such product") // fails every time
		}
		mu.Lock()
		handled[n] = true
		mu.Unlock()
		return nil // the router acks: the record is complete
	})
	billing.AddMiddleware(poisonQueue, middleware.Retry{MaxRetries: 2, InitialInterval: 10 * time.Millisecond}.Middleware)
	router.AddConsumerHandler("dlq-audit", "orders.dlq", dlqSub, func(msg *message.Message) error {
		n, _ := strconv.Atoi(string(msg.Payload))
		mu.Lock()
		deadLettered[n] = true
		mu.Unlock()
		return nil
	})

	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	// At OffsetNewest a new group starts at the end of the log as it is when
	// it joins: wait for that before publishing.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}
	if err := dlqSub.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}

	for n := range orders {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(n)))); err != nil {
			log.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		done := len(handled)+len(deadLettered) == orders
		mu.Unlock()
		if done {
			break
		}
	}
	if err := router.Close(); err != nil { // closes both subscribers: running handlers finish first
		log.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	fmt.Println("handled:", len(handled))
	fmt.Println("dead-lettered:", len(deadLettered), deadLettered[7], deadLettered[97])
	// Output:
	// handled: 90
	// dead-lettered: 10 true true
}
