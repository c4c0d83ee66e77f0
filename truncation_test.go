package safeack_test

import (
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// leaveTail runs a subscriber in group over the n records of partition 0
// of topic, acking every record but hold (none when hold < 0), and closes
// it: the group's commit is then hold (or n) with the completed tail
// behind it and the leader epoch the records were read at. It returns what
// the coordinator holds.
func leaveTail(t *testing.T, c *kafkatest.Cluster, group, topic string, n int, hold int64, configure ...func(*safeack.SubscriberConfig)) kafkatest.CommittedOffset {
	t.Helper()
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.DrainTimeout = 200 * time.Millisecond
		for _, f := range configure {
			f(cfg)
		}
	})
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		if off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context()); off != hold {
			m.Ack()
		}
	})
	want := uint64(n)
	if hold >= 0 {
		want--
	}
	waitCompleted(t, sub, topic, 0, want, 10*time.Second, "every record but the held one acked")
	require.NoError(t, sub.Close())
	return c.CommittedOffsets(t, group, topic)[0]
}

// handledBy runs a fresh subscriber in group, acking everything, until
// done holds for the offsets it handled; it returns those and the
// subscriber's totals for partition 0.
func handledBy(t *testing.T, c *kafkatest.Cluster, group, topic string, done func(map[int64]int) bool, initial ...int64) (map[int64]int, safeack.PartitionTotals) {
	t.Helper()
	return handledWith(t, c, group, topic, done, func(cfg *safeack.SubscriberConfig) {
		for _, at := range initial {
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = at
		}
	})
}

// handledWith is handledBy with the subscriber's config changed by configure.
func handledWith(t *testing.T, c *kafkatest.Cluster, group, topic string, done func(map[int64]int) bool,
	configure func(*safeack.SubscriberConfig)) (map[int64]int, safeack.PartitionTotals) {
	t.Helper()
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		configure(cfg)
	})
	seen := countAndAck(mustSubscribe(t, sub, topic))
	ok := kafkatest.Poll(10*time.Second, 20*time.Millisecond, func() bool { return done(seen.snapshot()) })
	got := seen.snapshot()
	require.True(t, ok, "the records expected were not handled; handled: %v", got)
	var totals safeack.PartitionTotals
	for _, tt := range sub.Totals() {
		if tt.Topic == topic && tt.Partition == 0 {
			totals = tt
		}
	}
	require.NoError(t, sub.Close())
	return got, totals
}

// bumpLeaderEpoch moves partition 0 of topic to the broker that leads it:
// a new leader epoch, as a leader election gives, over the same log.
func bumpLeaderEpoch(t *testing.T, c *kafkatest.Cluster, topic string) {
	t.Helper()
	kf := c.Kfake()
	require.NoError(t, kf.MoveTopicPartition(topic, 0, kf.LeaderFor(topic, 0)))
}

// answerEpochEnd makes the broker answer OffsetForLeaderEpoch for the
// partitions of topic with answer (an end offset, or an error code when
// code is not 0), as a leader would whose log ended the asked-for epoch
// there. It counts the requests.
func answerEpochEnd(c *kafkatest.Cluster, topic string, end int64, code int16) *atomic.Int32 {
	return answerEpochEnds(c, topic, func(int32) (int64, int16) { return end, code })
}

// answerEpochEndOnce is answerEpochEnd answering the first request with
// end and refusing the later ones (TopicAuthorizationFailed): a check that
// cannot run trusts the group's commit as it is.
func answerEpochEndOnce(c *kafkatest.Cluster, topic string, end int64) *atomic.Int32 {
	return answerEpochEnds(c, topic, func(answered int32) (int64, int16) {
		if answered == 0 {
			return end, 0
		}
		return -1, kerr.TopicAuthorizationFailed.Code
	})
}

// answerElection plays the new leader of an unclean election for the
// partitions of topic: the old epoch ends at diverged in its log (see
// answerEpochEnd). With startCheckRefused only the first request (the
// consuming member's) is answered, and the checks of the next starts are
// refused (see answerEpochEndOnce).
func answerElection(c *kafkatest.Cluster, topic string, diverged int64, startCheckRefused bool) *atomic.Int32 {
	if startCheckRefused {
		return answerEpochEndOnce(c, topic, diverged)
	}
	return answerEpochEnd(c, topic, diverged, 0)
}

