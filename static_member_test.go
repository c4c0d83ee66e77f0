package safeack_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// errorLog is a logger that keeps the Error lines, with when they were
// logged, and passes everything on to next.
type errorLog struct {
	next watermill.LoggerAdapter
	mu   *sync.Mutex
	errs *[]loggedError
}

type loggedError struct {
	at     time.Time
	msg    string
	err    error
	fields watermill.LogFields
}

func newErrorLog() errorLog {
	return errorLog{next: testLogger(), mu: new(sync.Mutex), errs: new([]loggedError)}
}

func (l errorLog) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	*l.errs = append(*l.errs, loggedError{at: time.Now(), msg: msg, err: err, fields: fields})
	l.mu.Unlock()
	l.next.Error(msg, err, fields)
}
func (l errorLog) Info(msg string, fields watermill.LogFields)  { l.next.Info(msg, fields) }
func (l errorLog) Debug(msg string, fields watermill.LogFields) { l.next.Debug(msg, fields) }
func (l errorLog) Trace(msg string, fields watermill.LogFields) { l.next.Trace(msg, fields) }
func (l errorLog) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return errorLog{next: l.next.With(fields), mu: l.mu, errs: l.errs}
}

// first returns the first Error logged whose error is target.
func (l errorLog) first(target error) (loggedError, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range *l.errs {
		if errors.Is(e.err, target) {
			return e, true
		}
	}
	return loggedError{}, false
}

// matching returns the Errors logged so far for which match holds.
func (l errorLog) matching(match func(loggedError) bool) []loggedError {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []loggedError
	for _, e := range *l.errs {
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}

// count returns how many Errors were logged whose error is target.
func (l errorLog) count(target error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range *l.errs {
		if errors.Is(e.err, target) {
			n++
		}
	}
	return n
}

// Two live Subscribers with one Consumer.Group.InstanceId (a copy of a
// deployment started beside the running one, say): the newer one takes the
// older one's member (static membership, KIP-345) and its partitions; the
// coordinator fences the older one (FENCED_INSTANCE_ID) at its next
// heartbeat ("idle": nothing to commit) or commit ("busy": acking while the
// newer one joins). The older subscription then stops for good: it hands
// nothing more out, commits nothing more (the ack of a record it held
// across the fence changes nothing: the newer one handles it again), closes
// its channel, logs the fencing as an Error and Ready reports
// ErrInstanceFenced. It does not rejoin: a rejoin under a new member id
// would fence the newer one in turn, and the two would take the partitions
// from each other for as long as both run. Every commit at the broker
// covers only acked records.
//
// On the consumer protocol (KIP-848) the coordinator refuses B's join
// while A is alive (UNRELEASED_INSTANCE_ID): B takes A's instance id only
// once A's session expired (A stalled: its heartbeats are held here), and
// A learns of it when its heartbeats get through again. From there A stops
// as on the classic protocol; B, refused meanwhile, joins once the id is
// free.
func TestStaticMemberFenced(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		for _, tc := range []struct {
			name              string
			busy, cooperative bool
		}{{"idle", false, false}, {"busy", true, false}, {"busy-cooperative", true, true}} {
			if p == safeack.GroupProtocolConsumer && tc.cooperative {
				continue // every rebalance of the consumer protocol is incremental
			}
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				if p == safeack.GroupProtocolConsumer {
					testStaticMemberFencedConsumer(t, tc.busy)
					return
				}
				testStaticMemberFenced(t, tc.busy, tc.cooperative)
			})
		}
	})
}

