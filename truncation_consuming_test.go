package safeack_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// handlingLog records when each offset of partition 0 was handled.
type handlingLog struct {
	mu    sync.Mutex
	times map[int64][]time.Time
}

func (l *handlingLog) handle(m *message.Message) {
	off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
	l.mu.Lock()
	l.times[off] = append(l.times[off], time.Now())
	l.mu.Unlock()
	m.Ack()
}

// firstAfter returns when off was first handled after since, or the zero

// uncleanElection plays an unclean election of topic's partition 0 while
// it is consumed: the old epoch ends at diverged in the new log (the next
// start's check answered, or refused with startCheckRefused), and more
// records follow in the new epoch, after the n there were. It waits until
// every record from the divergence on is handled after the election and
// all are committed, and returns when the election was.
func uncleanElection(t *testing.T, c *kafkatest.Cluster, group, topic string, handled *handlingLog,
	diverged, n, more int64, startCheckRefused bool) (truncatedAt time.Time) {
	t.Helper()
	asked := answerElection(c, topic, diverged, startCheckRefused)
	truncatedAt = time.Now()
	bumpLeaderEpoch(t, c, topic)
	produceSequential(t, c, topic, 0, int(more)) // n..n+more-1, in the new epoch
	kafkatest.WaitFor(t, 30*time.Second, "every record from the divergence on handled after the truncation", func() bool {
		for off := diverged; off < n+more; off++ {
			if handled.firstAfter(off, truncatedAt).IsZero() {
				return false
			}
		}
		return true
	})
	waitCommitted(t, c, group, topic, n+more, "every record committed after the election")
	require.Positive(t, asked.Load(), "the new leader was not asked where the validated epoch ends")
	return truncatedAt
}

// time.
func (l *handlingLog) firstAfter(off int64, since time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.times[off] {
		if at.After(since) {
			return at
		}
	}
	return time.Time{}
}

func (l *handlingLog) count(off int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.times[off])
}

// consumingSubscriber subscribes one member of group to topic, handling
// (and acking) every record into a handlingLog.
func consumingSubscriber(t *testing.T, c *kafkatest.Cluster, group, topic string, cooperative bool) (*safeack.Subscriber, *handlingLog) {
	t.Helper()
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		if cooperative {
			cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
				sarama.NewBalanceStrategyCooperativeSticky()}
		}
	})
	log := &handlingLog{times: map[int64][]time.Time{}}
	handleAll(mustSubscribe(t, sub, topic), log.handle)
	return sub, log
}

// waitCommitted waits until the group holds offset for partition 0, and
// returns what it holds.
func waitCommitted(t *testing.T, c *kafkatest.Cluster, group, topic string, offset int64, what string) kafkatest.CommittedOffset {
	t.Helper()
	var held kafkatest.CommittedOffset
	kafkatest.WaitFor(t, 30*time.Second, what, func() bool {
		held = c.CommittedOffsets(t, group, topic)[0]
		return held.Offset == offset
	})
	return held
}

// TestTruncatedLogWhileConsuming: an unclean leader election truncates the
// log of a partition a member is consuming, below records it has handled
// and committed; the new leader writes new records at the reused offsets.
// The member's marks carry the leader epoch it validated; when its metadata
// names the new epoch, it asks the new leader where the validated epoch
// ends, finds the log truncated below what it took from it, commits the
// divergence point and ends the session: the next session handles every
// record from the divergence on. Every commit is checked: one that carries
// the new epoch never covers a reused offset whose record was not handled
// after the truncation. Before the check, the member went on consuming
// from its fetch position past the reused offsets, and committed it with
// the new epoch: the next start found that epoch consistent, and the
// records at the reused offsets were never handled.
//
// With the next start's check refused (a missing ACL, a timeout: the
// commit is trusted as it is), only the committed divergence point brings
// those records back.
//
// kfake cannot truncate a log: the new leader is played by bumping the
// epoch and answering OffsetForLeaderEpoch as it would (the old epoch ends
// at diverged); the records kfake holds from diverged on stand for the new
// leader's.
func TestTruncatedLogWhileConsuming(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
		eachStartCheck(t, func(t *testing.T, startCheckRefused bool) {
			truncatedWhileConsuming(t, cooperative, startCheckRefused)
		})
	})
}

