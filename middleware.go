package safeack

// Router middleware for handlers that run on a safeack Subscriber lives in
// files of its own (poison_queue.go, skip_revoked.go, kafka_metadata.go,
// deferred_completion.go, telemetry.go). The chain that keeps the
// completed-prefix guarantee is in the package documentation (doc.go), where
// go doc shows it, and in docs/middleware.md.
