package safeack_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestSubscriberCommitNeverPassesUnacked checks invariant 1 at the broker:
// with many messages per partition in flight and acks arriving out of order,
// no OffsetCommit request ever covers a record whose Ack had not been called
// before the request reached the broker; and the group's final commits reach
// the end of every partition.
func TestSubscriberCommitNeverPassesUnacked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		autoCommit bool
		byKey      bool
	}{
		{"sarama-auto-commit", true, false},
		{"manual-commit-interval", false, false},
		{"by-key", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const partitions, records = 4, 2000
			c, topic, group := kafkatest.StartTopic(t, partitions)
			var keyFn func(int) string
			if tc.byKey {
				// 10 keys per partition, so same-key records queue up.
				keyFn = func(i int) string { return fmt.Sprintf("k%d", i%40) }
			}
			c.ProduceN(t, topic, partitions, records, keyFn)

			acks, watch := watchCommits(t, c, group, topic)
			sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.MaxInFlight = 100
				cfg.Ordering = safeack.Unordered
				if tc.byKey {
					cfg.Ordering = safeack.OrderByKey
				}
				cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = tc.autoCommit
				cfg.CommitInterval = 30 * time.Millisecond
			})
			msgs := mustSubscribe(t, sub, topic)

			var maxInFlight inFlightMeter
			keys := newKeyWatch()
			handleAll(msgs, func(m *message.Message) {
				maxInFlight.enter()
				if tc.byKey {
					keys.start(m)
				}
				randomDelay(20 * time.Millisecond)
				// Leave before Ack: the subscriber frees the slot (and the
				// key) only after it, so the meters never run ahead.
				maxInFlight.leave()
				if tc.byKey {
					keys.end(m)
				}
				acks.ack(m)
			})

			hwm := c.HighWaterMarks(t, topic)
			acks.waitAllAcked(t, c, topic, 30*time.Second)
			watch.waitCommitted(t, hwm, 15*time.Second)

			for _, e := range keys.errors() {
				t.Error(e)
			}
			n := watch.check(t)
			require.Positive(t, n, "no commit of the group was observed")
			require.Empty(t, acks.badMessages(), "messages without partition/offset in their context")
			// Out-of-order acks need several messages per partition at once.
			require.Greater(t, maxInFlight.max(), partitions, "handlers never ran concurrently beyond one per partition")
			require.LessOrEqual(t, maxInFlight.max(), 100, "more messages in flight than MaxInFlight")
			t.Logf("%d commits checked, %d records, max %d handlers at once", n, records, maxInFlight.max())
		})
	}
}

// keyWatch checks invariant 6 from the handlers: two records with the same
// key never run at once, and they start in offset order.
type keyWatch struct {
	mu        sync.Mutex
	busy      map[string]int64
	lastStart map[string]int64
	errs      []string
}

func newKeyWatch() *keyWatch {
	return &keyWatch{busy: make(map[string]int64), lastStart: make(map[string]int64)}
}

func (w *keyWatch) start(m *message.Message) {
	key, _ := safeack.MessageKeyFromCtx(m.Context())
	k, _ := msgPO(m)
	id := fmt.Sprintf("%d/%s", k.p, key)
	w.mu.Lock()
	defer w.mu.Unlock()
	if other, ok := w.busy[id]; ok {
		w.errs = append(w.errs, fmt.Sprintf("key %s: offset %d started while %d was running", id, k.o, other))
	}
	if last, ok := w.lastStart[id]; ok && last >= k.o {
		w.errs = append(w.errs, fmt.Sprintf("key %s: offset %d started after %d", id, k.o, last))
	}
	w.busy[id] = k.o
	w.lastStart[id] = k.o
}

func (w *keyWatch) end(m *message.Message) {
	key, _ := safeack.MessageKeyFromCtx(m.Context())
	k, _ := msgPO(m)
	w.mu.Lock()
	delete(w.busy, fmt.Sprintf("%d/%s", k.p, key))
	w.mu.Unlock()
}

func (w *keyWatch) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.errs...)
}

