package safeack

// Router middleware for handlers that run on a safeack Subscriber.
//
// Each middleware here is a message.HandlerMiddleware and composes with
// Watermill's own. Its doc says what it does with messages of any other
// subscriber. A chain that keeps the completed-prefix guarantee, outermost
// first (Router.AddMiddleware runs the first one added outermost):
//
//	router.AddMiddleware(
//		safeack.Telemetry(hook),          // sees every outcome, skips included
//		safeack.SkipRevoked,              // no work for a revoked assignment
//		safeack.KafkaMetadata,            // original topic/partition/offset for the DLQ
//		poisonQueue,                      // safeack.PoisonQueue: publish, then ack; never on shutdown
//		middleware.Retry{...}.Middleware, // bounded retries inside the poison queue (ResetContextOnRetry)
//		middleware.Timeout(d),            // per attempt
//		middleware.Recoverer,             // a panic becomes an error Retry sees
//		safeack.DeferredCompletion,       // CompletionFromCtx in the handler
//	)
//
// Watermill's middleware.PoisonQueue would dead-letter a record whose
// handler was cut short by a revocation or Close; safeack.PoisonQueue
// leaves it to the partition's next owner.
//
// middleware.InstantAck must not be used: it acks before the handler runs,
// so the record counts as completed and may be committed while its handler
// is still working, or after it failed.
