//go:build chaos

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
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

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// memberSpec describes one consumer of a scenario, in-process or a child
// process (which gets it as JSON).
type memberSpec struct {
	ID          int
	Brokers     []string
	Topic       string
	Group       string
	Session     time.Duration
	Cooperative bool
	// Initial is Consumer.Offsets.Initial; 0 keeps the harness's
	// (OffsetOldest).
	Initial int64
	Work    workSpec
	// Tap: report every OffsetCommit request the consumer sends (see
	// commitTap); set on a real cluster, whose broker side cannot be
	// observed.
	Tap bool
	// Protocol is the member's group protocol; on the consumer protocol
	// the coordinator assigns, and sets the session timeout and the
	// heartbeat (see scenario.shortenConsumerSessions).
	Protocol safeack.GroupProtocol
	// TopicID is Topic's id: OffsetCommit v10 (consumer protocol) names
	// topics by id, and the tap must know it.
	TopicID [16]byte
}

// workSpec is what a handler does with a record: sleep up to Max; one
// record in SlowEvery sleeps between SlowMin and SlowMax instead (a slow
// head that holds the committed prefix back while later records complete);
// one delivery in NackEvery is nacked (and redelivered). When HoldFor is
// set, every delivery of a record at offset HoldOffset (of any partition)
// sleeps HoldFor instead: at OffsetNewest, the first record of each
// partition (see scenario.begin).
type workSpec struct {
	Max              time.Duration
	SlowEvery        int
	SlowMin, SlowMax time.Duration
	NackEvery        int
	HoldOffset       int64
	HoldFor          time.Duration
}

var defaultWork = workSpec{
	Max:       4 * time.Millisecond,
	SlowEvery: 300,
	SlowMin:   100 * time.Millisecond,
	SlowMax:   600 * time.Millisecond,
	NackEvery: 100,
}

func (w workSpec) sleep(offset int64) {
	if w.HoldFor > 0 && offset == w.HoldOffset {
		time.Sleep(w.HoldFor)
		return
	}
	d := rand.N(w.Max + 1)
	if w.SlowEvery > 0 && rand.IntN(w.SlowEvery) == 0 {
		d = w.SlowMin + rand.N(w.SlowMax-w.SlowMin+1)
	}
	time.Sleep(d)
}

func (w workSpec) nack() bool { return w.NackEvery > 0 && rand.IntN(w.NackEvery) == 0 }

// newMember builds the Subscriber of one member. base is a harness Sarama
// config (kafkatest.Cluster.SaramaConfig). A non-nil tap sees the
// OffsetCommit requests it sends.
func newMember(spec memberSpec, base *sarama.Config, logger watermill.LoggerAdapter, tap *commitTap) (*safeack.Subscriber, error) {
	sc := base
	sc.ClientID = fmt.Sprintf("chaos-member-%d", spec.ID)
	sc.Consumer.Return.Errors = true
	sc.Consumer.Group.Session.Timeout = spec.Session
	// Frequent heartbeats: members learn of a rebalance quickly.
	sc.Consumer.Group.Heartbeat.Interval = min(300*time.Millisecond, spec.Session/3)
	sc.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	// A JoinGroup may wait up to Rebalance.Timeout, and Sarama gives it
	// only Net.ReadTimeout. 15 s rather than the default 30 s: the
	// embedded broker (kfake) can drop a member whose session timer runs
	// out while it waits in JoinGroup, and then never answers that
	// JoinGroup; the member only notices at this timeout.
	sc.Net.ReadTimeout = 15 * time.Second
	if spec.Initial != 0 {
		sc.Consumer.Offsets.Initial = spec.Initial
	}
	if spec.Cooperative {
		sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	if spec.Protocol == safeack.GroupProtocolConsumer {
		leaveToCoordinator(sc)
	}
	if tap != nil {
		tap.install(sc)
	}
	return safeack.NewSubscriber(safeack.SubscriberConfig{
		GroupProtocol:          spec.Protocol,
		Brokers:                spec.Brokers,
		OverwriteSaramaConfig:  sc,
		ConsumerGroup:          spec.Group,
		Ordering:               safeack.OrderByKey,
		MaxInFlight:            64,
		MaxPendingPerPartition: 5_000,
		NackResendSleep:        20 * time.Millisecond,
		ReconnectRetrySleep:    200 * time.Millisecond,
		DrainTimeout:           2 * time.Second,
		CommitInterval:         200 * time.Millisecond,
	}, logger)
}

// sink receives a consumer's handler events. ack is called just before
// Message.Ack with the time of the ack, and returns what to do just after
// it (a child process prints the ack line then: a line is never printed
// for an ack that did not happen).
type sink interface {
	start(p int32, o int64, key string, assign uint64)
	ack(p int32, o int64, key string) (after func())
	nack(p int32, o int64, key string)
}

// consume hands every message of sub's subscription to its own handler
// goroutine, as a Watermill router does. done closes once the subscription
// channel closed and every handler returned.
func consume(ctx context.Context, sub *safeack.Subscriber, topic string, s sink, work workSpec) (done <-chan struct{}, err error) {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		var wg sync.WaitGroup
		for m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(m, sub, topic, s, work)
			}()
		}
		wg.Wait()
	}()
	return ch, nil
}

