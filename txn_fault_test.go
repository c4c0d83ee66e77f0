package safeack_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// transform is the rigs' handler: one output per input, after up to delay.
func transform(att *attempts, delay time.Duration) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		randomDelay(delay)
		return []*message.Message{outputOf(msg, n)}, nil
	}
}

// Closing the router (and the subscriber) while handlers run and
// transactions are being written, then starting again: the outputs are
// exactly once.
func TestTxnCloseMidTransaction(t *testing.T) {
	t.Parallel()
	_, r, rd := startTxnRig(t, 4, 2000)
	ids := r.inputIDs()
	var att attempts

	sub1, pub1 := r.subscriber(t, "txn-close", nil)
	stop1 := runRouter(t, r, sub1, pub1, transform(&att, 3*time.Millisecond))
	kafkatest.WaitFor(t, 60*time.Second, "some outputs", func() bool { return rd.seen(ids) >= 300 })
	stop1()
	t.Logf("first run: %+v, %d inputs with output", pub1.Stats(), rd.seen(ids))

	sub2, pub2 := r.subscriber(t, "txn-close", nil)
	runRouter(t, r, sub2, pub2, transform(&att, 3*time.Millisecond))
	r.requireExactlyOnce(t, rd, ids, 60*time.Second, 30*time.Second)
	t.Logf("second run: %+v", pub2.Stats())
}

// A second member joins mid-stream (an eager rebalance moves partitions
// between the two while transactions are in flight), then the first one
// leaves: the outputs are exactly once.
func TestTxnRebalanceSecondMember(t *testing.T) {
	t.Parallel()
	_, r, rd := startTxnRig(t, 4, 3000)
	ids := r.inputIDs()
	var att attempts

	// The first member stops after a while until the second one owns
	// partitions, so that there is work left to share.
	gate := make(chan struct{})
	sub1, pub1 := r.subscriber(t, "txn-member-1", nil)
	work := transform(&att, 3*time.Millisecond)
	stop1 := runRouter(t, r, sub1, pub1, gateAfter(1000, gate, work))
	kafkatest.WaitFor(t, 60*time.Second, "some outputs", func() bool { return rd.seen(ids) >= 300 })

	sub2, pub2 := r.subscriber(t, "txn-member-2", nil)
	runRouter(t, r, sub2, pub2, transform(&att, 3*time.Millisecond))
	kafkatest.WaitFor(t, 60*time.Second, "the second member to own partitions", func() bool {
		return len(sub2.Stats()) > 0
	})
	close(gate)
	kafkatest.WaitFor(t, 60*time.Second, "the second member to commit a transaction", func() bool {
		return pub2.Stats().Committed > 0
	})
	stop1()
	r.requireExactlyOnce(t, rd, ids, 90*time.Second, 30*time.Second)
	t.Logf("member 1: %+v; member 2: %+v", pub1.Stats(), pub2.Stats())
}

// Another producer takes the subscription's transactional id mid-stream
// (as a restarted instance does): the running producer is fenced, its
// transaction aborted, and the partitions restart from the committed
// offsets. Nothing of the aborted transactions is visible, and the
// outputs are exactly once.
func TestTxnFencedByTransactionalID(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	if raceEnabled {
		// Sarama v1.61.1 reads transactionManager.lastError without its
		// lock in publishTxnPartitions (transaction_manager.go:884) while
		// the retry goroutines of a failed batch write it (transitionTo,
		// :249): fenced produce requests to several partitions trip the
		// race detector inside Sarama, in about two runs of three. The
		// test runs in the suite without -race. Reported upstream-ready,
		// with a reproducer: docs/upstream/sarama-txnmgr-race.md.
		t.Skip("a data race inside Sarama's transaction manager when a producer is fenced mid-produce (run without -race)")
	}
	r := newTxnRig(t, c, 2, 3000)
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	var att attempts
	sub, pub := r.subscriber(t, "txn-fenced", nil)
	// Handlers stop after a while until the fence is up, so that there are
	// transactions left to fence.
	gate := make(chan struct{})
	runRouter(t, r, sub, pub, gateAfter(1000, gate, transform(&att, 2*time.Millisecond)))
	kafkatest.WaitFor(t, 60*time.Second, "some outputs", func() bool { return rd.seen(ids) >= 300 })

	// InitProducerId with the same id bumps the epoch: the running producer
	// is fenced at its next request.
	pc := txnProducerConfig(c)
	pc.Producer.Idempotent = true
	pc.Net.MaxOpenRequests = 1
	pc.Producer.Transaction.ID = "txn-fenced-" + r.in
	fencer, err := sarama.NewSyncProducer(c.Brokers(), pc)
	require.NoError(t, err)
	require.NoError(t, fencer.Close())
	close(gate)

	kafkatest.WaitFor(t, 60*time.Second, "an aborted transaction", func() bool { return pub.Stats().Aborted > 0 })
	r.requireExactlyOnce(t, rd, ids, 90*time.Second, 30*time.Second)
	t.Logf("transactions: %+v", pub.Stats())
}