// eachStartCheck runs f as parallel subtests: with the next start's
// leader-epoch check answered, and refused.
func eachStartCheck(t *testing.T, f func(t *testing.T, startCheckRefused bool)) {
	t.Helper()
	for _, refused := range []bool{false, true} {
		name := "start check answered"
		if refused {
			name = "start check refused"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, refused)
		})
	}
}

// answerEpochEnds is answerEpochEnd with the answer to each request
// chosen by answer, told how many were answered before it.
func answerEpochEnds(c *kafkatest.Cluster, topic string, answer func(answered int32) (end int64, code int16)) *atomic.Int32 {
	return c.Answer(kmsg.OffsetForLeaderEpoch, func(req kmsg.Request, answered int32) (kmsg.Response, bool) {
		end, code := answer(answered)
		oreq := req.(*kmsg.OffsetForLeaderEpochRequest)
		resp := oreq.ResponseKind().(*kmsg.OffsetForLeaderEpochResponse)
		mine := false
		for _, rt := range oreq.Topics {
			st := kmsg.NewOffsetForLeaderEpochResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetForLeaderEpochResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				sp.LeaderEpoch = rp.LeaderEpoch
				sp.EndOffset = end
				if code != 0 {
					sp.LeaderEpoch, sp.EndOffset = -1, -1
				}
				mine = mine || rt.Topic == topic
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, mine
	})
}

// TestTruncatedLogUnderCommit: an unclean leader election truncates the
// partition under the group's commit, and the new leader is given new
// records at the offsets it lost. The next start asks the leader where the
// committed leader epoch ends, finds it below the committed offset, starts
// again there and drops the completed tail: every record at a reused offset
// is handled. Before the check, the start trusted the commit: the reused
// offsets below it were never handled, and those the tail listed were
// skipped as "already completed".
//
// When the log diverges inside the completed tail (the committed offset
// is below the divergence, the tail reaches past it), the tail is cut
// there: its entries below the divergence are still skipped, the records
// from the divergence on are handled. Before the cut, the whole tail was
// trusted and the records at its reused offsets were skipped.
//
// kfake cannot truncate a log, so the new leader is played by answering
// OffsetForLeaderEpoch as it would (the asked-for epoch ends at diverged);
// the records kfake still holds from there on stand for the ones written
// after the election. The leader epoch is bumped first, as an election does.
func TestTruncatedLogUnderCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold int64 // the record left unanswered: the commit's offset, the tail above it
		// past, when not 0, is a commit beyond the new leader's log end
		// (the old leader had more records), written as safeack writes it.
		past        int64
		sasl        bool  // the brokers require SASL/PLAIN: the check logs in as Sarama does
		diverged    int64 // where the committed epoch ends in the new log; 0: 3
		cooperative bool
	}{
		{name: "completed tail", hold: 5},
		{name: "offset alone", hold: -1},
		{name: "commit past the log end", past: 15},
		{name: "completed tail over SASL", hold: 5, sasl: true},
		{name: "tail crossing the divergence/eager", hold: 2, diverged: 6},
		{name: "tail crossing the divergence/cooperative", hold: 2, diverged: 6, cooperative: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var opts []kafkatest.Option
			if tc.sasl {
				opts = append(opts, kafkatest.WithPlainSuperuser("admin", "admin-secret"))
			}
			c := kafkatest.Start(t, opts...)
			c.RequireEmbedded(t)
			topic, group := c.NewTopic(t, 1), c.NewGroup(t)
			const n = 10
			diverged := tc.diverged
			if diverged == 0 {
				diverged = 3
			}
			produceSequential(t, c, topic, 0, n)
			rebalance := func(cfg *safeack.SubscriberConfig) {
				if tc.cooperative {
					cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
						sarama.NewBalanceStrategyCooperativeSticky()}
				}
			}

			if tc.past != 0 {
				meta, _, err := frontier.EncodeTailEpoch(tc.past, nil, frontier.DefaultMetadataBudget, 0)
				require.NoError(t, err)
				commitRaw(t, c, group, topic, tc.past, meta)
			} else {
				held := leaveTail(t, c, group, topic, n, tc.hold, rebalance)
				_, ok := frontier.LeaderEpochOf(held.Metadata)
				require.True(t, ok, "the commit carries no leader epoch: %q", held.Metadata)
				tail, err := frontier.DecodeTail(held.Metadata, held.Offset)
				require.NoError(t, err)
				if tc.hold >= 0 {
					require.EqualValues(t, tc.hold, held.Offset)
					require.Equal(t, []frontier.Range{{From: tc.hold + 1, To: n}}, tail.Ranges)
				} else {
					require.EqualValues(t, n, held.Offset)
					require.Empty(t, tail.Ranges)
				}
			}

			bumpLeaderEpoch(t, c, topic)
			asked := answerEpochEnd(c, topic, diverged, 0)

			// The held record, when the log still holds it, and every
			// record from the divergence on are handled; the tail's
			// entries below the divergence are skipped.
			heldKept := tc.past == 0 && tc.hold >= 0 && tc.hold < diverged
			var skipped int64
			if heldKept {
				skipped = diverged - tc.hold - 1
			}
			// At OffsetNewest (Sarama's default) a commit out of range
			// falls back to the log end: nothing would be handled.
			got, totals := handledWith(t, c, group, topic, func(seen map[int64]int) bool {
				if heldKept && seen[tc.hold] == 0 {
					return false
				}
				for off := diverged; off < n; off++ {
					if seen[off] == 0 {
						return false
					}
				}
				return true
			}, func(cfg *safeack.SubscriberConfig) {
				cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
				rebalance(cfg)
			})
			require.Positive(t, asked.Load(), "the leader was not asked where the committed epoch ends")
			for off := int64(0); off < diverged; off++ {
				if heldKept && off == tc.hold {
					continue
				}
				require.Zero(t, got[off], "offset %d, below the divergence, was handled again", off)
			}
			require.EqualValues(t, 1, totals.LogTruncations, "the truncation is counted")
			require.EqualValues(t, skipped, totals.SkippedTail, "the tail's entries below the divergence are skipped, and only those")
		})
	}
}

