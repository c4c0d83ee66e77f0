//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Environment of a transactional router process of TestTxnRouterChaos.
const (
	envTxnChild = "SAFEACK_CHAOS_TXN_CHILD" // "in,out,group,transactional id,balance" (balance: eager or cooperative)
)

const txnIDHeader = "input"

// txnRouterMember is one running member of the transactional router: a
// Subscriber, its TxnPublisher and a Router.
type txnRouterMember struct {
	router *message.Router
	sub    *safeack.Subscriber
	pub    *safeack.TxnPublisher
	done   chan error
	// clientID names the member's client (each start its own).
	clientID string
}

// txnLogs keeps the latest log lines of the process's members, for a
// drain that fails to say what they did.
var txnLogs = newTailBuffer(256 << 10)

// prefixed writes each write to w behind prefix (a log line per write).
type prefixed struct {
	prefix string
	w      io.Writer
}

func (p prefixed) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte(p.prefix), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// txnMemberStarts numbers the members startTxnRouter starts in a process.
var txnMemberStarts atomic.Int64

// startTxnRouter starts a member consuming in, writing one output per input
// (its id in a header) to out, as transactional id txnID, with eager or
// cooperative-sticky balancing; killable: with sessions short enough for a
// killed member to leave the group quickly (kafkatest.KillableSessions).
// Handlers take up to 5 ms and fail one delivery in twenty (redelivered:
// their outputs must never show).
func startTxnRouter(c *kafkatest.Cluster, in, out, group, txnID string, coop, killable bool) (*txnRouterMember, error) {
	sc := c.SaramaConfig()
	sc.Consumer.Return.Errors = true
	// Each start is a member of its own name: a drain that stalls says
	// which member holds what (describeTxnGroup).
	sc.ClientID = fmt.Sprintf("%s-%d-%d", txnID, os.Getpid(), txnMemberStarts.Add(1))
	if coop {
		sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	if killable {
		kafkatest.KillableSessions(sc)
		// A JoinGroup the embedded broker drops (a join phase that
		// outlasts the member's session: docs/upstream/kfake-join-dropped.md)
		// is retried after the read timeout: 10 s rather than 30, still
		// well above the 3 s a join may take.
		sc.Net.ReadTimeout = 10 * time.Second
	}
	pc := c.SaramaConfig()
	pc.Producer.Partitioner = sarama.NewHashPartitioner
	sub, pub, err := safeack.NewTxnSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		MaxInFlight:           32,
		Ordering:              safeack.Unordered,
		DrainTimeout:          500 * time.Millisecond,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, safeack.TxnConfig{
		TransactionalID:       txnID,
		CommitInterval:        100 * time.Millisecond,
		OverwriteSaramaConfig: pc,
	}, watermill.NewStdLoggerWithOut(prefixed{sc.ClientID + " ", txnLogs}, false, false))
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, nil)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(pub.Middleware)
	router.AddHandler("transform", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		time.Sleep(rand.N(5 * time.Millisecond))
		if rand.N(20) == 0 {
			return nil, errors.New("transient failure")
		}
		p, _ := safeack.MessagePartitionFromCtx(msg.Context())
		o, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
		outMsg := message.NewMessage(watermill.NewUUID(), msg.Payload)
		outMsg.Metadata.Set(txnIDHeader, fmt.Sprintf("%d@%d", p, o))
		return []*message.Message{outMsg}, nil
	})
	m := &txnRouterMember{router: router, sub: sub, pub: pub, done: make(chan error, 1), clientID: sc.ClientID}
	go func() { m.done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
		return m, nil
	case err := <-m.done:
		return nil, fmt.Errorf("router stopped at start: %w", err)
	case <-time.After(60 * time.Second):
		return nil, errors.New("router did not start within 60 s")
	}
}

func (m *txnRouterMember) stop() error {
	err := m.router.Close()
	return errors.Join(err, <-m.done)
}