func handle(m *message.Message, sub *safeack.Subscriber, topic string, s sink, work workSpec) {
	p, ok1 := safeack.MessagePartitionFromCtx(m.Context())
	o, ok2 := safeack.MessagePartitionOffsetFromCtx(m.Context())
	if !ok1 || !ok2 {
		panic("chaos: message without partition/offset in its context")
	}
	k, _ := safeack.MessageKeyFromCtx(m.Context())
	key := string(k)
	s.start(p, o, key, assignment(sub, topic, p))
	work.sleep(o)
	if work.nack() {
		s.nack(p, o, key)
		m.Nack()
		return
	}
	after := s.ack(p, o, key)
	m.Ack()
	after()
}

// assignment returns how many times sub has been assigned partition p:
// read when a handler starts, it names the assignment the message came
// from (a new assignment is counted before it delivers anything, and an
// assignment's handlers start before its drain ends).
func assignment(sub *safeack.Subscriber, topic string, p int32) uint64 {
	for _, pt := range sub.Totals() {
		if pt.Topic == topic && pt.Partition == p {
			return pt.Assignments
		}
	}
	return 0
}

// ---------------------------------------------------------------- child --

// TestChaosChild is not a test: TestCrashLoop re-executes the test binary
// to run it as a consumer process it can SIGKILL. It reports handler
// events on stdout (see lineSink), closes its Subscriber when stdin closes,
// prints BYE and exits.
func TestChaosChild(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("consumer process of TestCrashLoop")
	}
	var spec memberSpec
	if err := json.Unmarshal([]byte(os.Getenv(envChildSpec)), &spec); err != nil {
		t.Fatalf("child spec: %v", err)
	}
	// SAFEACK_KAFKA_BROKERS is the parent's cluster: Start starts nothing.
	c := kafkatest.Start(t)
	// Debug: session starts (generation, partitions) and drains. Kept in
	// the parent's buffer and shown when the scenario fails.
	logger := watermill.NewStdLoggerWithOut(os.Stderr, true, false)
	if os.Getenv(envSaramaLog) != "" {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
	}
	out := &lineSink{w: bufio.NewWriter(os.Stdout)}
	var tap *commitTap
	if spec.Tap {
		tap = &commitTap{topic: spec.Topic, topicID: spec.TopicID, sent: func(c sentCommit) { out.line("%s", commitLine(out.seq.Add(1), c)) }}
	}
	sub, err := newMember(spec, c.SaramaConfig(), logger, tap)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	go func() {
		// SIGUSR1: print every goroutine's stack and go on (the parent
		// asks when a stop takes long).
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1)
		for range sig {
			buf := make([]byte, 8<<20)
			buf = buf[:runtime.Stack(buf, true)]
			fmt.Fprintf(os.Stderr, "%s SIGUSR1: goroutines:\n%s\n", time.Now().Format("15:04:05.000"), buf)
		}
	}()
	go func() {
		// What the member owns, every two seconds: where a stall shows.
		for range time.Tick(2 * time.Second) {
			var b strings.Builder
			for _, ps := range sub.Stats() {
				fmt.Fprintf(&b, " p%d[safe %d marked %d confirmed %d delivered %d hwm %d inflight %d retained %d waiting %d stuck %v paused %v]",
					ps.Partition, ps.SafeOffset, ps.MarkedOffset, ps.ConfirmedOffset, ps.Delivered, ps.HighWaterMark,
					ps.InFlight, ps.Retained, ps.WaitingForKey, ps.Stuck, ps.Paused)
			}
			fmt.Fprintf(os.Stderr, "%s stats:%s\n", time.Now().Format("15:04:05.000"), b.String())
		}
	}()
	done, err := consume(context.Background(), sub, spec.Topic, out, spec.Work)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	go func() {
		// The partitions the member owns, whenever they change: at
		// OffsetNewest the parent starts producing only once the group
		// owns every partition.
		last := ""
		for range time.Tick(20 * time.Millisecond) {
			if f := ownedField(ownedPartitions(sub, spec.Topic)); f != last {
				last = f
				out.line("O %d %s", out.seq.Add(1), f)
			}
		}
	}()
	// The parent closes our stdin to stop us, or dies.
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = sub.Close()
	<-done
	out.line("BYE")
}