// TestLeaderChangeKeepsTail: a clean leader election (a new epoch, the log
// unchanged, new records in the new epoch) is no truncation: the real
// OffsetForLeaderEpoch answer ends the committed epoch past the committed
// offset, and the completed tail is skipped as before.
func TestLeaderChangeKeepsTail(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	const n = 10
	produceSequential(t, c, topic, 0, n)
	held := leaveTail(t, c, group, topic, n, 5)
	_, ok := frontier.LeaderEpochOf(held.Metadata)
	require.True(t, ok, "the commit carries no leader epoch: %q", held.Metadata)

	bumpLeaderEpoch(t, c, topic)
	produceSequential(t, c, topic, 0, 3) // offsets 10..12, in the new epoch

	got, totals := handledBy(t, c, group, topic, func(seen map[int64]int) bool {
		return seen[5] > 0 && seen[10] > 0 && seen[11] > 0 && seen[12] > 0
	})
	for off := int64(6); off < n; off++ {
		require.Zero(t, got[off], "offset %d of the completed tail was handled again", off)
	}
	require.Zero(t, totals.LogTruncations)
	require.EqualValues(t, n-6, totals.SkippedTail)
}

// TestEpochCheckRefusedTrustsCommit: a leader that refuses the check (an
// ACL, an old broker) does not hold the start up: the commit and its tail
// are trusted as before the check existed, and the refusal is logged.
func TestEpochCheckRefusedTrustsCommit(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	const n = 10
	produceSequential(t, c, topic, 0, n)
	leaveTail(t, c, group, topic, n, 5)
	asked := answerEpochEnd(c, topic, -1, kerr.TopicAuthorizationFailed.Code)

	began := time.Now()
	got, totals := handledBy(t, c, group, topic, func(seen map[int64]int) bool { return seen[5] > 0 })
	require.Less(t, time.Since(began), 8*time.Second, "the refused check held the start up")
	require.Positive(t, asked.Load())
	for off := int64(6); off < n; off++ {
		require.Zero(t, got[off], "offset %d of the completed tail was handled again", off)
	}
	require.Zero(t, totals.LogTruncations)
}

