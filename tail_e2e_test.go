package safeack_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Environment of the child process TestTailCrashChild runs as.
const (
	envTailChild   = "SAFEACK_TAIL_CHILD"
	envTailBrokers = "SAFEACK_TAIL_CHILD_BROKERS"
	envTailTopic   = "SAFEACK_TAIL_CHILD_TOPIC"
	envTailGroup   = "SAFEACK_TAIL_CHILD_GROUP"
)

func tailSubscriber(t testing.TB, brokers []string, cfg *sarama.Config, group string, mutate func(*safeack.SubscriberConfig)) *safeack.Subscriber {
	c := safeack.SubscriberConfig{
		Brokers:                brokers,
		OverwriteSaramaConfig:  cfg,
		ConsumerGroup:          group,
		Ordering:               safeack.Unordered,
		MaxInFlight:            256,
		MaxPendingPerPartition: 20_000,
		DrainTimeout:           200 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&c)
	}
	sub, err := safeack.NewSubscriber(c, testLogger())
	require.NoError(t, err)
	return sub
}

// TestTailCrashChild is not a test of its own: TestCompletedTailSurvivesCrash
// runs the test binary with it as a consumer process that holds the first
// record of the topic, acks every other one, reports each ack on stdout, and
// waits to be killed.
func TestTailCrashChild(t *testing.T) {
	if os.Getenv(envTailChild) == "" {
		t.Skip("child process of TestCompletedTailSurvivesCrash")
	}
	cfg := sarama.NewConfig()
	cfg.Version = kafkatest.DefaultVersion
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.Group.Session.Timeout = kafkatest.EmbeddedSessionTimeout
	cfg.Consumer.Group.Heartbeat.Interval = kafkatest.EmbeddedSessionTimeout / 3
	cfg.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	sec, err := kafkatest.EnvSecurity() // the parent's cluster: secured or not
	require.NoError(t, err)
	require.NoError(t, sec.ApplySarama(cfg))
	sub := tailSubscriber(t, strings.Split(os.Getenv(envTailBrokers), ","), cfg, os.Getenv(envTailGroup), nil)
	msgs, err := sub.Subscribe(context.Background(), os.Getenv(envTailTopic))
	require.NoError(t, err)
	out := bufio.NewWriter(os.Stdout)
	for msg := range msgs {
		off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
		if off == 0 {
			continue // held until the process is killed
		}
		msg.Ack()
		fmt.Fprintf(out, "acked %d\n", off)
		out.Flush()
	}
}

// TestCompletedTailSurvivesCrash: one record held, 10,000 completed behind
// it, the consumer process is killed with SIGKILL after a commit carried
// the tail; the next owner handles the held record and nothing else again.
func TestCompletedTailSurvivesCrash(t *testing.T) {
	t.Parallel()
	const n = 10_001
	cluster, topic, group := kafkatest.StartTopic(t, 1)
	produceSequential(t, cluster, topic, 0, n)

	child := exec.Command(os.Args[0], "-test.run=^TestTailCrashChild$", "-test.count=1")
	child.Env = append(os.Environ(),
		envTailChild+"=1",
		envTailBrokers+"="+strings.Join(cluster.Brokers(), ","),
		envTailTopic+"="+topic,
		envTailGroup+"="+group,
	)
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	var mu sync.Mutex
	ackedByChild := map[int64]bool{}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
				off, _ := strconv.ParseInt(v, 10, 64)
				mu.Lock()
				ackedByChild[off] = true
				mu.Unlock()
			}
		}
	}()

	// Wait for a commit at offset 0 whose tail covers every other record.
	waitForTail(t, cluster, group, topic, 0, func(tail frontier.Tail) bool {
		return tailCovers(tail, 1, n)
	})
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()

	handled := consumeUntil(t, cluster, group, topic, func(seen map[int64]int) bool { return seen[0] > 0 })
	// Anything else the new owner got is a repeat: the tail must prevent it.
	// Give it the time of a few more fetches to show up.
	require.Never(t, func() bool { return len(handled()) > 1 }, 2*time.Second, 50*time.Millisecond,
		"records other than the held one were handled again")
	require.Equal(t, map[int64]int{0: 1}, handled())
	mu.Lock()
	require.Len(t, ackedByChild, n-1, "the crashed consumer acked every record but the held one")
	mu.Unlock()
}