// lineSink writes handler events as lines:
//
//	S <seq> <partition> <offset> <assignment> <key>
//	A <seq> <partition> <offset> <unix-nanos> <key>
//	N <seq> <partition> <offset> <key>
//
// seq orders the process's events; an empty key is written as "-". The
// child also writes the partitions it owns whenever they change, as
// "O <seq> <p,p,...>" ("-" for none; see ownedField), and, on a real
// cluster, each commit request it sends (see commitLine).
type lineSink struct {
	mu  sync.Mutex
	w   *bufio.Writer
	seq atomic.Uint64
}

func keyField(k string) string {
	if k == "" {
		return "-"
	}
	return k
}

func (s *lineSink) line(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format+"\n", args...)
	_ = s.w.Flush()
}

func (s *lineSink) start(p int32, o int64, key string, assign uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, "S %d %d %d %d %s\n", s.seq.Add(1), p, o, assign, keyField(key))
	_ = s.w.Flush()
}

// ack holds the sink from before the ack until its line is written, so
// that the line follows the ack at once: a process SIGKILLed between the
// two loses an ack its commits may already cover (the checks would see a
// commit past an unacked record), and waiting for the sink behind other
// handlers' lines made that window wide on a loaded machine (seen on the
// consumer protocol, whose first commits come quickly). The commit lines
// of the tap wait too: none is written between an ack and its line.
func (s *lineSink) ack(p int32, o int64, key string) func() {
	s.mu.Lock()
	seq := s.seq.Add(1)
	at := time.Now()
	return func() {
		defer s.mu.Unlock()
		fmt.Fprintf(s.w, "A %d %d %d %d %s\n", seq, p, o, at.UnixNano(), keyField(key))
		_ = s.w.Flush()
	}
}

func (s *lineSink) nack(p int32, o int64, key string) {
	s.line("N %d %d %d %s", s.seq.Add(1), p, o, keyField(key))
}

// ownedPartitions returns the partitions of topic that sub owns now, in
// order. A partition shows in Stats once its claim started, that is once
// Sarama resolved where fetching starts.
func ownedPartitions(sub *safeack.Subscriber, topic string) []int32 {
	var out []int32
	for _, ps := range sub.Stats() {
		if ps.Topic == topic {
			out = append(out, ps.Partition)
		}
	}
	return out
}

// ownedField writes a set of partitions as "p,p,..." ("-" when empty), and
// parseOwned reads it back.
func ownedField(ps []int32) string {
	if len(ps) == 0 {
		return "-"
	}
	f := make([]string, len(ps))
	for i, p := range ps {
		f[i] = strconv.Itoa(int(p))
	}
	return strings.Join(f, ",")
}

func parseOwned(s string) ([]int32, bool) {
	if s == "-" {
		return nil, true
	}
	var out []int32
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, false
		}
		out = append(out, int32(p))
	}
	return out, true
}

// parseLine turns a child's line into an event of consumer id.
func parseLine(id int, line string) (event, bool) {
	f := strings.Fields(line)
	if len(f) < 5 {
		return event{}, false
	}
	e := event{consumer: id}
	switch f[0] {
	case "S", "A":
		if len(f) != 6 {
			return event{}, false
		}
	case "N":
		if len(f) != 5 {
			return event{}, false
		}
	default:
		return event{}, false
	}
	e.kind = f[0][0]
	var err error
	var p int64
	if e.seq, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return event{}, false
	}
	if p, err = strconv.ParseInt(f[2], 10, 32); err != nil {
		return event{}, false
	}
	e.p = int32(p)
	if e.o, err = strconv.ParseInt(f[3], 10, 64); err != nil {
		return event{}, false
	}
	key := f[len(f)-1]
	if key != "-" {
		e.key = key
	}
	switch e.kind {
	case 'S':
		if e.assign, err = strconv.ParseUint(f[4], 10, 64); err != nil {
			return event{}, false
		}
	case 'A':
		ns, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil {
			return event{}, false
		}
		e.at = time.Unix(0, ns)
	}
	return e, true
}