// TestCommitWhenAllComplete: a partition whose every received record is
// complete is committed at once, not at the next commit interval. The
// interval here is far longer than the test's deadline, so only the early
// commit can pass it; with auto-commit on (Sarama's interval) and off
// (CommitInterval), and with the completed tail on and off.
func TestCommitWhenAllComplete(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	for _, autoCommit := range []bool{true, false} {
		for _, tail := range []bool{true, false} {
			t.Run(fmt.Sprintf("auto-commit=%v/tail=%v", autoCommit, tail), func(t *testing.T) {
				t.Parallel()
				const partitions = 2
				topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
				acks, watch := watchCommits(t, c, group, topic)
				sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
					cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = autoCommit
					cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Interval = time.Hour
					cfg.CommitInterval = time.Hour
					cfg.DisableCompletedTail = !tail
					cfg.Ordering = safeack.Unordered
				})
				handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
					randomDelay(2 * time.Millisecond)
					acks.ack(m)
				})
				for round := range 3 {
					c.ProduceN(t, topic, partitions, 100, nil)
					acks.waitAllAcked(t, c, topic, 15*time.Second)
					// Well under the hour-long interval: only an early
					// commit reaches it. 30 s, not less: under the whole
					// suite's load one commit and its read-back have
					// taken more than 10 s (a local CI run: 14 of 50
					// committed on one partition after 10 s).
					watch.waitCommitted(t, c.HighWaterMarks(t, topic), 30*time.Second)
					t.Logf("round %d: end of every partition committed without waiting for the interval", round)
				}
				require.Positive(t, watch.check(t))
			})
		}
	}
}

// TestCommitNotBehindFetch: a commit does not wait behind a Fetch that
// waits for records. A broker answers the requests of one connection in
// order, and a Fetch that finds nothing new waits up to
// Consumer.MaxWaitTime: on the connection shared with fetching, the early
// commit of a burst's last records waited that long. Here MaxWaitTime is 5 s
// and the interval an hour: the end of every partition must be committed
// well within the MaxWaitTime after the last ack, burst after burst.
func TestCommitNotBehindFetch(t *testing.T) {
	t.Parallel()
	const maxWait = 5 * time.Second
	const partitions = 2
	c, topic, group, acks, watch := startWatched(t, partitions)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.MaxWaitTime = maxWait
		cfg.CommitInterval = time.Hour
		cfg.Ordering = safeack.Unordered
	})
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) { acks.ack(m) })
	for round := range 3 {
		c.ProduceN(t, topic, partitions, 50, nil)
		acks.waitAllAcked(t, c, topic, 15*time.Second)
		lastAck := time.Now()
		hwm := c.HighWaterMarks(t, topic)
		watch.waitCommitted(t, hwm, 2*maxWait)
		lag := time.Since(lastAck)
		t.Logf("round %d: end of every partition committed %v after the last ack", round, lag)
		require.Less(t, lag, maxWait/2, "the commit waited behind a Fetch (MaxWaitTime %v)", maxWait)
	}
	require.Positive(t, watch.check(t))
}

// TestEarlyCommitRefusedIsRetried: Sarama does not tell its caller that the
// coordinator refused a commit, so the early commit of a partition whose
// every record is complete reads the committed offsets back and commits
// again (within a tenth of the interval) until the coordinator holds them,
// rather than leaving them to the next interval. Here the interval is an
// hour and the coordinator refuses the first two commits past the start.
func TestEarlyCommitRefusedIsRetried(t *testing.T) {
	t.Parallel()
	for name, code := range map[string]int16{"loading": kerr.CoordinatorLoadInProgress.Code, "not coordinator": kerr.NotCoordinator.Code} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
			refused := refuseCommitsPastStart(c, group, code, 2)
			acks := newAckLog()
			sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
				cfg.CommitInterval = time.Hour
			})
			handleAll(mustSubscribe(t, sub, topic), acks.ack)
			c.ProduceN(t, topic, 1, 10, nil)
			acks.waitAllAcked(t, c, topic, 15*time.Second)
			kafkatest.WaitFor(t, 10*time.Second, "the coordinator to hold the end of the partition", func() bool {
				return c.CommittedOffsets(t, group, topic)[0].Offset == 10
			})
			require.EqualValues(t, 2, refused.Load(), "the coordinator refused two commits")
		})
	}
}

