package safeack_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
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

// Shared helpers of the subscriber integration tests.

// po names one record of a topic: its partition and offset.
type po struct {
	p int32
	o int64
}

func (k po) String() string { return fmt.Sprintf("%d@%d", k.p, k.o) }

// msgPO returns the partition and offset of a delivered message, read from
// its context.
func msgPO(m *message.Message) (po, bool) {
	p, ok1 := safeack.MessagePartitionFromCtx(m.Context())
	o, ok2 := safeack.MessagePartitionOffsetFromCtx(m.Context())
	return po{p, o}, ok1 && ok2
}

// ackLog records acks: for each record, the times just before Ack() was
// called. Counted acks are the ones the test expects the subscriber to
// honour; late acks (after the message's assignment was abandoned) are kept
// apart and must change nothing, so the commit check never credits them.
type ackLog struct {
	mu   sync.Mutex
	acks map[po][]time.Time
	late map[po][]time.Time
	bad  []string // messages without partition/offset in their context
}

func newAckLog() *ackLog {
	return &ackLog{acks: make(map[po][]time.Time), late: make(map[po][]time.Time)}
}

// ack records a counted ack of m and acks it.
func (l *ackLog) ack(m *message.Message) {
	k, ok := msgPO(m)
	l.mu.Lock()
	if !ok {
		l.bad = append(l.bad, m.UUID)
	} else {
		l.acks[k] = append(l.acks[k], time.Now())
	}
	l.mu.Unlock()
	m.Ack()
}

// ackLate records a late (uncounted) ack of m and acks it.
func (l *ackLog) ackLate(m *message.Message) {
	k, _ := msgPO(m)
	l.mu.Lock()
	l.late[k] = append(l.late[k], time.Now())
	l.mu.Unlock()
	m.Ack()
}

// first returns the time of the earliest counted ack of k.
func (l *ackLog) first(k po) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.acks[k]
	if len(ts) == 0 {
		return time.Time{}, false
	}
	first := ts[0]
	for _, at := range ts[1:] {
		if at.Before(first) {
			first = at
		}
	}
	return first, true
}

func (l *ackLog) count(k po) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks[k])
}

// snapshot returns how many counted acks each record got.
func (l *ackLog) snapshot() map[po]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[po]int, len(l.acks))
	for k, ts := range l.acks {
		out[k] = len(ts)
	}
	return out
}

func (l *ackLog) badMessages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.bad)
}

// missing returns the produced records of topic without a counted ack.
func (l *ackLog) missing(c *kafkatest.Cluster, topic string) []po {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []po
	for _, p := range c.ProducedRecords(topic) {
		k := po{p.Partition, p.Offset}
		if len(l.acks[k]) == 0 {
			out = append(out, k)
		}
	}
	return out
}

// waitAllAcked waits until every record produced to topic so far has a
// counted ack.
func (l *ackLog) waitAllAcked(t *testing.T, c *kafkatest.Cluster, topic string, timeout time.Duration) {
	t.Helper()
	var miss []po
	ok := waitCond(timeout, func() bool {
		miss = l.missing(c, topic)
		return len(miss) == 0
	})
	if !ok {
		if len(miss) > 10 {
			miss = miss[:10]
		}
		t.Fatalf("timed out after %v waiting for every produced record to be acked; %d missing, first: %v",
			timeout, len(l.missing(c, topic)), miss)
	}
}

// waitCond polls cond every 5ms until it holds or timeout passes; cond gets
// one last look after the deadline. It reports whether cond held.
func waitCond(timeout time.Duration, cond func() bool) bool {
	return kafkatest.Poll(timeout, 5*time.Millisecond, cond)
}

// newTestSubscriber builds a Subscriber on c for group with test-friendly
// defaults (short sleeps, short drain), lets mod adjust the config, and
// closes it at the end of the test.
func newTestSubscriber(t *testing.T, c *kafkatest.Cluster, group string, mod func(*safeack.SubscriberConfig)) *safeack.Subscriber {
	t.Helper()
	return newLoggedSubscriber(t, c, group, keptLogger(t), mod)
}

