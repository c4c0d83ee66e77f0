package safeack_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareCloseBrokerGone: the broker disappears while a share member
// holds a record. Ready must stop reporting nil, and Close must return
// within a bound (the drain, plus the flush's DrainTimeout + 5 s), not hang
// on a leave that can never be answered; its goroutines end.
func TestShareCloseBrokerGone(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	c.ProduceN(t, topic, 1, 3, nil)
	var sub *safeack.ShareSubscriber
	var msgs <-chan *message.Message
	scope := newGoroutineScope(t)
	scope.inScope(func() {
		sub = newShareSub(t, c, group, nil)
		msgs = subscribeShare(t, sub, topic)
	})
	held := receive(t, msgs, 20*time.Second, "no record")
	c.Kfake().Close()
	kafkatest.WaitFor(t, 20*time.Second, "Ready reports the lost broker", func() bool { return sub.Ready() != nil })

	start := time.Now()
	done := make(chan struct{})
	go func() { _ = sub.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Close still running after 30 s (DrainTimeout 500 ms); goroutines: %s", dumpGoroutines(t))
	}
	took := time.Since(start)
	t.Logf("Close took %v with the broker gone", took)
	assert.Less(t, took, 500*time.Millisecond+500*time.Millisecond+5*time.Second+2*time.Second, "Close past DrainTimeout + the flush bound")
	select {
	case <-held.Context().Done():
	default:
		t.Error("held message's context alive after Close")
	}
	scope.requireNoneLeft(t, closeLeftGrace, "Close returned")
}

// TestShareCloseReleasesAcrossBrokers: three brokers, partitions led by
// each, two members per subscription. Records held unanswered at Close
// reach another subscriber at once (long before the 30 s acquisition
// lock), acked ones are never delivered again, and every record is handled.
func TestShareCloseReleasesAcrossBrokers(t *testing.T) {
	t.Parallel()
	c := startShareClusterN(t, 3)
	topic := c.NewTopic(t, 6)
	group := c.NewGroup(t)
	const n = 120
	c.ProduceN(t, topic, 6, n, nil)

	first := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Members, cfg.MaxInFlight = 2, 8
	})
	msgs := subscribeShare(t, first, topic)
	var held []*message.Message
	acked := map[string]bool{}
	// Four acked, then eight held: MaxInFlight handlers, across the two
	// members' polls (each takes up to 4 x MaxInFlight records).
	for len(held) < 8 {
		select {
		case <-time.After(20 * time.Second):
			t.Fatalf("held %d of 8", len(held))
		case m := <-msgs:
			if len(acked) < 4 {
				m.Ack()
				acked[string(m.Payload)] = true
				continue
			}
			held = append(held, m)
		}
	}
	kafkatest.WaitFor(t, 5*time.Second, "the acks counted", func() bool {
		tot, _ := shareTotals(first)
		return tot.Accepted == 4
	})
	time.Sleep(300 * time.Millisecond) // past AckFlushInterval: the acks are sent

	second := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.Members = 2 })
	msgs2 := subscribeShare(t, second, topic)
	seen := newShareSeen()
	var mu sync.Mutex
	arrived := map[string]time.Duration{}
	start := time.Now()
	go func() {
		for m := range msgs2 {
			seen.add(m)
			mu.Lock()
			if _, ok := arrived[string(m.Payload)]; !ok {
				arrived[string(m.Payload)] = time.Since(start)
			}
			mu.Unlock()
			m.Ack()
		}
	}()
	require.NoError(t, first.Close())
	kafkatest.WaitFor(t, 12*time.Second, "every held record at the second subscriber", func() bool {
		for _, m := range held {
			if seen.count(string(m.Payload)) == 0 {
				return false
			}
		}
		return true
	})
	kafkatest.WaitFor(t, 25*time.Second, "every record not acked by the first handled by the second", func() bool {
		return seen.distinct() >= n-len(acked)
	})
	time.Sleep(time.Second)
	for v := range acked {
		assert.Zero(t, seen.count(v), "record %s acked by the first subscriber delivered again", v)
	}
	mu.Lock()
	defer mu.Unlock()
	var latest time.Duration
	for _, m := range held {
		latest = max(latest, arrived[string(m.Payload)])
	}
	t.Logf("held records at the second subscriber within %v of Close; %d distinct, %d deliveries", latest, seen.distinct(), seen.total())
	assert.Equal(t, n-len(acked), seen.distinct(), "records handled by the second")
	_ = fmt.Sprint
	_ = context.Background
}