// The group coordinator rejects the transaction's offsets as a zombie's
// (ILLEGAL_GENERATION, what KIP-447 fencing answers a member a rebalance
// left behind): the transaction aborts, its outputs are never visible to a
// read_committed reader, and the records are handled again.
func TestTxnOffsetsFencedByGeneration(t *testing.T) {
	t.Parallel()
	c, r, rd := startTxnRig(t, 2, 2000, kafkatest.Embedded())
	uncommitted := readOutputs(t, c, r.out, r.parts, sarama.ReadUncommitted)
	sub, pub := r.subscriber(t, "txn-zombie", nil)

	var reject atomic.Int32
	c.Kfake().ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.Kfake().KeepControl()
		if reject.Add(-1) < 0 {
			reject.Store(0)
			return nil, nil, false
		}
		creq := req.(*kmsg.TxnOffsetCommitRequest)
		resp := creq.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
		for _, rt := range creq.Topics {
			st := kmsg.NewTxnOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.IllegalGeneration.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	abortMidRun(t, c, r, rd, uncommitted, sub, pub, func() { reject.Store(2) }, "the aborted transactions wrote outputs that read_committed must not see")
}

// A record that never finishes holds its partition's committed offset back
// while the records after it complete: their outputs are committed with
// the completed tail that lists them, in the same transactions. The next
// owner skips exactly those records (their outputs are there already) and
// handles the held one: one output each.
func TestTxnCompletedTailHandedOver(t *testing.T) {
	t.Parallel()
	c, r, rd := startTxnRig(t, 1, 400)
	ids := r.inputIDs()
	held := ids[10]
	var att attempts

	sub1, pub1 := r.subscriber(t, "txn-tail", shortDrain)
	first := transform(&att, time.Millisecond)
	stop1 := runRouter(t, r, sub1, pub1, func(msg *message.Message) ([]*message.Message, error) {
		if k, _ := msgPO(msg); k.String() == held {
			att.next(msg)
			<-msg.Context().Done() // until the drain gives up on it
			return nil, msg.Context().Err()
		}
		return first(msg)
	})
	kafkatest.WaitFor(t, 60*time.Second, "every record but the held one to have its output", func() bool {
		return rd.seen(ids) == len(ids)-1
	})
	co := c.CommittedOffsets(t, r.group, r.in)[0]
	require.Equal(t, int64(10), co.Offset, "committed past the held record")
	require.NotEmpty(t, co.Metadata, "no completed tail committed")
	stop1()

	sub2, pub2 := r.subscriber(t, "txn-tail", nil)
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	r.requireExactlyOnce(t, rd, ids, 60*time.Second, 30*time.Second)
	att.mu.Lock()
	defer att.mu.Unlock()
	for _, id := range ids {
		want := 1
		if id == held {
			want = 2
		}
		require.Equal(t, want, att.n[id], "deliveries of %s", id)
	}
}

// The broker aborts a transaction that stays open past
// Producer.Transaction.Timeout (here: its EndTxn is held back longer than
// that): the producer's commit fails, the transaction's outputs are never
// visible to a read_committed reader, and the records are handled again.
func TestTxnAbortedByBrokerTimeout(t *testing.T) {
	t.Parallel()
	if raceEnabled {
		// The broker's abort fails the producer's batches in flight to
		// several partitions: the same race inside Sarama's transaction
		// manager as TestTxnFencedByTransactionalID's fence (transitionTo
		// against publishTxnPartitions). Four full -race runs on a loaded
		// two-core machine (2026-12-07) reported it, each time with this
		// test among those failed. It runs in the suite without -race.
		t.Skip("a data race inside Sarama's transaction manager when the broker aborts a transaction mid-produce (run without -race)")
	}
	c, r, rd := startTxnRig(t, 2, 2000, kafkatest.Embedded())
	uncommitted := readOutputs(t, c, r.out, r.parts, sarama.ReadUncommitted)
	const txnTimeout = 5 * time.Second // 3 s: a loaded machine's transactions outran it before the fault
	sub, pub := r.subscriber(t, "txn-timeout", func(_ *safeack.SubscriberConfig, tc *safeack.TxnConfig) {
		tc.OverwriteSaramaConfig.Producer.Transaction.Timeout = txnTimeout
	})

	kf := c.Kfake()
	var hold atomic.Bool
	kf.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if hold.CompareAndSwap(true, false) {
			// Yields to the broker's loop, whose timer aborts the
			// transaction meanwhile; then the EndTxn is answered.
			kf.SleepControl(func() { time.Sleep(2 * txnTimeout) })
		}
		return nil, nil, false
	})

	abortMidRun(t, c, r, rd, uncommitted, sub, pub, func() { hold.Store(true) }, "the aborted transaction wrote outputs that read_committed must not see")
}