// TestTxnChaosChild is not a test: TestTxnRouterChaos and
// TestTxnRouterChaosCooperative run it as a transactional router process
// that they SIGKILL.
func TestTxnChaosChild(t *testing.T) {
	spec := os.Getenv(envTxnChild)
	if spec == "" {
		t.Skip("helper process for TestTxnRouterChaos")
	}
	f := strings.Split(spec, ",")
	c := kafkatest.Start(t)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent holds it open
		os.Exit(3)
	}()
	if _, err := startTxnRouter(c, f[0], f[1], f[2], f[3], f[4] == kafkatest.RebalanceName(true), f[5] == "killable"); err != nil {
		fmt.Fprintln(os.Stderr, "txn child:", err)
		os.Exit(2)
	}
	fmt.Println("READY")
	select {}
}

// txnSlot is a place for one router member; its transactional id stays
// the same across the member's restarts, so that a restarted member aborts
// what its killed predecessor left open.
type txnSlot struct {
	id    string
	child *exec.Cmd
	stdin io.WriteCloser
	inner *txnRouterMember
}

// TestTxnRouterChaos: a consume-transform-produce router on safeack's
// transactional path, while a producer keeps writing: router processes are
// SIGKILLed and restarted, an in-process member is closed and restarted
// (rebalance storms), handlers fail and are redelivered. Afterwards a last
// member drains the input, and a read_committed reader of the output
// must see exactly one output per input record (by the input's
// partition@offset carried in a header): none missing, none twice, nothing
// of an aborted transaction or a failed delivery. Eager balancing (Sarama's
// default); TestTxnRouterChaosCooperative runs the same with
// cooperative-sticky.
func TestTxnRouterChaos(t *testing.T) { txnRouterChaos(t, false) }

// TestTxnRouterChaosCooperative is TestTxnRouterChaos with cooperative-sticky
// balancing: a member joining or leaving revokes only the partitions that
// move, each committing its outputs and position in a transaction before
// its revocation completes, while the other partitions go on.
func TestTxnRouterChaosCooperative(t *testing.T) { txnRouterChaos(t, true) }