// child is one consumer process.
type child struct {
	id       int
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	stderr   *tailBuffer
	read     chan struct{} // stdout fully read
	exited   chan struct{} // Wait returned
	waitErr  error
	bye      atomic.Bool
	stopping atomic.Bool  // killed or stopped on purpose
	goneAt   atomic.Int64 // when it was killed or asked to stop (Unix ns)
	other    atomic.Int64
	sc       *scenario

	mu    sync.Mutex
	owned []int32 // the partitions the process last said it owns
}

// ownedNow returns the partitions the process last said it owns.
func (ch *child) ownedNow() []int32 {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return slices.Clone(ch.owned)
}

// spawn starts a consumer process reporting into sc's ledger.
func (sc *scenario) spawn() *child {
	sc.t.Helper()
	ch, err := sc.spawnE()
	if err != nil {
		sc.t.Fatal(err)
	}
	return ch
}

// spawnE is spawn for goroutines other than the test's: it returns its
// error.
func (sc *scenario) spawnE() (*child, error) {
	t := sc.t
	spec := sc.spec()
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChaosChild$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envChild+"=1",
		envChildSpec+"="+string(js),
		kafkatest.EnvBrokers+"="+strings.Join(sc.c.Brokers(), ","),
	)
	ch := &child{id: spec.ID, cmd: cmd, stderr: newTailBuffer(4 << 20), read: make(chan struct{}), exited: make(chan struct{})}
	cmd.Stderr = ch.stderr
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting consumer process: %w", err)
	}
	sc.changed()
	sc.mu.Lock()
	sc.fig.Consumers++
	sc.children = append(sc.children, ch)
	sc.mu.Unlock()
	ch.sc = sc
	sc.note("consumer process %d started (pid %d)", ch.id, cmd.Process.Pid)
	go func() {
		defer close(ch.read)
		r := bufio.NewScanner(stdout)
		r.Buffer(make([]byte, 64<<10), 1<<20)
		for r.Scan() {
			line := r.Text()
			if e, ok := parseLine(ch.id, line); ok {
				sc.led.add(e)
			} else if f := strings.Fields(line); len(f) == 3 && f[0] == "O" {
				if ps, ok := parseOwned(f[2]); ok {
					ch.mu.Lock()
					ch.owned = ps
					ch.mu.Unlock()
				} else {
					ch.other.Add(1)
				}
			} else if c, ok := parseCommitLine(line); ok {
				sc.sent.add(ch.id, c)
			} else if line == "BYE" {
				ch.bye.Store(true)
			} else {
				ch.other.Add(1)
			}
		}
	}()
	go func() {
		<-ch.read
		ch.waitErr = cmd.Wait()
		close(ch.exited)
		if !ch.stopping.Load() {
			s := ch.stderr.String()
			t.Errorf("consumer process %d exited on its own: %v; its stderr ends with:\n%s", ch.id, ch.waitErr, s[max(0, len(s)-8192):])
		}
	}()
	return ch, nil
}

// kill SIGKILLs the process and waits for it.
func (ch *child) kill() {
	if !ch.stopping.Load() {
		ch.sc.note("consumer process %d killed", ch.id)
	}
	ch.stopping.Store(true)
	ch.goneAt.CompareAndSwap(0, time.Now().UnixNano())
	_ = ch.cmd.Process.Signal(syscall.SIGKILL)
	ch.sc.changed()
	<-ch.exited
}

