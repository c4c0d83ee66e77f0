package safeack_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// A router handler on safeack runs up to MaxInFlight messages at once.
// Under the default OrderByKey, records with the same Kafka key run one at
// a time, and records without a key (what kafka.DefaultMarshaler
// publishes) one at a time per partition, as in watermill-kafka: publish
// with kafka.NewWithPartitioningMarshaler, as here, to give records keys,
// or choose Unordered, to run them concurrently. The router acks when the
// handler returns; safeack commits only past records whose handlers all
// returned. An embedded broker (kfake) stands in for Kafka; give Brokers
// your cluster's addresses instead.
func ExampleNewSubscriber() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "payments"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	// Payments keyed by account: one account's payments run in order.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: cluster.ListenAddrs(),
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("account"), nil
		}),
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i, account := range []string{"a", "b", "a", "c"} {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "payment-%d", i+1))
		msg.Metadata.Set("account", account)
		if err := pub.Publish("payments", msg); err != nil {
			log.Fatal(err)
		}
	}
	_ = pub.Close()

	saramaCfg := safeack.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest // the payments came before the group
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               cluster.ListenAddrs(),
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         "billing",
		MaxInFlight:           128,
		Ordering:              safeack.OrderByKey,
		OverwriteSaramaConfig: saramaCfg,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond}.Middleware,
		middleware.Recoverer, // inside Retry: a panic is retried like an error
	)
	charged := make(chan string, 4)
	router.AddConsumerHandler("charge", "payments", sub, func(msg *message.Message) error {
		partition, _ := safeack.MessagePartitionFromCtx(msg.Context())
		offset, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
		charged <- fmt.Sprintf("charged %s (account %s) from %d@%d", msg.Payload, msg.Metadata.Get("account"), partition, offset)
		return nil // the router acks: the record is complete
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close() // closes sub too, committing what is complete

	var lines []string
	for range 4 {
		select {
		case l := <-charged:
			lines = append(lines, l)
		case <-time.After(30 * time.Second):
			log.Fatal("a payment was not charged within 30 s")
		}
	}
	slices.Sort(lines) // handlers of different accounts ran concurrently
	for _, l := range lines {
		fmt.Println(l)
	}
	// Every record is acked: the completed prefix is past all four.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st := sub.Stats(); len(st) == 1 && st[0].SafeOffset == 4 {
			fmt.Println("safe to resume from offset", st[0].SafeOffset)
			break
		}
	}
	// Output:
	// charged payment-1 (account a) from 0@0
	// charged payment-2 (account b) from 0@1
	// charged payment-3 (account a) from 0@2
	// charged payment-4 (account c) from 0@3
	// safe to resume from offset 4
}

// Stats tells, per partition, why the committed offset is where it is.
func ExampleSubscriber_Stats() {
	var sub *safeack.Subscriber // from NewSubscriber
	for _, p := range sub.Stats() {
		log.Printf("%s/%d safe=%d confirmed=%d blocked=%d oldest unfinished=%d (%v)",
			p.Topic, p.Partition, p.SafeOffset, p.ConfirmedOffset, p.Blocked, p.OldestUnfinished, p.OldestUnfinishedAge)
	}
}