// startShareClusterN is startShareCluster with n embedded brokers and the
// broker's default acquisition lock (30 s).
func startShareClusterN(t *testing.T, n int) *kafkatest.Cluster {
	t.Helper()
	c := kafkatest.Start(t, kafkatest.WithBrokers(n), kafkatest.WithKfakeOpts(kfake.BrokerConfigs(map[string]string{"share.record.lock.sweep.interval.ms": "100"})))
	requireShareGroups(t, c)
	return c
}

// cutDialer dials normally until cut; from then on every dial is refused
// and every write on a connection it made fails, as when the broker's host
// is gone and its connections were reset. While stalled (see stall), the
// writes on its connections wait instead: the connections stay open and
// the broker hears nothing, as over a congested link.
type cutDialer struct {
	cut     atomic.Bool
	stalled atomic.Pointer[chan struct{}] // closed when the stall ends
	tls     *tls.Config                   // a secured cluster's: the handshake on the cut connection
}

// stall holds every write on d's connections until the returned func is
// called.
func (d *cutDialer) stall() (resume func()) {
	ch := make(chan struct{})
	d.stalled.Store(&ch)
	return func() {
		if ch := d.stalled.Swap(nil); ch != nil {
			close(*ch)
		}
	}
}

// options are the kgo options that connect to c through d: kgo.Dialer,
// and on a secured cluster the TLS handshake in it (kgo takes a Dialer or
// a DialTLSConfig, not both) and the harness's SASL login.
func (d *cutDialer) options(t *testing.T, c *kafkatest.Cluster) []kgo.Opt {
	t.Helper()
	sec := c.Security()
	tc, err := sec.TLSConfig()
	require.NoError(t, err)
	d.tls = tc
	sec.CAFile = ""
	opts, err := sec.KgoOpts()
	require.NoError(t, err)
	return append(opts, kgo.Dialer(d.dial))
}

var errCut = errors.New("test: connection reset (network cut)")

func (d *cutDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if d.cut.Load() {
		return nil, errCut
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	cc := &cutConn{Conn: c, d: d}
	if d.tls == nil {
		return cc, nil
	}
	tc := d.tls.Clone()
	if tc.ServerName == "" {
		tc.ServerName, _, _ = net.SplitHostPort(host)
	}
	conn := tls.Client(cc, tc)
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = cc.Close()
		return nil, err
	}
	return conn, nil
}

type cutConn struct {
	net.Conn
	d *cutDialer
}

func (c *cutConn) Write(b []byte) (int, error) {
	if ch := c.d.stalled.Load(); ch != nil {
		<-*ch
	}
	if c.d.cut.Load() {
		return 0, errCut
	}
	return c.Conn.Write(b)
}

// TestShareReadyAfterNetworkCut: the network to the broker is cut (new
// connections refused, writes on the old ones reset). The share group
// heartbeats go unanswered, so Ready must stop reporting nil; the member
// only ever sees write and dial errors, never a failed heartbeat read.
// Once the network is back, Ready reports nil again.
func TestShareReadyAfterNetworkCut(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	d := &cutDialer{}
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.ClientOptions = d.options(t, c) // in place of the harness's
	})
	_ = subscribeShare(t, sub, topic)
	require.NoError(t, sub.Ready())
	d.cut.Store(true)
	kafkatest.WaitFor(t, 10*time.Second, "Ready reports the unanswered heartbeats", func() bool { return sub.Ready() != nil })
	t.Logf("Ready after the cut: %v", sub.Ready())
	d.cut.Store(false)
	kafkatest.WaitFor(t, 20*time.Second, "Ready again once the network is back", func() bool { return sub.Ready() == nil })
	start := time.Now()
	require.NoError(t, sub.Close())
	t.Logf("Close took %v", time.Since(start))
}

