// Package safeack is a Watermill subscriber for Kafka that hands many
// messages of one partition to handlers at once, lets them ack in any
// order, and commits only each partition's completed prefix: the position
// before the oldest record still being processed. A crash, a rebalance or a
// Close therefore never commits past unfinished work.
//
// Subscriber runs on IBM/sarama consumer groups and is a drop-in
// replacement for watermill-kafka v3's subscriber: SubscriberConfig keeps
// its field names and meanings (and takes watermill-kafka's marshalers and
// tracers), the context helpers keep their names (MessagePartitionFromCtx
// and the others), and a consumer group moves from one to the other and
// resumes where it was. SubscriberConfig adds bounds on concurrency
// (MaxInFlight) and on what a partition may hold (MaxPendingPerPartition),
// the ordering mode, and the completed tail.
//
//	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
//		Brokers:       []string{"localhost:9092"},
//		Unmarshaler:   kafka.DefaultMarshaler{},
//		ConsumerGroup: "billing",
//		MaxInFlight:   64,
//	}, logger)
//	if err != nil {
//		return err
//	}
//	router.AddConsumerHandler("bill", "orders", sub, handle)
//
// # Ordering modes
//
// SubscriberConfig.Ordering chooses what may run at once; the commit is safe
// in every mode, but it does not restore business order, so choose the
// order your handlers need:
//
//   - [OrderByKey] (the default): records with the same Kafka key (or
//     OrderingKey) one at a time, started in offset order; different keys
//     concurrently, also within one partition. Key-less records, which
//     watermill-kafka's DefaultMarshaler publishes, run one at a time per
//     partition in offset order, as in watermill-kafka.
//   - [OrderByPartition]: one record of a partition at a time, as
//     watermill-kafka.
//   - [Unordered]: anything beside anything, up to MaxInFlight.
//
// Order holds within one assignment of a partition: a handler still running
// when a drain gives up (DrainTimeout) is not stopped, and the partition's
// next owner may start the same record meanwhile.
//
// # Guarantees
//
// The guarantee is at-least-once: every record is acked at least once by
// some member of the group, across crashes, rebalances, closes and
// redeliveries. A committed offset means "safe to resume here": it never
// passes a delivered record whose handler has not acked it. Records after it
// that were already handled may be handled again by the next owner of the
// partition, so handlers must tolerate repeats; the completed tail, kept in
// the commit's metadata within the broker's limit, keeps most of them from
// being handled twice.
//
// An Ack means "done": with a router the handler's return is the ack. Use
// [Defer] or [DeferredCompletion] when the work finishes later (a batching
// writer), and never Watermill's middleware.InstantAck, which acks before
// the handler runs.
//
// Exactly-once holds only for outputs written to Kafka: [NewTxnSubscriber]
// builds a Subscriber that commits its offsets inside Kafka transactions
// with the outputs its handlers publish through the [TxnPublisher] built
// with it, so that read_committed readers see each input's outputs once.
// Effects outside Kafka still happen at least once.
//
// # Router middleware
//
// safeack's middleware composes with Watermill's. A chain that keeps the
// completed-prefix guarantee, outermost first (Router.AddMiddleware runs the
// first one added outermost):
//
//	poisonQueue, err := safeack.PoisonQueue(dlqPublisher, "orders.dlq")
//	...
//	router.AddMiddleware(
//		safeack.Telemetry(hook),          // sees every outcome, skips included
//		safeack.SkipRevoked,              // no work for a revoked assignment
//		safeack.KafkaMetadata,            // original topic/partition/offset for the DLQ
//		poisonQueue,                      // publish, then ack; never on shutdown
//		middleware.Retry{...}.Middleware, // bounded retries inside the poison queue (ResetContextOnRetry)
//		middleware.Timeout(d),            // per attempt
//		middleware.Recoverer,             // a panic becomes an error Retry sees
//		safeack.DeferredCompletion,       // CompletionFromCtx in the handler
//	)
//
// Each middleware also passes messages of any other subscriber through; its
// doc says how. Watermill's middleware.PoisonQueue would dead-letter a
// record whose handler was cut short by a revocation or Close;
// [PoisonQueue] leaves it to the partition's next owner. With a
// [TxnPublisher], its Middleware goes inside Retry, PoisonQueue and
// Recoverer.
//
// # Operations
//
// [Subscriber.Ready] and [Subscriber.WaitReady] tell whether every
// subscription holds its assignment (a readiness probe).
// [Subscriber.Stats] shows each partition's frontier: the safe offset, the
// offset the coordinator confirmed, what is blocked behind a slow record and
// since when; [Subscriber.Totals] and [Subscriber.Windows] add counters and
// the retained window, and the metrics package exports them to Prometheus.
// [Telemetry] reports every handler run.
//
// # Examples
//
// ExampleNewSubscriber, Example_fromWatermillKafka (a migrated application
// on an embedded broker), Example_routerMiddleware, ExampleDeferredCompletion,
// ExampleSubscriber_Ready, ExampleSubscriber_Stats, ExampleNewTxnSubscriber,
// ExampleNewShareSubscriber and ExampleBatch; the otel package has ExampleNewObserver,
// ExampleObserver_Outputs and ExampleRegisterShareMetrics; the frontier
// package has the bookkeeping on its own (ExampleTracker,
// ExampleTracker_AppendWindow, ExampleEncodeTail,
// ExampleEncodeTail_truncated). The README's first program is
// examples/first (a router, one handler, Close on SIGINT or SIGTERM). The
// router_example command (go run ./router_example) runs a router on an
// embedded broker with a live page of each partition's frontier, and
// examples/sink (go run ./examples/sink) writes a topic into SQLite or
// PostgreSQL in batches.
//
// # Further documentation
//
// In the repository, one subject a page:
//
//   - docs/guarantees.md: guarantees and failure cases
//   - docs/start-positions.md: where a partition starts (new groups,
//     commits out of range, added partitions, no consumer group)
//   - docs/exactly-once.md: exactly-once Kafka-to-Kafka routers
//   - docs/group-protocols.md: the classic group protocol or the consumer
//     group protocol (KIP-848, SubscriberConfig.GroupProtocol)
//   - docs/share-groups.md: NewShareSubscriber on Kafka 4.2+ share groups
//   - docs/middleware.md: the middleware chain, dead letters, deferred
//     completion
//   - docs/batch.md: Batch, handlers of many messages at once (a database
//     transaction per batch), and the examples/sink program
//   - docs/operations.md: connecting, readiness, Stats and metrics,
//     OpenTelemetry traces and metrics, configuration
//   - docs/migrating.md: moving from watermill-kafka, every difference
//   - docs/how-it-works.md: the data path and commits
//   - docs/performance.md: measurements, with docs/bench.md (the bench's
//     tables) and docs/performance-notes.md (how they got there)
//   - docs/testing.md: the test suite, real Kafka, the chaos suite, Kafka
//     versions
//
// # Modules, versions and license
//
// The packages otel (OpenTelemetry) and metrics (Prometheus) are modules of
// their own, github.com/safeack/safeack/otel and
// github.com/safeack/safeack/metrics, so that their requirements stay out
// of the module graph of a program that imports only this package. The
// module is at v0.x: the repository's CHANGELOG.md says what each version
// changes and README.md which API is held stable. safeack is licensed
// under the MIT license (the LICENSE file).
package safeack