func txnRouterChaos(t *testing.T, coop bool) {
	skipOnConsumerProtocol(t, "transactions are classic only (docs/group-protocols.md)")
	// On a real broker with a restart command (SAFEACK_CHAOS_RESTART), the
	// broker is restarted once, halfway through; the scenario then runs
	// alone, as TestBrokerRestart does, and otherwise beside the others.
	restart := os.Getenv(envRestart)
	if strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)) == "" {
		restart = "" // the embedded broker is not restarted
	}
	if restart == "" {
		t.Parallel()
	}
	c := kafkatest.Start(t)
	const parts = 4
	in, out, group := c.NewTopic(t, parts), c.NewTopic(t, parts), c.NewGroup(t)
	stream := uint64(15)
	if coop {
		stream = 16
	}
	rng := rand.New(rand.NewPCG(seed, stream))
	var err error
	t.Logf("seed %d, %s balancing", seed, kafkatest.RebalanceName(coop))

	// The producer: a record every millisecond or so, until stopped.
	var produced atomic.Int64
	stopProducing := make(chan struct{})
	producerDone := make(chan error, 1)
	go func() {
		cfg := c.SaramaConfig()
		cfg.Producer.Partitioner = sarama.NewRoundRobinPartitioner
		p, err := sarama.NewSyncProducer(c.Brokers(), cfg)
		if err != nil {
			producerDone <- err
			return
		}
		defer p.Close()
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				producerDone <- nil
				return
			default:
			}
			batch := make([]*sarama.ProducerMessage, 10)
			for j := range batch {
				batch[j] = &sarama.ProducerMessage{Topic: in, Value: sarama.StringEncoder("rec-" + strconv.Itoa(i*10+j))}
			}
			if err := p.SendMessages(batch); err != nil {
				// The broker may be restarting: what was written counts
				// (the check goes by the topic's end), so go on.
				time.Sleep(100 * time.Millisecond)
				continue
			}
			produced.Add(int64(len(batch)))
			time.Sleep(10 * time.Millisecond)
		}
	}()

	// A child sees the embedded broker as an external one: it is told
	// to use the same short sessions as the in-process member. Members of
	// one group with Sarama's defaults (10 s sessions, 60 s rebalance
	// timeouts) beside them would make kfake hold each join phase open
	// for the killed children, longer than the in-process member's
	// session, and drop its JoinGroup (docs/upstream/kfake-join-dropped.md).
	sessions := "default"
	if c.Embedded() {
		sessions = "killable"
	}
	startChild := func(s *txnSlot) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTxnChaosChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			kafkatest.EnvBrokers+"="+strings.Join(c.Brokers(), ","),
			envTxnChild+"="+strings.Join([]string{in, out, group, s.id, kafkatest.RebalanceName(coop), sessions}, ","),
		)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		s.child, s.stdin = cmd, stdin
	}
	killChild := func(s *txnSlot) {
		_ = s.child.Process.Signal(syscall.SIGKILL)
		_ = s.child.Wait()
		_ = s.stdin.Close()
		s.child = nil
	}
	// Transactional ids are per balancing: the two runs go side by side.
	b := kafkatest.RebalanceName(coop)
	slots := []*txnSlot{{id: "chaos-txn-a-" + b}, {id: "chaos-txn-b-" + b}, {id: "chaos-txn-inner-" + b}}
	defer func() {
		for _, s := range slots[:2] {
			if s.child != nil {
				killChild(s)
			}
		}
	}()
	startChild(slots[0])
	startChild(slots[1])
	slots[2].inner, err = startTxnRouter(c, in, out, group, slots[2].id, coop, c.Embedded())
	require.NoError(t, err)
	var aborted, committed, retried uint64
	collect := func(m *txnRouterMember) {
		st := m.pub.Stats()
		aborted += st.Aborted
		committed += st.Committed
		retried += st.Retried
	}

	admin, err := sarama.NewClusterAdmin(c.Brokers(), c.SaramaConfig())
	require.NoError(t, err)
	defer admin.Close()
	// Whether each closed in-process member left the group (see
	// noteLeft), followed beside the churn.
	var left sync.WaitGroup
	defer left.Wait()

	kills, storms := 0, 0
	begin := time.Now()
	for deadline := begin.Add(churn()); time.Now().Before(deadline); {
		if restart != "" && time.Since(begin) > churn()/2 {
			t.Log("restarting the broker")
			out, err := runRestart(restart)
			require.NoError(t, err, "restart command: %s", out)
			restart = ""
			continue
		}
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		switch s := slots[rng.IntN(len(slots))]; {
		case s.inner != nil:
			collect(s.inner)
			require.NoError(t, s.inner.stop())
			closed := s.inner.clientID // s.inner is replaced below
			left.Go(func() { noteLeft(t, c, admin, group, in, closed) })
			s.inner = restartTxnRouter(t, c, in, out, group, s.id, coop)
			storms++
		default:
			killChild(s)
			startChild(s)
			kills++
		}
	}
	close(stopProducing)
	require.NoError(t, <-producerDone)
	for _, s := range slots[:2] {
		killChild(s)
		kills++
	}
	t.Logf("churn over: %d records produced, %d SIGKILLs, %d closes of the in-process member, broker restarted: %v",
		produced.Load(), kills, storms, os.Getenv(envRestart) != "" && !c.Embedded())

	// The in-process member drains the input alone.
	hwm := endOffsets(t, c, in, parts)
	// What the group held when last read, for the failure message: a
	// drain that never ends says which partition stopped where.
	var lastHeld string
	nextReport := time.Now().Add(30 * time.Second)
	drained := kafkatest.Poll(5*time.Minute, 10*time.Millisecond, func() bool {
		if time.Now().After(nextReport) {
			// A drain this slow is worth a trace while it lasts: the group as
			// the broker sees it and what the member holds back.
			nextReport = time.Now().Add(30 * time.Second)
			t.Logf("drain after %v: held/end %s; %s; in-process member unclaimed %+v",
				time.Since(begin).Round(time.Second), lastHeld, describeTxnGroup(admin, group, in), slots[2].inner.sub.Unclaimed())
		}
		// Errors (a coordinator still loading after a restart) are retried.
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{in: {0, 1, 2, 3}})
		if err != nil {
			lastHeld = err.Error()
			return false
		}
		held := make([]string, 0, len(hwm))
		done := true
		for p, h := range hwm {
			b := resp.GetBlock(in, p)
			switch {
			case b == nil:
				held = append(held, fmt.Sprintf("%d: none/%d", p, h))
				done = false
			case b.Err != sarama.ErrNoError:
				held = append(held, fmt.Sprintf("%d: %v/%d", p, b.Err, h))
				done = false
			case b.Offset != h:
				held = append(held, fmt.Sprintf("%d: %d/%d", p, b.Offset, h))
				done = false
			}
		}
		lastHeld = strings.Join(held, ", ")
		return done
	})
	if !drained {
		if os.Getenv(envTxnChild) == "" {
			t.Logf("the in-process members' last log lines:\n%s", txnLogs.String())
		}
		t.Fatalf("timed out after 5m waiting for the group's commits to reach the end of the input: held/end %s; %s; in-process member: partitions %+v, unclaimed %+v, transactions %+v",
			lastHeld, describeTxnGroup(admin, group, in), slots[2].inner.sub.Stats(), slots[2].inner.sub.Unclaimed(), slots[2].inner.pub.Stats())
	}
	collect(slots[2].inner)
	require.NoError(t, slots[2].inner.stop())
	t.Logf("in-process member: %d transactions committed, %d aborted, %d retried in a new generation", committed, aborted, retried)

	outputs := map[string]int{}
	readCommittedOutputs(t, c, out, parts, func(m *sarama.ConsumerMessage) {
		outputs[headerValue(m, txnIDHeader)]++
	})

	var missing, twice []string
	inputs := 0
	for p, h := range hwm {
		for o := int64(0); o < h; o++ {
			id := fmt.Sprintf("%d@%d", p, o)
			inputs++
			switch n := outputs[id]; {
			case n == 0:
				missing = append(missing, id)
			case n > 1:
				twice = append(twice, fmt.Sprintf("%s×%d", id, n))
			}
			delete(outputs, id)
		}
	}
	t.Logf("%d inputs, %d missing, %d with more than one output, %d outputs of no input", inputs, len(missing), len(twice), len(outputs))
	require.Empty(t, missing, "inputs without output")
	require.Empty(t, twice, "inputs with more than one output")
	require.Empty(t, outputs, "outputs of no input")
}

