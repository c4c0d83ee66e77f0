//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
// started again at the end (it truncates its log and follows).

const (
	uncleanLeader   int32 = 1
	uncleanFollower int32 = 2
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

// uncleanMember subscribes a member of group to topic; it acks every
// record but those skip names, recording each handling.
func uncleanMember(t *testing.T, c *kafkatest.Cluster, group, topic string, skip func(int64) bool) (*safeack.Subscriber, *handlings) {
	t.Helper()
	cfg := c.SaramaConfig()
	cfg.ClientID = "chaos-unclean"
	// The partition is offline for a while: the member waits it out.
	cfg.Net.ReadTimeout = 15 * time.Second
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: cfg,
		ConsumerGroup:         group,
		Ordering:              safeack.Unordered,
		DrainTimeout:          time.Second,
		CommitInterval:        200 * time.Millisecond,
	}, errorLines{t: t, mu: &sync.Mutex{}, done: new(bool)}.cleanup())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
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
				if skip == nil || !skip(off) {
					m.Ack()
				}
			}(m)
		}
	}()
	return sub, h
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

// errorLines logs the Error lines of a member in the test's log (until the
// test ends): the truncations it found, and how.
type errorLines struct {
	watermill.NopLogger
	t    *testing.T
	mu   *sync.Mutex
	done *bool
}

func (l errorLines) cleanup() errorLines {
	l.t.Cleanup(func() {
		l.mu.Lock()
		*l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l errorLines) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !*l.done {
		l.t.Logf("member error: %s: %v %v", msg, err, fields)
	}
}

func (l errorLines) With(watermill.LogFields) watermill.LoggerAdapter { return l }

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
func TestClusterUncleanElection(t *testing.T) {
	k := requireCluster(t)
	c := kafkatest.Start(t)
	topic, group := uncleanTopic(t, k, c), c.NewGroup(t)
	const inSync, leaderOnly, hold = 10, 10, 5
	produceValues(t, c, topic, "old", 0, inSync)
	stopFollower(t, k, topic)
	produceValues(t, c, topic, "old", inSync, leaderOnly)

	// A member completes every record but hold: commit hold, tail above.
	a, _ := uncleanMember(t, c, group, topic, func(off int64) bool { return off == hold })
	held := waitGroupCommit(t, c, group, topic, "the completed tail committed", func(co kafkatest.CommittedOffset) bool {
		tail, err := frontier.DecodeTail(co.Metadata, co.Offset)
		return co.Offset == hold && err == nil && tail.Contains(inSync+leaderOnly-1)
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("committed %d %q", held.Offset, held.Metadata)

	electStaleFollower(t, k, c, topic)
	electedAt := time.Now()
	offs := produceValues(t, c, topic, "new", 0, leaderOnly)
	if offs[0] != inSync {
		t.Fatalf("the new leader wrote its first record at %d, not at %d: the log was not truncated", offs[0], inSync)
	}

	b, h := uncleanMember(t, c, group, topic, nil)
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
	for off := int64(hold + 1); off < inSync; off++ {
		if h.count(off) > 0 {
			t.Errorf("offset %d, in the completed tail below the divergence, was handled again", off)
		}
	}
	if truncations(b) == 0 {
		t.Error("the truncation was not counted")
	}
	if err := b.Close(); err != nil {
		t.Error(err)
	}
	if err := k.start(uncleanLeader); err != nil {
		t.Fatal(err)
	}
}

// TestClusterUncleanElectionWhileConsuming: a member handles and commits
// every record, also those only the leader has; an unclean election
// truncates the log below its position while it consumes, and the new
// leader is given more new records than it lost. The member handles every
// new record, those at the reused offsets too. Without the check of a new
// epoch while consuming, Sarama fetched on from the member's position and
// the records at the reused offsets were never handled.
func TestClusterUncleanElectionWhileConsuming(t *testing.T) {
	k := requireCluster(t)
	c := kafkatest.Start(t)
	topic, group := uncleanTopic(t, k, c), c.NewGroup(t)
	const inSync, leaderOnly, fresh = 10, 10, 15
	produceValues(t, c, topic, "old", 0, inSync)
	a, h := uncleanMember(t, c, group, topic, nil)
	waitGroupCommit(t, c, group, topic, "the in-sync records committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync
	})
	stopFollower(t, k, topic)
	produceValues(t, c, topic, "old", inSync, leaderOnly)
	waitGroupCommit(t, c, group, topic, "the leader's records committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync+leaderOnly
	})

	electStaleFollower(t, k, c, topic)
	electedAt := time.Now()
	offs := produceValues(t, c, topic, "new", 0, fresh)
	if offs[0] != inSync {
		t.Fatalf("the new leader wrote its first record at %d, not at %d: the log was not truncated", offs[0], inSync)
	}
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
	waitGroupCommit(t, c, group, topic, "every new record committed", func(co kafkatest.CommittedOffset) bool {
		return co.Offset == inSync+fresh
	})
	if truncations(a) == 0 {
		t.Error("the truncation was not counted")
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	if err := k.start(uncleanLeader); err != nil {
		t.Fatal(err)
	}
}
