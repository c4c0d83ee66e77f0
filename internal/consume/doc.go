// Package consume is the work behind a safeack Subscriber: one
// subscription per Subscribe call, from its first connection to its
// output channel's close.
//
// Read it in this order. subscribe.go: Start makes the first connection,
// Run consumes until the context ends or the host closes; the host (the
// Subscriber, host.go) is told of readiness, owned and unclaimed
// partitions and commits, and Options (options.go) is its configuration.
// subscription.go: the reconnect loop, one connection at a time, in one of
// two modes: group.go, the consumer-group session (Setup, ConsumeClaim,
// Cleanup), or nogroup.go, every partition without a group.
// start_positions.go: where each partition starts. committer.go: where a
// session's completed positions go, chosen by newCommitter: offset
// commits (offset_commit.go) or Kafka transactions (txn_*.go, with the
// publisher's shared side in txn.go). Beside the session: claims.go
// (claims that do not start, leaders that stop answering), epoch_check.go
// (leader epochs and log truncation), backfill.go and first_fetch.go (the
// records below a pinned start, the early first fetch), shutdown.go (the
// bounded end), observe.go (commit reports).
package consume
