package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Headers of the transactional router tests' records.
const (
	hdrInputID = "input_id" // on each output: the input record it came from ("p@o")
	hdrAttempt = "attempt"  // on each output: which delivery of the input wrote it
	hdrSentry  = "sentry"   // a plain record written after the run: everything before it was read
)

// txnRig is a consume-transform-produce setup on one cluster: an input
// topic with records, an output topic, and a group.
type txnRig struct {
	c       *kafkatest.Cluster
	in, out string
	group   string
	parts   int
	inputs  []kafkatest.Produced
}

func newTxnRig(t *testing.T, c *kafkatest.Cluster, partitions, records int) *txnRig {
	t.Helper()
	r := &txnRig{c: c, parts: partitions}
	r.in = c.NewTopic(t, partitions)
	r.out = c.NewTopic(t, partitions)
	r.group = c.NewGroup(t)
	r.inputs = c.ProduceN(t, r.in, partitions, records, nil)
	return r
}

// inputIDs lists every input record as "p@o".
func (r *txnRig) inputIDs() []string {
	ids := make([]string, len(r.inputs))
	for i, p := range r.inputs {
		ids[i] = fmt.Sprintf("%d@%d", p.Partition, p.Offset)
	}
	return ids
}

// subscriber makes a transactional Subscriber and its TxnPublisher.
func (r *txnRig) subscriber(t *testing.T, txnID string, mod func(*safeack.SubscriberConfig, *safeack.TxnConfig)) (*safeack.Subscriber, *safeack.TxnPublisher) {
	t.Helper()
	return r.loggedSubscriber(t, txnID, keptLogger(t), mod)
}

// loggedSubscriber is subscriber logging to logger.
func (r *txnRig) loggedSubscriber(t *testing.T, txnID string, logger watermill.LoggerAdapter, mod func(*safeack.SubscriberConfig, *safeack.TxnConfig)) (*safeack.Subscriber, *safeack.TxnPublisher) {
	t.Helper()
	skipOnConsumerProtocol(t, "transactions")
	var tc safeack.TxnConfig
	cfg := testSubscriberConfig(r.c, r.group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		cfg.MaxInFlight = 32
		tc = safeack.TxnConfig{
			TransactionalID:       txnID,
			CommitInterval:        50 * time.Millisecond,
			OverwriteSaramaConfig: txnProducerConfig(r.c),
		}
		if mod != nil {
			mod(cfg, &tc)
		}
	})
	sub, pub, err := safeack.NewTxnSubscriber(cfg, tc, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub, pub
}

func txnProducerConfig(c *kafkatest.Cluster) *sarama.Config {
	pc := c.SaramaConfig()
	pc.Producer.Partitioner = sarama.NewHashPartitioner
	// A transaction that Close abandons stays open until the broker aborts
	// it after this timeout, and until then read_committed readers of the
	// output and the partitions' next owners wait. On a loaded machine a
	// member stopped with the tests' 1 s DrainTimeout (so a 1 s wait for
	// its last EndTxn) abandoned one; at Sarama's default of a minute the
	// outputs then stalled past the tests' 60 s waits. Transactions here
	// last milliseconds.
	pc.Producer.Transaction.Timeout = 20 * time.Second
	return pc
}

// outputOf makes the output of input msg: its id and the delivery's attempt.
func outputOf(msg *message.Message, attempt int) *message.Message {
	p, _ := safeack.MessagePartitionFromCtx(msg.Context())
	o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
	out := message.NewMessage(watermill.NewUUID(), []byte("out of "+string(msg.Payload)))
	out.Metadata.Set(hdrInputID, fmt.Sprintf("%d@%d", p, o))
	out.Metadata.Set(hdrAttempt, strconv.Itoa(attempt))
	return out
}

// attempts counts deliveries per input id.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) next(msg *message.Message) int {
	p, _ := safeack.MessagePartitionFromCtx(msg.Context())
	o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = make(map[string]int)
	}
	id := fmt.Sprintf("%d@%d", p, o)
	a.n[id]++
	return a.n[id]
}

// runRouter runs a Watermill router with one handler from the rig's input
// to its output topic through sub and pub. It returns a stop function that
// closes the router and waits for it.
func runRouter(t *testing.T, r *txnRig, sub *safeack.Subscriber, pub *safeack.TxnPublisher, h message.HandlerFunc) (stop func()) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, keptLogger(t))
	require.NoError(t, err)
	router.AddMiddleware(pub.Middleware)
	router.AddHandler("transform", r.in, sub, r.out, pub, h)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// outputReader reads a topic from the start with IsolationLevel