// testStaticMemberFencedConsumer is TestStaticMemberFenced on the consumer
// group protocol: B joins with A's instance id once A's session expired
// while A stalled (its heartbeats held at the broker), and A, back, is
// fenced. busy: A acks and commits while it stalls.
func testStaticMemberFencedConsumer(t *testing.T, busy bool) {
	c := kafkatest.Start(t)
	c.RequireEmbedded(t) // A's heartbeats are held at the embedded broker
	const partitions = 2
	topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
	acks, watch := watchCommits(t, c, group, topic)
	c.ProduceN(t, topic, partitions, partitions*20, nil)
	member := func(logger watermill.LoggerAdapter) *safeack.Subscriber {
		cfg := protocolConfig(c, group, safeack.GroupProtocolConsumer, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.MaxInFlight = 4
			cfg.DrainTimeout = 300 * time.Millisecond
			cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "twin"
		})
		sub, err := safeack.NewSubscriber(cfg, logger)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}

	// A holds offset 5 of partition 0 and acks everything else, slowly
	// from offset 20 on.
	logA := newErrorLog()
	a := member(logA)
	twinA := holdAndAck(t, c, a, topic, acks, watch)
	var memberA string
	for _, oc := range watch.log.Commits() {
		if oc.Group == group {
			memberA = oc.MemberID
		}
	}
	require.NotEmpty(t, memberA)
	if busy {
		c.ProduceN(t, topic, partitions, 800, nil)
		kafkatest.WaitFor(t, mwWait, "A to ack some of the new records", func() bool {
			return len(acks.missing(c, topic)) < 790
		})
	}

	// A stalls: its heartbeats are held until B owns the partitions, so
	// that its session (3 s on the embedded broker) expires meanwhile.
	var b *safeack.Subscriber
	var bStarted atomic.Bool
	bOwnsAll := func() bool {
		return bStarted.Load() && len(ownedPartitions(b, topic)) == partitions
	}
	kf := c.Kfake()
	stalledAt := time.Now()
	kf.ControlKey(kmsg.ConsumerGroupHeartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if hb := req.(*kmsg.ConsumerGroupHeartbeatRequest); hb.Group == group && hb.MemberID == memberA {
			kf.SleepControl(func() { kafkatest.Poll(mwWait, 20*time.Millisecond, bOwnsAll) })
		}
		return nil, nil, false
	})
	b = newLoggedSubscriber(t, c, group, testLogger(), func(cfg *safeack.SubscriberConfig) {
		cfg.GroupProtocol = safeack.GroupProtocolConsumer
		cfg.Ordering = safeack.Unordered
		cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "twin"
	})
	bStarted.Store(true)
	doneB := handleAll(mustSubscribe(t, b, topic), acks.ack)
	kafkatest.WaitFor(t, mwWait, "B to own the partitions", bOwnsAll)
	require.NoError(t, b.WaitReady(t.Context()))

	// A reported the fencing, closed its channel, owns nothing.
	kafkatest.WaitFor(t, mwWait, "A to report the fencing", func() bool {
		return errors.Is(a.Ready(), safeack.ErrInstanceFenced)
	})
	err := a.Ready()
	require.ErrorIs(t, err, safeack.ErrNotReady)
	require.Contains(t, err.Error(), `"twin"`)
	logged := twinA.fenced(t, logA)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		require.NoError(t, b.Ready(), "B lost its membership: A came back")
		require.Len(t, ownedPartitions(b, topic), partitions, "B lost partitions: A came back")
		time.Sleep(50 * time.Millisecond)
	}

	// A's held record, acked now, changes nothing: B handles it again, and
	// everything else.
	twinA.ackHeldLate(t, partitions)

	require.NoError(t, b.Close())
	<-doneB
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Ready(), safeack.ErrSubscriberClosed)
	require.ErrorIs(t, a.Ready(), safeack.ErrInstanceFenced, "Ready after Close forgot the fencing")

	// At the broker: every commit of the group covers acked records only,
	// and none from A's member was taken after it stalled (A's commits
	// then are refused: its member is gone).
	require.Positive(t, watch.check(t))
	require.Empty(t, acks.badMessages())
	var fromAAfterStall int
	for _, oc := range watch.log.Commits() {
		if oc.Group != group || oc.MemberID != memberA {
			continue
		}
		require.False(t, oc.At.After(logged.at), "A committed after it logged the fencing: %+v", oc)
		if oc.At.After(stalledAt) {
			fromAAfterStall++
		}
	}
	t.Logf("A's commit requests after it stalled: %d; fencing logged %v after: %v", fromAAfterStall, logged.at.Sub(stalledAt), logged.err)
}