// newLoggedSubscriber is newTestSubscriber logging to logger.
func newLoggedSubscriber(t *testing.T, c *kafkatest.Cluster, group string, logger watermill.LoggerAdapter, mod func(*safeack.SubscriberConfig)) *safeack.Subscriber {
	t.Helper()
	cfg := testSubscriberConfig(c, group, mod)
	if cfg.GroupProtocol == safeack.GroupProtocolConsumer {
		requireConsumerProtocol(t)
	}
	sub, err := safeack.NewSubscriber(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// testSubscriberConfig is newTestSubscriber's config: short intervals and
// timeouts, changed by mod if it is not nil.
func testSubscriberConfig(c *kafkatest.Cluster, group string, mod func(*safeack.SubscriberConfig)) safeack.SubscriberConfig {
	return protocolConfig(c, group, envGroupProtocol, mod)
}

// envGroupProtocol is the group protocol of the suite's consumer groups:
// SAFEACK_TEST_GROUP_PROTOCOL=consumer runs them on GroupProtocolConsumer
// (KIP-848), anything else or unset on GroupProtocolClassic.
var envGroupProtocol = func() safeack.GroupProtocol {
	if os.Getenv("SAFEACK_TEST_GROUP_PROTOCOL") == "consumer" {
		return safeack.GroupProtocolConsumer
	}
	return safeack.GroupProtocolClassic
}()

// protocols lists the group protocols a test runs on with forProtocols.
var protocols = []safeack.GroupProtocol{safeack.GroupProtocolClassic, safeack.GroupProtocolConsumer}

// forProtocols runs test once per group protocol, as subtests named after
// it: the tests of the properties both engines must keep run on both in
// the default suite.
func forProtocols(t *testing.T, test func(t *testing.T, p safeack.GroupProtocol)) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			if p == safeack.GroupProtocolConsumer {
				requireConsumerProtocol(t)
			}
			test(t, p)
		})
	}
}

// requireConsumerProtocol skips a test on the consumer group protocol when
// the real broker the suite runs against is older than Kafka 4.0, which
// has no KIP-848 (franz-go would fall back to the classic protocol there).
// The embedded broker speaks it.
func requireConsumerProtocol(t *testing.T) {
	t.Helper()
	if os.Getenv("SAFEACK_KAFKA_BROKERS") == "" {
		return
	}
	v, err := sarama.ParseKafkaVersion(strings.TrimSpace(os.Getenv(kafkatest.EnvVersion)))
	if err == nil && !v.IsAtLeast(sarama.V4_0_0_0) {
		t.Skipf("the consumer group protocol (KIP-848) needs Kafka 4.0+; the broker is %v", v)
	}
}

// consumerHeartbeat is the heartbeat interval c's coordinator gives
// consumer-protocol members: a member takes or gives up a partition on its
// heartbeat. A real broker keeps Kafka's default
// (group.consumer.heartbeat.interval.ms, 5 s; scripts/kafka.sh only lowers
// its minimum).
func consumerHeartbeat(c *kafkatest.Cluster) time.Duration {
	if c.Embedded() {
		return kafkatest.EmbeddedConsumerHeartbeat
	}
	return 5 * time.Second
}

// skipOnConsumerProtocol skips a test of what only the classic protocol
// has (Sarama's assignors, its session timeouts, transactions), when the
// suite runs on the consumer protocol.
func skipOnConsumerProtocol(t *testing.T, why string) {
	t.Helper()
	if envGroupProtocol == safeack.GroupProtocolConsumer {
		t.Skip("classic group protocol only: " + why)
	}
}

// protocolConfig is testSubscriberConfig on group protocol p. On the
// consumer protocol the coordinator sets the session timeout and the
// heartbeat (the embedded broker's are short: see kafkatest.Start) and
// assigns, so Sarama's settings of them are left at their defaults, as
// NewSubscriber requires.
func protocolConfig(c *kafkatest.Cluster, group string, p safeack.GroupProtocol, mod func(*safeack.SubscriberConfig)) safeack.SubscriberConfig {
	cfg := classicTestConfig(c, group)
	if group != "" {
		cfg.GroupProtocol = p
	}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.GroupProtocol == safeack.GroupProtocolConsumer {
		if cfg.ConsumerGroup == "" {
			cfg.GroupProtocol = safeack.GroupProtocolClassic
		} else {
			// A test's Sarama balance strategy (eager or cooperative)
			// gives way to the coordinator's assignor: on the consumer
			// protocol every rebalance is incremental.
			def := sarama.NewConfig().Consumer.Group
			g := &cfg.OverwriteSaramaConfig.Consumer.Group
			g.Session.Timeout, g.Heartbeat.Interval = def.Session.Timeout, def.Heartbeat.Interval
			g.Rebalance.GroupStrategies, g.Rebalance.Strategy = def.Rebalance.GroupStrategies, nil
		}
	}
	return cfg
}

