package safeack_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// addedPartitionsMember configures a member of the tests of partitions
// added to a topic: cooperative-sticky, Sarama's default OffsetNewest,
// metadata refreshed every 500 ms (the added partitions are seen soon) and
// 200 ms to drain.
func addedPartitionsMember(cfg *safeack.SubscriberConfig) {
	cooperative(cfg)
	cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
	cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 500 * time.Millisecond
	cfg.DrainTimeout = 200 * time.Millisecond
}

// Partitions added to the topic after Subscribe, with a backlog, are read
// from their start beside their claims (cooperative-sticky, OffsetNewest);
// a second member joins while the first is still working through them,
// and the rebalance revokes some mid-way. The revoked ones' drains commit
// their completed prefix, the new owner resumes there, and every record of
// the added partitions is handled: none is skipped.
func TestNewPartitionsRevokedWhileCatchingUp(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	configure := func(cfg *safeack.SubscriberConfig) {
		addedPartitionsMember(cfg)
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 8
	}
	acks := newAckLog()
	slow := func(m *message.Message) {
		time.Sleep(5 * time.Millisecond)
		acks.ack(m)
	}
	sub1 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub1, topic), slow)
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own partition 0", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})

	c.AddPartitions(t, topic, 4)
	for p := int32(1); p < 4; p++ {
		c.Produce(t, topic, records(p, 1500)...)
	}
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to work on the added partitions", func() bool {
		return len(ownedPartitions(sub1, topic)) == 4 && ackedOn(acks, 1) > 0
	})

	sub2 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub2, topic), slow)
	kafkatest.WaitFor(t, 30*time.Second, "member 2 to take partitions", func() bool {
		return len(ownedPartitions(sub2, topic)) > 0 && len(ownedPartitions(sub1, topic)) < 4
	})
	for p := range ownedPartitions(sub2, topic) {
		if p > 0 {
			t.Logf("partition %d moved to member 2 with %d of its 1500 records acked", p, ackedOn(acks, p))
		}
	}
	for p := int32(1); p < 4; p++ {
		c.Produce(t, topic, records(p, 50)...)
	}
	for p := int32(1); p < 4; p++ {
		acks.waitAllAckedFrom(t, c, topic, p, 0, nil, 60*time.Second)
	}
}

// ackedOn counts the records of partition p acked so far.
func ackedOn(l *ackLog, p int32) int {
	n := 0
	for k := range l.snapshot() {
		if k.p == p {
			n++
		}
	}
	return n
}

// A partition added to the topic after Subscribe, empty when a cooperative
// rebalance gives it to a member at OffsetNewest: the member commits its
// start (the log start) at once, not at its first record, so that records
// produced after the member left and before the next one takes the
// partition are handled by that one, although to it (subscribed after the
// partition was added) OffsetNewest means the end.
func TestNewPartitionStartCommittedBeforeFirstRecord(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	configure := addedPartitionsMember
	acks := newAckLog()
	sub1 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub1, topic), acks.ack)
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own partition 0", func() bool {
		_, ok := statsOf(sub1, topic, 0)
		return ok
	})
	c.AddPartitions(t, topic, 2)
	kafkatest.WaitFor(t, 15*time.Second, "member 1 to own the new partition", func() bool {
		_, ok := statsOf(sub1, topic, 1)
		return ok
	})
	kafkatest.WaitFor(t, 10*time.Second, "the start of the empty new partition to be committed", func() bool {
		co, ok := c.CommittedOffsets(t, group, topic)[1]
		return ok && co.Offset == 0
	})
	require.NoError(t, sub1.Close())

	c.Produce(t, topic, records(1, 5)...)
	sub2 := newTestSubscriber(t, c, group, configure)
	handleAll(mustSubscribe(t, sub2, topic), acks.ack)
	acks.waitAllAckedFrom(t, c, topic, 1, 0, nil, 15*time.Second)
}
