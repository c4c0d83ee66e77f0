package safeack_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// cooperative gives cfg cooperative-sticky balancing, with a strategy of its
// own (strategies keep state).
func cooperative(cfg *safeack.SubscriberConfig) {
	cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
		sarama.NewBalanceStrategyCooperativeSticky(),
	}
}

// txnMember is one running member of a transactional router.
type txnMember struct {
	sub  *safeack.Subscriber
	pub  *safeack.TxnPublisher
	stop func()
}

// Transactional routing with cooperative-sticky balancing, members joining
// and leaving while records keep coming: each revocation commits the
// revoked partitions' outputs and positions in a transaction before it
// completes, while the member's other partitions go on. A read_committed
// reader sees exactly one output per input, none of a failed delivery, and
// the group's offsets end at the input's end; no transaction is aborted
// (an abort would end the member's whole session).
func TestTxnCooperativeExactlyOnce(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 6, 600)
	var att attempts
	handler := func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		randomDelay(3 * time.Millisecond)
		if rand.N(20) == 0 {
			return nil, errors.New("transient failure") // nacked, redelivered: its outputs must never show
		}
		return []*message.Message{outputOf(msg, n)}, nil
	}
	start := func(id string) *txnMember {
		sub, pub := r.subscriber(t, id, func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
			cooperative(cfg)
			if c.Embedded() {
				shortSessions(cfg.OverwriteSaramaConfig)
			}
		})
		return &txnMember{sub: sub, pub: pub, stop: runRouter(t, r, sub, pub, handler)}
	}
	owned := func(ms ...*txnMember) []int {
		n := make([]int, len(ms))
		for i, m := range ms {
			n[i] = len(ownedPartitions(m.sub, r.in))
		}
		return n
	}
	spread := func(what string, ms ...*txnMember) {
		t.Helper()
		kafkatest.WaitFor(t, 30*time.Second, what, func() bool {
			total := 0
			for _, n := range owned(ms...) {
				if n == 0 {
					return false
				}
				total += n
			}
			return total == r.parts
		})
	}
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	stopProducing, produced := produceSteadily(t, c, r.in)

	// Every change of membership happens while records come in and
	// handlers run: revocations find records in flight. Between changes,
	// outputs keep coming.
	seen := 0
	progress := func() {
		t.Helper()
		kafkatest.WaitFor(t, 60*time.Second, "outputs between membership changes", func() bool {
			rd.mu.Lock()
			defer rd.mu.Unlock()
			return rd.records >= seen+300
		})
		rd.mu.Lock()
		seen = rd.records
		rd.mu.Unlock()
	}
	a := start("txn-coop-a")
	spread("member a to own every partition", a)
	progress()
	b := start("txn-coop-b")
	spread("members a and b to share the partitions", a, b)
	progress()
	d := start("txn-coop-d")
	spread("members a, b and d to share the partitions", a, b, d)
	progress()
	a.stop()
	spread("members b and d to take a's partitions", b, d)
	progress()
	b.stop()
	spread("member d to take every partition", d)
	progress()
	stopProducing()
	r.inputs = append(r.inputs, produced()...)
	t.Logf("%d inputs", len(r.inputs))

	r.requireExactlyOnce(t, rd, r.inputIDs(), 90*time.Second, 30*time.Second)
	total := waitOutputsCounted(t, len(r.inputs), a.pub, b.pub, d.pub)
	t.Logf("transactions of all members: %+v", total)
	require.Zero(t, total.Aborted, "a transaction was aborted")
}

// produceSteadily writes about a thousand records a second to topic, spread
// over its partitions, until stop is called; produced then returns them.
func produceSteadily(t *testing.T, c *kafkatest.Cluster, topic string) (stop func(), produced func() []kafkatest.Produced) {
	t.Helper()
	cfg := c.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewRoundRobinPartitioner
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(c.Brokers(), cfg)
	require.NoError(t, err)
	quit, done := make(chan struct{}), make(chan struct{})
	var out []kafkatest.Produced
	var sendErr error
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
			batch := make([]*sarama.ProducerMessage, 10)
			for j := range batch {
				batch[j] = &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(fmt.Sprintf("steady-%d-%d", i, j))}
			}
			if err := p.SendMessages(batch); err != nil {
				sendErr = err
				return
			}
			for _, m := range batch {
				out = append(out, kafkatest.Produced{Topic: topic, Partition: m.Partition, Offset: m.Offset})
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(quit)
			<-done
			require.NoError(t, p.Close())
			require.NoError(t, sendErr, "producing steadily")
		})
	}
	t.Cleanup(stop)
	return stop, func() []kafkatest.Produced { <-done; return out }
}