func truncatedWhileConsuming(t *testing.T, cooperative, startCheckRefused bool) {
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	const n, diverged, more = 10, 6, 5
	produceSequential(t, c, topic, 0, n)
	commits := c.ObserveCommits(t)
	sub, handled := consumingSubscriber(t, c, group, topic, cooperative)
	before := waitCommitted(t, c, group, topic, n, "every record committed before the election")
	oldEpoch, ok := frontier.LeaderEpochOf(before.Metadata)
	require.True(t, ok, "the commit carries no leader epoch: %q", before.Metadata)

	truncatedAt := uncleanElection(t, c, group, topic, handled, diverged, n, more, startCheckRefused)

	// No commit carrying a newer epoch covers a reused offset whose
	// record was not handled after the truncation, before the commit.
	checked := commits.CheckUntil(t, time.Now(), func(oc kafkatest.ObservedCommit) error {
		co, ok := oc.Offset(topic, 0)
		if !ok || !oc.At.After(truncatedAt) {
			return nil
		}
		epoch, ok := frontier.LeaderEpochOf(co.Metadata)
		if !ok || epoch <= oldEpoch {
			return nil // the next start checks the old epoch
		}
		tail, _ := frontier.DecodeTail(co.Metadata, co.Offset)
		for off := int64(diverged); off < n; off++ {
			if off >= co.Offset && !tail.Contains(off) {
				continue
			}
			if at := handled.firstAfter(off, truncatedAt); at.IsZero() || !at.Before(oc.At) {
				return fmt.Errorf("committed %d (epoch %d) covers reused offset %d, not handled since the truncation", co.Offset, epoch, off)
			}
		}
		return nil
	})
	require.Positive(t, checked)
	for off := int64(0); off < n+more; off++ {
		require.Positive(t, handled.count(off), "offset %d was never handled", off)
	}
	truncations, _ := totalsOf(sub)
	require.Positive(t, truncations, "the truncation is counted")
}

// TestTruncatedLogWhileConsumingWithoutTail: an unclean leader election
// truncates the log of a partition a member with DisableCompletedTail is
// consuming. Such a member checks no epoch while consuming; the partition
// goes on: the records the new leader writes after it are handled and
// committed. On the consumer protocol franz-go checks the epoch of what it
// fetched on its own and moves its fetch back to the divergence point: the
// claim ends there (counted as a truncation) and starts again from the
// group's commit. Before, the records franz-go fetched again were below
// what the claim had taken: refused, and the partition stopped.
func TestTruncatedLogWhileConsumingWithoutTail(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	const n, diverged, more = 10, 6, 5
	produceSequential(t, c, topic, 0, n)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.DisableCompletedTail = true
	})
	handled := &handlingLog{times: map[int64][]time.Time{}}
	handleAll(mustSubscribe(t, sub, topic), handled.handle)
	waitCommitted(t, c, group, topic, n, "every record committed before the election")

	answerEpochEnd(c, topic, diverged, 0)
	bumpLeaderEpoch(t, c, topic)
	produceSequential(t, c, topic, 0, more) // n..n+more-1, in the new epoch
	kafkatest.WaitFor(t, 30*time.Second, "every record written after the election handled", func() bool {
		for off := int64(n); off < n+more; off++ {
			if handled.count(off) == 0 {
				return false
			}
		}
		return true
	})
	waitCommitted(t, c, group, topic, n+more, "every record committed after the election")
	if envGroupProtocol == safeack.GroupProtocolConsumer {
		truncations, _ := totalsOf(sub)
		require.Positive(t, truncations, "franz-go's finding is counted as a truncation")
	}
}

// TestTruncatedLogUnderIdleClaim: an unclean leader election truncates the
// log below the commit a member's claim started from, before the claim
// took any record (the partition was idle: the claim starts at its end).
// What the claim holds is then its start, the commit: the new leader's
// answer names a divergence below it, the claim moves its position back
// there and ends the session, and the next one handles every record from
// the divergence on. Before, a claim that had taken nothing held nothing:
// any answer validated the new epoch, and the records at the reused
// offsets below the commit were skipped. With the next start's check
// refused (the commit trusted as it is), only the position moved back
// brings them back: before, one nothing was marked under was left where
// it was.
func TestTruncatedLogUnderIdleClaim(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
		eachStartCheck(t, func(t *testing.T, startCheckRefused bool) {
			c := kafkatest.Start(t)
			c.RequireEmbedded(t)
			topic, group := c.NewTopic(t, 1), c.NewGroup(t)
			const n, diverged, more = 10, 6, 5
			produceSequential(t, c, topic, 0, n)
			leaveTail(t, c, group, topic, n, -1)
			sub, handled := consumingSubscriber(t, c, group, topic, cooperative)
			kafkatest.WaitFor(t, 30*time.Second, "the member's claim of the partition", func() bool {
				_, owned := ownedPartitions(sub, topic)[0]
				return owned
			})

			uncleanElection(t, c, group, topic, handled, diverged, n, more, startCheckRefused)
			for off := int64(0); off < diverged; off++ {
				require.Zero(t, handled.count(off), "offset %d, below the divergence, was handled again", off)
			}
			truncations, _ := totalsOf(sub)
			require.Positive(t, truncations, "the truncation is counted")
		})
	})
}