// TestFinalCommitRefusedIsRetried: when Close drains a partition, its final
// prefix is committed before Close returns even if the coordinator refuses
// that commit at first (a coordinator loading the group): the drain's
// commit and the session's last one are read back and sent again. Before,
// both were refused, Close returned with the group still at the start, and
// the next owner handled every acked record again.
func TestFinalCommitRefusedIsRetried(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	refused := refuseCommitsPastStart(c, group, kerr.CoordinatorLoadInProgress.Code, 2)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
		cfg.CommitInterval = time.Hour
		cfg.DrainTimeout = 5 * time.Second
		cfg.Ordering = safeack.Unordered
	})
	// The head is held until the drain starts, so that nothing past the
	// start is committed before it.
	m0 := holdHead(t, c, sub, topic, 10, func(m *message.Message) int64 {
		off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		return off
	})
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = sub.Close()
	}()
	kafkatest.WaitFor(t, 10*time.Second, "the drain to start", func() bool { return safeack.AssignmentEnded(m0) })
	m0.Ack()
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return")
	}
	require.EqualValues(t, 2, refused.Load(), "the coordinator refused two commits")
	require.EqualValues(t, 10, c.CommittedOffsets(t, group, topic)[0].Offset, "the final prefix is committed when Close returns")
}

// TestFinalTailRefusedIsRetried: with the head still running at Close,
// the final commit differs from the last one the coordinator holds only by
// its completed tail (same offset); refused, it is read back and sent again
// too. Before, the read-back compared offsets only, took it as held, and
// the next owner handled every record the tail listed again.
func TestFinalTailRefusedIsRetried(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	refused := c.RefuseCommits(group, kerr.CoordinatorLoadInProgress.Code, 2, func(rp kmsg.OffsetCommitRequestTopicPartition) bool {
		if rp.Metadata == nil {
			return false
		}
		tail, err := frontier.DecodeTail(*rp.Metadata, rp.Offset)
		return err == nil && len(tail.Ranges) > 0 // not the leader epoch alone
	})
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
		cfg.CommitInterval = time.Hour
		// DrainTimeout also sets how long the final commit may wait at
		// Close (1 s at 300 ms: on a loaded machine, too short for two
		// refusals, their backoff and a third commit, and the tail was
		// logged uncommitted, as documented).
		cfg.DrainTimeout = 2 * time.Second
		cfg.Ordering = safeack.Unordered
	})
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		if off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context()); off != 0 {
			m.Ack() // the head, 0, is never answered
		}
	})
	c.ProduceN(t, topic, 1, 10, nil)
	waitCompleted(t, sub, topic, 0, 9, 10*time.Second, "every record but the head acked")
	require.NoError(t, sub.Close())
	require.EqualValues(t, 2, refused.Load(), "the coordinator refused two commits with a tail")
	held := c.CommittedOffsets(t, group, topic)[0]
	require.EqualValues(t, 0, held.Offset)
	tail, err := frontier.DecodeTail(held.Metadata, 0)
	require.NoError(t, err, "the final commit's tail is held when Close returns")
	require.Equal(t, []frontier.Range{{From: 1, To: 10}}, tail.Ranges)
}

// TestEagerRevokeFinalCommitRefusedIsRetried: the final prefix of a
// partition revoked in an eager rebalance reaches the coordinator before
// the member rejoins, even if the coordinator refuses the drain's commit
// and the session's last one: Cleanup reads it back and sends it again.
// Before, both were lost and the partition's next owner handled every
// record again.
func TestEagerRevokeFinalCommitRefusedIsRetried(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's eager rebalance")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	refused := refuseCommitsPastStart(c, group, kerr.CoordinatorLoadInProgress.Code, 2)
	config := func(ordering safeack.Ordering) func(*safeack.SubscriberConfig) {
		return func(cfg *safeack.SubscriberConfig) {
			cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
			cfg.CommitInterval = time.Hour
			cfg.DrainTimeout = 5 * time.Second
			cfg.Ordering = ordering
		}
	}
	var mu sync.Mutex
	handled := map[int64]int{}
	handle := func(m *message.Message) int64 {
		off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		mu.Lock()
		defer mu.Unlock()
		handled[off]++
		return off
	}
	// The head is held until the drain starts, so that nothing past the
	// start is committed before it.
	a := newTestSubscriber(t, c, group, config(safeack.Unordered))
	m0 := holdHead(t, c, a, topic, 5, handle)

	// One record at a time, in order: a member starting at the head
	// handles it before the record produced below.
	b := newTestSubscriber(t, c, group, config(safeack.OrderByPartition))
	handleAll(mustSubscribe(t, b, topic), func(m *message.Message) {
		handle(m)
		m.Ack()
	})
	kafkatest.WaitFor(t, 30*time.Second, "the rebalance to revoke the partition", func() bool { return safeack.AssignmentEnded(m0) })
	m0.Ack() // during the drain: the final prefix is the end
	kafkatest.WaitFor(t, 30*time.Second, "the partition to be owned again", func() bool {
		return len(ownedPartitions(a, topic))+len(ownedPartitions(b, topic)) == 1
	})
	c.ProduceN(t, topic, 1, 1, nil)
	kafkatest.WaitFor(t, 15*time.Second, "the record after the revoked ones handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled[5] > 0
	})
	mu.Lock()
	defer mu.Unlock()
	for off := range int64(5) {
		require.Equal(t, 1, handled[off], "record %d handled again by the next owner (commits refused: %d)", off, refused.Load())
	}
}

