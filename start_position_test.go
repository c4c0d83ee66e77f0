package safeack_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Invariant 8: a partition's bookkeeping starts where fetching really
// starts, and a group that delivered anything has an in-range committed
// position at or before its oldest unfinished record, never below its real
// start. Each case puts one partition where users' partitions end up (a fresh
// group, a commit above the high-water mark or below the log start,
// compaction or an aborted transaction at the start), at Sarama's default
// OffsetNewest and at OffsetOldest, with auto-commit on and off and the
// completed tail on and off. Member 1 holds the first record it gets and
// acks the rest; every commit the broker sees must lie between the
// partition's real start and the held record and cover only acked records; after member 1 closes, member 2 must get the
// held record, and nothing before the first record.

// startCase is one way a partition can be found when a member joins.
type startCase struct {
	name    string
	initial int64 // Consumer.Offsets.Initial
	// prepare writes history and sets the group's commit before anyone
	// joins.
	prepare func(t *testing.T, c *kafkatest.Cluster, topic, group string)
	// first is the offset member 1 must start at, given the high-water mark
	// once it owns the partition (before the live records are produced).
	first func(hwm int64) int64
	// readCommitted consumes with IsolationLevel ReadCommitted.
	readCommitted bool
	embeddedOnly  bool // needs the embedded broker (compaction on demand)
}

func produceHistory(t *testing.T, c *kafkatest.Cluster, topic string, n int) {
	t.Helper()
	c.ProduceN(t, topic, 1, n, nil)
}

func atHWM(hwm int64) int64 { return hwm }
func at(off int64) func(int64) int64 {
	return func(int64) int64 { return off }
}

func startCases() []startCase {
	return []startCase{{
		// Issue 13 cases 1 and 2: nothing committed, OffsetNewest.
		name: "fresh-group/newest", initial: sarama.OffsetNewest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, _ string) { produceHistory(t, c, topic, 50) },
		first:   atHWM,
	}, {
		name: "fresh-group/oldest", initial: sarama.OffsetOldest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, _ string) { produceHistory(t, c, topic, 20) },
		first:   at(0),
	}, {
		// Case 3: the commit is above the high-water mark; Sarama falls
		// back to Offsets.Initial but keeps 30 as its current offset.
		name: "committed-above-hwm/oldest", initial: sarama.OffsetOldest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, group string) {
			produceHistory(t, c, topic, 10)
			c.CommitOffset(t, group, topic, 0, 30)
		},
		first: at(0),
	}, {
		// Case 4.
		name: "committed-above-hwm/newest", initial: sarama.OffsetNewest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, group string) {
			produceHistory(t, c, topic, 10)
			c.CommitOffset(t, group, topic, 0, 30)
		},
		first: atHWM,
	}, {
		name: "committed-below-log-start/oldest", initial: sarama.OffsetOldest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, group string) {
			produceHistory(t, c, topic, 30)
			c.CommitOffset(t, group, topic, 0, 5)
			c.DeleteRecords(t, topic, 0, 20)
		},
		first: at(20),
	}, {
		// Case 4: committed 5, log start 20.
		name: "committed-below-log-start/newest", initial: sarama.OffsetNewest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, group string) {
			produceHistory(t, c, topic, 30)
			c.CommitOffset(t, group, topic, 0, 5)
			c.DeleteRecords(t, topic, 0, 20)
		},
		first: atHWM,
	}, {
		// Case 5: a fresh group on a log that starts at 20.
		name: "fresh-group-log-start-20/oldest", initial: sarama.OffsetOldest,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, _ string) {
			produceHistory(t, c, topic, 30)
			c.DeleteRecords(t, topic, 0, 20)
		},
		first: at(20),
	}, {
		// Case 5, compaction: offsets 0..6 are compacted away; the log
		// starts at 0 but its first record is 7.
		name: "fresh-group-compacted-start/oldest", initial: sarama.OffsetOldest, embeddedOnly: true,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, _ string) {
			produce := func(key string) {
				c.Produce(t, topic, kafkatest.Record{Key: []byte(key), Value: []byte("v-" + key)})
			}
			for range 7 {
				produce("dup")
			}
			produce("k7")
			produce("k8")
			produce("dup") // 9 supersedes 0..6
			produce("k10") // compaction keeps the last batch whatever it holds
			c.Compact(t)
			// The test's accounting must not expect what compaction removed.
			c.ForgetProduced(topic, 0, 7)
		},
		first: at(7),
	}, {
		// An aborted transaction at the very start: 0..4 aborted, 5 its
		// marker; a read_committed consumer's first record is 6.
		name: "fresh-group-aborted-txn-start/oldest", initial: sarama.OffsetOldest, readCommitted: true,
		prepare: func(t *testing.T, c *kafkatest.Cluster, topic, _ string) {
			next := c.ProduceAborted(t, topic, 0, 5)
			require.EqualValues(t, 6, next, "5 aborted records and their marker")
			produceHistory(t, c, topic, 10)
		},
		first: at(6),
	}}
}

