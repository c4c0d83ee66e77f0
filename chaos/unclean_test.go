//go:build chaos

package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// The unclean-election scenarios truncate a partition's log for real: a
// one-partition topic replicated on two nodes only (the third keeps the
// KRaft quorum), min.insync.replicas 1 and unclean.leader.election.enable
// true. The follower is stopped, records are written to the leader alone,
// the leader is SIGKILLed and the stale follower started again: it is
// elected uncleanly, its log ends before the records only the old leader
// had, and records produced then take their offsets. The old leader is
// started again at the end (it truncates its log and follows). Each
// scenario runs at least once (members ack) and exactly once (members
// write their outputs through a TxnPublisher); see uncleanRun.

const (
	uncleanLeader   int32 = 1
	uncleanFollower int32 = 2
	// uncleanBystander is the node the scenarios never stop. The group's
	// coordinator and the members' transaction coordinators are placed on
	// it (see placeOn): a coordinator on the killed leader would end the
	// member's session, and the next session's start would find the
	// truncation before the check while consuming could.
	uncleanBystander int32 = 3
)

// uncleanTopic creates the scenario's topic (see above) with its replicas
// on uncleanLeader (preferred, so leading) and uncleanFollower, and waits
// until the leader answers for it with both replicas in sync.
func uncleanTopic(t *testing.T, k *clusterCtl, c *kafkatest.Cluster) string {
	t.Helper()
	topic := fmt.Sprintf("unclean-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
	one, yes := "1", "true"
	err := c.Admin(t).CreateTopic(topic, &sarama.TopicDetail{
		NumPartitions:     -1,
		ReplicationFactor: -1,
		ReplicaAssignment: map[int32][]int32{0: {uncleanLeader, uncleanFollower}},
		ConfigEntries: map[string]*string{
			"min.insync.replicas":            &one,
			"unclean.leader.election.enable": &yes,
		},
	}, false)
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	if err := k.waitLeadership(topic, uncleanLeader, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	return topic
}

// coordinatorPartition is the partition of its coordinator's topic
// (__consumer_offsets, __transaction_state) Kafka places a group or a
// transactional id on: Utils.abs(id.hashCode()) % partitions, the hash
// being Java's String.hashCode.
func coordinatorPartition(id string, partitions int) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(id)) {
		h = 31*h + int32(u)
	}
	switch {
	case h == math.MinInt32:
		h = 0
	case h < 0:
		h = -h
	}
	return h % int32(partitions)
}

// placeOn returns the first of name(0), name(1), ... whose partition of
// internal (see coordinatorPartition) has node as its preferred replica,
// so that no preferred-leader election moves it, and makes node its
// leader (a preferred election) if it is not: node coordinates that
// group or transactional id. coordinator asks the cluster which node
// does (and so creates internal when it does not exist yet); its answer
// is checked.
func (k *clusterCtl) placeOn(t *testing.T, admin sarama.ClusterAdmin, node int32, internal string, name func(i int) string, coordinator func(id string) (int32, error)) string {
	t.Helper()
	var err error
	if !waitCond(time.Minute, func() bool {
		_, err = coordinator(name(0))
		return err == nil
	}) {
		t.Fatalf("the coordinator of %s: %v", name(0), err)
	}
	if err := k.client.RefreshMetadata(internal); err != nil {
		t.Fatalf("metadata of %s: %v", internal, err)
	}
	ps, err := k.client.Partitions(internal)
	if err != nil || len(ps) == 0 {
		t.Fatalf("partitions of %s: %v %v", internal, ps, err)
	}
	for i := range 1000 {
		id := name(i)
		p := coordinatorPartition(id, len(ps))
		if replicas, err := k.client.Replicas(internal, p); err != nil || len(replicas) == 0 || replicas[0] != node {
			continue
		}
		if !waitCond(time.Minute, func() bool {
			if b, err := k.client.Leader(internal, p); err == nil && b.ID() == node {
				return true
			}
			_, _ = admin.ElectLeaders(sarama.PreferredElection, map[string][]int32{internal: {p}}) // node may lead already
			_ = k.client.RefreshMetadata(internal)
			return false
		}) {
			t.Fatalf("%s/%d: node %d, its preferred replica, does not lead it", internal, p, node)
		}
		if !waitCond(time.Minute, func() bool {
			c, err := coordinator(id)
			return err == nil && c == node
		}) {
			c, err := coordinator(id)
			t.Fatalf("%s: coordinated by node %d (%v), not by node %d, which leads %s/%d", id, c, err, node, internal, p)
		}
		return id
	}
	t.Fatalf("no name placed on node %d's partitions of %s", node, internal)
	return ""
}