// TestCompletedTailSurvivesCooperativeRevoke: a member holds the head of
// each of two partitions with everything behind it completed; a second
// member joins with the cooperative-sticky strategy and takes one
// partition; it handles that partition's held record and nothing else.
func TestCompletedTailSurvivesCooperativeRevoke(t *testing.T) {
	t.Parallel()
	const perPartition = 2_000
	cluster, topic, group := kafkatest.StartTopic(t, 2)
	for p := range int32(2) {
		recs := make([]kafkatest.Record, perPartition)
		for i := range recs {
			recs[i] = kafkatest.Record{Partition: p, Value: fmt.Appendf(nil, "%d-%d", p, i)}
		}
		cluster.Produce(t, topic, recs...)
	}
	cooperative := func() *sarama.Config {
		cfg := cluster.SaramaConfig()
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		return cfg
	}

	a := tailSubscriber(t, cluster.Brokers(), cooperative(), group, nil)
	t.Cleanup(func() { _ = a.Close() })
	aMsgs, err := a.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	go func() {
		for msg := range aMsgs {
			if off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); off != 0 {
				msg.Ack()
			}
		}
	}()
	for p := range int32(2) {
		waitForTailOn(t, cluster, group, topic, p, 0, func(tail frontier.Tail) bool {
			return tailCovers(tail, 1, perPartition)
		})
	}

	b := tailSubscriber(t, cluster.Brokers(), cooperative(), group, nil)
	t.Cleanup(func() { _ = b.Close() })
	bMsgs, err := b.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string]int{}
	go func() {
		for msg := range bMsgs {
			p, _ := safeack.MessagePartitionFromCtx(msg.Context())
			off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
			mu.Lock()
			seen[fmt.Sprintf("%d@%d", p, off)]++
			mu.Unlock()
			msg.Ack()
		}
	}()
	kafkatest.WaitFor(t, 30*time.Second, "the new member handles the moved partition's held record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["0@0"]+seen["1@0"] > 0
	})
	require.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 1
	}, 2*time.Second, 50*time.Millisecond, "the new member handled completed records again")
	mu.Lock()
	require.Len(t, seen, 1, "handled by the new member: %v", seen)
	mu.Unlock()
	var skipped uint64
	for _, ps := range b.Stats() {
		skipped += ps.SkippedTail
	}
	require.Equal(t, uint64(perPartition-1), skipped, "the new member skips the completed tail")
}

// TestForeignMetadataIsIgnored: metadata written by another client, or a
// tail relative to another offset, is ignored and every record after the
// committed offset is redelivered.
func TestForeignMetadataIsIgnored(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	produceSequential(t, cluster, topic, 0, 20)

	mismatched, _, err := frontier.EncodeTail(3, []frontier.Range{{From: 6, To: 20}}, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	for name, meta := range map[string]string{
		"other client":  `{"app":"someone else","done":[6,7,8]}`,
		"garbage":       "sa1:r%%%not-base64",
		"mismatch base": mismatched, // says 6..19 are done, relative to offset 3
	} {
		t.Run(name, func(t *testing.T) {
			group := cluster.NewGroup(t)
			commitRaw(t, cluster, group, topic, 5, meta)
			handled := consumeUntil(t, cluster, group, topic, func(seen map[int64]int) bool { return len(seen) == 15 })
			got := handled()
			for off := int64(5); off < 20; off++ {
				require.Equal(t, 1, got[off], "offset %d must be redelivered", off)
			}
		})
	}
}

// produceSequential writes n records to partition 0 of topic.
func produceSequential(t *testing.T, cluster *kafkatest.Cluster, topic string, partition int32, n int) {
	t.Helper()
	const batch = 2_000
	for i := 0; i < n; i += batch {
		recs := make([]kafkatest.Record, 0, batch)
		for j := i; j < min(i+batch, n); j++ {
			recs = append(recs, kafkatest.Record{Partition: partition, Value: []byte(strconv.Itoa(j))})
		}
		cluster.Produce(t, topic, recs...)
	}
}

// commitRaw commits offset with metadata for group, as another client
// would: a commit outside any generation, straight to the coordinator.
func commitRaw(t *testing.T, cluster *kafkatest.Cluster, group, topic string, offset int64, metadata string) {
	t.Helper()
	client, err := sarama.NewClient(cluster.Brokers(), cluster.SaramaConfig())
	require.NoError(t, err)
	defer client.Close()
	coordinator, err := client.Coordinator(group)
	require.NoError(t, err)
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1, RetentionTime: -1}
	req.AddBlock(topic, 0, offset, 0, metadata)
	resp, err := coordinator.CommitOffset(req)
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, resp.Errors[topic][0])
	got := cluster.CommittedOffsets(t, group, topic)[0]
	require.Equal(t, offset, got.Offset)
	require.Equal(t, metadata, got.Metadata)
}