// ReadCommitted (only committed transactions' records), or ReadUncommitted.
type outputReader struct {
	mu      sync.Mutex
	byID    map[string][]*sarama.ConsumerMessage
	sentry  map[int32]bool
	records int
}

func readOutputs(t *testing.T, c *kafkatest.Cluster, topic string, partitions int, isolation sarama.IsolationLevel) *outputReader {
	t.Helper()
	cfg := c.SaramaConfig()
	cfg.Consumer.IsolationLevel = isolation
	consumer, err := sarama.NewConsumer(c.Brokers(), cfg)
	require.NoError(t, err)
	rd := &outputReader{byID: make(map[string][]*sarama.ConsumerMessage), sentry: make(map[int32]bool)}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	t.Cleanup(func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		_ = consumer.Close()
	})
	for p := range int32(partitions) {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		pcs = append(pcs, pc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range pc.Messages() {
				rd.add(m)
			}
		}()
	}
	return rd
}

func (rd *outputReader) add(m *sarama.ConsumerMessage) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.records++
	var id string
	for _, h := range m.Headers {
		switch string(h.Key) {
		case hdrSentry:
			rd.sentry[m.Partition] = true
			return
		case hdrInputID:
			id = string(h.Value)
		}
	}
	rd.byID[id] = append(rd.byID[id], m)
}

// waitRecords waits until n records were read.
func (rd *outputReader) waitRecords(t *testing.T, n int, what string) {
	t.Helper()
	kafkatest.WaitFor(t, 20*time.Second, what, func() bool {
		rd.mu.Lock()
		defer rd.mu.Unlock()
		return rd.records == n
	})
}

// complete waits until a plain "sentry" record written to every partition
// now has been read: every record before it has been read too.
func (rd *outputReader) complete(t *testing.T, c *kafkatest.Cluster, topic string, partitions int) {
	t.Helper()
	for p := range int32(partitions) {
		c.Produce(t, topic, kafkatest.Record{Partition: p, Value: []byte("sentry"), Headers: map[string]string{hdrSentry: "1"}})
	}
	kafkatest.WaitFor(t, 60*time.Second, "reading the output topic up to the sentries", func() bool {
		rd.mu.Lock()
		defer rd.mu.Unlock()
		return len(rd.sentry) == partitions
	})
}

func (rd *outputReader) seen(ids []string) int {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	n := 0
	for _, id := range ids {
		if len(rd.byID[id]) > 0 {
			n++
		}
	}
	return n
}

// waitAll waits until every id has at least one output.
func (rd *outputReader) waitAll(t *testing.T, ids []string, timeout time.Duration) {
	t.Helper()
	kafkatest.WaitFor(t, timeout, fmt.Sprintf("outputs of all %d inputs", len(ids)), func() bool {
		return rd.seen(ids) == len(ids)
	})
}

// checkExactlyOnce fails unless every id has exactly one output and no
// output belongs to another id.
func (rd *outputReader) checkExactlyOnce(t *testing.T, ids []string) {
	t.Helper()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	want := make(map[string]bool, len(ids))
	var missing, twice []string
	for _, id := range ids {
		want[id] = true
		switch n := len(rd.byID[id]); {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			twice = append(twice, fmt.Sprintf("%s×%d", id, n))
		}
	}
	var foreign []string
	for id := range rd.byID {
		if !want[id] {
			foreign = append(foreign, id)
		}
	}
	require.Empty(t, missing, "inputs without output")
	require.Empty(t, twice, "inputs with more than one output")
	require.Empty(t, foreign, "outputs of no input")
}

// requireExactlyOnce is how a transactional test ends: it waits until
// every input has an output visible to rd and the group's commits reached
// the end of the input, reads the output topic to its end, and checks
// that every input has exactly one output.
func (r *txnRig) requireExactlyOnce(t *testing.T, rd *outputReader, ids []string, outputsWithin, commitsWithin time.Duration) {
	t.Helper()
	rd.waitAll(t, ids, outputsWithin)
	r.waitCommittedAll(t, commitsWithin)
	rd.complete(t, r.c, r.out, r.parts)
	rd.checkExactlyOnce(t, ids)
}