// A partition added to the input after Subscribe, with transactional
// routing, cooperative-sticky balancing and OffsetNewest (Sarama's
// default): the records written to it before the group noticed it are
// handled too, each output exactly once, its start committed in a
// transaction. Before, they were skipped (the claim started at the end).
func TestTxnCooperativeNewPartition(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := &txnRig{c: c, parts: 2, in: c.NewTopic(t, 1), out: c.NewTopic(t, 2), group: c.NewGroup(t)}
	sub, pub := r.subscriber(t, "txn-coop-new", func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cooperative(cfg)
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 500 * time.Millisecond
	})
	var att attempts
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg, att.next(msg))}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	kafkatest.WaitFor(t, 15*time.Second, "the member to commit the start of partition 0", func() bool {
		co, ok := c.CommittedOffsets(t, r.group, r.in)[0]
		return ok && co.Offset == 0
	})
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, 20, nil)...)

	c.AddPartitions(t, r.in, 2)
	// Produced before the group notices the partition, most likely.
	r.inputs = append(r.inputs, c.Produce(t, r.in, records(1, 10)...)...)
	kafkatest.WaitFor(t, 15*time.Second, "the member to own the new partition", func() bool {
		_, ok := statsOf(sub, r.in, 1)
		return ok
	})
	r.inputs = append(r.inputs, c.Produce(t, r.in, records(1, 5)...)...)

	r.requireExactlyOnce(t, rd, r.inputIDs(), 30*time.Second, 30*time.Second)
	st := pub.Stats()
	require.Zero(t, st.Aborted, "a transaction was aborted")
	t.Logf("transactions: %+v", st)
}

// A record whose completion was deferred (safeack.Defer) on a partition
// that a cooperative rebalance revokes, resolved only after its drain gave
// up: the session goes on, and when the partition comes back to the same
// member its new assignment's transactions must not carry the old
// delivery's output, since the record was handled again by the member it
// went to. One output per input, the moved record's from its second
// delivery.
func TestTxnCooperativeDeferredResolvedAfterRevoke(t *testing.T) {
	t.Parallel()
	c, r, rd := startTxnRig(t, 2, 200)
	held := map[string]bool{"0@10": true, "1@10": true}
	var att attempts
	var mu sync.Mutex
	deferred := map[string]*safeack.Completion{}
	coop := func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cooperative(cfg)
		cfg.DrainTimeout = 200 * time.Millisecond
		if c.Embedded() {
			shortSessions(cfg.OverwriteSaramaConfig)
		}
	}
	subA, pubA := r.subscriber(t, "txn-coop-deferred-a", coop)
	plain := transform(&att, time.Millisecond)
	runRouter(t, r, subA, pubA, func(msg *message.Message) ([]*message.Message, error) {
		k, _ := msgPO(msg)
		id := k.String()
		if !held[id] {
			return plain(msg)
		}
		n := att.next(msg)
		comp, err := safeack.Defer(msg)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		deferred[id] = comp
		mu.Unlock()
		return []*message.Message{outputOf(msg, n)}, nil
	})
	ids := r.inputIDs()
	kafkatest.WaitFor(t, 60*time.Second, "every record but the held ones to have its output", func() bool {
		return rd.seen(ids) == len(ids)-len(held)
	})

	subB, pubB := r.subscriber(t, "txn-coop-deferred-b", coop)
	stopB := runRouter(t, r, subB, pubB, plain)
	var moved string
	kafkatest.WaitFor(t, 30*time.Second, "a partition to move to member b and its held record to be handled there", func() bool {
		for p := range ownedPartitions(subB, r.in) {
			moved = fmt.Sprintf("%d@10", p)
			return len(ownedPartitions(subA, r.in)) == 1 && rd.seen([]string{moved}) == 1
		}
		return false
	})
	mu.Lock()
	for _, comp := range deferred {
		comp.Done() // the moved one's drain gave up on it long ago
	}
	mu.Unlock()
	stopB()
	kafkatest.WaitFor(t, 30*time.Second, "member a to take the partition back", func() bool {
		return len(ownedPartitions(subA, r.in)) == 2
	})
	// New records, so that the new assignment commits positions past the
	// moved record.
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, r.parts, 100, nil)...)
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	rd.mu.Lock()
	defer rd.mu.Unlock()
	require.Equal(t, "2", headerOf(rd.byID[moved][0], hdrAttempt), "output of the moved record from the delivery whose drain gave up")
	t.Logf("moved %s; member a: %+v; member b: %+v", moved, pubA.Stats(), pubB.Stats())
}