// TestShareLockRenewedSequentialReader: a consumer that reads its channel
// one message at a time (for m := range msgs { handle; Ack }), each
// handling taking two and a half acquisition locks (4 s here: a renewal,
// sent at half the lock, then has 2 s to reach the broker; with a 2 s
// lock, a loaded machine lost one once). The
// documented renewal ("a long handler keeps its record") must hold for the
// message in work and for the next one, which a free handler waits to
// hand to the reader: neither may go to another member, and every Ack
// must be accepted. The poll's records behind them, which no handler is
// about to take, are given back once they waited half a lock (issue 42),
// for the other member or, again, the slow one: each record handled once.
func TestShareLockRenewedSequentialReader(t *testing.T) {
	t.Parallel()
	const lock = 4 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("a")}, kafkatest.Record{Value: []byte("b")}, kafkatest.Record{Value: []byte("c")})
	slow := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, slow, topic)
	// The first message, then the other member, so that the poll that
	// took it is the slow member's.
	first := receive(t, msgs, 20*time.Second, "no message")
	other := newShareSub(t, c, group, nil)
	others := subscribeShare(t, other, topic)
	seen := answerAll(others, (*message.Message).Ack)
	handled := newShareSeen()
	handle := func(m *message.Message) {
		time.Sleep(lock * 5 / 2)
		handled.add(m)
		m.Ack()
	}
	handle(first)
	for handled.distinct()+seen.distinct() < 3 {
		select {
		case m := <-msgs:
			handle(m)
		case <-time.After(20 * time.Second):
			t.Fatalf("handled %d by the slow member, %d by the other", handled.distinct(), seen.distinct())
		}
	}
	time.Sleep(lock * 5 / 4) // past a lock of the last record, would it be lost
	tot, _ := shareTotals(slow)
	t.Logf("slow member: handled %d, %+v; other member got %d", handled.total(), tot, seen.total())
	for _, v := range []string{"a", "b", "c"} {
		assert.Equal(t, 1, seen.count(v)+handled.count(v), "record %s: handled %d times by the slow member, %d by the other", v, handled.count(v), seen.count(v))
	}
	assert.GreaterOrEqual(t, handled.distinct(), 2, "the slow member lost the message in work or the next one")
	// A record given back may come back to the slow subscriber's other
	// member (its handlers are free: the reader is the bottleneck).
	assert.GreaterOrEqual(t, tot.GivenBack, uint64(seen.distinct()), "records given back by the slow member")
	assert.Zero(t, tot.AckErrors, "the broker refused acks: locks had expired")
}

// TestShareAckDuringDrain: records answered while Close drains (inside
// DrainTimeout) are accepted, never released nor delivered again, and
// Close returns once the last one is answered rather than at the end of
// DrainTimeout.
func TestShareAckDuringDrain(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	first := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxInFlight = 5
		cfg.DrainTimeout = 5 * time.Second
	})
	// Produced first: a member polls again only once its last poll is
	// answered, so all five must come in one poll.
	c.ProduceN(t, topic, 1, 5, nil)
	msgs := subscribeShare(t, first, topic)
	var held []*message.Message
	for len(held) < 5 {
		select {
		case m := <-msgs:
			held = append(held, m)
		case <-time.After(20 * time.Second):
			t.Fatalf("held %d of 5", len(held))
		}
	}
	second := newShareSub(t, c, group, nil)
	msgs2 := subscribeShare(t, second, topic)
	seen := answerAll(msgs2, (*message.Message).Ack)
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() { _ = first.Close(); closed <- time.Since(start) }()
	time.Sleep(300 * time.Millisecond)
	for _, m := range held {
		select {
		case <-m.Context().Done():
			t.Fatalf("message %s: context cancelled during the drain", m.Payload)
		default:
		}
		m.Ack()
	}
	var took time.Duration
	select {
	case took = <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return")
	}
	t.Logf("Close returned %v after it started (acks at 300 ms, DrainTimeout 5 s)", took)
	assert.Less(t, took, 3*time.Second, "Close waited for DrainTimeout although every message was answered")
	tot, _ := shareTotals(first)
	assert.Equal(t, uint64(5), tot.Accepted)
	assert.Zero(t, tot.ReleasedAtClose)
	c.ProduceN(t, topic, 1, 1, nil) // a sentinel: once the second has it, the acked ones would have shown
	kafkatest.WaitFor(t, 20*time.Second, "the sentinel at the second subscriber", func() bool { return seen.distinct() >= 1 })
	time.Sleep(500 * time.Millisecond)
	for _, m := range held {
		assert.Zero(t, seen.count(string(m.Payload)), "record %s acked during the drain delivered again", m.Payload)
	}
}