func testStaticMemberFenced(t *testing.T, busy, cooperative bool) {
	c := kafkatest.Start(t)
	session := time.Second
	if !c.Embedded() {
		session = kafkatest.RealSessionTimeout // the broker's minimum by default
	}
	const partitions = 2
	topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
	acks, watch := watchCommits(t, c, group, topic)
	c.ProduceN(t, topic, partitions, partitions*20, nil)

	// A is the member fenced; B, joining with A's instance id, is not the
	// subject: its session is long enough that a loaded machine does not
	// expire it (a 1 s session with B's heartbeat late once made B lose
	// its partitions, which the test took for A coming back).
	member := func(logger watermill.LoggerAdapter, isB bool) *safeack.Subscriber {
		sc := c.SaramaConfig()
		sc.Consumer.Return.Errors = true
		sc.Consumer.Group.Session.Timeout = session
		sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
		switch {
		case isB:
			sc.Consumer.Group.Session.Timeout = max(session, 6*time.Second)
		case busy:
			// The commits, every 50 ms, meet the fence first.
			sc.Consumer.Group.Heartbeat.Interval = 900 * time.Millisecond
		}
		sc.Consumer.Group.InstanceId = "twin"
		if cooperative {
			sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		}
		sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
			Brokers:               c.Brokers(),
			OverwriteSaramaConfig: sc,
			ConsumerGroup:         group,
			Ordering:              safeack.Unordered,
			MaxInFlight:           4,
			ReconnectRetrySleep:   100 * time.Millisecond,
			DrainTimeout:          300 * time.Millisecond,
			CommitInterval:        50 * time.Millisecond,
		}, logger)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}

	// A holds offset 5 of partition 0 and acks everything else, slowly
	// from offset 20 on.
	logA := newErrorLog()
	a := member(logA, false)
	twinA := holdAndAck(t, c, a, topic, acks, watch)
	var memberA string // on the embedded broker, where commits are observed
	if watch.log != nil {
		for _, oc := range watch.log.Commits() {
			if oc.Group == group {
				memberA = oc.MemberID
			}
		}
		require.NotEmpty(t, memberA)
	}
	if busy {
		// About 2 s of work for A: it is acking and committing when B
		// joins.
		c.ProduceN(t, topic, partitions, 800, nil)
		kafkatest.WaitFor(t, mwWait, "A to ack some of the new records", func() bool {
			return len(acks.missing(c, topic)) < 790
		})
	}

	// B joins with the same instance id. It keeps the partitions: long
	// enough for A to have rejoined and taken them back if it were going
	// to (its rejoin window is two session timeouts, then a new client
	// joins under a new member id).
	// When B's join reached the broker, which fences A's member from then
	// on (on the embedded broker, where requests are observed; before B
	// is made, elsewhere). A's commits sent before it are not refused,
	// and on a loaded machine B takes a while to get there.
	joinedB := time.Now()
	var joinSeen atomic.Int64
	if c.Embedded() {
		kf := c.Kfake()
		kf.ControlKey(kmsg.JoinGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			if jg := req.(*kmsg.JoinGroupRequest); jg.Group == group && jg.MemberID == "" {
				joinSeen.CompareAndSwap(0, time.Now().UnixNano())
			}
			return nil, nil, false
		})
		if busy {
			// The commit path is what the busy variants test: A's
			// heartbeats after B's join are answered a second late, so
			// that a refused commit (one every 50 ms while A acks) tells
			// A of the fence first. On a loaded machine A's heartbeat
			// came first once, before A's next commit.
			kf.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kf.KeepControl()
				if hb := req.(*kmsg.HeartbeatRequest); hb.Group == group && hb.MemberID == memberA && joinSeen.Load() != 0 {
					kf.SleepControl(func() { time.Sleep(time.Second) })
				}
				return nil, nil, false
			})
		}
	}
	b := member(testLogger(), true)
	doneB := handleAll(mustSubscribe(t, b, topic), acks.ack)
	require.NoError(t, b.WaitReady(t.Context()))
	if at := joinSeen.Load(); at != 0 {
		joinedB = time.Unix(0, at)
	}
	kafkatest.WaitFor(t, mwWait, "B to own the partitions", func() bool {
		return len(ownedPartitions(b, topic)) == partitions
	})
	for end := time.Now().Add(2*session + 3*time.Second); time.Now().Before(end); {
		require.NoError(t, b.Ready(), "B lost its membership: A came back")
		require.Len(t, ownedPartitions(b, topic), partitions, "B lost partitions: A came back")
		time.Sleep(50 * time.Millisecond)
	}

	// A reported the fencing, closed its channel, owns nothing.
	err := a.Ready()
	require.ErrorIs(t, err, safeack.ErrInstanceFenced)
	require.ErrorIs(t, err, safeack.ErrNotReady)
	require.ErrorIs(t, err, sarama.ErrFencedInstancedId)
	require.Contains(t, err.Error(), `"twin"`)
	require.ErrorIs(t, a.WaitReady(t.Context()), safeack.ErrInstanceFenced, "WaitReady waits for a fenced subscription")
	logged := twinA.fenced(t, logA)

	// A's held record, acked now, changes nothing: B handles it again, and
	// everything else.
	twinA.ackHeldLate(t, partitions)

	require.NoError(t, b.Close())
	<-doneB
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Ready(), safeack.ErrSubscriberClosed)
	require.ErrorIs(t, a.Ready(), safeack.ErrInstanceFenced, "Ready after Close forgot the fencing")

	// At the broker: no commit from A's member after it learnt of the
	// fence (before it logged it; at most the refused one that told it,
	// per path), and every commit of the group covers acked records only
	// (polled on a real broker, where requests cannot be observed).
	require.Positive(t, watch.check(t))
	require.Empty(t, acks.badMessages())
	if watch.log == nil {
		return
	}
	var fromAAfterJoin int
	for _, oc := range watch.log.Commits() {
		if oc.Group != group || oc.MemberID != memberA {
			continue
		}
		require.False(t, oc.At.After(logged.at), "A committed after it logged the fencing: %+v", oc)
		if oc.At.After(joinedB) {
			fromAAfterJoin++
		}
	}
	t.Logf("A's commit requests after B joined: %d; fencing logged %v after B joined: %v",
		fromAAfterJoin, logged.at.Sub(joinedB), logged.err)
	require.LessOrEqual(t, fromAAfterJoin, 2, "A kept committing after B took its member")
	if busy {
		require.Positive(t, fromAAfterJoin, "A was not committing when B joined: the commit path is not tested")
	}
}

