package safeack_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestGroupProtocolMigration moves a running group from the classic
// protocol to the consumer protocol (KIP-848) member by member while
// records flow, and, in "round trip", back to the classic protocol. Each
// step starts a member of the other protocol, waits for it to take
// partitions, and closes one of the old protocol. Nothing is lost (every
// produced record is acked), no commit passes a record not acked before
// it was sent (each OffsetCommit at the embedded broker; on a real one the
// commits the members report sending and the committed offsets polled),
// the group ends committed at the end of every partition, and the group's
// type at the broker is the one expected at each step.
//
// On a real Kafka (4.0+) the roll is online: the coordinator converts the
// group when the first consumer-protocol member joins and hosts the
// classic members in it (a mixed group), and converts it back when the
// last consumer-protocol member leaves. That needs the broker's
// group.consumer.migration.policy to allow it: "bidirectional" (Kafka 4.x's
// default) for the round trip, "upgrade" or "bidirectional" for the
// upgrade; the test reads the policy, and skips the round trip, saying
// so, where it is not bidirectional.
//
// The embedded broker (kfake) converts a classic group only once it is
// empty, as Kafka does with the migration disabled (where the upgrade runs
// the same way): the consumer-protocol members wait outside the group
// (their joins refused) until the last classic member left, and then take
// every partition. It does not convert a group back at all (its
// skipped_features: "Group downgrade"), so the round trip runs on a real
// Kafka only.
//
// The classic members balance eagerly (Sarama's default), cooperatively,
// or are static: a static member is closed first and replaced by one of
// the other protocol with its instance id.
func TestGroupProtocolMigration(t *testing.T) {
	t.Parallel()
	for _, back := range []bool{false, true} {
		t.Run(map[bool]string{false: "upgrade", true: "round trip"}[back], func(t *testing.T) {
			t.Parallel()
			kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperative bool) {
				runMigration(t, back, cooperative, false)
			})
			// Static members (Consumer.Group.InstanceId), each replaced
			// by one of the other protocol with its instance id, as a
			// rolling restart of a StatefulSet does.
			t.Run("static", func(t *testing.T) {
				t.Parallel()
				runMigration(t, back, false, true)
			})
		})
	}
}

// migrationMembers is how many members the group has through the roll.
const migrationMembers = 3

// migrationMember is one member of the rolled group.
type migrationMember struct {
	name     string
	instance string // Consumer.Group.InstanceId; "": dynamic
	protocol safeack.GroupProtocol
	sub      *safeack.Subscriber
	closed   bool
}

// sentCommits checks the commits the members report sending (the
// Observer's CommitEvent: its Start is when the request left) against the
// acks seen before: what the test sees of the commits on a real broker,
// where the requests cannot be observed.
type sentCommits struct {
	t     *testing.T
	watch *commitWatch
	mu    sync.Mutex
	seen  []safeack.CommitEvent
	by    []string // the member of each of seen
}

// sentBy is the Observer of one member: its commits go to sentCommits
// with its name.
type sentBy struct {
	*sentCommits
	member string
}

func (s sentBy) Delivered(ctx context.Context, _ safeack.Delivery) (context.Context, safeack.DeliveryObserver) {
	return ctx, nil
}

func (s sentBy) Committed(c safeack.CommitEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, c)
	s.by = append(s.by, s.member)
}

// check returns how many commit events touched the topic, failing t for
// each position that passed a record not acked before it was sent.
func (s *sentCommits) check(t *testing.T) int {
	t.Helper()
	s.mu.Lock()
	events := slices.Clone(s.seen)
	s.mu.Unlock()
	byPart := s.watch.recordsByPartition()
	failed := 0
	for _, e := range events {
		for _, p := range e.Partitions {
			if err := s.watch.violation(byPart, p.Partition, p.Offset, e.Start); err != nil {
				failed++
				if failed <= 20 {
					t.Errorf("commit sent at %v (final %v): %v", e.Start.Format("15:04:05.000000"), e.Final, err)
				}
			}
		}
	}
	return len(events)
}

// refused counts the commit events whose commit did not take.
func (s *sentCommits) refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i, e := range s.seen {
		if e.Err != nil {
			n++
			s.t.Logf("commit sent by %s at %v did not take (final %v, %v): %v", s.by[i], e.Start.Format("15:04:05.000000"), e.Final, e.Partitions, e.Err)
		}
	}
	return n
}