// groupCoordinator and txnCoordinator are coordinator functions of
// placeOn.
func (k *clusterCtl) groupCoordinator(group string) (int32, error) { return k.coordinator(group) }

func (k *clusterCtl) txnCoordinator(id string) (int32, error) {
	if err := k.client.RefreshTransactionCoordinator(id); err != nil {
		return 0, err
	}
	b, err := k.client.TransactionCoordinator(id)
	if err != nil {
		return 0, err
	}
	return b.ID(), nil
}

// waitLeadership waits until node leads partition 0 of topic with isr
// replicas in sync (0: any), and answers a ListOffsets for it.
func (k *clusterCtl) waitLeadership(topic string, node int32, isr int, timeout time.Duration) error {
	var why string
	if waitCond(timeout, func() bool {
		if err := k.client.RefreshMetadata(topic); err != nil {
			why = err.Error()
			return false
		}
		b, err := k.client.Leader(topic, 0)
		if err != nil {
			why = err.Error()
			return false
		}
		if b.ID() != node {
			why = fmt.Sprintf("led by node %d", b.ID())
			return false
		}
		in, err := k.client.InSyncReplicas(topic, 0)
		if err != nil || isr > 0 && len(in) != isr {
			why = fmt.Sprintf("in-sync replicas %v (%v)", in, err)
			return false
		}
		if _, err := k.client.GetOffset(topic, 0, sarama.OffsetNewest); err != nil {
			why = "ListOffsets: " + err.Error()
			return false
		}
		return true
	}) {
		return nil
	}
	return fmt.Errorf("%s/0: node %d does not lead it with %d replicas in sync within %v: %s", topic, node, isr, timeout, why)
}

// produceValues produces one record per value to partition 0 and returns
// their offsets.
func produceValues(t *testing.T, c *kafkatest.Cluster, topic, prefix string, from, n int) []int64 {
	t.Helper()
	recs := make([]kafkatest.Record, n)
	for i := range recs {
		recs[i] = kafkatest.Record{Partition: 0, Value: fmt.Appendf(nil, "%s-%d", prefix, from+i)}
	}
	var offs []int64
	for _, p := range c.Produce(t, topic, recs...) {
		offs = append(offs, p.Offset)
	}
	return offs
}

