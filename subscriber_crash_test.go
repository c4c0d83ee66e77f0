package safeack_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Environment of the helper consumer process.
const (
	envHelperConsumer = "SAFEACK_TEST_HELPER_CONSUMER" // "1" in the child
	envHelperTopic    = "SAFEACK_TEST_HELPER_TOPIC"
	envHelperGroup    = "SAFEACK_TEST_HELPER_GROUP"
	envHelperHold     = "SAFEACK_TEST_HELPER_HOLD"     // "p@o,p@o": records never acked
	envHelperEmbedded = "SAFEACK_TEST_HELPER_EMBEDDED" // "1" when the parent runs kfake
	envHelperNoTail   = "SAFEACK_TEST_HELPER_NO_TAIL"  // "1": DisableCompletedTail
	envHelperNewest   = "SAFEACK_TEST_HELPER_NEWEST"   // "1": Offsets.Initial is OffsetNewest
)

// TestHelperConsumerProcess is not a test: TestSubscriberCrashRedeliversOnlyAfterCommit
// re-executes the test binary to run it as a consumer process it can
// SIGKILL. It acks every record except the held ones, out of order, and
// prints "ACK <partition> <offset>" just before each Ack, and
// "ASSIGNED <partition>" once it owns a partition. It runs until it is
// killed, or until its stdin closes (the parent died).
func TestHelperConsumerProcess(t *testing.T) {
	if os.Getenv(envHelperConsumer) != "1" {
		t.Skip("helper process for TestSubscriberCrashRedeliversOnlyAfterCommit")
	}
	hold := make(map[po]bool)
	for _, s := range strings.Split(os.Getenv(envHelperHold), ",") {
		if k, ok := parsePO(s); ok {
			hold[k] = true
		}
	}
	// SAFEACK_KAFKA_BROKERS is set to the parent's cluster: Start uses it
	// and starts nothing.
	c := kafkatest.Start(t)
	sc := c.SaramaConfig()
	sc.Consumer.Return.Errors = true
	if os.Getenv(envHelperNewest) == "1" {
		sc.Consumer.Offsets.Initial = sarama.OffsetNewest
	}
	if os.Getenv(envHelperEmbedded) == "1" {
		// The parent's embedded broker accepts short sessions.
		kafkatest.KillableSessions(sc)
	}
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         os.Getenv(envHelperGroup),
		MaxInFlight:           32,
		Ordering:              safeack.Unordered,
		DrainTimeout:          500 * time.Millisecond,
		DisableCompletedTail:  os.Getenv(envHelperNoTail) == "1",
	}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: NewSubscriber:", err)
		os.Exit(2)
	}
	msgs, err := sub.Subscribe(context.Background(), os.Getenv(envHelperTopic))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: Subscribe:", err)
		os.Exit(2)
	}
	go func() {
		// The parent holds our stdin open; EOF means it is gone.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	var outMu sync.Mutex
	go func() {
		reported := make(map[int32]bool)
		for range time.Tick(10 * time.Millisecond) {
			for _, ps := range sub.Stats() {
				if !reported[ps.Partition] {
					reported[ps.Partition] = true
					outMu.Lock()
					fmt.Fprintf(os.Stdout, "ASSIGNED %d\n", ps.Partition)
					outMu.Unlock()
				}
			}
		}
	}()
	for m := range msgs {
		go func(m *message.Message) {
			k, ok := msgPO(m)
			if !ok {
				fmt.Fprintln(os.Stderr, "helper: message without partition/offset")
				return
			}
			if hold[k] {
				return // never acked: the crash leaves it unfinished
			}
			randomDelay(3 * time.Millisecond)
			outMu.Lock()
			// Wall-clock nanoseconds: the parent compares them with when
			// its broker saw each commit (same host, same clock).
			fmt.Fprintf(os.Stdout, "ACK %d %d %d\n", k.p, k.o, time.Now().UnixNano())
			outMu.Unlock()
			m.Ack()
		}(m)
	}
	select {} // killed by the parent
}

func parsePO(s string) (po, bool) {
	ps, os_, ok := strings.Cut(strings.TrimSpace(s), "@")
	if !ok {
		return po{}, false
	}
	p, err1 := strconv.ParseInt(ps, 10, 32)
	o, err2 := strconv.ParseInt(os_, 10, 64)
	if err1 != nil || err2 != nil {
		return po{}, false
	}
	return po{int32(p), o}, true
}