// newProtocolSubscriber is newTestSubscriber on group protocol p.
func newProtocolSubscriber(t *testing.T, c *kafkatest.Cluster, group string, p safeack.GroupProtocol, mod func(*safeack.SubscriberConfig)) *safeack.Subscriber {
	t.Helper()
	cfg := protocolConfig(c, group, p, mod)
	if cfg.GroupProtocol == safeack.GroupProtocolConsumer {
		requireConsumerProtocol(t)
	}
	sub, err := safeack.NewSubscriber(cfg, keptLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func classicTestConfig(c *kafkatest.Cluster, group string) safeack.SubscriberConfig {
	sc := c.SaramaConfig()
	sc.Consumer.Return.Errors = true
	// Notice rebalances quickly.
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cfg := safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
		DrainTimeout:          time.Second,
		CommitInterval:        50 * time.Millisecond,
	}
	return cfg
}

// startWatched starts a broker with a topic of the given partitions and a
// group, and a commit watch of that group checked against acks.
func startWatched(t *testing.T, partitions int) (c *kafkatest.Cluster, topic, group string, acks *ackLog, watch *commitWatch) {
	t.Helper()
	c, topic, group = kafkatest.StartTopic(t, partitions)
	acks, watch = watchCommits(t, c, group, topic)
	return c, topic, group, acks, watch
}

// watchCommits returns a new ack log and a commit watch of group on topic
// checked against it.
func watchCommits(t *testing.T, c *kafkatest.Cluster, group, topic string) (*ackLog, *commitWatch) {
	t.Helper()
	acks := newAckLog()
	return acks, newCommitWatch(t, c, group, topic, acks)
}

// offsetCounts counts the deliveries of each offset of a partition.
type offsetCounts struct {
	mu   sync.Mutex
	seen map[int64]int
}

// countAndAck handles every message of msgs as a Watermill router does
// (handleAll), counting its offset and acking it.
func countAndAck(msgs <-chan *message.Message) *offsetCounts {
	oc := &offsetCounts{seen: map[int64]int{}}
	handleAll(msgs, func(m *message.Message) {
		off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		oc.mu.Lock()
		oc.seen[off]++
		oc.mu.Unlock()
		m.Ack()
	})
	return oc
}

// snapshot returns a copy of the counts so far.
func (oc *offsetCounts) snapshot() map[int64]int {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return maps.Clone(oc.seen)
}

// waitCompleted waits until the subscriber's stats show n completed
// records of the partition of topic.
func waitCompleted(t *testing.T, s *safeack.Subscriber, topic string, partition int32, n uint64, timeout time.Duration, what string) {
	t.Helper()
	kafkatest.WaitFor(t, timeout, what, func() bool {
		st, ok := statsOf(s, topic, partition)
		return ok && st.Completed == n
	})
}

// receive returns the next value of ch, failing the test with fatal when
// none comes within timeout.
func receive[T any](t *testing.T, ch <-chan T, timeout time.Duration, fatal string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatal(fatal)
		panic("unreachable")
	}
}

// startTxnRig is the preamble of the exactly-once end-to-end tests: a
// broker (started with opts), a txnRig of records inputs over partitions,
// and a read_committed reader of its output topic.
func startTxnRig(t *testing.T, partitions, records int, opts ...kafkatest.Option) (*kafkatest.Cluster, *txnRig, *outputReader) {
	t.Helper()
	skipOnConsumerProtocol(t, "transactions")
	c := kafkatest.Start(t, opts...)
	r := newTxnRig(t, c, partitions, records)
	return c, r, readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
}

// errorsTo is handler middleware that sends a handler's error to errs
// when errs has room (a full errs drops it: the record is handled again).
func errorsTo(errs chan<- error) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			return out, err
		}
	}
}

// handleAll runs handler in its own goroutine for every message of msgs,
// as a Watermill router does. The returned channel closes once msgs closed.
func handleAll(msgs <-chan *message.Message, handler func(*message.Message)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			go handler(m)
		}
	}()
	return done
}

// randomDelay simulates handler work of up to max.
func randomDelay(max time.Duration) {
	if max <= 0 {
		return
	}
	time.Sleep(rand.N(max + 1))
}

// producedByPartition returns the produced offsets of topic per partition,
// ascending.
func producedByPartition(c *kafkatest.Cluster, topic string) map[int32][]int64 {
	out := make(map[int32][]int64)
	for _, p := range c.ProducedRecords(topic) {
		out[p.Partition] = append(out[p.Partition], p.Offset)
	}
	for _, offs := range out {
		slices.Sort(offs)
	}
	return out
}