// waitOutputsCounted waits until the publishers together count want
// outputs in committed transactions, and returns their summed stats. A
// publisher counts a transaction once its commit call returns, a moment
// after readers and the group's offsets already show it. A transaction
// abandoned at Close is counted by nobody, though the broker may have
// committed it (its outputs then stand for its records): with one, fewer
// outputs are accepted once the counts stop moving.
func waitOutputsCounted(t *testing.T, want int, pubs ...*safeack.TxnPublisher) safeack.TxnStats {
	t.Helper()
	var total safeack.TxnStats
	sum := func() safeack.TxnStats {
		var s safeack.TxnStats
		for _, p := range pubs {
			st := p.Stats()
			s.Committed += st.Committed
			s.Aborted += st.Aborted
			s.Retried += st.Retried
			s.Abandoned += st.Abandoned
			s.Outputs += st.Outputs
			s.AckedDuringCommit += st.AckedDuringCommit
			s.CommitTime += st.CommitTime
			s.MaxCommit = max(s.MaxCommit, st.MaxCommit)
		}
		return s
	}
	var counted uint64
	var since time.Time
	kafkatest.WaitFor(t, 30*time.Second, fmt.Sprintf("the publishers to count %d outputs", want), func() bool {
		total = sum()
		if total.Outputs >= uint64(want) {
			return true
		}
		if total.Outputs != counted || since.IsZero() {
			counted, since = total.Outputs, time.Now()
		}
		return total.Abandoned > 0 && time.Since(since) > 2*time.Second
	})
	if total.Abandoned > 0 && total.Outputs < uint64(want) {
		t.Logf("%d of %d outputs counted; the rest are in the %d transactions abandoned at Close, which the broker committed", total.Outputs, want, total.Abandoned)
		return total
	}
	require.EqualValues(t, want, total.Outputs, "transactions: %+v", total)
	return total
}

// waitCommittedAll waits until the group's committed offsets are at the
// input topic's high-water marks.
func (r *txnRig) waitCommittedAll(t *testing.T, timeout time.Duration) {
	t.Helper()
	hwm := r.c.HighWaterMarks(t, r.in)
	kafkatest.WaitFor(t, timeout, "the group's commits to reach the high-water marks", func() bool {
		got := r.c.CommittedOffsets(t, r.group, r.in)
		for p, h := range hwm {
			if got[p].Offset != h {
				return false
			}
		}
		return true
	})
}

// A consume-transform-produce router whose handlers take different times
// and ack out of order: a read_committed reader sees exactly one output per
// input, and the group's offsets end at the input's end, committed only in
// transactions (the broker sees no plain OffsetCommit past the start).
func TestTxnRouterExactlyOnce(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 4, 2000)
	var plainCommits *kafkatest.CommitLog
	if c.CanObserveCommits() {
		plainCommits = c.ObserveCommits(t)
	}
	sub, pub := r.subscriber(t, "txn-eo", nil)
	var att attempts
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		randomDelay(2 * time.Millisecond)
		return []*message.Message{outputOf(msg, n)}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	r.requireExactlyOnce(t, rd, ids, 60*time.Second, 30*time.Second)

	st := waitOutputsCounted(t, len(ids), pub)
	require.Greater(t, st.Committed, uint64(1))
	require.Zero(t, st.Aborted)
	if plainCommits != nil {
		for _, oc := range plainCommits.Commits() {
			if oc.Group != r.group {
				continue
			}
			// Only the start of partitions without a commit goes through
			// OffsetCommit (pinStarts): offset 0 here.
			for p := range int32(r.parts) {
				if co, ok := oc.Offset(r.in, p); ok {
					require.Zero(t, co.Offset, "a plain OffsetCommit past the start: %+v", oc)
				}
			}
		}
	}
	t.Logf("transactions: %+v", st)
}

// Handlers are not stopped while a transaction commits: deliveries are
// acked, and their outputs taken for the next transaction, while one is in
// flight.
func TestTxnHandlersRunDuringCommit(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 2, 3000)
	sub, pub := r.subscriber(t, "txn-nostop", func(_ *safeack.SubscriberConfig, tc *safeack.TxnConfig) {
		tc.CommitInterval = 20 * time.Millisecond
	})
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		time.Sleep(time.Millisecond)
		return []*message.Message{outputOf(msg, 1)}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	rd.waitAll(t, ids, 60*time.Second)
	st := waitOutputsCounted(t, len(ids), pub)
	t.Logf("transactions: %+v (mean commit %s)", st, st.CommitTime/time.Duration(max(st.Committed, 1)))
	require.Greater(t, st.AckedDuringCommit, uint64(0), "no delivery was acked while a transaction committed")
	rd.complete(t, c, r.out, r.parts)
	rd.checkExactlyOnce(t, ids)
}

