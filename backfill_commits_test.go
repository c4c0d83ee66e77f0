package safeack_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestNewPartitionsCommitsNeverPassUnacked: cooperative-sticky,
// OffsetNewest (Sarama's default), partitions added after Subscribe with a
// backlog read from their log start beside their claims; handlers take
// random time (one record in fifty 300 ms), so heads stay unfinished while
// later records complete; a second member joins mid-way and takes some of
// the added partitions, then the first leaves. Checked at the broker:
// no OffsetCommit ever passes a record not acked before it was sent, and
// every record is acked.
func TestNewPartitionsCommitsNeverPassUnacked(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	acks := newAckLog()
	watch := newCommitWatch(t, c, group, topic, acks)
	configure := func(cfg *safeack.SubscriberConfig) {
		cooperative(cfg)
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 500 * time.Millisecond
		cfg.CommitInterval = 100 * time.Millisecond
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 16
		cfg.DrainTimeout = 200 * time.Millisecond
	}
	handler := func(m *message.Message) {
		if rand.N(50) == 0 {
			time.Sleep(300 * time.Millisecond)
		} else {
			time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
		}
		acks.ack(m)
	}
	sub1 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub1, topic), handler)
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own partition 0", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})
	c.Produce(t, topic, records(0, 100)...)
	c.AddPartitions(t, topic, 4)
	for p := int32(1); p < 4; p++ {
		c.Produce(t, topic, records(p, 800)...)
	}
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to work on the added partitions", func() bool {
		return len(ownedPartitions(sub1, topic)) == 4 && ackedOn(acks, 1) > 0
	})
	sub2 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub2, topic), handler)
	kafkatest.WaitFor(t, 30*time.Second, "member 2 to take partitions", func() bool {
		return len(ownedPartitions(sub2, topic)) > 0
	})
	for p := int32(0); p < 4; p++ {
		c.Produce(t, topic, records(p, 30)...)
	}
	require.NoError(t, sub1.Close())
	for p := int32(0); p < 4; p++ {
		c.Produce(t, topic, records(p, 30)...)
	}
	acks.waitAllAcked(t, c, topic, 60*time.Second)
	time.Sleep(500 * time.Millisecond) // the last commits
	n := watch.check(t)
	dups := 0
	for _, k := range acks.snapshot() {
		if k > 1 {
			dups++
		}
	}
	t.Logf("%d commits checked; %d records acked more than once (in work at a revocation)", n, dups)
	require.Positive(t, n)
}