// TestEpochCheckRefusedForGood: a leader-epoch check that fails in a way
// trying again cannot cure (a refused ACL here; no client for a SASL
// GSSAPI config is alike), or whose answer knows no end for the epoch, is
// not tried again, at a start or while consuming: the commit, or the new
// epoch, is trusted as it is, and the commits come to carry the new
// epoch. Before, a claim tried such a check of a new epoch again every
// second for as long as it ran, and its commits kept the old epoch.
func TestEpochCheckRefusedForGood(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		atStart bool  // the election happens before the member starts
		code    int16 // the answer's error; 0: the leader knows no end for the epoch
	}{
		{name: "refused at the start", atStart: true, code: kerr.TopicAuthorizationFailed.Code},
		{name: "refused while consuming", code: kerr.TopicAuthorizationFailed.Code},
		{name: "no end known while consuming"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			c.RequireEmbedded(t)
			topic, group := c.NewTopic(t, 1), c.NewGroup(t)
			const n, more = 10, 5
			produceSequential(t, c, topic, 0, n)
			held := leaveTail(t, c, group, topic, n, -1)
			oldEpoch, ok := frontier.LeaderEpochOf(held.Metadata)
			require.True(t, ok, "the commit carries no leader epoch: %q", held.Metadata)
			var asked *atomic.Int32
			elect := func() {
				asked = answerEpochEnd(c, topic, -1, tc.code)
				bumpLeaderEpoch(t, c, topic)
			}
			if tc.atStart {
				elect()
			}
			sub, handled := consumingSubscriber(t, c, group, topic, false)
			kafkatest.WaitFor(t, 30*time.Second, "the member's claim of the partition", func() bool {
				_, owned := ownedPartitions(sub, topic)[0]
				return owned
			})
			if !tc.atStart {
				elect()
			}
			produceSequential(t, c, topic, 0, more)

			kafkatest.WaitFor(t, 30*time.Second, "a commit of every record carrying the new epoch", func() bool {
				held := c.CommittedOffsets(t, group, topic)[0]
				e, ok := frontier.LeaderEpochOf(held.Metadata)
				return held.Offset == n+more && ok && e > oldEpoch
			})
			require.EqualValues(t, 1, asked.Load(), "a check that cannot succeed was tried again")
			for off := int64(n); off < n+more; off++ {
				require.Equal(t, 1, handled.count(off), "offset %d handled other than once", off)
			}
		})
	}
}

// TestLeaderChangeWhileConsuming: a clean leader election while a member
// consumes (a new epoch over the same log, new records in it) is no
// truncation: the old epoch ends where the new one starts, past nothing the
// member took. Nothing is handled twice, no commit moves back, and the
// marks come to carry the new epoch.
func TestLeaderChangeWhileConsuming(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
		c := kafkatest.Start(t)
		c.RequireEmbedded(t)
		topic, group := c.NewTopic(t, 1), c.NewGroup(t)
		const n, more = 10, 10
		produceSequential(t, c, topic, 0, n)
		commits := c.ObserveCommits(t)
		sub, handled := consumingSubscriber(t, c, group, topic, cooperative)
		before := waitCommitted(t, c, group, topic, n, "every record committed before the election")
		oldEpoch, ok := frontier.LeaderEpochOf(before.Metadata)
		require.True(t, ok, "the commit carries no leader epoch: %q", before.Metadata)

		bumpedAt := time.Now()
		bumpLeaderEpoch(t, c, topic)
		produceSequential(t, c, topic, 0, more)

		kafkatest.WaitFor(t, 30*time.Second, "a commit of every record carrying the new epoch", func() bool {
			held := c.CommittedOffsets(t, group, topic)[0]
			e, ok := frontier.LeaderEpochOf(held.Metadata)
			return held.Offset == n+more && ok && e > oldEpoch
		})
		for off := int64(0); off < n+more; off++ {
			require.Equal(t, 1, handled.count(off), "offset %d handled other than once", off)
		}
		// No commit moves back, and none after the election comes from
		// another generation: the session was not ended.
		last, generation := int64(-1), int32(-1)
		checked := commits.CheckUntil(t, time.Now(), func(oc kafkatest.ObservedCommit) error {
			co, ok := oc.Offset(topic, 0)
			if !ok {
				return nil
			}
			defer func() { last, generation = max(last, co.Offset), oc.Generation }()
			if co.Offset < last {
				return fmt.Errorf("committed %d after %d: the position moved back", co.Offset, last)
			}
			if oc.At.After(bumpedAt) && generation >= 0 && oc.Generation != generation {
				return fmt.Errorf("committed in generation %d after %d: the session ended", oc.Generation, generation)
			}
			return nil
		})
		require.Positive(t, checked)
		for _, tt := range sub.Totals() {
			require.Zero(t, tt.LogTruncations, "a clean leader change was taken for a truncation")
		}
	})
}
