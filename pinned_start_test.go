package safeack_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// refuseEveryCommit makes the embedded broker answer every OffsetCommit
// of group with COORDINATOR_LOAD_IN_PROGRESS until the fault is removed.
func refuseEveryCommit(c *kafkatest.Cluster, group string) *kfake.FaultHandle {
	return c.Kfake().Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.OffsetCommit},
		Group: group,
		Err:   kerr.CoordinatorLoadInProgress,
		Count: -1,
	})
}

// defaultSubscriber is a member of group on Sarama's and safeack's
// defaults (no config but the brokers and the group), closed at cleanup.
func defaultSubscriber(t *testing.T, c *kafkatest.Cluster, group string) *safeack.Subscriber {
	t.Helper()
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: group}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// TestPinnedStartCommittedBeforeHandOut: a new group at OffsetNewest (the
// defaults) hands out no record before the start it pinned is committed,
// also when the coordinator refuses that commit for a while. Handing out
// before would leave a group that delivered a record without any commit:
// a member that then dies leaves the next one to resolve OffsetNewest
// afresh, past the record it never finished.
func TestPinnedStartCommittedBeforeHandOut(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	c.ProduceN(t, topic, 1, 5, nil) // history the group starts after
	refuse := refuseEveryCommit(c, group)
	sub := defaultSubscriber(t, c, group)
	msgs := mustSubscribe(t, sub, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, refuse.Wait(ctx, 1), "no commit of the pinned start was attempted")
	c.ProduceN(t, topic, 1, 1, nil)

	time.AfterFunc(1500*time.Millisecond, refuse.Remove)
	requireFirstHandedOutCommitted(t, c, msgs, group, topic, 5, refuse)
}

// requireFirstHandedOutCommitted takes the first message of msgs and checks
// that it is the record at offset want of partition 0, and that the group's
// committed position was want by the time it was handed out.
func requireFirstHandedOutCommitted(t *testing.T, c *kafkatest.Cluster, msgs <-chan *message.Message, group, topic string, want int64, refuse *kfake.FaultHandle) {
	t.Helper()
	select {
	case m := <-msgs:
		k, _ := msgPO(m)
		co := c.CommittedOffsets(t, group, topic)[0]
		require.Equal(t, want, k.o)
		require.Equal(t, want, co.Offset,
			"record %v handed out while the group's committed position is %d (refused commits: %d)", k, co.Offset, refuse.Hits())
		m.Ack()
	case <-time.After(20 * time.Second):
		t.Fatal("the record was never handed out")
	}
}

// TestFallbackStartCommittedBeforeHandOut: when Sarama resolves the start
// itself (here the group's commit is above the end of the log, at the
// default OffsetNewest), the first record is handed out only once the
// coordinator holds its offset, also when it refuses that commit for a
// while. Handed out before, with the broker still holding the out-of-range
// commit, a member that dies leaves the next one to fall back to the end
// of the log again, past the record.
func TestFallbackStartCommittedBeforeHandOut(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	c.ProduceN(t, topic, 1, 5, nil)
	c.CommitOffset(t, group, topic, 0, 30) // above the end: Sarama falls back to OffsetNewest
	refuse := refuseEveryCommit(c, group)
	defer refuse.Remove()
	sub := defaultSubscriber(t, c, group)
	msgs := mustSubscribe(t, sub, topic)
	kafkatest.WaitFor(t, 30*time.Second, "the partition claimed (Sarama's start resolved)", func() bool {
		_, ok := ownedPartitions(sub, topic)[0]
		return ok
	})
	c.ProduceN(t, topic, 1, 1, nil) // offset 5, the first record fetched
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, refuse.Wait(ctx, 1), "no commit of the start was attempted")
	time.AfterFunc(1500*time.Millisecond, refuse.Remove)
	requireFirstHandedOutCommitted(t, c, msgs, group, topic, 5, refuse)
}

// TestSessionEndedBeforeStartHeldHandsNothingOut: a session that ends (here
// Close) while the coordinator still refuses the commit of its pinned start
// hands nothing out, though the claim has fetched records meanwhile: the
// start was never held, and the assignment is over. Before, ConsumeClaim
// went on once the pin gave up and handed a record out to a handler of an
// assignment that had already ended.
func TestSessionEndedBeforeStartHeldHandsNothingOut(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	refuse := refuseEveryCommit(c, group)
	defer refuse.Remove()
	sub := defaultSubscriber(t, c, group)
	var delivered atomic.Int32
	done := handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		delivered.Add(1)
		m.Ack()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, refuse.Wait(ctx, 1), "no commit of the pinned start was attempted")
	c.ProduceN(t, topic, 1, 3, nil) // after the start: the claim fetches them
	// The pin retries at 100, 200, 400 ms...: by the fourth refusal the
	// claim has long fetched the records.
	require.NoError(t, refuse.Wait(ctx, 4))
	require.NoError(t, sub.Close())
	<-done
	require.Zero(t, delivered.Load(), "records handed out by a session that ended before its start was held")
}