// runMigration is one roll of TestGroupProtocolMigration: up, and back
// when back is set.
func runMigration(t *testing.T, back, cooperative, static bool) {
	requireConsumerProtocol(t)
	const partitions = 6
	c, topic, group, acks, watch := startWatched(t, partitions)
	online := false
	if !c.Embedded() {
		// An upgrade the broker does not run online runs as on the
		// embedded broker; the round trip needs both ways online.
		policy := migrationPolicy(t, c)
		online = policy == "upgrade" || policy == "bidirectional"
		if back && policy != "bidirectional" {
			t.Skipf("the broker's group.consumer.migration.policy is %q; moving a running group there and back needs bidirectional (Kafka 4.x's default)", policy)
		}
	} else if back {
		t.Skip("the embedded broker (kfake) does not convert a consumer-protocol group back to a classic one (its skipped_features: \"Group downgrade\"); " +
			"the round trip runs on a real Kafka 4.x (scripts/kafka.sh start; docs/testing.md)")
	}
	sent := &sentCommits{t: t, watch: watch}
	start := time.Now()

	var members []*migrationMember
	names := 0
	join := func(p safeack.GroupProtocol, instance string) *migrationMember {
		names++
		m := &migrationMember{name: fmt.Sprintf("%s-%d", p, names), protocol: p, instance: instance}
		m.sub = newProtocolSubscriber(t, c, group, p, func(cfg *safeack.SubscriberConfig) {
			cfg.MaxInFlight = 16
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 3 * time.Second
			cfg.Observer = sentBy{sent, m.name}
			cfg.OverwriteSaramaConfig.ClientID = m.name
			cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = instance
			if cooperative {
				cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
			}
		})
		handleAll(mustSubscribe(t, m.sub, topic), func(msg *message.Message) {
			randomDelay(6 * time.Millisecond)
			if msg.Context().Err() != nil {
				acks.ackLate(msg) // its assignment ended: changes nothing
				return
			}
			acks.ack(msg)
		})
		members = append(members, m)
		return m
	}
	live := func() []*migrationMember {
		var out []*migrationMember
		for _, m := range members {
			if !m.closed {
				out = append(out, m)
			}
		}
		return out
	}
	// Records keep coming through the whole roll: a few per partition
	// every 20 ms while the test waits.
	lastProduce := time.Time{}
	polled := time.Time{}
	keepProducing := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		ok := waitCond(timeout, func() bool {
			if time.Since(lastProduce) >= 20*time.Millisecond {
				c.ProduceN(t, topic, partitions, partitions, nil)
				lastProduce = time.Now()
			}
			if watch.log == nil && time.Since(polled) >= 250*time.Millisecond {
				watch.poll(t) // a real broker: check the commit as it is now
				polled = time.Now()
			}
			return cond()
		})
		if !ok {
			t.Fatalf("timed out after %v waiting for %s (group type %q; live members own %v)", timeout, what, groupType(t, c, group), owners(live(), topic))
		}
	}
	// ownsAll: the live members own every partition between them, each
	// once, and those in want own at least one each.
	ownsAll := func(want ...*migrationMember) func() bool {
		return func() bool {
			seen := make(map[int32]bool)
			for _, m := range live() {
				owned := ownedPartitions(m.sub, topic)
				if slices.Contains(want, m) && len(owned) == 0 {
					return false
				}
				for p := range owned {
					if seen[p] {
						return false
					}
					seen[p] = true
				}
			}
			return len(seen) == partitions
		}
	}
	const stepTimeout = 45 * time.Second
	// flow lets records flow a while through the group as it is, so that
	// each step's rebalance meets records in flight.
	flow := func(step string) {
		t.Helper()
		until := time.Now().Add(300 * time.Millisecond)
		keepProducing(step+": records to flow", stepTimeout, func() bool { return time.Now().After(until) })
	}
	expectType := func(step, typ string, classic, consumer int) {
		t.Helper()
		var cl, co int
		keepProducing(fmt.Sprintf("%s: the group to be a %s group with %d classic and %d consumer-protocol members", step, typ, classic, consumer), stepTimeout, func() bool {
			var got string
			got, cl, co = describeGroup(t, c, group)
			return got == typ && (typ == "classic" || cl < 0 || (cl == classic && co == consumer))
		})
		t.Logf("%v %s: a %s group (members by type at the broker: %d classic, %d consumer; -1: not told)", time.Since(start).Round(time.Millisecond), step, typ, cl, co)
	}

	for i := range migrationMembers {
		instance := ""
		if static {
			instance = fmt.Sprintf("member-%d", i+1)
		}
		join(safeack.GroupProtocolClassic, instance)
	}
	keepProducing("the classic members to own every partition", stepTimeout, ownsAll(live()...))
	flow("before the roll")
	expectType("before the roll", "classic", migrationMembers, 0)

	// roll replaces each member of protocol from by one of protocol to.
	roll := func(from, to safeack.GroupProtocol, hosted bool) {
		t.Helper()
		for i := range migrationMembers {
			var old *migrationMember
			for _, m := range live() {
				if m.protocol == from {
					old = m
					break
				}
			}
			step := fmt.Sprintf("%s to %s, step %d", from, to, i+1)
			if static {
				// The old member goes first; the new one takes its
				// instance id.
				require.NoError(t, old.sub.Close(), "closing %s", old.name)
				old.closed = true
			}
			joined := join(to, old.instance)
			if hosted {
				// The coordinator takes the new member in at once and
				// moves partitions to it.
				keepProducing(step+": the new member to take partitions", stepTimeout, ownsAll(joined))
				typ := "consumer"
				if countOf(live(), safeack.GroupProtocolConsumer) == 0 {
					// The last consumer-protocol member was replaced
					// (static): the group is classic again at once.
					typ = "classic"
				}
				expectType(step+", joined", typ, countOf(live(), safeack.GroupProtocolClassic), countOf(live(), safeack.GroupProtocolConsumer))
				flow(step)
			}
			if !static {
				require.NoError(t, old.sub.Close(), "closing %s", old.name)
				old.closed = true
			}
			if hosted || i == migrationMembers-1 {
				keepProducing(step+": the live members to own every partition", stepTimeout, ownsAll(live()...))
			} else {
				// The consumer-protocol members wait outside the group
				// until the last classic member left.
				keepProducing(step+": the classic members left to own every partition", stepTimeout, ownsAll(classicOf(live())...))
				expectType(step+", closed", "classic", countOf(live(), safeack.GroupProtocolClassic), 0)
			}
			flow(step)
		}
	}
	roll(safeack.GroupProtocolClassic, safeack.GroupProtocolConsumer, online)
	expectType("after the upgrade", "consumer", 0, migrationMembers)
	if back {
		roll(safeack.GroupProtocolConsumer, safeack.GroupProtocolClassic, true)
		expectType("after the roll back", "classic", migrationMembers, 0)
	}
	rolled := time.Since(start)

	hwm := c.HighWaterMarks(t, topic)
	acks.waitAllAcked(t, c, topic, 30*time.Second)
	watch.waitCommitted(t, hwm, 30*time.Second)
	checked := watch.check(t)
	require.Positive(t, checked, "no commit of the group was checked")
	events := sent.check(t)
	require.Positive(t, events, "no commit was reported sent")
	require.Empty(t, acks.badMessages())

	total, dups := 0, 0
	for _, n := range acks.snapshot() {
		total++
		dups += n - 1
	}
	what := "OffsetCommit requests observed at the broker"
	if watch.log == nil {
		what = "polls of the committed offsets"
	}
	t.Logf("rolled in %v (all acked and committed after %v): %d records produced, %d acked, %d acked more than once; %d %s and %d commits reported sent checked (%d of them did not take)",
		rolled.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), len(c.ProducedRecords(topic)), total, dups, checked, what, events, sent.refused())
}