// commitWatch checks invariant 1 — no commit passes a record that has not
// been acked (counted acks only) — at the broker: on the embedded broker
// against every observed OffsetCommit request, on a real cluster by polling
// the committed offsets and checking them against the acks seen before the
// read.
type commitWatch struct {
	c     *kafkatest.Cluster
	log   *kafkatest.CommitLog // nil on a real cluster
	group string
	topic string
	acks  *ackLog
	polls int
	// floor holds, per partition, the offset its group started at when
	// that is not where its log starts (OffsetNewest on a topic with
	// history): a commit below it makes the next owner re-handle history.
	floor map[int32]int64
	// records, when set, lists the topic's records per partition in
	// place of the ones produced through the harness (for records
	// published by other producers).
	records func() map[int32][]int64
}

func (w *commitWatch) recordsByPartition() map[int32][]int64 {
	if w.records != nil {
		return w.records()
	}
	return producedByPartition(w.c, w.topic)
}

// newCommitWatch must run before the consumers start, so that every commit
// is observed.
func newCommitWatch(t *testing.T, c *kafkatest.Cluster, group, topic string, acks *ackLog) *commitWatch {
	t.Helper()
	return &commitWatch{c: c, log: c.ObserveCommits(t), group: group, topic: topic, acks: acks, floor: make(map[int32]int64)}
}

// violation checks one commit of offsets at time at.
func (w *commitWatch) violation(byPart map[int32][]int64, partition int32, committed int64, at time.Time) error {
	if floor := w.floor[partition]; committed < floor {
		return fmt.Errorf("partition %d committed %d, below where the group started (%d)", partition, committed, floor)
	}
	for _, off := range byPart[partition] {
		if off >= committed {
			break
		}
		k := po{partition, off}
		ackAt, ok := w.acks.first(k)
		if !ok {
			return fmt.Errorf("partition %d committed %d but record %v was never acked", partition, committed, k)
		}
		if !ackAt.Before(at) {
			return fmt.Errorf("partition %d committed %d at %v but record %v was first acked %v later",
				partition, committed, at.Format("15:04:05.000000"), k, ackAt.Sub(at))
		}
	}
	return nil
}

// poll is the real-cluster fallback: read the committed offsets and check
// them against the acks recorded before the read. A no-op on the embedded
// broker, where check sees every request.
func (w *commitWatch) poll(t *testing.T) map[int32]kafkatest.CommittedOffset {
	t.Helper()
	if w.log != nil {
		return nil
	}
	co := w.c.CommittedOffsets(t, w.group, w.topic)
	at := time.Now()
	byPart := w.recordsByPartition()
	violations := func() []error {
		var errs []error
		for p, c := range co {
			if c.Offset < 0 {
				continue
			}
			if err := w.violation(byPart, p, c.Offset, at); err != nil {
				errs = append(errs, err)
			}
		}
		return errs
	}
	// An ack is recorded before the handler acks, but one reported by a
	// child process may still be in its stdout pipe when this read sees the
	// commit it allowed: give the reporting a moment to catch up. A record
	// never acked, or first acked after the read, still fails.
	errs := violations()
	if len(errs) > 0 && waitCond(ackReportSlack, func() bool { return len(violations()) == 0 }) {
		errs = nil
	}
	for _, err := range errs {
		t.Errorf("polled commit of group %s: %v", w.group, err)
	}
	w.polls++
	return co
}

// ackReportSlack bounds how long a polled commit waits for the acks it
// covers to be reported (see poll).
const ackReportSlack = 2 * time.Second

// check runs the invariant over every commit observed so far and returns
// how many commits of the group touched the topic.
func (w *commitWatch) check(t *testing.T) int {
	t.Helper()
	if w.log == nil {
		w.poll(t)
		return w.polls
	}
	byPart := w.recordsByPartition()
	n := 0
	w.log.CheckUntil(t, time.Now(), func(o kafkatest.ObservedCommit) error {
		if o.Group != w.group {
			return nil
		}
		touched := false
		for tp, co := range o.Offsets {
			if tp.Topic != w.topic {
				continue
			}
			touched = true
			if err := w.violation(byPart, tp.Partition, co.Offset, o.At); err != nil {
				return err
			}
		}
		if touched {
			n++
		}
		return nil
	})
	return n
}

// committed returns the group's committed offsets on the topic, read from
// the broker.
func (w *commitWatch) committed(t *testing.T) map[int32]int64 {
	t.Helper()
	out := make(map[int32]int64)
	for p, co := range w.c.CommittedOffsets(t, w.group, w.topic) {
		out[p] = co.Offset
	}
	return out
}