func TestStartPosition(t *testing.T) {
	t.Parallel()
	for _, sc := range startCases() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			if sc.embeddedOnly {
				c.RequireEmbedded(t)
			}
			for _, autoCommit := range []bool{true, false} {
				for _, tail := range []bool{true, false} {
					name := fmt.Sprintf("auto-commit=%v/tail=%v", autoCommit, tail)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						runStartCase(t, c, sc, envGroupProtocol, autoCommit, tail)
					})
				}
			}
		})
	}
}

// TestStartPositionConsumerProtocol runs every start case on the consumer
// group protocol (KIP-848) too, in the default suite: its member resolves
// and pins the starts as the classic one does (commits with the tail, no
// auto-commit: the commit loop is the same on both).
func TestStartPositionConsumerProtocol(t *testing.T) {
	t.Parallel()
	requireConsumerProtocol(t)
	for _, sc := range startCases() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			if sc.embeddedOnly {
				c.RequireEmbedded(t)
			}
			runStartCase(t, c, sc, safeack.GroupProtocolConsumer, false, true)
		})
	}
}

func runStartCase(t *testing.T, c *kafkatest.Cluster, sc startCase, p safeack.GroupProtocol, autoCommit, tail bool) {
	var topic string
	if sc.embeddedOnly {
		topic = c.NewCompactedTopic(t, 1)
	} else {
		topic = c.NewTopic(t, 1)
	}
	group := c.NewGroup(t)
	sc.prepare(t, c, topic, group)
	commits := c.ObserveCommits(t)

	configure := func(cfg *safeack.SubscriberConfig) {
		sc2 := cfg.OverwriteSaramaConfig
		sc2.Consumer.Offsets.Initial = sc.initial
		sc2.Consumer.Offsets.AutoCommit.Enable = autoCommit
		if sc.readCommitted {
			sc2.Consumer.IsolationLevel = sarama.ReadCommitted
		}
		cfg.DisableCompletedTail = !tail
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = 200 * time.Millisecond
	}

	// Member 1: holds the first record it gets, acks the others.
	acks := newAckLog()
	sub1 := newProtocolSubscriber(t, c, group, p, configure)
	// The first message out of the channel is the first handed out: the
	// partition's lowest offset.
	held := holdFirst(t, sub1, topic, acks, func(po) bool { return true })
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own the partition", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})
	hwm := c.HighWaterMarks(t, topic)[0]
	first := sc.first(hwm)
	// floor is the partition's real start: where Offsets.Initial resolved.
	// Commits never go below it; they may stay below first when offsets
	// between are gone (compaction, an aborted transaction).
	floor := hwm
	if sc.initial == sarama.OffsetOldest {
		floor = c.LogStartOffsets(t, topic)[0]
	}
	// Unique keys: the compaction case's topic is compacted (by any
	// subtest's Compact), which drops records without a key.
	uniqueKeys := func(label string) func(int) string {
		return func(i int) string { return fmt.Sprintf("%s-%d", label, i) }
	}
	c.ProduceN(t, topic, 1, 10, uniqueKeys("live"))

	var h po
	select {
	case h = <-held:
	case <-time.After(15 * time.Second):
		t.Fatal("member 1 got no record")
	}
	require.Equal(t, po{0, first}, h, "member 1's first record is where its partition starts")
	end := c.HighWaterMarks(t, topic)[0]
	acks.waitAllAckedFrom(t, c, topic, 0, first, []po{h}, 15*time.Second)

	// The held record's position reaches the broker, and Stats agrees.
	var pos int64
	kafkatest.WaitFor(t, 10*time.Second, "the held record's position to be safe, marked and confirmed at the broker", func() bool {
		ps, ok := statsOf(sub1, topic, 0)
		if !ok {
			return false
		}
		pos = ps.SafeOffset
		return ps.MarkedOffset == pos && ps.ConfirmedOffset == pos && ps.HasUnfinished && ps.OldestUnfinished == h.o &&
			c.CommittedOffsets(t, group, topic)[0].Offset == pos
	})
	require.True(t, pos >= floor && pos <= h.o, "committed %d while holding %d; the partition starts at %d", pos, h.o, floor)
	ps, _ := statsOf(sub1, topic, 0)
	require.Equal(t, max(ps.HighWaterMark-pos, 0), ps.Lag, "lag counts from the safe offset")
	require.GreaterOrEqual(t, ps.HighWaterMark, end)
	require.NoError(t, sub1.Close())

	// More records after member 1 left (issue 13 case 3 lost these).
	c.ProduceN(t, topic, 1, 5, uniqueKeys("after"))

	// Member 2 must get the held record, nothing before the start, and
	// together the members ack every record from the start on.
	var mu sync.Mutex
	var before []po
	sub2 := newProtocolSubscriber(t, c, group, p, configure)
	handleAll(mustSubscribe(t, sub2, topic), func(m *message.Message) {
		k, _ := msgPO(m)
		if k.o < first {
			mu.Lock()
			before = append(before, k)
			mu.Unlock()
		}
		acks.ack(m)
	})
	acks.waitAllAckedFrom(t, c, topic, 0, first, nil, 15*time.Second)
	require.Positive(t, acks.count(h), "the record member 1 held was never handled again")
	mu.Lock()
	require.Empty(t, before, "member 2 handled records from before the group's start")
	mu.Unlock()

	final := c.HighWaterMarks(t, topic)[0]
	kafkatest.WaitFor(t, 10*time.Second, "the group to commit the end of the partition", func() bool {
		return c.CommittedOffsets(t, group, topic)[0].Offset == final
	})
	checkStartCommits(t, c, commits, group, topic, floor, acks)
}