// consumeUntil runs a fresh subscriber in group until done holds for the
// offsets it handled (acking each), and returns a function reading them.
func consumeUntil(t *testing.T, cluster *kafkatest.Cluster, group, topic string, done func(map[int64]int) bool) func() map[int64]int {
	t.Helper()
	sub := tailSubscriber(t, cluster.Brokers(), cluster.SaramaConfig(), group, nil)
	t.Cleanup(func() { _ = sub.Close() })
	seen := countAndAck(mustSubscribe(t, sub, topic))
	kafkatest.WaitFor(t, 30*time.Second, "the expected records handled", func() bool { return done(seen.snapshot()) })
	return seen.snapshot
}

// tailCovers reports whether tail lists every offset in [from, to) as
// completed. Its two ends are not enough: each delivery's ack is turned
// into a completion by a goroutine of its own, so a commit can list the
// last record acked while an earlier one, acked before it, is not yet
// completed; a consumer killed right after that commit leaves that record
// to be handled again, as it should.
func tailCovers(tail frontier.Tail, from, to int64) bool {
	for _, r := range tail.Ranges {
		if r.From <= from && to <= r.To {
			return true
		}
	}
	return false
}

// waitForTail waits until the group's commit of partition 0, read back from
// the broker, is at offset with metadata that decodes to a tail satisfying
// ok. Read back, not observed on the wire: a commit request the broker
// refuses (a stale generation when the member's session lapsed on a loaded
// machine) is seen by an observer but not kept, and the next owner resumes
// from what was kept.
func waitForTail(t *testing.T, cluster *kafkatest.Cluster, group, topic string, offset int64, ok func(frontier.Tail) bool) {
	t.Helper()
	waitForTailOn(t, cluster, group, topic, 0, offset, ok)
}

// waitForTailOn is waitForTail for any partition.
func waitForTailOn(t *testing.T, cluster *kafkatest.Cluster, group, topic string, partition int32, offset int64, ok func(frontier.Tail) bool) {
	t.Helper()
	kafkatest.WaitFor(t, 30*time.Second, fmt.Sprintf("a commit of partition %d carrying the completed tail", partition), func() bool {
		c := cluster.CommittedOffsets(t, group, topic)[partition]
		tail, err := frontier.DecodeTail(c.Metadata, offset)
		return c.Offset == offset && err == nil && ok(tail)
	})
}

// TestTailEncodedAtMostOncePerCommitInterval acks records one by one for a
// while behind a held head, so that the tail changes on every ack, and
// checks that it was encoded no more often than once per commit interval.
func TestTailEncodedAtMostOncePerCommitInterval(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	topic := cluster.NewTopic(t, 1)
	produceSequential(t, cluster, topic, 0, 400)
	cfg := cluster.SaramaConfig()
	const interval = 100 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = interval
	sub := tailSubscriber(t, cluster.Brokers(), cfg, cluster.NewGroup(t), nil)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	start := time.Now()
	acked := 0
	for acked < 399 {
		msg := <-msgs
		if off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); off == 0 {
			continue // the head stays unfinished: every ack grows the tail
		}
		time.Sleep(2 * time.Millisecond) // spread the acks over many intervals
		msg.Ack()
		acked++
	}
	var stats safeack.PartitionStats
	kafkatest.WaitFor(t, 10*time.Second, "the whole tail encoded", func() bool {
		stats = sub.Stats()[0]
		return stats.Blocked == 399 && stats.TailEncodes > 0 && time.Since(start) > 2*interval
	})
	elapsed := time.Since(start)
	allowed := uint64(elapsed/interval) + 2
	require.LessOrEqual(t, stats.TailEncodes, allowed, "%d encodes in %v at one per %v", stats.TailEncodes, elapsed, interval)
	t.Logf("%d acks, %d tail encodes in %v", acked, stats.TailEncodes, elapsed)
}