// fencedTwin is member A of TestStaticMemberFenced: it holds offset 5 of
// partition 0 and acks everything else, slowly from offset 20 on, and
// notes every record handed to it once it is known to be fenced.
type fencedTwin struct {
	c     *kafkatest.Cluster
	sub   *safeack.Subscriber
	topic string
	acks  *ackLog
	watch *commitWatch
	done  <-chan struct{}

	mu               sync.Mutex
	held             *message.Message
	handedAfterFence []po
	fencedAt         time.Time
}

// holdAndAck subscribes a as fencedTwin and waits until it acked all but
// its held record and the commits reached it.
func holdAndAck(t *testing.T, c *kafkatest.Cluster, a *safeack.Subscriber, topic string, acks *ackLog, watch *commitWatch) *fencedTwin {
	f := &fencedTwin{c: c, sub: a, topic: topic, acks: acks, watch: watch}
	f.done = handleAll(mustSubscribe(t, a, topic), func(m *message.Message) {
		k, _ := msgPO(m)
		f.mu.Lock()
		if !f.fencedAt.IsZero() {
			f.handedAfterFence = append(f.handedAfterFence, k)
		}
		if k == (po{0, 5}) && f.held == nil {
			f.held = m
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if k.o >= 20 {
			time.Sleep(10 * time.Millisecond)
		}
		acks.ack(m)
	})
	kafkatest.WaitFor(t, mwWait, "A to ack all but its held record", func() bool {
		return len(acks.missing(c, topic)) == 1
	})
	watch.waitCommitted(t, map[int32]int64{0: 5, 1: 20}, mwWait)
	return f
}

// fenced checks what A did once it reported the fencing: logged it once
// (the log entry is returned), closed its message channel, owns nothing.
// Records handed to A from here on are noted (see ackHeldLate).
func (f *fencedTwin) fenced(t *testing.T, logA errorLog) loggedError {
	f.mu.Lock()
	f.fencedAt = time.Now()
	f.mu.Unlock()
	logged, ok := logA.first(safeack.ErrInstanceFenced)
	require.True(t, ok, "A logged no Error wrapping ErrInstanceFenced")
	require.Equal(t, 1, logA.count(safeack.ErrInstanceFenced), "the fencing is logged once")
	select {
	case <-f.done:
	case <-time.After(mwWait):
		t.Fatal("A's message channel did not close after the fencing")
	}
	require.Empty(t, ownedPartitions(f.sub, f.topic), "A still shows partitions in Stats")
	return logged
}

// ackHeldLate acks A's held record now, which must change nothing: the
// group (B) handles it again, and everything else, once, and commits the
// end of every partition; A was handed nothing after its fencing.
func (f *fencedTwin) ackHeldLate(t *testing.T, partitions int) {
	f.mu.Lock()
	require.NotNil(t, f.held)
	f.acks.ackLate(f.held)
	f.mu.Unlock()
	f.c.ProduceN(t, f.topic, partitions, partitions*10, nil)
	f.acks.waitAllAcked(t, f.c, f.topic, mwWait)
	require.Equal(t, 1, f.acks.count(po{0, 5}), "the record A held was not handled again by B")
	f.watch.waitCommitted(t, f.c.HighWaterMarks(t, f.topic), mwWait)
	f.mu.Lock()
	require.Empty(t, f.handedAfterFence, "A handed records out after it reported the fencing")
	f.mu.Unlock()
}

// In transactional mode too, the fenced member stops: its transactions
// stop (a TxnOffsetCommit from it would be refused anyway, aborting its
// outputs), it does not rejoin, and the outputs are exactly once.
func TestTxnStaticMemberFenced(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	session := time.Second
	if !c.Embedded() {
		session = kafkatest.RealSessionTimeout
	}
	r := newTxnRig(t, c, 2, 2000)
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	var att attempts
	static := func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "twin"
		cfg.OverwriteSaramaConfig.Consumer.Group.Session.Timeout = session
		cfg.OverwriteSaramaConfig.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	}

	// A stops after a while, until it is fenced, so that there is work
	// left for B.
	gate := make(chan struct{})
	var handled atomic.Int32
	a, pubA := r.subscriber(t, "txn-twin-a", static)
	work := transform(&att, 2*time.Millisecond)
	runRouter(t, r, a, pubA, func(msg *message.Message) ([]*message.Message, error) {
		if handled.Add(1) > 600 {
			select {
			case <-gate:
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
		}
		return work(msg)
	})
	kafkatest.WaitFor(t, 60*time.Second, "some outputs", func() bool { return rd.seen(ids) >= 200 })

	b, pubB := r.subscriber(t, "txn-twin-b", static)
	runRouter(t, r, b, pubB, transform(&att, 2*time.Millisecond))
	kafkatest.WaitFor(t, mwWait, "A to report the fencing", func() bool {
		return errors.Is(a.Ready(), safeack.ErrInstanceFenced)
	})
	committedA := pubA.Stats().Committed
	close(gate) // A's held handlers finish: their outputs must not show
	for end := time.Now().Add(2*session + 3*time.Second); time.Now().Before(end); {
		require.NoError(t, b.Ready(), "B lost its membership: A came back")
		time.Sleep(50 * time.Millisecond)
	}
	r.requireExactlyOnce(t, rd, ids, 90*time.Second, 30*time.Second)
	require.Equal(t, committedA, pubA.Stats().Committed, "A committed a transaction after it was fenced")
	require.ErrorIs(t, a.Ready(), safeack.ErrInstanceFenced)
	t.Logf("A: %+v; B: %+v", pubA.Stats(), pubB.Stats())
}

// A Subscriber with a Consumer.Group.InstanceId holds one subscription at
// a time: a second one would be a second group member with the same
// instance id, and the two would fence each other. The second Subscribe
// fails with ErrInvalidConfig and changes nothing; once the first
// subscription ended, the instance id is free again.
func TestStaticMemberOneSubscriptionAtATime(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic1, topic2 := c.NewTopic(t, 1), c.NewTopic(t, 1)
	group := c.NewGroup(t)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "only"
		// The records are produced once Subscribe returned, perhaps before
		// the group assigned the topic (a real broker's rebalance of a
		// static member takes longer than kfake's): not to be skipped.
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	ctx1, cancel1 := context.WithCancel(t.Context())
	msgs1, err := sub.Subscribe(ctx1, topic1)
	require.NoError(t, err)
	require.NoError(t, sub.WaitReady(t.Context()))

	_, err = sub.Subscribe(t.Context(), topic2)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	require.Contains(t, err.Error(), `"only"`)
	require.Contains(t, err.Error(), topic1)

	// The first subscription goes on.
	c.ProduceN(t, topic1, 1, 3, nil)
	for range 3 {
		select {
		case m := <-msgs1:
			m.Ack()
		case <-time.After(mwWait):
			t.Fatal("the first subscription stopped delivering")
		}
	}
	require.NoError(t, sub.Ready())

	cancel1()
	for range msgs1 {
	}
	// Subscribing again takes the id back (as a restarted static member
	// does). To the same topic: a real broker hands a static member that
	// rejoins its old assignment, without a rebalance, even when the topics
	// it subscribes to changed; so an id is for one topic (see
	// docs/guarantees.md).
	msgs2, err := sub.Subscribe(t.Context(), topic1)
	require.NoError(t, err, "the instance id was not released when the first subscription ended")
	c.ProduceN(t, topic1, 1, 1, nil)
	select {
	case m := <-msgs2:
		m.Ack()
	case <-time.After(mwWait):
		t.Fatal("the second subscription delivered nothing")
	}
}

// TestStaticMemberRestart: a static member (Group.InstanceId) closes
// while holding a record and is replaced by a new Subscriber with the same
// instance id, which gets its partitions back without a rebalance of the
// others; meanwhile the old one, still in its drain, acks late. No commit
// passes an unacked record, the completed tail is skipped, and everything
// is acked.
func TestStaticMemberRestart(t *testing.T) {
	t.Parallel()
	const partitions = 2
	c, topic, group, acks, watch := startWatched(t, partitions)
	c.ProduceN(t, topic, partitions, partitions*30, nil)
	member := func() *safeack.Subscriber {
		return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Ordering = safeack.Unordered
			cfg.DrainTimeout = 200 * time.Millisecond
			cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId = "static-1"
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		})
	}
	hold := newHolder(po{0, 3}, po{1, 3})
	a := member()
	handleAll(mustSubscribe(t, a, topic), func(m *message.Message) {
		if !hold.take(m) {
			acks.ack(m)
		}
	})
	kafkatest.WaitFor(t, mwWait, "A to hold its records and ack the rest", func() bool {
		return hold.count() == partitions && len(acks.missing(c, topic)) == partitions
	})
	watch.waitCommitted(t, map[int32]int64{0: 3, 1: 3}, mwWait)
	before := acks.snapshot()
	require.NoError(t, a.Close())
	for _, h := range hold.all() {
		acks.ackLate(h.m)
	}

	b := member()
	handleAll(mustSubscribe(t, b, topic), acks.ack)
	c.ProduceN(t, topic, partitions, partitions*10, nil)
	acks.waitAllAcked(t, c, topic, mwWait)
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), mwWait)
	require.Positive(t, watch.check(t))
	for k, n := range acks.snapshot() {
		if n > before[k] && before[k] > 0 {
			t.Errorf("record %v completed before the restart was handled again", k)
		}
	}
}
