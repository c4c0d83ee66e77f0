package safeack_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// An exactly-once router: orders in, invoices out. Handlers run
// concurrently and ack in any order; each order's invoice and the consumer
// offset past the order are committed in the same Kafka transaction, so a
// read_committed reader of "invoices" sees one invoice per order across
// crashes, rebalances and restarts.
func ExampleNewTxnSubscriber() {
	// An in-process Kafka-protocol broker with the two topics.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(2, "orders", "invoices"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	in, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := range 5 {
		if err := in.Publish("orders", message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%d", i))); err != nil {
			log.Fatal(err)
		}
	}
	_ = in.Close()

	saramaCfg := safeack.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest // the orders came before the group
	// The subscriber and its transactional publisher, built together: the
	// subscriber's offsets are committed only in the transactions that
	// carry the invoices.
	sub, pub, err := safeack.NewTxnSubscriber(safeack.SubscriberConfig{
		Brokers:               brokers,
		ConsumerGroup:         "invoicing",
		Ordering:              safeack.Unordered,
		OverwriteSaramaConfig: saramaCfg,
	}, safeack.TxnConfig{
		TransactionalID: "invoicing-1", // unique per running instance, stable across its restarts
		CommitInterval:  100 * time.Millisecond,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(pub.Middleware) // files returned messages under the delivery they came from
	router.AddHandler("invoice", "orders", sub, "invoices", pub, func(msg *message.Message) ([]*message.Message, error) {
		invoice := message.NewMessage(watermill.NewUUID(), []byte(strings.Replace(string(msg.Payload), "order", "invoice", 1)))
		return []*message.Message{invoice}, nil // enters a transaction once the router acks msg
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	defer router.Close()

	// A read_committed reader sees invoices once their transaction
	// committed, never those of an aborted one.
	readCfg := sarama.NewConfig()
	readCfg.Consumer.IsolationLevel = sarama.ReadCommitted
	consumer, err := sarama.NewConsumer(brokers, readCfg)
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	got := make(chan string, 100)
	for p := range int32(2) {
		pc, err := consumer.ConsumePartition("invoices", p, sarama.OffsetOldest)
		if err != nil {
			log.Fatal(err)
		}
		defer pc.AsyncClose()
		go func() {
			for m := range pc.Messages() {
				got <- string(m.Value)
			}
		}()
	}
	var invoices []string
	for timeout := time.After(30 * time.Second); len(invoices) < 5; {
		select {
		case v := <-got:
			invoices = append(invoices, v)
		case <-timeout:
			log.Fatal("invoices missing: ", invoices)
		}
	}
	slices.Sort(invoices)
	fmt.Println(invoices)
	// Output:
	// [invoice-0 invoice-1 invoice-2 invoice-3 invoice-4]
}