// checkStartCommits checks every observed commit of group on partition 0 of
// topic: never below floor (the partition's real start), never past the
// high-water mark, never past a record not acked before the commit was seen.
// On a real cluster, where commits cannot be observed, it checks the final
// committed offset the same way.
func checkStartCommits(t *testing.T, c *kafkatest.Cluster, log *kafkatest.CommitLog, group, topic string, floor int64, acks *ackLog) {
	t.Helper()
	end := c.HighWaterMarks(t, topic)[0]
	check := func(off int64, at time.Time) error {
		if off < floor || off > end {
			return fmt.Errorf("commit %d outside [%d, %d]", off, floor, end)
		}
		for _, p := range c.ProducedRecords(topic) {
			if p.Partition != 0 || p.Offset < floor || p.Offset >= off {
				continue
			}
			ackAt, ok := acks.first(po{0, p.Offset})
			if !ok || !ackAt.Before(at) {
				return fmt.Errorf("commit %d covers record %d, not acked before it", off, p.Offset)
			}
		}
		return nil
	}
	if log == nil {
		co := c.CommittedOffsets(t, group, topic)[0]
		require.NoError(t, check(co.Offset, time.Now()))
		return
	}
	n := log.CheckUntil(t, time.Now(), func(o kafkatest.ObservedCommit) error {
		if o.Group != group {
			return nil
		}
		if co, ok := o.Offset(topic, 0); ok {
			return check(co.Offset, o.At)
		}
		return nil
	})
	require.Positive(t, n, "no commit observed")
}