func countOf(ms []*migrationMember, p safeack.GroupProtocol) int {
	n := 0
	for _, m := range ms {
		if m.protocol == p {
			n++
		}
	}
	return n
}

func classicOf(ms []*migrationMember) []*migrationMember {
	var out []*migrationMember
	for _, m := range ms {
		if m.protocol == safeack.GroupProtocolClassic {
			out = append(out, m)
		}
	}
	return out
}

// owners lists the partitions each member owns, for failure messages.
func owners(ms []*migrationMember, topic string) string {
	var b strings.Builder
	for _, m := range ms {
		ps := make([]int32, 0)
		for p := range ownedPartitions(m.sub, topic) {
			ps = append(ps, p)
		}
		slices.Sort(ps)
		fmt.Fprintf(&b, "%s: %v; ", m.name, ps)
	}
	return b.String()
}

// adminKgo is a kgo client of the cluster for admin requests.
func adminKgo(t *testing.T, c *kafkatest.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// groupType is the type of group at the broker (ListGroups v5+:
// "classic" or "consumer"), "" when the broker does not list it.
func groupType(t *testing.T, c *kafkatest.Cluster, group string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrListGroupsRequest().RequestWith(ctx, adminKgo(t, c))
	require.NoError(t, err)
	for _, g := range resp.Groups {
		if g.Group == group {
			return g.GroupType
		}
	}
	return ""
}

// describeGroup returns the type of group at the broker and, for a
// consumer-protocol group, how many of its members speak the classic
// protocol and how many the consumer one (ConsumerGroupDescribe v1+; -1
// when the broker does not say).
func describeGroup(t *testing.T, c *kafkatest.Cluster, group string) (typ string, classic, consumer int) {
	t.Helper()
	typ = groupType(t, c, group)
	if typ != "consumer" {
		return typ, -1, -1
	}
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, adminKgo(t, c))
	require.NoError(t, err)
	if len(resp.Groups) != 1 || kerr.ErrorForCode(resp.Groups[0].ErrorCode) != nil {
		return typ, -1, -1
	}
	for _, m := range resp.Groups[0].Members {
		switch m.MemberType {
		case 0:
			classic++
		case 1:
			consumer++
		default:
			return typ, -1, -1
		}
	}
	return typ, classic, consumer
}

