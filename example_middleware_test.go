package safeack_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// batchWriter stands for an asynchronous writer that stores rows in
// batches (a bulk INSERT, a COPY): it reports each row's Completion once
// the batch holding it is durable.
type batchWriter struct {
	mu      sync.Mutex
	size    int
	rows    []string
	pending []*safeack.Completion
	batches [][]string
}

func (w *batchWriter) Add(row string, done *safeack.Completion) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rows = append(w.rows, row)
	w.pending = append(w.pending, done)
	if len(w.rows) < w.size {
		return // a real writer also flushes on a timer
	}
	// "Write" the batch, then report every row of it.
	w.batches = append(w.batches, w.rows)
	for _, c := range w.pending {
		c.Done() // on a write error: c.Fail(err) redelivers the row
	}
	w.rows, w.pending = nil, nil
}

// A handler hands each order to a batching writer and returns at once: the
// router acks, so the handler's slot is free for the next order, but the
// subscriber commits an order's offset only once the writer reported its
// batch durable.
func ExampleDeferredCompletion() {
	// An in-process Kafka-protocol broker, with a topic of one partition.
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
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
	for i := range 6 {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%d", i))); err != nil {
			log.Fatal(err)
		}
	}

	saramaCfg := safeack.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest // the orders were published before the group existed
	saramaCfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               brokers,
		ConsumerGroup:         "billing",
		Ordering:              safeack.Unordered,
		OverwriteSaramaConfig: saramaCfg,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	writer := &batchWriter{size: 3}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(safeack.DeferredCompletion)
	router.AddConsumerHandler("billing", "orders", sub, func(msg *message.Message) error {
		done, err := safeack.CompletionFromCtx(msg.Context())
		if err != nil {
			return err
		}
		writer.Add(string(msg.Payload), done)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	// Wait until the group coordinator holds the commit of all six orders
	// (Stats reads it back after each commit).
	committed := int64(-1)
	for deadline := time.Now().Add(10 * time.Second); committed < 6 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, ps := range sub.Stats() {
			committed = ps.ConfirmedOffset
		}
	}
	_ = router.Close()
	fmt.Println("committed offset:", committed)

	writer.mu.Lock()
	defer writer.mu.Unlock()
	for _, b := range writer.batches {
		fmt.Println("batch of", len(b))
	}
	var rows []string
	for _, b := range writer.batches {
		rows = append(rows, b...)
	}
	slices.Sort(rows)
	fmt.Println(rows)
	// Output:
	// committed offset: 6
	// batch of 3
	// batch of 3
	// [order-0 order-1 order-2 order-3 order-4 order-5]
}

// The middleware chain that keeps the completed-prefix guarantee with
// Watermill's own middleware, outermost first: a record that keeps failing
// is retried, then dead-lettered with its original topic, partition and
// offset in metadata, and only then completed. A record whose handler was
// cut short by a revocation or Close is not dead-lettered: safeack's
// PoisonQueue leaves it to the partition's next owner. Never add
// middleware.InstantAck: it acks before the handler runs.
func Example_routerMiddleware() {
	var (
		router *message.Router              // message.NewRouter(...)
		sub    *safeack.Subscriber          // safeack.NewSubscriber(...)
		dlqPub message.Publisher            // e.g. a watermill-kafka publisher
		handle message.NoPublishHandlerFunc // the business handler
	)

	poisonQueue, err := safeack.PoisonQueue(dlqPub, "orders.dlq")
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		safeack.Telemetry(func(e safeack.CompletionEvent) {
			// e.g. histograms of e.Wait and e.Duration by e.Outcome
		}),
		safeack.SkipRevoked,   // a revoked assignment's messages are left to the next owner
		safeack.KafkaMetadata, // kafka_topic, kafka_partition, kafka_partition_offset, kafka_key
		poisonQueue,           // after the retries: publish to the DLQ, then ack; never on shutdown
		middleware.Retry{
			MaxRetries:          3,
			InitialInterval:     100 * time.Millisecond,
			Multiplier:          2,
			ResetContextOnRetry: true, // each attempt gets a fresh Timeout
		}.Middleware,
		middleware.Timeout(30*time.Second), // per attempt; the end of a drain also ends the context
		middleware.Recoverer,               // a panic becomes an error Retry and PoisonQueue see
		safeack.DeferredCompletion,         // safeack.CompletionFromCtx in the handler
	)
	router.AddConsumerHandler("orders", "orders", sub, handle)
}