// waitAllAckedFrom waits until every produced record of topic/partition at
// or after from, except those in but, has a counted ack.
func (l *ackLog) waitAllAckedFrom(t *testing.T, c *kafkatest.Cluster, topic string, partition int32, from int64, but []po, timeout time.Duration) {
	t.Helper()
	var miss []po
	ok := waitCond(timeout, func() bool {
		miss = miss[:0]
		l.mu.Lock()
		defer l.mu.Unlock()
	next:
		for _, p := range c.ProducedRecords(topic) {
			k := po{p.Partition, p.Offset}
			if p.Partition != partition || p.Offset < from || len(l.acks[k]) > 0 {
				continue
			}
			for _, b := range but {
				if b == k {
					continue next
				}
			}
			miss = append(miss, k)
		}
		return len(miss) == 0
	})
	if !ok {
		t.Fatalf("timed out after %v: %d records from offset %d not acked, first: %v", timeout, len(miss), from, miss[:min(len(miss), 10)])
	}
}

// TestStartPositionNewPartition: a partition added to the topic after
// Subscribe, with no commit, starts at its first record although
// Offsets.Initial is OffsetNewest (Sarama's default): every record in it
// was written after Subscribe. Before, records produced to it before the
// group noticed it (a metadata refresh later: Metadata.RefreshFrequency,
// 10 minutes by default) were skipped. The start is committed before
// anything past it: issue 13 case 6 committed 0 while a later record was
// held, so the next member re-handled the skipped ones.
//
// With eager balancing the new partition comes in a new session, whose Setup
// commits its start before fetching. With cooperative-sticky it is added to
// the running session without Setup and Sarama fetches it from its end: the
// subscriber commits the log start when the claim begins and reads the
// partition from there beside the claim until it has caught up with it.
// Before, there, the records produced before the group noticed the
// partition were skipped ('Should be zero, but was 10').
func TestStartPositionNewPartition(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
		testNewPartition(t, c, cooperative)
	})
}

func testNewPartition(t *testing.T, c *kafkatest.Cluster, cooperative bool) {
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	commits := c.ObserveCommits(t)
	configure := func(cfg *safeack.SubscriberConfig) {
		if cooperative {
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky(),
			}
		}
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 500 * time.Millisecond
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = 200 * time.Millisecond
	}

	acks := newAckLog()
	sub1 := newTestSubscriber(t, c, group, configure)
	held := holdFirst(t, sub1, topic, acks, func(k po) bool { return k.p == 1 })
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own partition 0", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})

	c.AddPartitions(t, topic, 2)
	// Produced before the group notices the partition, most likely: at
	// OffsetNewest they are still delivered.
	c.Produce(t, topic, records(1, 10)...)
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own the new partition", func() bool {
		_, ok := statsOf(sub1, topic, 1)
		return ok
	})
	c.Produce(t, topic, records(1, 5)...)
	var h po
	select {
	case h = <-held:
	case <-time.After(15 * time.Second):
		t.Fatal("member 1 got no record of the new partition")
	}
	t.Logf("the new partition started at %d (10 records were produced to it before the group could notice)", h.o)
	require.Zero(t, h.o, "the records produced to the new partition before the group noticed it were skipped")
	acks.waitAllAckedFrom(t, c, topic, 1, h.o, []po{h}, 15*time.Second)
	kafkatest.WaitFor(t, 10*time.Second, "the held offset to be committed on the new partition", func() bool {
		return c.CommittedOffsets(t, group, topic)[1].Offset == h.o
	})
	require.NoError(t, sub1.Close())

	sub2 := newTestSubscriber(t, c, group, configure)
	var mu sync.Mutex
	var before []po
	handleAll(mustSubscribe(t, sub2, topic), func(m *message.Message) {
		if k, _ := msgPO(m); k.p == 1 && k.o < h.o {
			mu.Lock()
			before = append(before, k)
			mu.Unlock()
		}
		acks.ack(m)
	})
	acks.waitAllAckedFrom(t, c, topic, 1, h.o, nil, 15*time.Second)
	mu.Lock()
	require.Empty(t, before, "member 2 handled records of the new partition from before its start")
	mu.Unlock()
	if commits != nil {
		end := c.HighWaterMarks(t, topic)[1]
		commits.CheckUntil(t, time.Now(), func(o kafkatest.ObservedCommit) error {
			if co, ok := o.Offset(topic, 1); ok && o.Group == group && (co.Offset < h.o || co.Offset > end) {
				return fmt.Errorf("commit %d on the new partition outside [%d, %d]", co.Offset, h.o, end)
			}
			return nil
		})
	}
}