// TestShareRollingCloses: share subscribers of one group are closed and
// replaced one after another while records keep coming and handlers take
// random time. Every record is handled, and a record acked by a subscriber
// whose Close has returned (its acks sent) is never delivered again, to
// any member; no ack is refused.
func TestShareRollingCloses(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 2)
	group := c.NewGroup(t)

	var mu sync.Mutex
	ackedBy := map[string]int{}       // value -> generation of the subscriber that acked it
	ackedAt := map[string]time.Time{} // value -> when
	closeStart := map[int]time.Time{} // generation -> when its Close started
	closedGen := map[int]bool{}       // generations whose Close returned
	var violations []string           // deliveries after a confirmed ack
	deliveries := map[string]int{}    // value -> deliveries
	var refused atomic.Uint64

	run := func(gen int) *safeack.ShareSubscriber {
		sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
			cfg.Members, cfg.MaxInFlight = 2, 8
			cfg.DrainTimeout = 300 * time.Millisecond
		})
		msgs := subscribeShare(t, sub, topic)
		go func() {
			for m := range msgs {
				v := string(m.Payload)
				mu.Lock()
				deliveries[v]++
				// An ack given before its subscriber's Close started took
				// effect (nothing released it) and was sent by the time
				// Close returned.
				if g, ok := ackedBy[v]; ok && closedGen[g] && ackedAt[v].Before(closeStart[g]) {
					violations = append(violations, fmt.Sprintf("%s delivered again after subscriber %d acked it and closed", v, g))
				}
				mu.Unlock()
				go func() {
					time.Sleep(time.Duration(rand.N(500)) * time.Millisecond)
					select {
					case <-m.Context().Done():
						m.Nack() // too late: released at Close
						return
					default:
					}
					mu.Lock()
					if _, ok := ackedBy[v]; !ok {
						ackedBy[v], ackedAt[v] = gen, time.Now()
					}
					mu.Unlock()
					m.Ack()
				}()
			}
		}()
		return sub
	}
	stop := make(chan struct{})
	var produced atomic.Int64
	var prodWG sync.WaitGroup
	prodWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			c.Produce(t, topic, kafkatest.Record{Partition: int32(i % 2), Value: []byte(fmt.Sprintf("r%d", i))})
			produced.Add(1)
		}
	})
	live := []*safeack.ShareSubscriber{run(0), run(1)}
	for gen := 2; gen < 8; gen++ {
		time.Sleep(time.Duration(700+rand.N(800)) * time.Millisecond)
		old := live[0]
		live = append(live[1:], run(gen))
		mu.Lock()
		closeStart[gen-2] = time.Now()
		mu.Unlock()
		require.NoError(t, old.Close())
		tot, _ := shareTotals(old)
		refused.Add(tot.AckErrors)
		mu.Lock()
		closedGen[gen-2] = true
		mu.Unlock()
	}
	close(stop)
	prodWG.Wait()
	n := int(produced.Load())
	kafkatest.WaitFor(t, 30*time.Second, "every record acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ackedBy) == n
	})
	for _, s := range live {
		require.NoError(t, s.Close())
		tot, _ := shareTotals(s)
		refused.Add(tot.AckErrors)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, d := range deliveries {
		total += d
	}
	t.Logf("%d records, %d deliveries, %d acks refused", n, total, refused.Load())
	assert.Empty(t, violations)
	assert.Zero(t, refused.Load(), "acks refused by the broker")
}

