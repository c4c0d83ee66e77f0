package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// A router handler on a share group: records of one partition run at once,
// on as many members as there are, in no order. A record whose handler
// fails every retry is rejected: the broker archives it and never delivers
// it again. The embedded kfake broker serves share groups; use Kafka 4.2 or
// later otherwise.
func ExampleNewShareSubscriber() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:       cluster.ListenAddrs(),
		ShareGroup:    "billing",
		InitialOffset: sarama.OffsetOldest, // a new group starts at the log start
		MaxInFlight:   32,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:   cluster.ListenAddrs(),
		Marshaler: kafka.DefaultMarshaler{},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	for _, order := range []string{"order-1", "order-2", "broken"} {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
			log.Fatal(err)
		}
	}

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		safeack.RejectPoison, // outside Retry: only what failed every retry
		middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware,
	)
	router.AddConsumerHandler("billing", "orders", sub, func(msg *message.Message) error {
		if string(msg.Payload) == "broken" {
			return errors.New("cannot bill")
		}
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if st := sub.Stats(); len(st) == 1 && st[0].Accepted+st[0].Rejected == 3 {
			fmt.Printf("accepted %d, rejected %d, in flight %d\n", st[0].Accepted, st[0].Rejected, st[0].InFlight)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = router.Close()
	// Output:
	// accepted 2, rejected 1, in flight 0
}