// migrationPolicy reads the broker's group.consumer.migration.policy.
func migrationPolicy(t *testing.T, c *kafkatest.Cluster) string {
	t.Helper()
	cl := adminKgo(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	require.NoError(t, err)
	require.NotEmpty(t, meta.Brokers)
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeBroker
	res.ResourceName = fmt.Sprint(meta.Brokers[0].NodeID)
	res.ConfigNames = []string{"group.consumer.migration.policy"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, r := range resp.Resources {
		require.NoError(t, kerr.ErrorForCode(r.ErrorCode))
		for _, cfg := range r.Configs {
			if cfg.Name == "group.consumer.migration.policy" && cfg.Value != nil {
				return strings.ToLower(*cfg.Value)
			}
		}
	}
	t.Fatalf("the broker does not report group.consumer.migration.policy")
	return ""
}

// TestConsumerProtocolWaitsForClassicGroup: a consumer-protocol member
// whose group the broker keeps classic while classic members are in it
// (the embedded broker always; Kafka when group.consumer.migration.policy
// is disabled or downgrade) waits outside the group: its Ready says why,
// naming the policy, and the log says it without a fetch error at each of
// franz-go's retries. Once the last classic member left it joins, takes
// every partition from the classic member's commits, and nothing is lost.
func TestConsumerProtocolWaitsForClassicGroup(t *testing.T) {
	t.Parallel()
	requireConsumerProtocol(t)
	const partitions = 3
	c, topic, group, acks, watch := startWatched(t, partitions)
	if !c.Embedded() {
		if p := migrationPolicy(t, c); p == "upgrade" || p == "bidirectional" {
			t.Skipf("the broker's group.consumer.migration.policy is %q: it takes the member into the classic group (TestGroupProtocolMigration); this test needs disabled or downgrade", p)
		}
	}
	classic := newProtocolSubscriber(t, c, group, safeack.GroupProtocolClassic, nil)
	handleAll(mustSubscribe(t, classic, topic), acks.ack)
	c.ProduceN(t, topic, partitions, 30, nil)
	kafkatest.WaitFor(t, 20*time.Second, "the classic member to own every partition", func() bool {
		return len(ownedPartitions(classic, topic)) == partitions
	})

	logs := watermill.NewCaptureLogger()
	member := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
		cfg.GroupProtocol = safeack.GroupProtocolConsumer
	})
	handleAll(mustSubscribe(t, member, topic), acks.ack)
	kafkatest.WaitFor(t, 20*time.Second, "the consumer-protocol member's Ready to say why it waits", func() bool {
		err := member.Ready()
		return err != nil && strings.Contains(err.Error(), "group.consumer.migration.policy")
	})
	require.Empty(t, ownedPartitions(member, topic), "the refused member owns partitions")
	c.ProduceN(t, topic, partitions, 30, nil)
	require.Equal(t, "classic", groupType(t, c, group))

	require.NoError(t, classic.Close())
	kafkatest.WaitFor(t, 20*time.Second, "the consumer-protocol member to join and own every partition", func() bool {
		return member.Ready() == nil && len(ownedPartitions(member, topic)) == partitions
	})
	require.Equal(t, "consumer", groupType(t, c, group))
	c.ProduceN(t, topic, partitions, 30, nil)
	hwm := c.HighWaterMarks(t, topic)
	acks.waitAllAcked(t, c, topic, 20*time.Second)
	watch.waitCommitted(t, hwm, 20*time.Second)
	require.Positive(t, watch.check(t))

	waiting := 0
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		require.NotEqual(t, "Fetch error", m.Msg, "a refused join logged as a fetch error: %v", m.Err)
		if m.Msg == "Waiting to join the consumer group" {
			waiting++
		}
	}
	require.Positive(t, waiting, "the refused join was not logged")
}
