//go:build chaos

package chaos

import (
	"bufio"
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
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Environment of a share group member process of TestShareChaos.
const envShareChild = "SAFEACK_CHAOS_SHARE_CHILD" // "topic,group"

// shareLock is the acquisition lock of the scenario's share group: a killed
// member's records come back after it.
const shareLock = 3 * time.Second

// shareHandled is one handler run: 'A' about to return nil (the record is
// then accepted), 'P' a poison record failing (RejectPoison rejects it).
type shareHandled struct {
	proc  string
	kind  byte
	value string
	dc    int32
}

// startShareMember starts a router on a ShareSubscriber of group: handlers
// take up to 3 ms, poison records fail and are rejected. Every run is
// reported to out before the handler returns.
func startShareMember(c *kafkatest.Cluster, topic, group string, out func(kind byte, value string, dc int32)) (*message.Router, *safeack.ShareSubscriber, error) {
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:       c.Brokers(),
		ShareGroup:    group,
		InitialOffset: sarama.OffsetOldest,
		MaxInFlight:   16,
		// The kills raise delivery counts: keep records from being
		// rejected for it (the broker's limit is 10 here).
		MaxDeliveries: 10,
		DrainTimeout:  time.Second,
	}, nil)
	if err != nil {
		return nil, nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	if err != nil {
		return nil, nil, err
	}
	router.AddMiddleware(safeack.RejectPoison)
	router.AddConsumerHandler("share", topic, sub, func(msg *message.Message) error {
		// Work long beside a fetch's round trip, so that a kill lands
		// mid-batch: records in work, to come back after the lock.
		time.Sleep(time.Duration(5000+rand.IntN(25000)) * time.Microsecond)
		dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
		v := string(msg.Payload)
		if strings.HasPrefix(v, "poison-") {
			out('P', v, dc)
			return errors.New("poison")
		}
		out('A', v, dc)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case <-time.After(30 * time.Second):
		return nil, nil, errors.New("router did not start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return router, sub, sub.WaitReady(ctx)
}

// TestShareChaosChild is a member process of TestShareChaos; it reports
// every handler run on stdout.
func TestShareChaosChild(t *testing.T) {
	spec := os.Getenv(envShareChild)
	if spec == "" {
		t.Skip("share group member process of TestShareChaos")
	}
	f := strings.Split(spec, ",")
	c := kafkatest.Start(t)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent holds it open
		os.Exit(3)
	}()
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	out := func(kind byte, value string, dc int32) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "%c %s %d\n", kind, value, dc)
		_ = w.Flush() // before the handler returns: a SIGKILL loses nothing reported
	}
	if _, _, err := startShareMember(c, f[0], f[1], out); err != nil {
		fmt.Fprintln(os.Stderr, "share child:", err)
		os.Exit(2)
	}
	select {}
}