// TestShareDeadLetterFailsAtDefaultLimit: with the defaults (MaxDeliveries
// 5, the broker's group.share.delivery.count.limit 5), a record whose
// handler always fails reaches DeadLetter at its fifth delivery; the
// dead-letter topic is away at that moment. The docs promise that a
// failing DeadLetter releases the record "to be tried again": it must come
// back and reach DeadLetter again, not be archived by the broker unseen.
func TestShareDeadLetterFailsAtDefaultLimit(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	var mu sync.Mutex
	var dead []int32
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.DeadLetter = func(ctx context.Context, msg *message.Message) error {
			dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, dc)
			if len(dead) == 1 {
				return errors.New("dead-letter topic away")
			}
			return nil
		}
	})
	msgs := subscribeShare(t, sub, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	seen := answerAll(msgs, (*message.Message).Nack)
	ok := kafkatest.Poll(15*time.Second, 100*time.Millisecond, func() bool {
		tot, _ := shareTotals(sub)
		return tot.DeadLettered == 1
	})
	tot, _ := shareTotals(sub)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("deliveries %v, DeadLetter calls at delivery counts %v, %+v", seen.deliveryCounts("bad"), dead, tot)
	assert.True(t, ok, "the record never reached DeadLetter again after its failure: the broker archived it at its delivery limit")
}

// TestShareDeadLetterPastMaxDeliveries: a record that arrives past
// MaxDeliveries (here: released once by a subscriber allowing more, then
// received by one with MaxDeliveries 1) is not handed out but given to
// DeadLetter; a failing DeadLetter is tried again while the record is
// held, and the record is accepted once it succeeds.
func TestShareDeadLetterPastMaxDeliveries(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	first := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, first, topic)
	select {
	case m := <-msgs:
		m.Nack() // released: delivery count 1
	case <-time.After(20 * time.Second):
		t.Fatal("no record")
	}
	kafkatest.WaitFor(t, 10*time.Second, "the release counted", func() bool {
		tot, _ := shareTotals(first)
		return tot.Released == 1
	})
	require.NoError(t, first.Close())

	var mu sync.Mutex
	var dead []int32
	second := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxDeliveries = 1
		cfg.DeadLetter = func(ctx context.Context, msg *message.Message) error {
			dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, dc)
			if len(dead) < 3 {
				return errors.New("dead-letter topic away")
			}
			return nil
		}
	})
	msgs2 := subscribeShare(t, second, topic)
	handed := make(chan struct{}, 10)
	go func() {
		for m := range msgs2 {
			handed <- struct{}{}
			m.Ack()
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "dead-lettered and accepted", func() bool {
		tot, _ := shareTotals(second)
		return tot.DeadLettered == 1 && tot.Accepted == 1
	})
	mu.Lock()
	// Two at least: the first subscriber may acquire the released record
	// again before it leaves, and release it at Close.
	if assert.Len(t, dead, 3, "DeadLetter calls") {
		assert.GreaterOrEqual(t, dead[0], int32(2))
		assert.Equal(t, []int32{dead[0], dead[0], dead[0]}, dead, "tried again on the same delivery")
	}
	mu.Unlock()
	assert.Empty(t, handed, "a record past MaxDeliveries was handed out")
	tot, inFlight := shareTotals(second)
	assert.Zero(t, tot.Released)
	assert.Zero(t, inFlight)
}

