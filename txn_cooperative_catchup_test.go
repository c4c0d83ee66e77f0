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

// TestTxnCooperativeNewPartitionsHandedOverWhileCatchingUp: transactional
// routing, cooperative-sticky balancing, OffsetNewest (Sarama's default).
// Partitions added to the input while a member runs, with many records
// written to them before the member notices; while the member reads them
// from their log start beside its claims (a slow handler keeps it busy), a
// second member joins and a cooperative rebalance hands some of them over
// mid-catch-up, then the first member leaves. A read_committed reader sees
// exactly one output per input, and no transaction is aborted.
func TestTxnCooperativeNewPartitionsHandedOverWhileCatchingUp(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := &txnRig{c: c, parts: 4, in: c.NewTopic(t, 1), out: c.NewTopic(t, 4), group: c.NewGroup(t)}
	mod := func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cooperative(cfg)
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 500 * time.Millisecond
		if c.Embedded() {
			shortSessions(cfg.OverwriteSaramaConfig)
		}
	}
	var att attempts
	handler := func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		time.Sleep(2 * time.Millisecond)
		return []*message.Message{outputOf(msg, n)}, nil
	}
	subA, pubA := r.subscriber(t, "txn-hunt-a", mod)
	stopA := runRouter(t, r, subA, pubA, handler)
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	kafkatest.WaitFor(t, 15*time.Second, "the member to commit the start of partition 0", func() bool {
		co, ok := c.CommittedOffsets(t, r.group, r.in)[0]
		return ok && co.Offset == 0
	})
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, 50, nil)...)

	c.AddPartitions(t, r.in, 4)
	for p := int32(1); p < 4; p++ {
		r.inputs = append(r.inputs, c.Produce(t, r.in, records(p, 400)...)...)
	}
	kafkatest.WaitFor(t, 15*time.Second, "member a to own the new partitions", func() bool {
		return len(ownedPartitions(subA, r.in)) == 4
	})
	subB, pubB := r.subscriber(t, "txn-hunt-b", mod)
	runRouter(t, r, subB, pubB, handler)
	kafkatest.WaitFor(t, 30*time.Second, "member b to own partitions", func() bool {
		return len(ownedPartitions(subB, r.in)) > 0
	})
	for p := int32(0); p < 4; p++ {
		r.inputs = append(r.inputs, c.Produce(t, r.in, records(p, 20)...)...)
	}
	stopA()
	for p := int32(0); p < 4; p++ {
		r.inputs = append(r.inputs, c.Produce(t, r.in, records(p, 20)...)...)
	}
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	a, b := pubA.Stats(), pubB.Stats()
	t.Logf("transactions: a %+v, b %+v", a, b)
	require.Zero(t, a.Aborted+b.Aborted, "a transaction was aborted")
}