// readCommittedOutputs reads the outputs of topic's parts partitions
// that a read_committed reader sees, from the start up to sentries it
// writes after everything else (a record "sentry" per partition), and
// calls each with every other record, one at a time.
func readCommittedOutputs(t *testing.T, c *kafkatest.Cluster, topic string, parts int, each func(*sarama.ConsumerMessage)) {
	t.Helper()
	cfg := c.SaramaConfig()
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	consumer, err := sarama.NewConsumer(c.Brokers(), cfg)
	require.NoError(t, err)
	defer consumer.Close()
	var mu sync.Mutex
	sentries := map[int32]bool{}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for p := range int32(parts) {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		pcs = append(pcs, pc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range pc.Messages() {
				mu.Lock()
				if string(m.Value) == "sentry" {
					sentries[m.Partition] = true
				} else {
					each(m)
				}
				mu.Unlock()
			}
		}()
	}
	for p := range int32(parts) {
		c.Produce(t, topic, kafkatest.Record{Partition: p, Value: []byte("sentry")})
	}
	kafkatest.WaitFor(t, 2*time.Minute, "the output read up to the sentries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sentries) == parts
	})
	for _, pc := range pcs {
		pc.AsyncClose()
	}
	wg.Wait()
}

// headerValue is the value of m's header key, "" without one.
func headerValue(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// endOffsets reads the end offset of each partition of topic, retrying
// while the cluster's metadata settles (after a broker restart).
func endOffsets(t *testing.T, c *kafkatest.Cluster, topic string, parts int) map[int32]int64 {
	t.Helper()
	client, err := sarama.NewClient(c.Brokers(), c.SaramaConfig())
	require.NoError(t, err)
	defer client.Close()
	ends := map[int32]int64{}
	kafkatest.WaitFor(t, 2*time.Minute, "the end offsets of "+topic, func() bool {
		if err := client.RefreshMetadata(topic); err != nil {
			return false
		}
		for p := range int32(parts) {
			off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return false
			}
			ends[p] = off
		}
		return true
	})
	return ends
}