// waitCommitted waits until the group's commit on every partition in want
// reaches at least that offset (observed requests on the embedded broker,
// polled offsets elsewhere, checking invariant 1 on every poll).
func (w *commitWatch) waitCommitted(t *testing.T, want map[int32]int64, timeout time.Duration) {
	t.Helper()
	if w.log != nil {
		w.log.WaitForOffsets(t, timeout, w.group, w.topic, want)
		return
	}
	kafkatest.WaitFor(t, timeout, fmt.Sprintf("group %s to commit %v on %s", w.group, want, w.topic), func() bool {
		co := w.poll(t)
		for p, off := range want {
			if co[p].Offset < off {
				return false
			}
		}
		return true
	})
}

// statsOf returns the Stats entry of topic/partition, if the subscriber
// owns it.
func statsOf(s *safeack.Subscriber, topic string, partition int32) (safeack.PartitionStats, bool) {
	for _, ps := range s.Stats() {
		if ps.Topic == topic && ps.Partition == partition {
			return ps, true
		}
	}
	return safeack.PartitionStats{}, false
}

// ownedPartitions returns the partitions of topic in the subscriber's Stats.
func ownedPartitions(s *safeack.Subscriber, topic string) map[int32]safeack.PartitionStats {
	out := make(map[int32]safeack.PartitionStats)
	for _, ps := range s.Stats() {
		if ps.Topic == topic {
			out[ps.Partition] = ps
		}
	}
	return out
}

// defaultsOn returns the Sarama config a test of the defaults gives: nil
// (the defaults) on a plaintext cluster; on a secured one, which the
// defaults cannot reach, def() with the harness's TLS and login and
// nothing else changed.
func defaultsOn(c *kafkatest.Cluster, def func() *sarama.Config) *sarama.Config {
	if !c.Secured() {
		return nil
	}
	return c.Secure(def())
}

// mustSubscribe subscribes with a context cancelled at the end of the test.
func mustSubscribe(t *testing.T, s *safeack.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := s.Subscribe(ctx, topic)
	require.NoError(t, err)
	return msgs
}

// inFlightMeter tracks how many handlers run at once.
type inFlightMeter struct {
	mu       sync.Mutex
	cur, top int
}

func (m *inFlightMeter) enter() {
	m.mu.Lock()
	m.cur++
	m.top = max(m.top, m.cur)
	m.mu.Unlock()
}

func (m *inFlightMeter) leave() {
	m.mu.Lock()
	m.cur--
	m.mu.Unlock()
}

func (m *inFlightMeter) max() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.top
}

// addAt records a counted ack of k at time at, for acks made elsewhere
// (another process).
func (l *ackLog) addAt(k po, at time.Time) {
	l.mu.Lock()
	l.acks[k] = append(l.acks[k], at)
	l.mu.Unlock()
}

// startAfterHistory prepares a test of a group at initial on topic: at
// OffsetNewest it produces perPartition records to every partition that no
// member may handle (they precede the group), removes them from the
// harness's accounting, and sets watch's floors past them. It returns the
// offset the group starts at on every partition.
func startAfterHistory(t *testing.T, c *kafkatest.Cluster, watch *commitWatch, topic string, partitions int, initial int64, perPartition int) int64 {
	t.Helper()
	if initial != sarama.OffsetNewest {
		return 0
	}
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	for p := int32(0); p < int32(partitions); p++ {
		c.ForgetProduced(topic, p, int64(perPartition))
		watch.floor[p] = int64(perPartition)
	}
	return int64(perPartition)
}

// initialName names a Consumer.Offsets.Initial value in test names.
func initialName(initial int64) string {
	if initial == sarama.OffsetNewest {
		return "newest"
	}
	return "oldest"
}

// recordAcks is an outermost router middleware that records, just before
// the router acks, the records whose handler chain returned nil. A message
// whose context already ended (its assignment was revoked or closed) is
// recorded as a late ack, which the commit check never credits.
func recordAcks(acks *ackLog) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				return out, err
			}
			k, ok := msgPO(m)
			acks.mu.Lock()
			switch {
			case !ok:
				acks.bad = append(acks.bad, m.UUID)
			case m.Context().Err() != nil:
				acks.late[k] = append(acks.late[k], time.Now())
			default:
				acks.acks[k] = append(acks.acks[k], time.Now())
			}
			acks.mu.Unlock()
			return out, err
		}
	}
}
