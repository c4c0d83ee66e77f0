// Package chaos is safeack's crash, rebalance and fault suite. It holds no
// library code: its tests are behind the build tag "chaos", so the default
// `go test ./...` does not run them.
//
// Every scenario runs consumers of one group while a producer keeps
// writing, injects its kind of trouble, lets a last consumer drain the
// topic, and then checks, over everything that happened:
//
//   - no loss: every record in the topic (from the floor, see below) was
//     acked at least once;
//   - safe commits: no commit (every OffsetCommit request the embedded
//     broker received; on a real cluster, every OffsetCommit request a
//     consumer sent, seen at its socket, and every committed offset polled
//     from the broker) passed a record that had not been acked when it was
//     made, and no completed tail in the commit metadata claimed a record
//     that had not been acked;
//   - where the group started (OffsetNewest variants): no record below the
//     floor was handled, no commit went below it, and each partition's
//     start was committed while its first record was still unfinished;
//   - key order (OrderByKey): within one consumer's lifetime two records of
//     a key never ran at the same time, and within one assignment of a
//     partition the records of a key started in offset order;
//   - the group ends committed at the end of every partition.
//
// It reports how many records were handled more than once: the
// at-least-once price of the trouble, and, for each broker failure, the
// stall: the time from the failure until every partition it affected
// acked a record produced after it.
//
// On a real cluster the broker's side of a commit cannot be observed, so
// each consumer's Sarama client dials through a tap (Net.Proxy.Dialer) that
// decodes every OffsetCommit request as it is written; the request is
// checked against the acks made before that moment. Consumer processes
// report theirs on stdout. On the consumer protocol the commits are
// safeack's own OffsetCommit v9+ (member id and epoch; v10 names the topic
// by id) through its franz-go client, which dials through the same
// Net.Proxy.Dialer: the tap reads them too. A tap that saw no request on a
// real cluster is a violation.
//
// Group protocol: -chaos.protocol=consumer (or SAFEACK_TEST_GROUP_PROTOCOL=
// consumer, the root suite's switch, when the flag is not given) runs
// every scenario's consumers, in-process members and consumer processes,
// on GroupProtocolConsumer (KIP-848); the scenarios' names then end in
// "-consumer". The coordinator sets the session timeout and heartbeat:
// the embedded broker is started with 3 s and 250 ms (kafkatest.Start); on
// a real cluster each scenario sets its group's consumer.session.timeout.ms
// (the session below) and consumer.heartbeat.interval.ms (500 ms) as group
// configs, which scripts/kafka.sh's brokers accept (their
// group.consumer.min.* settings; Kafka's defaults are 45 s and 5 s). On a
// real cluster older than 4.0 the consumer-protocol scenarios are skipped.
// The share group and transactional scenarios (TestShareChaos,
// TestTxnRouterChaos*, TestClusterTxnUnclean*) run in the classic run
// only: share groups are not consumer groups, and transactions are
// classic only (docs/group-protocols.md). The generations column counts
// member epochs there.
//
// A group watch runs beside the crash loop, the storms and the cluster
// scenarios: partitions that no live consumer owns for longer than a
// session timeout, a rebalance timeout and a JoinGroup read timeout (and
// as much again for a loaded machine; more on the three-node cluster)
// after the harness's last change are a stuck group (on the consumer
// protocol: the session timeout, the coordinator's wait for a revocation,
// the rebalance timeout, and a few heartbeats, and as much again). The
// watch logs what the broker says of the group (DescribeGroups;
// ConsumerGroupDescribe on the consumer protocol, with each member's epoch,
// assignment and target assignment) and restarts a consumer (a new member
// makes the coordinator assign again), so the run goes on and is judged on
// its invariants. On the
// embedded broker that is reported as the broker's fault (kfake, after
// dropping JoinGroup answers, has left partitions unowned for minutes with
// no rebalance started); on a real broker, which finishes its rebalances,
// it is also a violation.
//
// The crash loop and the rebalance storms run twice, at the two settings
// of Consumer.Offsets.Initial: OffsetOldest (the harness's) and
// OffsetNewest (Sarama's default, and so what a user gets), the second
// with "-newest" after the scenario's name. The two run side by side in
// the place the scenario takes among the -parallel tests. At OffsetOldest
// the producer starts first, then the consumers. At OffsetNewest the
// topic first gets 50 records of history a partition; the consumers join,
// and once they own every partition the end of each partition is its
// floor, where the group started. Only then does the producer start. The
// first record of each partition (the floor) is held 1.5 s by every
// handler it reaches, the broker must hold each partition's start while it
// is held (safeack commits the start before it hands out the first
// record, at the latest), and the trouble starts then, so that the crashes
// and rebalances meet unfinished starts. It does not start earlier, so
// that the scenarios do not depend on how early safeack commits a start: a
// partition that changes hands before its start is committed starts over
// at the newest offset, past what was produced meanwhile, as with any
// consumer at OffsetNewest.
// The records column of the figures counts from the floor.
//
// Scenarios:
//
//   - TestCrashLoop (oldest, newest): consumers are separate OS processes
//     (the test binary re-executed) killed with SIGKILL at random moments;
//     a replacement starts after each kill.
//   - TestRebalanceStorm (eager, cooperative; each oldest, newest):
//     in-process members join and leave every few hundred milliseconds,
//     with eager and cooperative-sticky balancing. On the consumer
//     protocol there is one variant (subtest consumer; oldest, newest):
//     the coordinator's assignor moves only the partitions that must move.
//   - TestBrokerFaults (embedded broker only): failed, timed-out
//     (REQUEST_TIMED_OUT after applying) and stalled OffsetCommits,
//     coordinator moves and partition leader moves over three brokers,
//     failed fetches, heartbeats and joins. On the consumer protocol the
//     commit errors include STALE_MEMBER_EPOCH (instead of
//     REBALANCE_IN_PROGRESS), and ConsumerGroupHeartbeats fail with
//     coordinator errors, timeouts and unknown errors (instead of
//     heartbeats and joins).
//   - TestBrokerRestart (real broker only, when SAFEACK_CHAOS_RESTART names
//     a command that restarts the broker keeping its data, for example
//     scripts/ci-kafka-bounce.sh): the broker is restarted mid-run.
//   - TestCluster* (three-node cluster only, when SAFEACK_CHAOS_CLUSTER
//     names its control script; see cluster_test.go): with three members
//     (or consumer processes) on a 6-partition topic replicated three
//     times, min.insync.replicas 2, each failure starting from a whole
//     cluster and a group that owns every partition:
//     TestClusterLeaderKill SIGKILLs the node leading the most partitions
//     (2 times; 5 without -short), TestClusterCoordinatorKill SIGKILLs the
//     group coordinator's node just as a member wrote an OffsetCommit to it
//     (2; 4), TestClusterBrokerPause SIGSTOPs a node for twice the session
//     timeout, at least 12 s (1; 2), TestClusterRollingRestart restarts
//     the three nodes one after the other (1 round; 2),
//     TestClusterConsumersAndBroker SIGKILLs a node and one or two consumer
//     processes at once (2; 4). A killed node is started again once the
//     cluster has fenced it. TestClusterUncleanElection and
//     TestClusterUncleanElectionWhileConsuming (unclean_test.go, one
//     member, their own checks; on either protocol) truncate a log for real: a topic on nodes
//     1 and 2 only with unclean.leader.election.enable, the follower
//     stopped, records written to the leader alone, the leader SIGKILLed
//     and the stale follower elected uncleanly, new records at the reused
//     offsets; a new member (after a committed tail), or the member
//     consuming all along, must handle every new record.
//     TestClusterTxnUncleanElection and
//     TestClusterTxnUncleanElectionWhileConsuming (eager, then
//     cooperative-sticky) are the same in exactly-once mode: a
//     consume-transform-produce member (NewTxnSubscriber), and a
//     read_committed reader of its outputs must see exactly one output of
//     every record the new leader's log holds (the old leader's outputs
//     committed before the truncation stay, and are counted). They are not
//     parallel: each has the cluster to itself.
//   - TestTxnRouterChaos (txn_test.go): the exactly-once router
//     (safeack.TxnPublisher) instead of the checks above: two router
//     processes SIGKILLed and restarted with their transactional ids, an
//     in-process member closed and restarted, one delivery in twenty
//     failing, while a producer writes (on a real broker with
//     SAFEACK_CHAOS_RESTART, the broker is restarted halfway); a last
//     member drains, and a read_committed reader must see exactly one
//     output per input record. TestTxnRouterChaosCooperative runs the
//     same with cooperative-sticky balancing.
//   - TestShareChaos (share_test.go): safeack.ShareSubscriber instead of
//     the checks above: three members of one share group on one
//     partition, two of them processes SIGKILLed mid-batch and restarted,
//     one in-process member throughout, a producer writing records and,
//     one in a hundred, poison records (rejected by RejectPoison). After a
//     drain by the in-process member: every record handled at least once,
//     the group's lag 0 (DescribeShareGroupOffsets), no record delivered
//     again after the in-process member accepted or rejected it, the killed
//     members' records back with a higher delivery count, and every member
//     given work. Skipped on a cluster without share groups.
//
// Running it:
//
//	go test -tags chaos -race -count=1 -parallel 4 -v -short ./chaos/          # short: 5 crashes, 10 s of churn per scenario
//	go test -tags chaos -race -count=1 -parallel 4 -v -timeout 30m ./chaos/    # long: 25 crashes, 60 s per scenario, 3 broker restarts
//	eval "export $(scripts/kafka.sh start)"                                  # then, against a real broker:
//	SAFEACK_CHAOS_SESSION_TIMEOUT=3s SAFEACK_CHAOS_RESTART=$PWD/scripts/ci-kafka-bounce.sh \
//	  go test -tags chaos -race -count=1 -parallel 4 -v -short -timeout 20m ./chaos/
//	scripts/kafka.sh stop
//	eval "export $(scripts/kafka-cluster.sh start)"                          # a three-node cluster:
//	go test -tags chaos -race -count=1 -v -short -timeout 30m -run '^TestCluster' ./chaos/   # short, about 5 minutes
//	go test -tags chaos -race -count=1 -v -timeout 90m -run '^TestCluster' ./chaos/          # long, 21 failures; 30 min on a loaded 2-core box
//	scripts/kafka-cluster.sh stop
//
// Each of these runs on the consumer group protocol with
// -chaos.protocol=consumer after the package; against a real broker or
// cluster that needs Kafka 4.0+ (SAFEACK_KAFKA_VERSION=4.4.0 before the
// scripts' start). The long version is run on both protocols, one after
// the other:
//
//	go test -tags chaos -race -count=1 -parallel 4 -v -timeout 30m ./chaos/ -chaos.protocol=classic
//	go test -tags chaos -race -count=1 -parallel 4 -v -timeout 30m ./chaos/ -chaos.protocol=consumer
//	export SAFEACK_KAFKA_VERSION=4.4.0; eval "export $(scripts/kafka-cluster.sh start)"  # then, for each protocol:
//	go test -tags chaos -race -count=1 -v -timeout 90m -run '^TestCluster' ./chaos/ -chaos.protocol=consumer
//
// .ci/run runs the short version with -race -parallel 4 -v on each group
// protocol, classic then consumer: on the embedded broker (35-45 s and
// 25-40 s on two cores) and against scripts/kafka.sh's Kafka 4.1.2 broker
// with a restart (about 55 s and 40-55 s), then the cluster scenarios,
// short with one failure each (-chaos.failures=1), on
// scripts/kafka-cluster.sh's three-node Kafka 4.4.0 cluster: every
// TestCluster scenario on the classic protocol, and on the consumer
// protocol all but the rolling restart and the transactional ones
// (measured on a loaded 2-core machine, load 10-14: 428 s and 188 s, where
// the classic run at two failures a scenario took 687 s). The scenarios
// mostly wait on the group protocol, so -parallel 4 (more than GOMAXPROCS)
// is what keeps the suite short.
//
// Flags (after the package): -chaos.duration (the churn phase of each
// scenario), -chaos.kills (SIGKILLs in the crash loop), -chaos.failures
// (node failures in each cluster scenario, rounds of the rolling restart),
// -chaos.seed (0: from the clock; it fixes the scenarios' choices, not the
// scheduling), -chaos.protocol (classic or consumer; see Group protocol
// above). The
// figures of the run are printed at the end as a Markdown table (with -v, or
// when a scenario fails: go test hides a passing package's output
// otherwise), and after each scenario.
//
// Environment: SAFEACK_KAFKA_BROKERS (a real cluster instead of the
// embedded broker), SAFEACK_CHAOS_SESSION_TIMEOUT (group session timeout on
// a real cluster, default 6s; on the consumer protocol set on the group as
// consumer.session.timeout.ms), SAFEACK_TEST_GROUP_PROTOCOL (consumer: the
// consumer protocol, when -chaos.protocol is not given), SAFEACK_CHAOS_RESTART (see
// TestBrokerRestart), SAFEACK_CHAOS_CLUSTER (the control script of the
// three-node cluster SAFEACK_KAFKA_BROKERS names, DIR/ctl from
// scripts/kafka-cluster.sh start; the cluster scenarios run `ctl nodes` and
// `ctl node ID start|stop`, and signal the pids `nodes` prints directly
// when the moment matters), SAFEACK_CHAOS_ARTIFACTS (where the logs of a
// failed scenario and the goroutine dumps of consumer processes that hang
// go; default the temporary directory), SAFEACK_CHAOS_KEEP_LOGS=1 (keep the
// timeline and the consumers' logs of passing scenarios too),
// SAFEACK_CHAOS_SARAMA_LOG=1 (Sarama's own log in the consumer processes'
// stderr), SAFEACK_CHAOS_DEBUG=1 (for the first duplicated record, the
// commits of its partition around it).
//
// On the consumer protocol: a member whose session expires (a SIGKILL,
// or a coordinator that restarts and loads the group while the member's
// heartbeat is still waiting to retry) loses its partitions; the next owner
// replays what it had completed since its last commit. A revoked partition
// drains and commits before the member acknowledges the revocation, so the
// storms replay next to nothing. On the three-node cluster a dead
// coordinator stalls the group for the fencing and the new coordinator's
// load of the group (the members kept their epochs and partitions in
// the runs so far: nothing was handled twice).
//
// Known costs the figures show: a SIGKILL replays what the dead member had
// completed since its last commit (the completed tail in the commit
// metadata keeps the rest); with cooperative-sticky balancing under a storm
// of joins, the final commit of a revoked partition can be rejected
// (ILLEGAL_GENERATION: Sarama commits it after the new generation's
// SyncGroup, and the generation has often moved on again), so the next
// owner replays the records completed since the previous commit.
//
// On the three-node cluster: a dead leader stalls its partitions until the
// cluster fences the node (broker.session.timeout.ms, 6 s there); a dead
// coordinator stalls the group for the fencing, then the new coordinator's
// load of the group and one rebalance: Sarama returns the JoinGroup's
// connection error at once (no retry for a transport error), safeack
// retries Consume on the same consumer group (after refreshing the
// coordinator) so each member rejoins under its own member id, which the
// new coordinator loaded with the group (replacing the Sarama client
// instead, as safeack did before, gave each member a new id and made the
// group wait one more session timeout for the old ones to expire); a
// hung node stalls the partitions it led until it answers again or
// Sarama's Net.ReadTimeout ends the fetch waiting on it; a rolling restart
// (controlled shutdowns) costs next to nothing. Records handled twice there
// are those completed since the last commit that went through before the
// coordinator died.
package chaos