// records returns n records for partition p.
func records(p int32, n int) []kafkatest.Record {
	out := make([]kafkatest.Record, n)
	for i := range out {
		out[i] = kafkatest.Record{Partition: p, Value: fmt.Appendf(nil, "p%d-%d-%d", p, i, time.Now().UnixNano())}
	}
	return out
}

// TestStartPositionWithoutGroup: without a consumer group the start is
// resolved before consuming, so Stats is right before the first record
// (issue 13 case 5 reported safe 0, lag 20 at OffsetNewest).
func TestStartPositionWithoutGroup(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	noGroup := func(initial int64) func(*safeack.SubscriberConfig) {
		return func(cfg *safeack.SubscriberConfig) {
			cfg.ConsumerGroup = ""
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = initial
			cfg.Ordering = safeack.Unordered // key-less records out at once, unacked
		}
	}

	t.Run("newest", func(t *testing.T) {
		t.Parallel()
		topic := c.NewTopic(t, 1)
		c.ProduceN(t, topic, 1, 20, nil)
		sub := newTestSubscriber(t, c, "", noGroup(sarama.OffsetNewest))
		msgs := mustSubscribe(t, sub, topic)
		kafkatest.WaitFor(t, 10*time.Second, "Stats to show the partition at offset 20 with no lag", func() bool {
			ps, ok := statsOf(sub, topic, 0)
			return ok && ps.SafeOffset == 20 && ps.Lag == 0 && ps.HighWaterMark == 20
		})
		c.ProduceN(t, topic, 1, 3, nil)
		// Unordered: the three are handed out at once, in any order.
		got := map[po]bool{}
		for len(got) < 3 {
			select {
			case m := <-msgs:
				k, _ := msgPO(m)
				got[k] = true
				m.Ack()
			case <-time.After(10 * time.Second):
				t.Fatalf("messages at %v only; want offsets 20, 21 and 22", got)
			}
		}
		require.Equal(t, map[po]bool{{0, 20}: true, {0, 21}: true, {0, 22}: true}, got)
	})

	t.Run("oldest-log-start-20", func(t *testing.T) {
		t.Parallel()
		topic := c.NewTopic(t, 1)
		c.ProduceN(t, topic, 1, 30, nil)
		c.DeleteRecords(t, topic, 0, 20)
		sub := newTestSubscriber(t, c, "", noGroup(sarama.OffsetOldest))
		msgs := mustSubscribe(t, sub, topic)
		var got []*message.Message
		for range 10 {
			select {
			case m := <-msgs:
				got = append(got, m)
			case <-time.After(10 * time.Second):
				t.Fatalf("got %d of 10 messages", len(got))
			}
		}
		k, _ := msgPO(got[0])
		require.Equal(t, po{0, 20}, k, "the first record is the log start")
		ps, ok := statsOf(sub, topic, 0)
		require.True(t, ok)
		require.EqualValues(t, 20, ps.SafeOffset, "nothing acked: safe is the log start")
		require.EqualValues(t, 10, ps.Lag)
		for _, m := range got {
			m.Ack()
		}
		kafkatest.WaitFor(t, 10*time.Second, "the safe offset to reach the end", func() bool {
			ps, ok := statsOf(sub, topic, 0)
			return ok && ps.SafeOffset == 30 && ps.Lag == 0
		})
	})
}