// A handler that publishes its output itself and then fails, and one whose
// router publish succeeds but that nacks: the outputs of those deliveries
// never become visible; the redelivery's do, once.
func TestTxnFailedDeliveryOutputsDiscarded(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 2, 300)
	sub, pub := r.subscriber(t, "txn-fail", nil)
	var att attempts
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
		out := outputOf(msg, n)
		switch {
		case o%3 == 0 && n == 1:
			// Publishes itself, then fails: the router nacks.
			out.SetContext(msg.Context())
			if err := pub.Publish(r.out, out); err != nil {
				return nil, err
			}
			return nil, errors.New("failed after publishing")
		case o%3 == 1 && n == 1:
			// Publishes itself, then nacks explicitly and returns nil
			// (the router's Ack then changes nothing).
			out.SetContext(msg.Context())
			if err := pub.Publish(r.out, out); err != nil {
				return nil, err
			}
			msg.Nack()
			return nil, nil
		case o%3 == 2:
			// Publishes itself and succeeds.
			out.SetContext(msg.Context())
			return nil, pub.Publish(r.out, out)
		}
		return []*message.Message{out}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	r.requireExactlyOnce(t, rd, ids, 60*time.Second, 30*time.Second)
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for id, ms := range rd.byID {
		var o int64
		_, _ = fmt.Sscanf(id[len(fmt.Sprint(ms[0].Partition))+1:], "%d", &o)
		attempt := headerOf(ms[0], hdrAttempt)
		if o%3 != 2 {
			require.Equal(t, "2", attempt, "output of %s from a failed delivery", id)
		}
	}
}

func headerOf(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// An output without the context of a delivery is refused with a clear
// error, as is one published after its delivery was answered.
func TestTxnPublishWithoutDelivery(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 1, 1)
	sub, pub := r.subscriber(t, "txn-nodelivery", nil)
	err := pub.Publish(r.out, message.NewMessage("x", nil))
	require.ErrorIs(t, err, safeack.ErrNoDelivery)

	msgs := mustSubscribe(t, sub, r.in)
	var m *message.Message
	select {
	case m = <-msgs:
	case <-time.After(30 * time.Second):
		t.Fatal("no message")
	}
	out := outputOf(m, 1)
	out.SetContext(m.Context())
	m.Nack()
	require.ErrorIs(t, pub.Publish(r.out, out), safeack.ErrAlreadyAnswered)
}

