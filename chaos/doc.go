// Package chaos is safeack's crash, rebalance and fault suite. It holds no
// library code: its tests are behind the build tag "chaos", so the default
// `go test ./...` does not run them.
//
// Every scenario runs consumers of one group while a producer keeps
// writing, injects its kind of trouble, lets a last consumer drain the
// topic, and then checks, over everything that happened:
//
//   - no loss: every record in the topic was acked at least once;
//   - safe commits: no commit (every OffsetCommit request the embedded
//     broker received, or, on a real cluster, every committed offset polled
//     from it) passed a record that had not been acked when it was made,
//     and no completed tail in the commit metadata claimed a record that had
//     not been acked;
//   - key order (OrderByKey): within one consumer's lifetime two records of
//     a key never ran at the same time, and within one assignment of a
//     partition the records of a key started in offset order;
//   - the group ends committed at the end of every partition.
//
// It reports how many records were handled more than once: the
// at-least-once price of the trouble.
//
// Scenarios:
//
//   - TestCrashLoop: consumers are separate OS processes (the test binary
//     re-executed) killed with SIGKILL at random moments; a replacement
//     starts after each kill.
//   - TestRebalanceStorm: in-process members join and leave every few
//     hundred milliseconds, with eager and cooperative-sticky balancing.
//   - TestBrokerFaults (embedded broker only): failed, timed-out
//     (REQUEST_TIMED_OUT after applying) and stalled OffsetCommits,
//     coordinator moves and partition leader moves over three brokers,
//     failed fetches, heartbeats and joins.
//   - TestBrokerRestart (real broker only, when SAFEACK_CHAOS_RESTART names
//     a command that restarts the broker keeping its data, for example
//     scripts/ci-kafka-bounce.sh): the broker is restarted mid-run.
//
// Running it:
//
//	go test -tags chaos -count=1 -short ./chaos/           # short: 5 crashes, 10 s of churn per scenario
//	go test -tags chaos -count=1 -timeout 30m ./chaos/     # long: 25 crashes, 60 s per scenario
//	SAFEACK_KAFKA_BROKERS=127.0.0.1:39092 SAFEACK_CHAOS_SESSION_TIMEOUT=3s \
//	  SAFEACK_CHAOS_RESTART=$PWD/scripts/ci-kafka-bounce.sh \
//	  go test -tags chaos -count=1 -short -timeout 20m ./chaos/
//
// Flags (after the package): -chaos.duration (the churn phase of each
// scenario), -chaos.kills (SIGKILLs in the crash loop), -chaos.seed (0: from
// the clock). The figures of the run are printed at the end as a Markdown
// table, whatever -v says.
package chaos