// A record whose completion was deferred (safeack.Defer) and resolved only
// after its drain gave up at Close: its output, returned by the handler,
// is never committed by the member that handed the partition on, and the
// next owner handles the record again: one output, from the second
// delivery.
func TestTxnDeferredResolvedAfterHandOver(t *testing.T) {
	t.Parallel()
	_, r, rd := startTxnRig(t, 1, 200)
	ids := r.inputIDs()
	held := ids[10]
	var att attempts
	late := make(chan *safeack.Completion, 1)

	sub1, pub1 := r.subscriber(t, "txn-deferred-late", shortDrain)
	first := transform(&att, time.Millisecond)
	stop1 := runRouter(t, r, sub1, pub1, func(msg *message.Message) ([]*message.Message, error) {
		if k, _ := msgPO(msg); k.String() != held {
			return first(msg)
		}
		n := att.next(msg)
		comp, err := safeack.Defer(msg)
		if err != nil {
			return nil, err
		}
		late <- comp // resolved after Close
		return []*message.Message{outputOf(msg, n)}, nil
	})
	kafkatest.WaitFor(t, 60*time.Second, "every record but the held one to have its output", func() bool {
		return rd.seen(ids) == len(ids)-1
	})
	stop1()
	(<-late).Done()

	sub2, pub2 := r.subscriber(t, "txn-deferred-late", nil)
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	r.requireExactlyOnce(t, rd, ids, 60*time.Second, 30*time.Second)
	rd.mu.Lock()
	defer rd.mu.Unlock()
	require.Equal(t, "2", headerOf(rd.byID[held][0], hdrAttempt), "output of the deferred record from the delivery whose drain gave up")
}

// abortMidRun runs a router of sub and pub over the rig's inputs, starts
// fault once 300 outputs were read, waits for a transaction to abort, and
// requires one visible output per input while the read_uncommitted reader
// saw the aborted ones too (what: the message of that check).
func abortMidRun(t *testing.T, c *kafkatest.Cluster, r *txnRig, rd, uncommitted *outputReader, sub *safeack.Subscriber, pub *safeack.TxnPublisher, fault func(), what string) {
	t.Helper()
	ids := r.inputIDs()
	var att attempts
	// Past the first 300 records, handlers wait for the fault: the run
	// must still be under way when it comes (a fast run used to be over
	// before this saw its 300th output, and no transaction was left to
	// fail).
	armed := make(chan struct{})
	runRouter(t, r, sub, pub, gateAfter(300, armed, transform(&att, 2*time.Millisecond)))
	kafkatest.WaitFor(t, 60*time.Second, "some outputs", func() bool { return rd.seen(ids) >= 300 })
	fault()
	close(armed)
	kafkatest.WaitFor(t, 60*time.Second, "an aborted transaction", func() bool { return pub.Stats().Aborted > 0 })
	r.requireExactlyOnce(t, rd, ids, 90*time.Second, 30*time.Second)
	requireAbortedOutputs(t, c, r, uncommitted, pub, len(ids), what)
}

// requireAbortedOutputs reads the output topic to its end with the
// read_uncommitted reader and requires more records there (both readers'
// sentries not counted) than inputs: aborted transactions wrote outputs
// that the read_committed reader never showed.
func requireAbortedOutputs(t *testing.T, c *kafkatest.Cluster, r *txnRig, uncommitted *outputReader, pub *safeack.TxnPublisher, inputs int, what string) {
	t.Helper()
	uncommitted.complete(t, c, r.out, r.parts)
	uncommitted.mu.Lock()
	written := uncommitted.records - len(uncommitted.sentry)*2 // both readers' sentries
	uncommitted.mu.Unlock()
	t.Logf("transactions: %+v; records written (read_uncommitted): %d for %d inputs", pub.Stats(), written, inputs)
	require.Greater(t, written, inputs, what)
}

// gateAfter is work behind a gate: past the first n records, a handler
// waits until gate closes (or its message's context ends).
func gateAfter(n int32, gate <-chan struct{}, work func(*message.Message) ([]*message.Message, error)) func(*message.Message) ([]*message.Message, error) {
	var handled atomic.Int32
	return func(msg *message.Message) ([]*message.Message, error) {
		if handled.Add(1) > n {
			select {
			case <-gate:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
		}
		return work(msg)
	}
}

// shortDrain gives a transactional member 200 ms to drain: a handler held
// past it is given up on.
func shortDrain(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
	cfg.DrainTimeout = 200 * time.Millisecond
}