// TestSubscriberCrashRedeliversOnlyAfterCommit kills a consumer process with
// SIGKILL while it holds unacked records and has acked records after them,
// then lets a new subscriber of the same group consume the rest. Every
// produced record must be acked at least once across both, and the only
// records acked twice are at or after the committed offset of their
// partition at the time of the crash: everything below it was acked, and
// nothing above the oldest unacked record had been committed.
//
// With the completed tail on (the default) the records the dead member
// acked above a held one are in the commit metadata, and the survivor must
// not handle them again; with it off they are redelivered.
func TestSubscriberCrashRedeliversOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	for _, initial := range []int64{sarama.OffsetOldest, sarama.OffsetNewest} {
		t.Run("completed-tail/"+initialName(initial), func(t *testing.T) {
			t.Parallel()
			testCrash(t, true, initial)
		})
		t.Run("no-tail/"+initialName(initial), func(t *testing.T) {
			t.Parallel()
			testCrash(t, false, initial)
		})
	}
}

// testCrash runs the scenario with the group's partitions found at
// Consumer.Offsets.Initial: at OffsetNewest, with history before the child
// joins that no member may handle or commit below, and the records produced
// once the child owns its partitions.
func testCrash(t *testing.T, tail bool, initial int64) {
	const partitions, perPartition = 3, 150
	began := time.Now()
	c, topic, group := kafkatest.StartTopic(t, partitions)
	acks := newAckLog()    // the survivor's acks
	allAcks := newAckLog() // the child's and the survivor's, for the commit check
	watch := newCommitWatch(t, c, group, topic, allAcks)
	start := startAfterHistory(t, c, watch, topic, partitions, initial, 20)
	if initial == sarama.OffsetOldest {
		c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	}

	// Held by the child: partition 0 stops committing at 50, partition 1 at
	// 120, partition 2 completes; records acked after a held one are
	// completed but not committable.
	held := []po{{0, start + 50}, {1, start + 120}}
	end := start + perPartition
	wantCommitted := map[int32]int64{0: start + 50, 1: start + 120, 2: end}
	heldSet := map[po]bool{}
	for _, k := range held {
		heldSet[k] = true
	}

	// The child.
	var holdSpec []string
	for _, k := range held {
		holdSpec = append(holdSpec, k.String())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperConsumerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envHelperConsumer+"=1",
		kafkatest.EnvBrokers+"="+strings.Join(c.Brokers(), ","),
		envHelperTopic+"="+topic,
		envHelperGroup+"="+group,
		envHelperHold+"="+strings.Join(holdSpec, ","),
	)
	if c.Embedded() {
		cmd.Env = append(cmd.Env, envHelperEmbedded+"=1")
	}
	if !tail {
		cmd.Env = append(cmd.Env, envHelperNoTail+"=1")
	}
	if initial == sarama.OffsetNewest {
		cmd.Env = append(cmd.Env, envHelperNewest+"=1")
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		_ = stdin.Close()
	})

	var childMu sync.Mutex
	childAcks := make(map[po]int)
	assigned := make(map[int32]bool)
	var childOther []string
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			var k po
			var ns int64
			if _, err := fmt.Sscanf(line, "ACK %d %d %d", &k.p, &k.o, &ns); err == nil {
				childMu.Lock()
				childAcks[k]++
				childMu.Unlock()
				allAcks.addAt(k, time.Unix(0, ns))
				continue
			}
			var p int32
			if _, err := fmt.Sscanf(line, "ASSIGNED %d", &p); err == nil {
				childMu.Lock()
				assigned[p] = true
				childMu.Unlock()
				continue
			}
			childMu.Lock()
			childOther = append(childOther, line)
			childMu.Unlock()
		}
	}()
	childAcked := func(k po) bool {
		childMu.Lock()
		defer childMu.Unlock()
		return childAcks[k] > 0
	}

	if initial == sarama.OffsetNewest {
		kafkatest.WaitFor(t, 20*time.Second, "the child to own every partition", func() bool {
			childMu.Lock()
			defer childMu.Unlock()
			return len(assigned) == partitions
		})
		c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	}

	// Wait until the child committed the prefixes and reported the acks
	// behind them.
	watch.waitCommitted(t, wantCommitted, 20*time.Second)
	if !waitCond(10*time.Second, func() bool {
		for p := int32(0); p < partitions; p++ {
			for o := start; o < end; o++ {
				if !heldSet[po{p, o}] && !childAcked(po{p, o}) {
					return false
				}
			}
		}
		return true
	}) {
		childMu.Lock()
		n := len(childAcks)
		childMu.Unlock()
		t.Fatalf("child acked only %d records; stderr:\n%s", n, stderr.String())
	}
	if tail {
		// And until the commit metadata holds the whole completed tail, so
		// that the survivor can be held to skipping all of it.
		kafkatest.WaitFor(t, 10*time.Second, "the completed tails in the commit metadata", func() bool {
			co := c.CommittedOffsets(t, group, topic)
			for _, k := range held {
				tl, err := frontier.DecodeTail(co[k.p].Metadata, co[k.p].Offset)
				if err != nil {
					return false
				}
				for o := k.o + 1; o < end; o++ {
					if !tl.Contains(o) {
						return false
					}
				}
			}
			return true
		})
	}

	// Crash.
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed = true
	<-readerDone
	atCrash := watch.committed(t)
	t.Logf("%v: killed the child; committed at crash: %v", time.Since(began).Round(time.Millisecond), atCrash)
	for p, want := range wantCommitted {
		// Nothing else was acked, so nothing else can be committed: more
		// would pass a held record.
		require.Equal(t, want, atCrash[p], "partition %d: committed offset at crash", p)
	}

	// More records arrive; the survivor takes over.
	c.ProduceN(t, topic, partitions, partitions*50, nil)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = initial
		cfg.MaxInFlight = 32
		cfg.Ordering = safeack.Unordered
		cfg.DisableCompletedTail = !tail
	})
	msgs := mustSubscribe(t, sub, topic)
	handleAll(msgs, func(m *message.Message) {
		randomDelay(3 * time.Millisecond)
		if k, ok := msgPO(m); ok {
			allAcks.addAt(k, time.Now())
		}
		acks.ack(m)
	})

	// Every produced record acked at least once across both consumers.
	lost := func() []po {
		var out []po
		for _, p := range c.ProducedRecords(topic) {
			k := po{p.Partition, p.Offset}
			if !childAcked(k) && acks.count(k) == 0 {
				out = append(out, k)
			}
		}
		return out
	}
	if !waitCond(30*time.Second, func() bool { return len(lost()) == 0 }) {
		l := lost()
		t.Fatalf("%d records never acked after the crash, first: %v", len(l), l[:min(10, len(l))])
	}
	watch.waitCommitted(t, c.HighWaterMarks(t, topic), 15*time.Second)
	t.Logf("%v: the survivor finished", time.Since(began).Round(time.Millisecond))

	// The only records acked twice are at or after the crash-time commit.
	survivor := acks.snapshot()
	dups := 0
	childMu.Lock()
	for k, n := range childAcks {
		if n > 1 {
			t.Errorf("child acked %v %d times", k, n)
		}
	}
	for k, n := range survivor {
		total := n + childAcks[k]
		if total < 2 {
			continue
		}
		dups++
		if k.o < atCrash[k.p] {
			t.Errorf("record %v acked %d times but the crash-time commit of partition %d was %d: committed work was replayed",
				k, total, k.p, atCrash[k.p])
		} else if tail {
			t.Errorf("record %v acked %d times although the crash-time commit metadata recorded it completed", k, total)
		}
	}
	if len(childOther) > 0 {
		t.Logf("other child output: %q", childOther[:min(5, len(childOther))])
	}
	childMu.Unlock()
	for _, k := range held {
		require.Positive(t, survivor[k], "held record %v was not redelivered to the survivor", k)
	}
	if !tail {
		// Records acked by the child above a held one were not committed,
		// so they come again: the at-least-once price of the crash.
		require.Positive(t, dups, "expected redeliveries of records acked above the held ones")
	}
	require.Positive(t, watch.check(t), "no commit observed")
	t.Logf("%d records handled twice after the crash", dups)
}

// lockedBuffer is a strings.Builder safe for the exec package's copying
// goroutine and the test reading it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
