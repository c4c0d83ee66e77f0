// Package consume is the work behind a safeack Subscriber: one
// subscription per Subscribe call, from its first connection to its
// output channel's close.
//
// Read it in this order. subscribe.go: Start makes the first connection,
// Run consumes until the context ends or the host closes; the host (the
// Subscriber, host.go) is told of readiness, owned and unclaimed
// partitions and commits, and Options (options.go) is its configuration.
// subscription.go: the reconnect loop, one connection at a time, in one of
// two modes: a consumer group, or nogroup.go, every partition without a
// group. start_positions.go: where each partition starts.
//
// A consumer group has two sides. The engine-neutral one names no client
// library's types (but the record, Sarama's ConsumerMessage, which the
// public API hands to the Unmarshaler): engine.go says what an engine
// gives it (groupSession, groupClaim, clusterReads); member.go is the
// group member, each session's start and end; claim.go one claim's life
// (admission, where it starts, its worker's run, the hand-over);
// committer.go where a session's completed positions go: offset commits
// (offset_commit.go, with session_offsets.go for the commits read back
// until the coordinator holds them) or the transactional committer
// (txn_session.go); epoch_check.go and epoch_watch.go the leader-epoch
// checks (epoch_client.go sends them); position_metadata.go edits of a
// position's metadata; leader_loss.go, workers.go and observe.go what
// Stats, Unclaimed and the Observer are told; shutdown.go the bounded end.
//
// The other side is the engine: Sarama's consumer group. group.go runs it
// (consumeGroup) and hands its sessions and claims to the member
// (groupHandler: Setup, ConsumeClaim, Cleanup); sarama_cluster.go answers
// clusterReads; group_client.go and claim_watch.go keep Sarama from giving
// up on partitions without a leader and report claims that do not start;
// backfill.go and first_fetch.go fetch the records below a pinned start
// and a new claim's first records early; fenced.go and rejoin.go read
// Sarama's errors; connect.go makes the client. Kafka transactions run on
// Sarama's producer: txn.go (the publisher's shared side), txn_committer.go
// (the committer's life), txn_marker.go, txn_coverage.go, txn_run.go (one
// transaction), txn_delivery.go and txn_output_topics.go.
//
// The second engine is the consumer group protocol (KIP-848) on franz-go's
// kgo (Options.ConsumerProtocol): kgo_group.go runs the membership and the
// fetches and hands each assignment's partitions to the member as claims
// added to one long session (its start prepared as a session's start is),
// a revocation's claims drained and committed before kgo acknowledges it;
// kgo_session.go is its groupSession, with safeack's own OffsetCommit
// carrying the member epoch; kgo_claim.go a claim's feed; kgo_cluster.go
// answers clusterReads through the subscription's own kgo client (connect
// makes it: a consumer-protocol subscription has no Sarama client);
// kgo_held.go holds back the claims of partitions whose leaders do not
// answer and reports them, as claim_watch.go does for Sarama's;
// kgo_refused.go a member the coordinator keeps out of a classic group (a
// migration the broker does not run online); kgo_static.go a static
// member's fencing and leave; kgo_ready.go what Ready says of the member
// (joined, heartbeats reaching the coordinator).
package consume