// TestTailOverBudgetKeepsWorkingAndCanPause: with a tiny metadata budget
// and every other record held, the tail no longer fits; the partition keeps
// flowing, commits stay within the budget, Stats says the tail was cut, and
// with PauseAtTailUsage the partition stops taking records as soon as its
// tail reaches the fraction, not a commit interval later (the consumer takes
// the whole topic well within one interval), and takes none until the held
// ones complete.
func TestTailOverBudgetKeepsWorkingAndCanPause(t *testing.T) {
	t.Parallel()
	for _, pause := range []bool{false, true} {
		t.Run(fmt.Sprintf("pause=%v", pause), func(t *testing.T) {
			t.Parallel()
			cluster := kafkatest.Start(t)
			topic := cluster.NewTopic(t, 1)
			// Far more records than the tail can describe: they are all
			// fetched, and taken within a commit interval when nothing
			// pauses.
			const n, budget = 5000, 48
			produceSequential(t, cluster, topic, 0, n)
			log := cluster.ObserveCommits(t)
			cfg := cluster.SaramaConfig()
			cfg.Consumer.Offsets.AutoCommit.Interval = 50 * time.Millisecond
			group := cluster.NewGroup(t)
			sub := tailSubscriber(t, cluster.Brokers(), cfg, group, func(c *safeack.SubscriberConfig) {
				c.TailMetadataBudget = budget
				c.MaxInFlight = n
				if pause {
					c.PauseAtTailUsage = 0.5
				}
			})
			t.Cleanup(func() { _ = sub.Close() })
			msgs, err := sub.Subscribe(context.Background(), topic)
			require.NoError(t, err)

			// Hold a random half of the records, ack the others: an
			// incompressible tail, far more than 48 bytes can say.
			rng := rand.New(rand.NewPCG(1, 2))
			hold := make(map[int64]bool, n)
			for off := range int64(n) {
				hold[off] = off == 0 || rng.IntN(2) == 0
			}
			var held []*message.Message
			var mu sync.Mutex
			var handled atomic.Int64
			go func() {
				for msg := range msgs {
					handled.Add(1)
					if off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); hold[off] {
						mu.Lock()
						held = append(held, msg)
						mu.Unlock()
						continue
					}
					msg.Ack()
				}
			}()
			if pause {
				kafkatest.WaitFor(t, 20*time.Second, "the partition pauses with its tail near the budget", func() bool {
					st := sub.Stats()
					return len(st) == 1 && st[0].Paused
				})
				st := sub.Stats()[0]
				taken := st.Delivered
				t.Logf("paused after taking %d records: tail %d bytes (cut: %v), %d encodes", taken, st.TailBytes, st.TailTruncated, st.TailEncodes)
				require.True(t, st.TailTruncated || st.TailBytes >= budget/2, "paused with a tail of %d bytes, below the fraction", st.TailBytes)
				require.LessOrEqual(t, taken, int64(pauseTakenMax), "the partition must pause once its tail reaches the fraction, not take the whole burst")
				require.Never(t, func() bool { return sub.Stats()[0].Delivered > taken+pauseSlack }, 500*time.Millisecond, 20*time.Millisecond,
					"records kept being taken while paused")
			} else {
				kafkatest.WaitFor(t, 20*time.Second, "every record handed out despite the cut tail", func() bool { return handled.Load() == n })
				kafkatest.WaitFor(t, 5*time.Second, "a tail cut to the budget", func() bool {
					st := sub.Stats()[0]
					return st.TailTruncated && st.TailBytes <= budget
				})
			}
			mu.Lock()
			for _, msg := range held {
				msg.Ack()
			}
			held = nil
			mu.Unlock()
			kafkatest.WaitFor(t, 20*time.Second, "everything handled and committed", func() bool {
				mu.Lock()
				for _, msg := range held {
					msg.Ack()
				}
				held = nil
				mu.Unlock()
				return handled.Load() >= n && cluster.CommittedOffsets(t, group, topic)[0].Offset == n
			})
			if pause {
				require.Positive(t, sub.Stats()[0].PausedFor)
			}
			if log != nil {
				for _, c := range log.Commits() {
					if co, ok := c.Offset(topic, 0); ok && c.Group == group {
						require.LessOrEqual(t, len(co.Metadata), budget, "a commit's metadata exceeded the budget")
					}
				}
			}
		})
	}
}

// pauseSlack is what a partition may still take after Stats shows it paused:
// the record the run loop may be taking when the commit loop, another
// goroutine, decides the pause.
const pauseSlack = 1

// pauseTakenMax bounds the records taken before the pause in
// TestTailOverBudgetKeepsWorkingAndCanPause. Half of the first hundred-odd
// records held already make a tail of 24 bytes; the rest is what was on its
// way when the tail reached the fraction: the ready queue (32), records
// whose acks the partition has not seen yet, and one bound check in eight
// skipped while the bound grows (see tailCheckDueLocked). Without the check
// between commits the whole topic (5,000) is taken.
const pauseTakenMax = 1000