// Invalid transactional configuration is an error that names the field,
// and changes nothing: the caller's Sarama configs keep their values.
func TestTxnConfigErrors(t *testing.T) {
	skipOnConsumerProtocol(t, "transactions")
	t.Parallel()
	c := kafkatest.Start(t)
	group := c.NewGroup(t)
	mk := func(mod func(*safeack.SubscriberConfig)) safeack.SubscriberConfig {
		return testSubscriberConfig(c, group, mod)
	}
	oldProducer := c.SaramaConfig()
	oldProducer.Version = sarama.V2_4_0_0
	for _, tc := range []struct {
		name  string
		sub   safeack.SubscriberConfig
		cfg   safeack.TxnConfig
		field string
	}{
		{"no id", mk(nil), safeack.TxnConfig{}, "TxnConfig.TransactionalID"},
		{"negative interval", mk(nil), safeack.TxnConfig{TransactionalID: "x", CommitInterval: -1}, "TxnConfig.CommitInterval"},
		{"interval below 1 ms", mk(nil), safeack.TxnConfig{TransactionalID: "x", CommitInterval: time.Microsecond}, "TxnConfig.CommitInterval"},
		{"empty broker", mk(nil), safeack.TxnConfig{TransactionalID: "x", Brokers: []string{""}}, "TxnConfig.Brokers"},
		{"old producer version", mk(nil), safeack.TxnConfig{TransactionalID: "x", OverwriteSaramaConfig: oldProducer}, "TxnConfig.OverwriteSaramaConfig.Version"},
		{"no group", mk(func(cfg *safeack.SubscriberConfig) { cfg.ConsumerGroup = "" }), safeack.TxnConfig{TransactionalID: "x"}, "SubscriberConfig.ConsumerGroup"},
		{"old version", mk(func(cfg *safeack.SubscriberConfig) { cfg.OverwriteSaramaConfig.Version = sarama.V2_4_0_0 }), safeack.TxnConfig{TransactionalID: "x"}, "SubscriberConfig.OverwriteSaramaConfig.Version"},
		{"invalid subscriber config", mk(func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = -1 }), safeack.TxnConfig{TransactionalID: "x"}, "MaxInFlight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, pub, err := safeack.NewTxnSubscriber(tc.sub, tc.cfg, nil)
			require.ErrorIs(t, err, safeack.ErrInvalidConfig)
			require.ErrorContains(t, err, tc.field+":")
			require.Nil(t, sub)
			require.Nil(t, pub)
			if strings.HasPrefix(tc.field, "TxnConfig.") {
				// What can be judged without the subscriber's config,
				// Validate judges alone.
				verr := tc.cfg.Validate()
				require.ErrorIs(t, verr, safeack.ErrInvalidConfig)
				require.ErrorContains(t, verr, tc.field+":")
			}
			require.Equal(t, sarama.ReadUncommitted, tc.sub.OverwriteSaramaConfig.Consumer.IsolationLevel)
		})
	}
	require.NoError(t, safeack.TxnConfig{TransactionalID: "x"}.Validate())

	t.Run("valid", func(t *testing.T) {
		cfg := mk(nil)
		sub, pub, err := safeack.NewTxnSubscriber(cfg, safeack.TxnConfig{TransactionalID: "x"}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		require.NotNil(t, pub)
		// The Subscriber's own copy reads committed; the caller's is untouched.
		require.Equal(t, sarama.ReadUncommitted, cfg.OverwriteSaramaConfig.Consumer.IsolationLevel)
		_, err = safeack.NewTxnPublisher(sub, safeack.TxnConfig{TransactionalID: "y"}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig, "a second TxnPublisher for a transactional Subscriber")
	})

	// The deprecated NewTxnPublisher refuses what NewTxnSubscriber does, and
	// a Subscriber that was used already, or has a TxnPublisher.
	plain := func(mod func(*safeack.SubscriberConfig)) *safeack.Subscriber {
		return newTestSubscriber(t, c, group, mod)
	}
	t.Run("wrapper: no group", func(t *testing.T) {
		_, err := safeack.NewTxnPublisher(plain(func(cfg *safeack.SubscriberConfig) { cfg.ConsumerGroup = "" }), safeack.TxnConfig{TransactionalID: "x"}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig)
		require.ErrorContains(t, err, "SubscriberConfig.ConsumerGroup:")
	})
	t.Run("wrapper: no id", func(t *testing.T) {
		_, err := safeack.NewTxnPublisher(plain(nil), safeack.TxnConfig{}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig)
		require.ErrorContains(t, err, "TxnConfig.TransactionalID:")
	})
	t.Run("wrapper: nil subscriber", func(t *testing.T) {
		_, err := safeack.NewTxnPublisher(nil, safeack.TxnConfig{TransactionalID: "x"}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	})
	t.Run("wrapper: after subscribe", func(t *testing.T) {
		sub := plain(nil)
		mustSubscribe(t, sub, c.NewTopic(t, 1))
		_, err := safeack.NewTxnPublisher(sub, safeack.TxnConfig{TransactionalID: "x"}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	})
	t.Run("wrapper: twice", func(t *testing.T) {
		sub := plain(nil)
		_, err := safeack.NewTxnPublisher(sub, safeack.TxnConfig{TransactionalID: "x"}, nil)
		require.NoError(t, err)
		_, err = safeack.NewTxnPublisher(sub, safeack.TxnConfig{TransactionalID: "y"}, nil)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	})
}

// The deprecated NewTxnPublisher still makes a plain Subscriber
// transactional for existing users: exactly one committed output per input.
func TestTxnPublisherDeprecatedWrapper(t *testing.T) {
	skipOnConsumerProtocol(t, "transactions")
	t.Parallel()
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 2, 200)
	sc := testSubscriberConfig(c, r.group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	sub, err := safeack.NewSubscriber(sc, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub, err := safeack.NewTxnPublisher(sub, safeack.TxnConfig{
		TransactionalID:       "txn-wrapper",
		CommitInterval:        50 * time.Millisecond,
		OverwriteSaramaConfig: txnProducerConfig(c),
	}, testLogger())
	require.NoError(t, err)
	require.Equal(t, sarama.ReadUncommitted, sc.OverwriteSaramaConfig.Consumer.IsolationLevel, "the caller's config changed")
	var att attempts
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg, att.next(msg))}, nil
	})
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	require.Zero(t, pub.Stats().Aborted)
}