// describeTxnGroup says what the broker reports of group: its state and
// each member's id, client and host with the partitions of topic assigned
// to it.
func describeTxnGroup(admin sarama.ClusterAdmin, group, topic string) string {
	return describeGroupMembers(admin, group, topic, func(id string, m *sarama.GroupMemberDescription, parts string) string {
		return fmt.Sprintf("%s (%s %s) %s", id, m.ClientId, m.ClientHost, parts)
	})
}

// noteLeft waits until the member whose client is clientID, closed, is out
// of group, and logs it when it is still listed after 20 s: the drain
// waits for such a member (the broker expires it), and a closed Subscriber
// still in its group would keep partitions from the live members. The
// embedded broker has been seen, twice in many runs, to keep such a member
// Stable, with its partitions, for minutes after its session ended (the
// first time no goroutine of the process heartbeated for it; a real
// broker expires a member whose heartbeats stop). There the test removes
// the member with a LeaveGroup of its own and says so, so that the drain
// measures safeack, not that fault.
func noteLeft(t *testing.T, c *kafkatest.Cluster, admin sarama.ClusterAdmin, group, topic, clientID string) {
	var last, memberID string
	if !kafkatest.Poll(20*time.Second, 200*time.Millisecond, func() bool {
		ds, err := admin.DescribeConsumerGroups([]string{group})
		if err != nil || len(ds) == 0 {
			last = fmt.Sprintf("DescribeGroups: %v", err)
			return false
		}
		for id, m := range ds[0].Members {
			if m.ClientId == clientID {
				last, memberID = "still a member as "+id, id
				return false
			}
		}
		return true
	}) {
		t.Logf("closed member %s still listed by the broker 20 s after its Close (%s): %s", clientID, last, describeTxnGroup(admin, group, topic))
		if c.Embedded() && memberID != "" {
			t.Logf("BROKER FAULT (embedded broker, kfake): a closed member kept past its session; removing it: %v",
				leaveFor(c, group, memberID))
		}
	}
}

// leaveFor sends the LeaveGroup of group's member memberID, as its own
// client would have.
func leaveFor(c *kafkatest.Cluster, group, memberID string) error {
	client, err := sarama.NewClient(c.Brokers(), c.SaramaConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	coordinator, err := client.Coordinator(group)
	if err != nil {
		return err
	}
	resp, err := coordinator.LeaveGroup(&sarama.LeaveGroupRequest{GroupId: group, MemberId: memberID})
	if err != nil {
		return err
	}
	if resp.Err != sarama.ErrNoError {
		return resp.Err
	}
	return nil
}

// restartTxnRouter starts the in-process member again, trying for up to a
// minute: a Subscribe that cannot reach any broker fails (as
// watermill-kafka's does), and the broker may be restarting.
func restartTxnRouter(t *testing.T, c *kafkatest.Cluster, in, out, group, txnID string, coop bool) *txnRouterMember {
	var m *txnRouterMember
	var last error
	if !kafkatest.Poll(time.Minute, time.Second, func() bool {
		m, last = startTxnRouter(c, in, out, group, txnID, coop, c.Embedded())
		if last != nil {
			t.Logf("in-process member did not start (trying again): %v", last)
		}
		return last == nil
	}) {
		t.Fatalf("in-process member did not start within a minute: %v", last)
	}
	return m
}