// answerStartCheckRefusedOnce plays the new leader of an unclean election
// (see answerElection) that refuses the first request, the next start's
// check, with an error trying again may cure (KAFKA_STORAGE_ERROR: a
// timeout is alike), and names the divergence to the later ones. It
// counts the requests.
func answerStartCheckRefusedOnce(c *kafkatest.Cluster, topic string, diverged int64) *atomic.Int32 {
	return answerEpochEnds(c, topic, func(answered int32) (int64, int16) {
		if answered == 0 {
			return -1, kerr.KafkaStorageError.Code
		}
		return diverged, 0
	})
}

// TestTruncatedLogUnderCommitStartCheckRefused: an unclean leader election
// truncates the log under the group's commit while no member runs, and the
// next start's check is refused once, with an error trying again may cure.
// The start trusts the commit, and the claim starts there; but it checks
// the commit's leader epoch while it consumes (not the one the metadata
// names, which a start that checked nothing cannot take as validated),
// against what the commit covers: the answer names the divergence, below
// the claim's start or inside its completed tail, and the claim holds its
// marks there (not below the log start, where nothing is left to handle
// and a commit would be out of range) and ends the session. The next one
// handles every record the log holds from there. Before, the claim took
// the new epoch as validated and never checked the commit's: the records
// at the reused offsets below the commit, or listed in its tail, were
// never handled.
//
// A clean election (the commit's epoch ends at the commit) is no
// truncation, though the claim took the new leader's records past the
// commit before the answer came: each is handled once.
func TestTruncatedLogUnderCommitStartCheckRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []startCheckRefusedCase{
		{name: "below the start", hold: -1, diverged: 6},
		{name: "inside the completed tail", hold: 2, diverged: 6},
		{name: "below the log start", hold: -1, diverged: 6, logStart: 8},
		{name: "clean election", hold: -1, diverged: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
				truncatedUnderCommitStartCheckRefused(t, cooperative, tc)
			})
		})
	}
}

type startCheckRefusedCase struct {
	name     string
	hold     int64 // the record left unanswered: the commit's offset, the tail above it; -1: none
	diverged int64 // where the commit's epoch ends in the new log; 10, the commit: a clean election
	logStart int64 // the records below it are deleted after the election; 0: none
}

func truncatedUnderCommitStartCheckRefused(t *testing.T, cooperative bool, tc startCheckRefusedCase) {
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	const n, more = 10, 5
	produceSequential(t, c, topic, 0, n)
	rebalance := func(cfg *safeack.SubscriberConfig) {
		if cooperative {
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky()}
		}
	}
	held := leaveTail(t, c, group, topic, n, tc.hold, rebalance)
	oldEpoch, ok := frontier.LeaderEpochOf(held.Metadata)
	require.True(t, ok, "the commit carries no leader epoch: %q", held.Metadata)

	bumpLeaderEpoch(t, c, topic)
	asked := answerStartCheckRefusedOnce(c, topic, tc.diverged)
	produceSequential(t, c, topic, 0, more) // n..n+more-1, in the new epoch
	if tc.logStart > 0 {
		c.DeleteRecords(t, topic, 0, tc.logStart)
	}

	// Every record the log holds from the divergence on is handled, and
	// the held record; nothing else below the divergence. After a clean
	// election, the claim's commits come to carry the new epoch.
	from := max(tc.diverged, tc.logStart)
	clean := tc.diverged >= n
	got, totals := handledWith(t, c, group, topic, func(seen map[int64]int) bool {
		if tc.hold >= 0 && seen[tc.hold] == 0 {
			return false
		}
		if clean {
			held := c.CommittedOffsets(t, group, topic)[0]
			if epoch, ok := frontier.LeaderEpochOf(held.Metadata); held.Offset != n+more || !ok || epoch <= oldEpoch {
				return false
			}
		}
		for off := from; off < n+more; off++ {
			if seen[off] == 0 {
				return false
			}
		}
		return true
	}, func(cfg *safeack.SubscriberConfig) {
		// At OffsetNewest (Sarama's default) a commit out of range falls
		// back to the log end: nothing below it would be handled.
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		rebalance(cfg)
	})
	require.Greater(t, asked.Load(), int32(1), "the commit's epoch was not checked again after the start's check was refused")
	for off := int64(0); off < from; off++ {
		if off != tc.hold {
			require.Zero(t, got[off], "offset %d, below the divergence, was handled again", off)
		}
	}
	if clean {
		for off := int64(n); off < n+more; off++ {
			require.Equal(t, 1, got[off], "offset %d handled other than once", off)
		}
		require.Zero(t, totals.LogTruncations, "a clean leader change was taken for a truncation")
		return
	}
	require.Positive(t, totals.LogTruncations, "the truncation is counted")
	held = c.CommittedOffsets(t, group, topic)[0]
	require.GreaterOrEqual(t, held.Offset, from, "the group's commit is below the log start or the divergence")
}