// TestShareChaos: members of one share group on one partition, two of them
// processes SIGKILLed mid-batch and restarted, one in-process member that
// lives throughout, while a producer writes records and, one in a hundred,
// poison records. Afterwards the in-process member drains the partition
// alone, and:
//
//   - every record was handled at least once (none lost), and the share
//     group ends with nothing left (DescribeShareGroupOffsets: lag 0);
//   - a record the in-process member answered (accepted, or rejected as
//     poison) was never delivered again: its acks were never lost, and a
//     rejected record is never redelivered;
//   - the killed members' records came back, their delivery count raised
//     (after the acquisition lock timeout);
//   - the members shared the partition's work: the in-process member and
//     the processes each handled records.
func TestShareChaos(t *testing.T) {
	skipOnConsumerProtocol(t, "share groups are not consumer groups")
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": strconv.FormatInt(shareLock.Milliseconds(), 10),
		"share.record.lock.sweep.interval.ms": "100",
		"group.share.delivery.count.limit":    "10",
	})))
	requireShares(t, c)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	if !c.Embedded() {
		setGroupLock(t, c, group)
	}
	rng := rand.New(rand.NewPCG(seed, 26))
	t.Logf("seed %d", seed)
	fig := figures{Scenario: "share", Broker: "embedded", Generations: -1, Consumers: 3}
	if !c.Embedded() {
		fig.Broker = "kafka " + strings.Join(c.Brokers(), ",")
	}
	begin := time.Now()

	var mu sync.Mutex
	var runs []shareHandled
	record := func(proc string) func(kind byte, value string, dc int32) {
		return func(kind byte, value string, dc int32) {
			mu.Lock()
			runs = append(runs, shareHandled{proc, kind, value, dc})
			mu.Unlock()
		}
	}

	// The producer: ten records every 20 ms, one in a hundred poison.
	var produced atomic.Int64
	stopProducing := make(chan struct{})
	producerDone := make(chan error, 1)
	go func() {
		p, err := sarama.NewSyncProducer(c.Brokers(), c.SaramaConfig())
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
				n := i*10 + j
				v := "rec-" + strconv.Itoa(n)
				if n%100 == 99 {
					v = "poison-" + strconv.Itoa(n)
				}
				batch[j] = &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(v)}
			}
			if err := p.SendMessages(batch); err != nil {
				producerDone <- err
				return
			}
			produced.Add(int64(len(batch)))
			time.Sleep(20 * time.Millisecond)
		}
	}()

	type child struct {
		name    string
		cmd     *exec.Cmd
		stdin   io.WriteCloser
		done    chan struct{}
		handled atomic.Int64 // records this process reported handling
	}
	generation := 0
	start := func(slot int) *child {
		generation++
		ch := &child{name: fmt.Sprintf("p%d.%d", slot, generation), done: make(chan struct{})}
		cmd := exec.Command(os.Args[0], "-test.run=^TestShareChaosChild$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			kafkatest.EnvBrokers+"="+strings.Join(c.Brokers(), ","),
			envShareChild+"="+topic+","+group,
		)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		ch.cmd, ch.stdin = cmd, stdin
		out := record(ch.name)
		go func() {
			defer close(ch.done)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) != 3 || len(f[0]) != 1 {
					continue // a test binary's own output
				}
				dc, err := strconv.Atoi(f[2])
				if err != nil {
					continue
				}
				out(f[0][0], f[1], int32(dc))
				ch.handled.Add(1)
			}
		}()
		return ch
	}
	kill := func(ch *child) {
		_ = ch.cmd.Process.Signal(syscall.SIGKILL)
		<-ch.done
		_ = ch.cmd.Wait()
		_ = ch.stdin.Close()
	}
	children := []*child{start(0), start(1)}
	defer func() {
		for _, ch := range children {
			if ch != nil {
				kill(ch)
			}
		}
	}()
	router, inner, err := startShareMember(c, topic, group, record("inner"))
	require.NoError(t, err)
	defer func() { _ = router.Close() }()

	for deadline := begin.Add(churn()); time.Now().Before(deadline) || fig.Crashes < 2; {
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		slot := rng.IntN(len(children))
		// Killed mid-batch: once it has records in work, not while the
		// process is still starting (slow on a loaded machine), when it
		// holds nothing that could come back.
		ch := children[slot]
		kafkatest.Poll(30*time.Second, 20*time.Millisecond, func() bool { return ch.handled.Load() > 0 })
		kill(children[slot])
		children[slot] = start(slot)
		fig.Crashes++
	}
	close(stopProducing)
	require.NoError(t, <-producerDone)
	for i, ch := range children {
		kill(ch)
		children[i] = nil
		fig.Crashes++
	}
	total := int(produced.Load())
	fig.Records = total
	t.Logf("churn over: %d records produced, %d SIGKILLs", total, fig.Crashes)

	// The in-process member drains alone; the killed members' records
	// come back after the acquisition lock.
	handledAll := func() (missing []string) {
		mu.Lock()
		defer mu.Unlock()
		seen := make(map[string]bool, total)
		for _, r := range runs {
			seen[r.value] = true
		}
		for n := range total {
			v := "rec-" + strconv.Itoa(n)
			if n%100 == 99 {
				v = "poison-" + strconv.Itoa(n)
			}
			if !seen[v] {
				missing = append(missing, v)
			}
		}
		return missing
	}
	if !kafkatest.Poll(2*time.Minute, 50*time.Millisecond, func() bool { return len(handledAll()) == 0 }) {
		missing := handledAll()
		fig.Lost = len(missing)
		t.Errorf("%d records never handled, first %v", len(missing), missing[:min(10, len(missing))])
	}
	if !kafkatest.Poll(time.Minute, 100*time.Millisecond, func() bool { return shareLag(t, c, group, topic) == 0 }) {
		t.Errorf("the share group still has %d records to deliver after the drain", shareLag(t, c, group, topic))
	}
	require.NoError(t, router.Close())

	// Judge every run.
	mu.Lock()
	defer mu.Unlock()
	answered := map[string]int32{} // by the in-process member: value -> delivery count
	count := map[string]int{}
	perProc := map[string]int{}
	redelivered := 0
	for _, r := range runs {
		count[r.value]++
		perProc[strings.SplitN(r.proc, ".", 2)[0]]++
		if r.dc > 1 {
			redelivered++
		}
		if r.proc == "inner" {
			answered[r.value] = max(answered[r.value], r.dc)
		}
	}
	var ackErrors uint64
	for _, st := range inner.Stats() {
		ackErrors += st.AckErrors
	}
	for _, r := range runs {
		if d, ok := answered[r.value]; ok && r.dc > d {
			if ackErrors == 0 {
				fig.Violations++
				t.Errorf("%s delivered again (%s, delivery %d) after the in-process member answered it at delivery %d", r.value, r.proc, r.dc, d)
			}
		}
	}
	for _, n := range count {
		if n > 1 {
			fig.Twice++
		}
	}
	if ackErrors > 0 {
		t.Logf("the in-process member had %d acknowledgements refused (held past the lock): its answers are not judged", ackErrors)
	}
	t.Logf("handler runs: %d (%v), records handled more than once: %d, deliveries with a delivery count above 1: %d", len(runs), perProc, fig.Twice, redelivered)
	require.Positive(t, perProc["inner"], "the in-process member got no work")
	require.Positive(t, perProc["p0"]+perProc["p1"], "the member processes got no work")
	require.Positive(t, redelivered, "no record of a killed member came back with a higher delivery count")
	fig.Elapsed = time.Since(begin)
	fig.Passed = !t.Failed()
	report(fig)
}