// TestShareDeadLetterFailingAtClose: DeadLetter fails for good; the record
// is held and DeadLetter tried again until Close, which releases it and
// returns promptly, its goroutines ended.
func TestShareDeadLetterFailingAtClose(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	var calls atomic.Int64
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxDeliveries = 1
		cfg.DrainTimeout = 5 * time.Second
		cfg.DeadLetter = func(ctx context.Context, msg *message.Message) error {
			calls.Add(1)
			return errors.New("dead-letter topic away")
		}
	})
	msgs := subscribeShare(t, sub, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")})
	go func() {
		for m := range msgs {
			m.Nack()
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "DeadLetter tried three times", func() bool { return calls.Load() >= 3 })
	tot, inFlight := shareTotals(sub)
	assert.Zero(t, tot.Released, "released while DeadLetter was being retried")
	assert.Equal(t, 1, inFlight)
	start := time.Now()
	require.NoError(t, sub.Close())
	took := time.Since(start)
	t.Logf("Close took %v; DeadLetter called %d times", took, calls.Load())
	assert.Less(t, took, 3*time.Second, "Close waited out DrainTimeout for a record only DeadLetter held")
	tot, inFlight = shareTotals(sub)
	assert.Equal(t, uint64(1), tot.Released)
	assert.Zero(t, inFlight)
}

// TestShareSubscribeContextEnds: ending Subscribe's context ends that
// subscription like Close does (held records released, the channel
// closed, message contexts cancelled) while the ShareSubscriber stays
// usable: a new Subscribe gets the released record at once, and after
// Close no goroutine of either subscription is left.
func TestShareSubscribeContextEnds(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("held")})
	var sub *safeack.ShareSubscriber
	var msgs <-chan *message.Message
	scope := newGoroutineScope(t)
	ctx, cancel := context.WithCancel(context.Background())
	scope.inScope(func() {
		sub = newShareSub(t, c, group, nil)
		var err error
		msgs, err = sub.Subscribe(ctx, topic)
		require.NoError(t, err)
	})
	held := receive(t, msgs, 20*time.Second, "no record")
	cancel()
	select {
	case _, ok := <-msgs:
		require.False(t, ok, "a message after the context ended")
	case <-time.After(10 * time.Second):
		t.Fatal("the channel did not close after Subscribe's context ended")
	}
	select {
	case <-held.Context().Done():
	default:
		t.Error("held message's context alive after its subscription ended")
	}
	var msgs2 <-chan *message.Message
	scope.inScope(func() { msgs2 = subscribeShare(t, sub, topic) })
	start := time.Now()
	select {
	case m := <-msgs2:
		assert.Equal(t, "held", string(m.Payload))
		m.Ack()
		t.Logf("released record back after %v", time.Since(start))
	case <-time.After(15 * time.Second):
		t.Fatal("the released record did not come back (the lock is 30 s)")
	}
	require.NoError(t, sub.Close())
	scope.requireNoneLeft(t, closeLeftGrace, "Close returned")
}

// TestShareAckAfterLockEndedUnconfirmed: a member whose link to the broker
// stalls (its connections open, its writes held) cannot renew the lock of
// the record it holds; the lock ends and the record goes to another
// member, which accepts it. When the link is back the first member's
// handler acks: that acknowledgement came after the lock ended (the broker
// may take it or not: Kafka 4.4.0 answered nothing wrong), so it is
// reported unconfirmed: AckErrors, and the Observer's Acknowledged with an
// error wrapping ErrShareAckUnconfirmed. (A connection reset instead ends
// the member's share session: the broker releases its records at once and
// refuses the ack, which is reported with the broker's error.)
func TestShareAckAfterLockEndedUnconfirmed(t *testing.T) {
	t.Parallel()
	const lock = 2 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("held")})

	d := &cutDialer{}
	rec := newShareRecorder()
	cut := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.ClientOptions = d.options(t, c)
		cfg.Observer = rec
	})
	held := receive(t, subscribeShare(t, cut, topic), 20*time.Second, "the record")
	resume := d.stall()
	t.Cleanup(resume)

	other := newShareSub(t, c, group, nil)
	seen := answerAll(subscribeShare(t, other, topic), (*message.Message).Ack)
	kafkatest.WaitFor(t, 30*time.Second, "the other member gets the record once its lock ended", func() bool {
		return seen.count("held") == 1
	})
	kafkatest.WaitFor(t, 10*time.Second, "the other member's accept taken", func() bool {
		tot, _ := shareTotals(other)
		return tot.Accepted == 1
	})

	resume()
	before, _ := shareTotals(cut)
	held.Ack()
	kafkatest.WaitFor(t, 10*time.Second, "the late ack counted", func() bool {
		tot, _ := shareTotals(cut)
		return tot.AckErrors > before.AckErrors && tot.Accepted == 1
	})
	kafkatest.WaitFor(t, 20*time.Second, "the late ack reported", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.acks["held#1"]) == 1
	})
	rec.mu.Lock()
	a := rec.acks["held#1"][0]
	rec.mu.Unlock()
	assert.Equal(t, "accept", a.Ack.String())
	assert.ErrorIs(t, a.Err, safeack.ErrShareAckUnconfirmed, "acknowledged: %+v", a)
}