// TestTruncatedLogUnderCooperativeHandover: with cooperative rebalancing a
// partition handed to another member is added to its running session
// without Setup, and Sarama fetches it from the commit at once. The check
// runs for that claim too: finding the log truncated, it commits the
// divergence point and ends the session, and the next session starts
// there. Without it, the new member started at the commit and skipped the
// tail.
func TestTruncatedLogUnderCooperativeHandover(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	const n, hold, diverged = 10, 5, 3
	topic, group := c.NewTopic(t, 2), c.NewGroup(t)
	for p := range int32(2) {
		recs := make([]kafkatest.Record, n)
		for i := range recs {
			recs[i] = kafkatest.Record{Partition: p, Value: []byte{byte(i)}}
		}
		c.Produce(t, topic, recs...)
	}
	cooperative := func() *sarama.Config {
		cfg := c.SaramaConfig()
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		return cfg
	}
	var mu sync.Mutex
	var after bool // the truncation happened: count deliveries
	seen := map[po]int{}
	deliver := func(m *message.Message) {
		k, _ := msgPO(m)
		mu.Lock()
		if after {
			seen[k]++
		}
		mu.Unlock()
	}
	a := tailSubscriber(t, c.Brokers(), cooperative(), group, nil)
	t.Cleanup(func() { _ = a.Close() })
	handleAll(mustSubscribe(t, a, topic), func(m *message.Message) {
		deliver(m)
		if off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context()); off != hold {
			m.Ack()
		}
	})
	for p := range int32(2) {
		waitForTailOn(t, c, group, topic, p, hold, func(tail frontier.Tail) bool {
			return tailCovers(tail, hold+1, n)
		})
	}

	kf := c.Kfake()
	for p := range int32(2) {
		require.NoError(t, kf.MoveTopicPartition(topic, p, kf.LeaderFor(topic, p)))
	}
	asked := answerEpochEnd(c, topic, diverged, 0)
	mu.Lock()
	after = true
	mu.Unlock()

	b := tailSubscriber(t, c.Brokers(), cooperative(), group, nil)
	t.Cleanup(func() { _ = b.Close() })
	handleAll(mustSubscribe(t, b, topic), func(m *message.Message) {
		deliver(m)
		m.Ack()
	})
	ok := kafkatest.Poll(30*time.Second, 20*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for p := range int32(2) {
			all := true
			for off := int64(diverged); off < n; off++ {
				all = all && seen[po{p, off}] > 0
			}
			if all {
				return true
			}
		}
		return false
	})
	mu.Lock()
	got := maps.Clone(seen)
	mu.Unlock()
	require.True(t, ok, "no partition had its records from the divergence on handled again; handled: %v", got)
	require.Positive(t, asked.Load())
	ta, _ := totalsOf(a)
	tb, _ := totalsOf(b)
	require.Positive(t, ta+tb, "the truncation is counted")
}