// requireShares skips the scenario on a cluster without share groups.
func requireShares(t *testing.T, c *kafkatest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := safeack.CheckShareGroups(ctx, c.Brokers()); errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		t.Skipf("%v: needs Kafka 4.2+ with share groups enabled", err)
	} else {
		require.NoError(t, err)
	}
}

// setGroupLock shortens the group's acquisition lock on a real cluster
// (the broker's default is 30 s), so the killed members' records come back
// within the scenario.
func setGroupLock(t *testing.T, c *kafkatest.Cluster, group string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	v := strconv.FormatInt(shareLock.Milliseconds(), 10)
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = "share.record.lock.duration.ms", &v
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(context.Background(), cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Logf("share.record.lock.duration.ms not set on the group (%v): killed members' records come back after the broker's lock", err)
	}
}

// shareLag is the group's lag on the topic's partition 0 as the broker
// describes it (DescribeShareGroupOffsets), or -1 when it cannot tell.
func shareLag(t *testing.T, c *kafkatest.Cluster, group, topic string) int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	if err != nil {
		return -1
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group
	tp := kmsg.NewDescribeShareGroupOffsetsRequestGroupTopic()
	tp.Topic = topic
	tp.Partitions = []int32{0}
	g.Topics = append(g.Topics, tp)
	req.Groups = append(req.Groups, g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Groups) != 1 || len(resp.Groups[0].Topics) != 1 || len(resp.Groups[0].Topics[0].Partitions) != 1 {
		return -1
	}
	p := resp.Groups[0].Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		return -1
	}
	return p.Lag
}