// holdHead subscribes sub to topic (one partition), produces n records
// and acks every record but the head, offset 0, which it returns once the
// others completed. offset tells (and may note) a delivery's offset.
func holdHead(t *testing.T, c *kafkatest.Cluster, sub *safeack.Subscriber, topic string, n int, offset func(*message.Message) int64) *message.Message {
	t.Helper()
	head := make(chan *message.Message, 1)
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		if offset(m) == 0 {
			head <- m
			return
		}
		m.Ack()
	})
	c.ProduceN(t, topic, 1, n, nil)
	m0 := receive(t, head, 15*time.Second, "the first record was not delivered")
	waitCompleted(t, sub, topic, 0, uint64(n-1), 10*time.Second, "every record but the head acked")
	return m0
}

// refuseCommitsPastStart makes the embedded broker answer the first n
// OffsetCommit requests of group that carry an offset above 0 with code
// (the pinned start, offset 0, goes through). It returns the count refused.
func refuseCommitsPastStart(c *kafkatest.Cluster, group string, code int16, n int32) *atomic.Int32 {
	return c.RefuseCommits(group, code, n, func(rp kmsg.OffsetCommitRequestTopicPartition) bool { return rp.Offset > 0 })
}

// TestCooperativeRevokeFinalCommitRefusedIsRetried: a partition revoked
// from a cooperative session has its final prefix committed before the
// revocation completes even if the coordinator refuses that commit at
// first. Sarama drops a revoked partition's marks once its claim returns
// (auto-commit being off), so the commit is read back and sent again
// before; the new owner then starts after every record the old one acked.
// Before, the refused commit was dropped and the new owner handled the
// record acked during the drain again.
func TestCooperativeRevokeFinalCommitRefusedIsRetried(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	const partitions, perPartition = 2, 5
	topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
	refused := refuseCommitsPastStart(c, group, kerr.CoordinatorLoadInProgress.Code, 2)
	cooperative := func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
		cfg.CommitInterval = time.Hour
		cfg.DrainTimeout = 5 * time.Second
		cfg.Ordering = safeack.Unordered
	}
	a := newTestSubscriber(t, c, group, cooperative)
	// Each partition's head is held until its assignment ends, so that
	// nothing past the start is committed before a drain.
	heads := make(chan *message.Message, partitions)
	handleAll(mustSubscribe(t, a, topic), func(m *message.Message) {
		if off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context()); off == 0 {
			heads <- m
			return
		}
		m.Ack()
	})
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	held := make([]*message.Message, 0, partitions)
	for range partitions {
		select {
		case m := <-heads:
			held = append(held, m)
		case <-time.After(15 * time.Second):
			t.Fatal("the heads were not delivered")
		}
	}
	kafkatest.WaitFor(t, 10*time.Second, "every record but the heads acked", func() bool {
		ps := ownedPartitions(a, topic)
		return len(ps) == partitions && ps[0].Completed == perPartition-1 && ps[1].Completed == perPartition-1
	})

	b := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cooperative(cfg)
		cfg.Ordering = safeack.OrderByPartition
	})
	var mu sync.Mutex
	seenByB := map[po]int{}
	handleAll(mustSubscribe(t, b, topic), func(m *message.Message) {
		k, _ := msgPO(m)
		mu.Lock()
		seenByB[k]++
		mu.Unlock()
		m.Ack()
	})
	var moved *message.Message
	kafkatest.WaitFor(t, 30*time.Second, "a partition to be revoked from the first member", func() bool {
		for _, m := range held {
			if safeack.AssignmentEnded(m) {
				moved = m
				return true
			}
		}
		return false
	})
	moved.Ack() // during the drain: the final prefix is the end
	defer func() {
		for _, m := range held {
			m.Ack() // the head still owned: no drain timeout at Close
		}
	}()
	p, _ := safeack.MessagePartitionFromCtx(moved.Context())
	kafkatest.WaitFor(t, 30*time.Second, "the second member to own the moved partition", func() bool {
		_, ok := ownedPartitions(b, topic)[p]
		return ok
	})
	// A record after the moved ones: the new owner handles it, and, had it
	// started at the head (one record at a time, in order), the head
	// before it.
	c.Produce(t, topic, kafkatest.Record{Partition: p, Value: []byte("after")})
	kafkatest.WaitFor(t, 15*time.Second, "the new owner to handle the record after the moved ones", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seenByB[po{p, perPartition}] > 0
	})
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, seenByB[po{p, 0}], "the new owner handled again the record the old one acked during its drain (commits refused: %d)", refused.Load())
	require.EqualValues(t, 2, refused.Load(), "the coordinator refused two commits")
}