// stop closes the process's stdin, so that it closes its Subscriber and
// exits, and waits up to timeout; it reports whether the process said BYE
// and exited cleanly.
func (ch *child) stop(timeout time.Duration) error {
	ch.sc.note("consumer process %d asked to stop", ch.id)
	ch.sc.changed()
	defer func() { ch.sc.note("consumer process %d gone", ch.id); ch.sc.changed() }()
	ch.stopping.Store(true)
	ch.goneAt.CompareAndSwap(0, time.Now().UnixNano())
	_ = ch.stdin.Close()
	slow := time.NewTimer(timeout / 3)
	defer slow.Stop()
	select {
	case <-ch.exited:
	case <-slow.C:
		// Slow to stop: have it print its goroutines, for the record.
		ch.sc.note("consumer process %d slow to stop: SIGUSR1", ch.id)
		_ = ch.cmd.Process.Signal(syscall.SIGUSR1)
	}
	select {
	case <-ch.exited:
	case <-time.After(timeout - timeout/3):
		// SIGQUIT: the Go runtime prints every goroutine's stack on
		// stderr and exits.
		_ = ch.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-ch.exited:
		case <-time.After(10 * time.Second):
			_ = ch.cmd.Process.Signal(syscall.SIGKILL)
			<-ch.exited
		}
		return fmt.Errorf("consumer process %d did not stop within %v; its goroutines at SIGQUIT are in %s",
			ch.id, timeout, saveArtifact(fmt.Sprintf("chaos-consumer-%d-%d-stderr.txt", ch.id, ch.cmd.Process.Pid), ch.stderr.String()))
	}
	if ch.waitErr != nil || !ch.bye.Load() {
		s := ch.stderr.String()
		return fmt.Errorf("consumer process %d: exit %v, bye %v; stderr ends with:\n%s", ch.id, ch.waitErr, ch.bye.Load(), s[max(0, len(s)-8192):])
	}
	return nil
}

// --------------------------------------------------------------- member --

// member is an in-process consumer.
type member struct {
	id     int
	sub    *safeack.Subscriber
	tap    *commitTap // real cluster only
	done   <-chan struct{}
	left   chan struct{} // closed once leave returned
	goneAt atomic.Int64  // when it was asked to leave (Unix ns)
	once   sync.Once
	sc     *scenario
}

// join starts an in-process member reporting into sc's ledger.
func (sc *scenario) join() *member {
	sc.t.Helper()
	m, err := sc.joinE()
	if err != nil {
		sc.t.Fatal(err)
	}
	return m
}

// joinE is join for goroutines other than the test's: it returns its error.
func (sc *scenario) joinE() (*member, error) {
	spec := sc.spec()
	var tap *commitTap
	if spec.Tap {
		tap = &commitTap{topic: spec.Topic, topicID: spec.TopicID, sent: func(c sentCommit) { sc.sent.add(spec.ID, c) }}
	}
	sub, err := newMember(spec, sc.c.SaramaConfig(), sc.logger, tap)
	if err != nil {
		return nil, fmt.Errorf("NewSubscriber: %w", err)
	}
	done, err := consume(context.Background(), sub, spec.Topic, memberSink{l: sc.led, id: spec.ID}, spec.Work)
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("Subscribe: %w", err)
	}
	m := &member{id: spec.ID, sub: sub, tap: tap, done: done, left: make(chan struct{}), sc: sc}
	sc.note("member %d joined", m.id)
	sc.changed()
	sc.mu.Lock()
	sc.fig.Consumers++
	sc.members = append(sc.members, m)
	sc.mu.Unlock()
	return m, nil
}

// ownedNow returns the partitions the member owns now.
func (m *member) ownedNow() []int32 { return ownedPartitions(m.sub, m.sc.topic) }

// leave closes the member's Subscriber (drain, final commit, leave the
// group) and waits for its handlers.
func (m *member) leave() {
	m.once.Do(func() {
		m.sc.note("member %d leaving", m.id)
		m.goneAt.Store(time.Now().UnixNano())
		m.sc.changed()
		defer func() { m.sc.note("member %d left", m.id); m.sc.changed() }()
		_ = m.sub.Close()
		<-m.done
		close(m.left)
	})
	<-m.left
}

// memberSink records an in-process member's events in the ledger directly,
// ordered by the ledger's sequence.
type memberSink struct {
	l  *ledger
	id int
}

func (s memberSink) start(p int32, o int64, key string, assign uint64) {
	s.l.record(event{consumer: s.id, kind: 'S', p: p, o: o, key: key, assign: assign})
}

func (s memberSink) ack(p int32, o int64, key string) func() {
	s.l.record(event{consumer: s.id, kind: 'A', p: p, o: o, key: key, at: time.Now()})
	return func() {}
}

func (s memberSink) nack(p int32, o int64, key string) {
	s.l.record(event{consumer: s.id, kind: 'N', p: p, o: o, key: key})
}
