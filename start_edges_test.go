package safeack_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Issue 30, items 1 to 3: where the group's commit and the log disagree
// (a commit above the high-water mark, a completed tail partly below a
// log start that moved), and a member that writes no tail after one that
// did. Transactional mode is checked with outputs read back by a
// read_committed reader and offsets read at the broker; at-least-once mode
// by the records each member handled.

// The group's commit (30) is above the input's end (10): Sarama falls back
// to Offsets.Initial (OffsetOldest). The transactional session starts at
// the first record, commits the outputs of 0..9 with the offset 10, and
// the next member resumes there: the 30 records produced afterwards
// (offsets 10..39) all get their output, once.
func TestTxnCommitAboveHighWaterMark(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 1, 10)
	c.CommitOffset(t, r.group, r.in, 0, 30)
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	var att attempts

	sub1, pub1 := r.subscriber(t, "txn-above-hwm", nil)
	stop1 := runRouter(t, r, sub1, pub1, transform(&att, time.Millisecond))
	rd.waitAll(t, r.inputIDs(), 20*time.Second)
	r.waitCommittedAll(t, 20*time.Second)
	waitOutputsCounted(t, 10, pub1)
	stop1()

	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, 30, nil)...)
	sub2, pub2 := r.subscriber(t, "txn-above-hwm", nil)
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	ids := r.inputIDs()
	require.Len(t, ids, 40)
	r.requireExactlyOnce(t, rd, ids, 30*time.Second, 20*time.Second)
}

// txnHoldOne runs a transactional member on the rig that never finishes
// input held (until its drain gives up on it) and handles every other
// input, until the group's commit stands at held's offset with a completed
// tail that lists every other record up to the input's end, and all their
// outputs are visible. Then it stops the member.
func txnHoldOne(t *testing.T, r *txnRig, rd *outputReader, att *attempts, txnID string, held int64) {
	t.Helper()
	sub, pub := r.subscriber(t, txnID, func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.DrainTimeout = 200 * time.Millisecond
	})
	handle := transform(att, time.Millisecond)
	stop := runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		if o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); o == held {
			att.next(msg)
			<-msg.Context().Done()
			return nil, msg.Context().Err()
		}
		return handle(msg)
	})
	ids := r.inputIDs()
	kafkatest.WaitFor(t, 30*time.Second, "every input but the held one to have its output", func() bool {
		return rd.seen(ids) == len(ids)-1
	})
	end := r.c.HighWaterMarks(t, r.in)[0]
	waitForTail(t, r.c, r.group, r.in, held, func(tail frontier.Tail) bool {
		return tail.Contains(held+1) && tail.Contains(end-1)
	})
	stop()
}

// without returns ids without one.
func without(ids []string, drop string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if id != drop {
			out = append(out, id)
		}
	}
	return out
}

// Member 1 commits 5 with the completed tail [6,40) and the outputs of
// 0..4 and 6..39. The log start then moves to 20 (retention,
// DeleteRecords): the commit is below it, and Sarama falls back to
// OffsetOldest. Member 2 must still skip the part of the tail above its real
// start (20..39): their outputs are there already. Record 5 is gone, and
// with it its output.
func TestTxnCompletedTailAboveMovedLogStart(t *testing.T) {
	t.Parallel()
	c, r, rd := startTxnRig(t, 1, 40)
	var att attempts
	txnHoldOne(t, r, rd, &att, "txn-moved-start", 5)
	c.DeleteRecords(t, r.in, 0, 20)

	sub2, pub2 := r.subscriber(t, "txn-moved-start", nil)
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	ids := without(r.inputIDs(), "0@5")
	r.requireExactlyOnce(t, rd, ids, 30*time.Second, 20*time.Second)
	att.mu.Lock()
	defer att.mu.Unlock()
	for _, id := range ids {
		require.Equal(t, 1, att.n[id], "deliveries of %s", id)
	}
}

// Member 1 writes completed tails; member 2 has DisableCompletedTail. It
// writes none, but still reads the tail member 1 left and skips the records
// it lists: only the held record is handled again, and every output is
// there once.
func TestTxnCompletedTailReadWithTailDisabled(t *testing.T) {
	t.Parallel()
	_, r, rd := startTxnRig(t, 1, 40)
	var att attempts
	txnHoldOne(t, r, rd, &att, "txn-tail-disabled", 5)

	sub2, pub2 := r.subscriber(t, "txn-tail-disabled", func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.DisableCompletedTail = true
	})
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	ids := r.inputIDs()
	r.requireExactlyOnce(t, rd, ids, 30*time.Second, 20*time.Second)
	att.mu.Lock()
	defer att.mu.Unlock()
	for _, id := range ids {
		want := 1
		if id == "0@5" {
			want = 2
		}
		require.Equal(t, want, att.n[id], "deliveries of %s", id)
	}
}

// holdOne runs an at-least-once member on partition 0 of topic that holds
// offset held and acks every other record, until the group's commit stands
// at held with a completed tail that lists every other record up to the
// partition's end. Then it closes the member.
func holdOne(t *testing.T, c *kafkatest.Cluster, group, topic string, held int64) {
	t.Helper()
	sub := tailSubscriber(t, c.Brokers(), c.SaramaConfig(), group, nil)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	go func() {
		for msg := range msgs {
			if o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); o != held {
				msg.Ack()
			}
		}
	}()
	end := c.HighWaterMarks(t, topic)[0]
	waitForTail(t, c, group, topic, held, func(tail frontier.Tail) bool {
		return tail.Contains(held+1) && tail.Contains(end-1)
	})
	require.NoError(t, sub.Close())
}

// consumeToEnd runs a subscriber in group (configured by mutate) that acks
// every record, until the group's commit reaches the partition's end, and
// returns the offsets it handled.
func consumeToEnd(t *testing.T, c *kafkatest.Cluster, group, topic string, mutate func(*safeack.SubscriberConfig)) map[int64]int {
	t.Helper()
	sub := tailSubscriber(t, c.Brokers(), c.SaramaConfig(), group, mutate)
	t.Cleanup(func() { _ = sub.Close() })
	seen := countAndAck(mustSubscribe(t, sub, topic))
	end := c.HighWaterMarks(t, topic)[0]
	kafkatest.WaitFor(t, 20*time.Second, fmt.Sprintf("the group's commit to reach %d", end), func() bool {
		return c.CommittedOffsets(t, group, topic)[0].Offset == end
	})
	require.NoError(t, sub.Close())
	return seen.snapshot()
}

// At-least-once mode, as TestTxnCompletedTailAboveMovedLogStart: the part of
// the completed tail above the moved log start is skipped, and the group's
// commit reaches the end without handling anything again.
func TestCompletedTailAboveMovedLogStart(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	produceSequential(t, c, topic, 0, 40)
	holdOne(t, c, group, topic, 5)
	c.DeleteRecords(t, topic, 0, 20)
	require.Empty(t, consumeToEnd(t, c, group, topic, nil), "records of the completed tail handled again")
}

// At-least-once mode, as TestTxnCompletedTailReadWithTailDisabled: a member
// with DisableCompletedTail handles the held record only.
func TestCompletedTailReadWithTailDisabled(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1)
	produceSequential(t, c, topic, 0, 40)
	holdOne(t, c, group, topic, 5)
	got := consumeToEnd(t, c, group, topic, func(cfg *safeack.SubscriberConfig) { cfg.DisableCompletedTail = true })
	require.Equal(t, map[int64]int{5: 1}, got, "records of the completed tail handled again")
}