// TestFinalCommitOfUnmovedStartIsHeld: a partition whose assignment starts
// from the group's commit and ends without a new record marked nothing, so
// its final position is the commit it started from, whose metadata the
// earlier owner wrote with the leader epoch alone ("sa2:0"), and which
// Sarama does not send again. The coordinator holds that position: the
// final commit is confirmed at once, and no Error says it is not. Before,
// the read-back compared the metadata as text ("" against "sa2:0"),
// committed again for the whole final-commit bound, and logged "Final
// positions not committed ... held=0:5 uncommitted=0:5" at every such
// rebalance and Close.
func TestFinalCommitOfUnmovedStartIsHeld(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	logs := watermill.NewCaptureLogger()
	config := func(cfg *safeack.SubscriberConfig) {
		cfg.DrainTimeout = 5 * time.Second // the final commit's bound at Close, and at a rebalance
		// Commits come early, once every record is complete; the commit
		// loop's tick would mark the partition's position again.
		cfg.CommitInterval = time.Hour
	}
	a := newLoggedSubscriber(t, c, group, logs, config)
	handleAll(mustSubscribe(t, a, topic), func(m *message.Message) { m.Ack() })
	c.ProduceN(t, topic, 1, 5, nil)
	kafkatest.WaitFor(t, 15*time.Second, "the records committed", func() bool {
		return c.CommittedOffsets(t, group, topic)[0].Offset == 5
	})
	held := c.CommittedOffsets(t, group, topic)[0]
	epoch, ok := frontier.LeaderEpochOf(held.Metadata)
	require.True(t, ok, "the commit carries the leader epoch alone (metadata %q)", held.Metadata)
	tail, err := frontier.DecodeTail(held.Metadata, held.Offset)
	require.NoError(t, err)
	require.Empty(t, tail.Ranges, "no completed tail")
	t.Logf("held 5 with metadata %q (leader epoch %d)", held.Metadata, epoch)

	// A second member: the rebalance starts a session in which the
	// partition's owner starts from the commit, and gets no record.
	b := newLoggedSubscriber(t, c, group, logs, config)
	handleAll(mustSubscribe(t, b, topic), func(m *message.Message) { m.Ack() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.WaitReady(ctx), "the second member joined: the rebalance is over")
	var owner *safeack.Subscriber
	kafkatest.WaitFor(t, 30*time.Second, "the partition owned after the rebalance", func() bool {
		for _, s := range []*safeack.Subscriber{a, b} {
			if st, ok := ownedPartitions(s, topic)[0]; ok && st.ConfirmedOffset == 5 && len(ownedPartitions(a, topic))+len(ownedPartitions(b, topic)) == 1 {
				owner = s
				return true
			}
		}
		return false
	})
	start := time.Now()
	require.NoError(t, owner.Close())
	took := time.Since(start)
	require.Empty(t, uncommittedLogged(logs, topic), "no final position reported as not committed")
	require.Less(t, took, 3*time.Second, "Close confirmed the final commit at once (its bound is 5 s)")
	require.EqualValues(t, 5, c.CommittedOffsets(t, group, topic)[0].Offset)
}