// TestStartPositionCommittedBeforeFetching: a new group at OffsetNewest has
// its position at the broker before it hands anything out (Stats shows the
// partition only once that commit returned), so records
// produced after a member got the partition are not lost when that member
// leaves before handing any of them out (its handlers were all busy): the
// next member resumes at the pinned start, not at the then-newest offset.
func TestStartPositionCommittedBeforeFetching(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	c.ProduceN(t, topic, 1, 30, nil) // history: before the group, never handled
	configure := func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		cfg.DrainTimeout = 200 * time.Millisecond
	}

	sub1 := newTestSubscriber(t, c, group, configure)
	_ = mustSubscribe(t, sub1, topic) // never read: nothing is handed out
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own the partition", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})
	require.EqualValues(t, 30, c.CommittedOffsets(t, group, topic)[0].Offset,
		"the group's start is committed before anything is fetched")
	c.ProduceN(t, topic, 1, 10, nil)
	kafkatest.WaitFor(t, 10*time.Second, "member 1 to fetch the new records", func() bool {
		ps, ok := statsOf(sub1, topic, 0)
		return ok && ps.Delivered > 30
	})
	require.NoError(t, sub1.Close())

	acks := newAckLog()
	sub2 := newTestSubscriber(t, c, group, configure)
	var mu sync.Mutex
	var history []po
	handleAll(mustSubscribe(t, sub2, topic), func(m *message.Message) {
		if k, _ := msgPO(m); k.o < 30 {
			mu.Lock()
			history = append(history, k)
			mu.Unlock()
		}
		acks.ack(m)
	})
	acks.waitAllAckedFrom(t, c, topic, 0, 30, nil, 15*time.Second)
	mu.Lock()
	require.Empty(t, history, "records from before the group were handled")
	mu.Unlock()
}

// TestNoGroupStartResolvedBeforeSubscribeReturns: without a consumer group,
// at the defaults (OffsetNewest), a record produced after Subscribe
// returned is delivered, as with watermill-kafka, which starts its
// partition consumers before Subscribe returns. Before, the start of each
// partition was resolved later, when the subscription's goroutine first
// consumed, and records produced in between were skipped.
func TestNoGroupStartResolvedBeforeSubscribeReturns(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	const partitions = 16
	topic := c.NewTopic(t, partitions)
	c.ProduceN(t, topic, partitions, 2*partitions, nil) // history, skipped at OffsetNewest
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{Brokers: c.Brokers(),
		OverwriteSaramaConfig: defaultsOn(c, safeack.DefaultSaramaSubscriberConfig)}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs := mustSubscribe(t, sub, topic)
	after := c.ProduceN(t, topic, partitions, partitions, nil)
	want := make(map[po]bool, len(after))
	for _, r := range after {
		want[po{r.Partition, r.Offset}] = true
	}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case m := <-msgs:
			k, _ := msgPO(m)
			require.True(t, want[k], "record %v delivered: produced before Subscribe", k)
			delete(want, k)
			m.Ack()
		case <-deadline:
			t.Fatalf("%d of the %d records produced after Subscribe returned not delivered", len(want), partitions)
		}
	}
}

// holdFirst subscribes sub to topic and never answers the first delivery
// that match accepts, whose position it sends on the returned channel; it
// acks every other delivery (each in its own goroutine) into acks.
func holdFirst(t *testing.T, sub *safeack.Subscriber, topic string, acks *ackLog, match func(po) bool) <-chan po {
	t.Helper()
	held := make(chan po, 1)
	msgs := mustSubscribe(t, sub, topic)
	go func() {
		first := true
		for m := range msgs {
			if k, _ := msgPO(m); first && match(k) {
				first = false
				held <- k
				continue
			}
			go acks.ack(m)
		}
	}()
	return held
}