// electStaleFollower takes the partition's log back: the follower (down)
// has the first records only, the leader the others too. The leader is
// SIGKILLed, the follower started again and elected uncleanly (asked for
// with an unclean ElectLeaders when the controller does not do it on its
// own within 10 s).
func electStaleFollower(t *testing.T, k *clusterCtl, c *kafkatest.Cluster, topic string) {
	t.Helper()
	n, err := k.node(uncleanLeader)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.signal(n, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := k.waitState(uncleanLeader, "down", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d (the leader) SIGKILLed; starting node %d, the stale follower", uncleanLeader, uncleanFollower)
	if err := k.start(uncleanFollower); err != nil {
		t.Fatal(err)
	}
	if k.waitLeadership(topic, uncleanFollower, 0, 10*time.Second) != nil {
		t.Logf("node %d not elected within 10 s; asking for an unclean election", uncleanFollower)
		if _, err := c.Admin(t).ElectLeaders(sarama.UncleanElection, map[string][]int32{topic: {0}}); err != nil {
			t.Logf("unclean ElectLeaders: %v", err)
		}
	}
	if err := k.waitLeadership(topic, uncleanFollower, 0, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d leads %s/0 after an unclean election", uncleanFollower, topic)
}

// stopFollower stops the follower (controlled shutdown: it leaves the ISR
// at once) and waits until the leader leads alone.
func stopFollower(t *testing.T, k *clusterCtl, topic string) {
	t.Helper()
	if err := k.stop(uncleanFollower); err != nil {
		t.Fatal(err)
	}
	if err := k.waitLeadership(topic, uncleanLeader, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// handlings records each handling of partition 0: the record's value, by
// offset, and when.
type handlings struct {
	mu   sync.Mutex
	seen map[int64][]handling
}

type handling struct {
	value string
	at    time.Time
}

// valueAfter reports whether offset was handled with value after since.
func (h *handlings) valueAfter(offset int64, value string, since time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.seen[offset] {
		if s.value == value && s.at.After(since) {
			return true
		}
	}
	return false
}

func (h *handlings) count(offset int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen[offset])
}

func (h *handlings) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for off := int64(0); off < 64; off++ {
		for _, s := range h.seen[off] {
			fmt.Fprintf(&b, "%d:%s ", off, s.value)
		}
	}
	return b.String()
}

// uncleanRun is one unclean-election scenario: the cluster, the topic
// whose partition 0 the election truncates, the group, and how its members
// consume. At least once, a member acks each record it handles; exactly
// once (out is set), it is a consume-transform-produce member
// (safeack.NewTxnSubscriber, as in docs/exactly-once.md) that writes one
// output per record to out through its TxnPublisher before it acks.
type uncleanRun struct {
	t            *testing.T
	k            *clusterCtl
	c            *kafkatest.Cluster
	topic, group string
	out          string // exactly once: the output topic (one partition); "" at least once
	cooperative  bool   // members balance cooperative-sticky; eager (Sarama's default) otherwise
	members      int    // members started, for their transactional ids
	errors       *errorLines
	gate         *fetchGate // when set, members fetch through it
}

// newUncleanRun needs the cluster (see requireCluster), creates the
// scenario's topic (see uncleanTopic), a group and, exactly once, the
// output topic (the cluster's defaults: three replicas, two in sync, so
// that its outputs survive the nodes the scenario stops). The group's
// coordinator is uncleanBystander.
func newUncleanRun(t *testing.T, exactlyOnce bool) *uncleanRun {
	t.Helper()
	if exactlyOnce {
		skipOnConsumerProtocol(t, "transactions are classic only (docs/group-protocols.md)")
	}
	k := requireCluster(t)
	c := kafkatest.Start(t)
	if protocol == safeack.GroupProtocolConsumer {
		requireConsumerProtocol(t, c)
	}
	r := &uncleanRun{t: t, k: k, c: c, topic: uncleanTopic(t, k, c), errors: newErrorLines(t)}
	base := c.NewGroup(t)
	r.group = k.placeOn(t, c.Admin(t), uncleanBystander, "__consumer_offsets",
		func(i int) string { return fmt.Sprintf("%s-%d", base, i) }, k.groupCoordinator)
	if protocol == safeack.GroupProtocolConsumer {
		shortenConsumerSessions(t, c, r.group, kafkatest.RealSessionTimeout)
	}
	if exactlyOnce {
		r.out = c.NewTopic(t, 1)
	}
	return r
}

// produce produces one record per value to partition 0 (see
// produceValues).
func (r *uncleanRun) produce(prefix string, from, n int) []int64 {
	r.t.Helper()
	return produceValues(r.t, r.c, r.topic, prefix, from, n)
}

// elect truncates the log by an unclean election (see electStaleFollower)
// and has the new leader write n records "new-0".. at the reused offsets
// from diverged: it returns when it was elected and their offsets.
func (r *uncleanRun) elect(diverged int64, n int) (time.Time, []int64) {
	r.t.Helper()
	electStaleFollower(r.t, r.k, r.c, r.topic)
	electedAt := time.Now()
	offs := r.produce("new", 0, n)
	if offs[0] != diverged {
		r.t.Fatalf("the new leader wrote its first record at %d, not at %d: the log was not truncated", offs[0], diverged)
	}
	return electedAt, offs
}

// member subscribes a member of the group to the topic; it handles every
// record but those skip names (never acked), recording each handling.
func (r *uncleanRun) member(skip func(int64) bool) (*safeack.Subscriber, *handlings) {
	t := r.t
	t.Helper()
	r.members++
	cfg := r.c.SaramaConfig()
	cfg.ClientID = "chaos-unclean"
	// The partition is offline for a while: the member waits it out.
	cfg.Net.ReadTimeout = 15 * time.Second
	if r.gate != nil {
		r.gate.install(cfg)
	}
	if r.cooperative {
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	if protocol == safeack.GroupProtocolConsumer {
		leaveToCoordinator(cfg)
	}
	config := safeack.SubscriberConfig{
		GroupProtocol:         protocol,
		Brokers:               r.c.Brokers(),
		OverwriteSaramaConfig: cfg,
		ConsumerGroup:         r.group,
		Ordering:              safeack.Unordered,
		DrainTimeout:          time.Second,
		CommitInterval:        200 * time.Millisecond,
	}
	logger := r.errors
	var sub *safeack.Subscriber
	var pub *safeack.TxnPublisher
	var err error
	if r.out == "" {
		sub, err = safeack.NewSubscriber(config, logger)
	} else {
		// The producer's transactional id is TransactionalID-topic:
		// its coordinator is uncleanBystander too.
		producerID := r.k.placeOn(t, r.c.Admin(t), uncleanBystander, "__transaction_state",
			func(i int) string { return fmt.Sprintf("%s-m%d-%d-%s", r.group, r.members, i, r.topic) }, r.k.txnCoordinator)
		sub, pub, err = safeack.NewTxnSubscriber(config, safeack.TxnConfig{
			TransactionalID: strings.TrimSuffix(producerID, "-"+r.topic),
			CommitInterval:  200 * time.Millisecond,
		}, logger)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	if r.gate != nil {
		t.Cleanup(r.gate.open) // before the Close above
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, r.topic)
	if err != nil {
		t.Fatal(err)
	}
	h := &handlings{seen: map[int64][]handling{}}
	go func() {
		for m := range msgs {
			go func(m *message.Message) {
				off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
				h.mu.Lock()
				h.seen[off] = append(h.seen[off], handling{value: string(m.Payload), at: time.Now()})
				h.mu.Unlock()
				if skip != nil && skip(off) {
					return
				}
				if pub != nil {
					out := message.NewMessage(watermill.NewUUID(), m.Payload)
					out.Metadata.Set(txnIDHeader, fmt.Sprintf("0@%d", off))
					out.SetContext(m.Context()) // files it under m's delivery
					if err := pub.Publish(r.out, out); err != nil {
						logger.Error("publishing an output", err, watermill.LogFields{"offset": off})
						m.Nack()
						return
					}
				}
				m.Ack()
			}(m)
		}
	}()
	return sub, h
}

// fetchGate holds the Fetch requests a member writes to one node until it
// is opened; every other request passes. It stands for a busy partition,
// whose new leader has written past a member's position by the time the
// member's first fetch reaches it. Without it, that fetch (from a log that
// ends below the position) is out of range, which ends the claim: the next
// session's start check finds the truncation, and the check while
// consuming never has to. The members' transactional producers and
// leader-epoch checks dial through it too; they send no Fetch.
type fetchGate struct {
	addr   string // the node's
	opened chan struct{}
	once   sync.Once
}

func newFetchGate(addr string) *fetchGate {
	return &fetchGate{addr: addr, opened: make(chan struct{})}
}

func (g *fetchGate) open() { g.once.Do(func() { close(g.opened) }) }

// install has cfg's client dial through the gate, with cfg's dial timeout
// and keep-alive (Sarama applies them only to its own dialer).
func (g *fetchGate) install(cfg *sarama.Config) {
	cfg.Net.Proxy.Enable = true
	cfg.Net.Proxy.Dialer = &gateDialer{d: net.Dialer{Timeout: cfg.Net.DialTimeout, KeepAlive: cfg.Net.KeepAlive}, gate: g}
}

type gateDialer struct {
	d    net.Dialer
	gate *fetchGate
}

func (d *gateDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.d.Dial(network, addr)
	if err != nil || addr != d.gate.addr {
		return c, err
	}
	return &gatedConn{Conn: c, gate: d.gate}, nil
}

type gatedConn struct {
	net.Conn
	gate *fetchGate
}

// Write holds a Fetch request until the gate opens. Sarama writes each
// request with one Write: size, then the header's API key.
func (c *gatedConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && int16(binary.BigEndian.Uint16(b[4:])) == kmsg.Fetch.Int16() {
		<-c.gate.opened
	}
	return c.Conn.Write(b)
}

// requireOutputs checks, exactly once, what a read_committed reader of
// the output topic sees, the log now holding the old leader's records
// "old-0".. below diverged and the new leader's "new-0".. from there to
// end: exactly one output of each record the log holds, and at most one
// more at each offset from diverged to removedEnd, with the value of the
// old leader's record the truncation removed there. Those are outputs a
// transaction committed before the truncation was found (the member had
// handled those records, and its position covered them): a committed
// transaction cannot be undone, so they stay; they are counted and
// logged. No other output may show.
func (r *uncleanRun) requireOutputs(diverged, removedEnd, end int64) {
	t := r.t
	t.Helper()
	seen := map[int64]map[string]int{} // by input offset, by value
	var foreign []string
	readCommittedOutputs(t, r.c, r.out, 1, func(m *sarama.ConsumerMessage) {
		var off int64
		if _, err := fmt.Sscanf(headerValue(m, txnIDHeader), "0@%d", &off); err != nil {
			foreign = append(foreign, fmt.Sprintf("%q (header %q)", m.Value, headerValue(m, txnIDHeader)))
			return
		}
		if seen[off] == nil {
			seen[off] = map[string]int{}
		}
		seen[off][string(m.Value)]++
	})
	kept := 0
	for off := int64(0); off < max(end, removedEnd); off++ {
		byValue := seen[off]
		delete(seen, off)
		if off < end {
			want := fmt.Sprintf("old-%d", off)
			if off >= diverged {
				want = fmt.Sprintf("new-%d", off-diverged)
			}
			if n := byValue[want]; n != 1 {
				t.Errorf("offset %d: %d outputs of %s, the record the log holds there, not 1", off, n, want)
			}
			delete(byValue, want)
		}
		if removed := fmt.Sprintf("old-%d", off); off >= diverged && off < removedEnd && byValue[removed] > 0 {
			if byValue[removed] > 1 {
				t.Errorf("offset %d: %d outputs of %s, the old leader's record the truncation removed, more than 1", off, byValue[removed], removed)
			}
			kept += byValue[removed]
			delete(byValue, removed)
		}
		for v, n := range byValue {
			foreign = append(foreign, fmt.Sprintf("%d×%s at %d", n, v, off))
		}
	}
	for off, byValue := range seen {
		for v, n := range byValue {
			foreign = append(foreign, fmt.Sprintf("%d×%s at %d", n, v, off))
		}
	}
	if len(foreign) > 0 {
		t.Errorf("outputs of no record the log holds or held: %v", foreign)
	}
	t.Logf("read_committed: the outputs of the %d records the log holds checked; %d outputs of records of the old leader the truncation removed (committed before it: they stay)", end, kept)
}

// waitGroupCommit waits until the group holds ok's position for partition 0.
func waitGroupCommit(t *testing.T, c *kafkatest.Cluster, group, topic, what string, ok func(kafkatest.CommittedOffset) bool) kafkatest.CommittedOffset {
	t.Helper()
	var held kafkatest.CommittedOffset
	if !waitCond(time.Minute, func() bool {
		held = c.CommittedOffsets(t, group, topic)[0]
		return ok(held)
	}) {
		t.Fatalf("%s: the group holds %d %q", what, held.Offset, held.Metadata)
	}
	return held
}

// errorLines logs the Error lines of a scenario's members in the test's
// log (until the test ends): the truncations they found, and how. It keeps
// their messages for logged.
type errorLines struct {
	watermill.NopLogger
	t    *testing.T
	mu   sync.Mutex
	done bool
	msgs []string
}

func newErrorLines(t *testing.T) *errorLines {
	l := &errorLines{t: t}
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l *errorLines) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg)
	if !l.done {
		l.t.Logf("member error: %s: %v %v", msg, err, fields)
	}
}

// Info logs the Info lines about leader epochs too: a check that could
// not run, and why.
func (l *errorLines) Info(msg string, fields watermill.LogFields) {
	if !strings.Contains(msg, "leader epoch") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg)
	if !l.done {
		l.t.Logf("member info: %s %v", msg, fields)
	}
}

func (l *errorLines) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// logged reports whether a member logged an Error whose message contains
// part.
func (l *errorLines) logged(part string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

func truncations(sub *safeack.Subscriber) uint64 {
	var n uint64
	for _, tt := range sub.Totals() {
		n += tt.LogTruncations
	}
	return n
}

// TestClusterUncleanElection: a member commits a completed tail; an
// unclean election truncates the log inside it, and the new leader is
// given new records at the reused offsets. A new member handles every
// record the log now holds from the commit on but the tail's entries below
// the divergence: the held record and every new record. Without the
// epoch check it skipped the new records the tail listed.
func TestClusterUncleanElection(t *testing.T) { uncleanElection(t, false) }

// TestClusterTxnUncleanElection is TestClusterUncleanElection in
// transactional mode: consume-transform-produce members whose positions
// and tails are committed in the transactions that carry their outputs.
// A read_committed reader of the outputs sees exactly one output of each
// record the log holds after the election, the new leader's records at
// the reused offsets among them, and the group's commit reaches the new
// log's end. The first member's outputs of the old leader's records that
// the truncation removed were committed with its tail and stay (logged).
func TestClusterTxnUncleanElection(t *testing.T) { uncleanElection(t, true) }

func uncleanElection(t *testing.T, exactlyOnce bool) {
	r := newUncleanRun(t, exactlyOnce)
	const inSync, leaderOnly, hold = 10, 10, 5
	r.produce("old", 0, inSync)
	stopFollower(t, r.k, r.topic)
	r.produce("old", inSync, leaderOnly)

	// A member completes every record but hold: commit hold, tail above.
	a, _ := r.member(func(off int64) bool { return off == hold })
	held := waitGroupCommit(t, r.c, r.group, r.topic, "the completed tail committed", func(co kafkatest.CommittedOffset) bool {
		tail, err := frontier.DecodeTail(co.Metadata, co.Offset)
		return co.Offset == hold && err == nil && tail.Contains(inSync+leaderOnly-1)
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("committed %d %q", held.Offset, held.Metadata)

	electedAt, offs := r.elect(inSync, leaderOnly)
	b, h := r.member(nil)
	if !waitCond(time.Minute, func() bool {
		if !h.valueAfter(hold, fmt.Sprintf("old-%d", hold), electedAt) {
			return false
		}
		for i := range leaderOnly {
			if !h.valueAfter(offs[i], fmt.Sprintf("new-%d", i), electedAt) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the new member did not handle the held record and every record the new leader wrote; handled: %s", h)
	}
	waitGroupCommit(t, r.c, r.group, r.topic, "every record of the new log committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync+leaderOnly
	})
	for off := int64(hold + 1); off < inSync; off++ {
		if h.count(off) > 0 {
			t.Errorf("offset %d, in the completed tail below the divergence, was handled again", off)
		}
	}
	if truncations(b) == 0 {
		t.Error("the truncation was not counted")
	}
	if !r.errors.logged("truncated inside the group's completed tail") {
		t.Error("the new member's start did not find the truncation inside the completed tail")
	}
	if err := b.Close(); err != nil {
		t.Error(err)
	}
	if exactlyOnce {
		r.requireOutputs(inSync, inSync+leaderOnly, inSync+leaderOnly)
	}
	if err := r.k.start(uncleanLeader); err != nil {
		t.Fatal(err)
	}
}

// TestClusterUncleanElectionWhileConsuming: a member handles and commits
// every record, also those only the leader has; an unclean election
// truncates the log below its position while it consumes, and the new
// leader is given more new records than it lost. The member handles every
// new record, those at the reused offsets too, and the check of the new
// epoch while consuming must be what finds the truncation. Without it,
// Sarama fetched on from the member's position (its fetches from the new
// leader are held until that leader has written past it: see fetchGate)
// and the records at the reused offsets were never handled.
func TestClusterUncleanElectionWhileConsuming(t *testing.T) {
	uncleanElectionWhileConsuming(t, false, false)
}

// TestClusterTxnUncleanElectionWhileConsuming is
// TestClusterUncleanElectionWhileConsuming in transactional mode: the
// member's transactions committed the outputs of the old leader's records
// and positions past the divergence before the election. A read_committed
// reader of the outputs sees exactly one output of each record the log
// holds after it, the new leader's records at the reused offsets among
// them, and the group's commit reaches the new log's end. The outputs of
// the old leader's records that the truncation removed stay (logged).
// Eager, then cooperative-sticky balancing (under which the truncation
// ends the member's assignment, and its session, without a rebalance
// having revoked anything); one after the other, each with the cluster to
// itself.
func TestClusterTxnUncleanElectionWhileConsuming(t *testing.T) {
	for _, cooperative := range []bool{false, true} {
		t.Run(kafkatest.RebalanceName(cooperative), func(t *testing.T) {
			uncleanElectionWhileConsuming(t, true, cooperative)
		})
	}
}

func uncleanElectionWhileConsuming(t *testing.T, exactlyOnce, cooperative bool) {
	r := newUncleanRun(t, exactlyOnce)
	r.cooperative = cooperative
	// The member fetches from the new leader only once it has written
	// the new records, past the member's position (see fetchGate).
	follower, err := r.k.node(uncleanFollower)
	if err != nil {
		t.Fatal(err)
	}
	r.gate = newFetchGate(follower.Addr)
	const inSync, leaderOnly, fresh = 10, 10, 15
	r.produce("old", 0, inSync)
	a, h := r.member(nil)
	waitGroupCommit(t, r.c, r.group, r.topic, "the in-sync records committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync
	})
	stopFollower(t, r.k, r.topic)
	r.produce("old", inSync, leaderOnly)
	waitGroupCommit(t, r.c, r.group, r.topic, "the leader's records committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync+leaderOnly
	})

	electedAt, offs := r.elect(inSync, fresh)
	r.gate.open()
	if !waitCond(time.Minute, func() bool {
		for i := range fresh {
			if !h.valueAfter(offs[i], fmt.Sprintf("new-%d", i), electedAt) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the member did not handle every record the new leader wrote; handled: %s", h)
	}
	waitGroupCommit(t, r.c, r.group, r.topic, "every new record committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync+fresh
	})
	if truncations(a) == 0 {
		t.Error("the truncation was not counted")
	}
	// Nothing else ended the member's session (the coordinators are on
	// uncleanBystander), so no next start may have found it first.
	if !r.errors.logged("truncated while it was consumed") {
		t.Error("the truncation was not found while the member consumed")
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	if exactlyOnce {
		r.requireOutputs(inSync, inSync+leaderOnly, inSync+fresh)
	}
	if err := r.k.start(uncleanLeader); err != nil {
		t.Fatal(err)
	}
}
