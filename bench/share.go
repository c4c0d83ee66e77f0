package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
)

// The share workloads (issue 26): safeack's ShareSubscriber (a Kafka share
// group, KIP-932) beside safeack's consumer-group Subscriber on the same
// records, both read through a message.Router as an application would. A
// share contender runs each member in a child process of this binary
// (-share-member), as separate instances of a service would; the
// consumer-group row runs in this process, as every other safeack row.

// shareGroupLabel is the consumer-group row of the share workloads, the
// row ×group divides by.
const shareGroupLabel = "safeack/unordered (router)"

// shareConc is MaxInFlight of every row: the default of both subscribers
// (for a share member, the records it takes per poll).
const shareConc = safeack.DefaultMaxInFlight

// errPoison is what the bench handler returns for a poison record.
var errPoison = errors.New("bench: poison record")

func shareCases(t *topicSpec, work []time.Duration, poisonEvery int) []*caseSpec {
	share := func(label string, processes int, set map[string]string) *caseSpec {
		return &caseSpec{label: label, kind: kindShare, topic: t, conc: shareConc, work: work, members: processes, shareSet: set, poisonEvery: poisonEvery}
	}
	javaShare := func(label string, processes int, props map[string]string) *caseSpec {
		c := share(label, processes, props)
		c.javaShare = true
		return c
	}
	cases := []*caseSpec{
		{label: shareGroupLabel, kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: shareConc, work: work, share: true, poisonEvery: poisonEvery},
		share("share/1 process", 1, nil),
		// What each part of the defaults buys: the hand-out before them
		// (one member, polls of MaxInFlight), then each part alone.
		share("share/1, 1 member × polls of 64", 1, map[string]string{"Members": "1", "MaxPollRecords": strconv.Itoa(shareConc)}),
		share("share/1, 2 members × polls of 64", 1, map[string]string{"Members": "2", "MaxPollRecords": strconv.Itoa(shareConc)}),
		share("share/1, 1 member × polls of 256", 1, map[string]string{"Members": "1"}),
		// Whole stored batches per fetch, as Kafka's own consumer does by
		// default (AcquireMode 1 = ShareAcquireBatchOptimized).
		share("share/1, batch-optimized", 1, map[string]string{"AcquireMode": strconv.Itoa(int(safeack.ShareAcquireBatchOptimized))}),
		share("share/3 processes", 3, nil),
		// Kafka's own Java share consumer, the same way (jshare.go): its
		// defaults, then polls held to what a Go member takes.
		javaShare("java-share/1 process", 1, nil),
		javaShare("java-share/1, polls of 256 (record_limit)", 1, map[string]string{"share.acquire.mode": "record_limit", "max.poll.records": strconv.Itoa(4 * shareConc)}),
		javaShare("java-share/3 processes", 3, nil),
	}
	if work != nil {
		cases = append(cases, &caseSpec{label: "ideal (measured, no Kafka)", kind: kindLocal, topic: t, conc: shareConc, work: work})
	}
	return cases
}

var shareNotes = []string{
	fmt.Sprintf("Every row reads through a message.Router. %s: safeack.Subscriber on a consumer group, Unordered, MaxInFlight %d, in this process. share/N: safeack.ShareSubscriber (MaxInFlight %d, InitialOffset oldest, the other fields at their defaults: Members %d, MaxPollRecords %d; rows that name them set them) in each of N child processes of the bench binary; their CPU s and RSS MB are summed over the N processes (each from its own start to the run's end), and each reports its acks to the bench over a pipe with their times.", shareGroupLabel, shareConc, shareConc, safeack.DefaultShareMembers, 4*shareConc),
	fmt.Sprintf("java-share/N: Apache Kafka's own KafkaShareConsumer (kafka-clients %s, Java 17; our driver bench/jshare) in each of N child JVMs, share.acknowledgement.mode=explicit, the group's share.auto.offset.reset=earliest set with the Admin client, every other property at the client's default (max.poll.records 500, share.acquire.mode batch_optimized: a poll may pass max.poll.records to keep the broker's batches whole, here often 1,000-3,000 records), and a pool of %d worker threads: poll, hand every record to the pool, wait for all of them, acknowledge each (ACCEPT, or REJECT for a poison record), poll again (the acks ride on that poll). A record counts as done when it is acknowledged, after its whole poll finished. The record_limit row sets share.acquire.mode=record_limit and max.poll.records=%d (what a Go member takes per poll). A cold JVM (no warm-up pass, unlike pc/*); startup includes the JVM's start; CPU s and RSS MB are the JVMs' own, reported as the Go members'.", jshareClients, shareConc, 4*shareConc),
	"Share groups keep no order; the consumer-group row is Unordered too (1 partition: one member of a consumer group gets all of it, so more processes would not help it).",
	"×group = rec/s over the consumer-group row's. busiest process % = the share of the records one process completed, the largest over the processes (100 for one process). startup counts from the consumer's construction (for share rows, from starting the child processes) to the first delivery; rec/s from the first delivery to the last ack.",
	"given back = records the safeack share processes released without handing them out (ShareStats.GivenBack: they waited half their acquisition lock with no handler about to take them), summed over the processes (median over the reps, min–max); blank for rows that are not safeack share subscribers.",
	"Share groups commit no offsets (the broker keeps each record's state), so their end lag is blank (the consumer-group row's is measured as in the other workloads); their acks reach the broker within AckFlushInterval (100 ms) or with the next fetch.",
}

func shareIO() *workload {
	n := quick(20_000, 5_000)
	work := constWork(n, 2*time.Millisecond)
	t := &topicSpec{name: "share-io", partitions: 1, n: n, valueSize: valueSize, keys: 1000}
	w := &workload{
		name:  "share-io",
		desc:  fmt.Sprintf("issue 26: %d records, 1 partition, handler sleeps 2 ms, MaxInFlight %d per process; share groups beside a consumer group", n, shareConc),
		cols:  []string{"wall", "startup", "rate", "xideal", "xgroup", "cpu", "rss", "endlag", "dups", "x:busiest", "x:givenback"},
		cases: shareCases(t, work, 0),
		run:   runStandard,
		notes: append([]string{"ideal = MaxInFlight / 2 ms for one process; share/3 runs 3 × MaxInFlight handlers, so its ×ideal can pass 1."}, shareNotes...),
	}
	w.setIdeal(work, shareConc)
	return w
}

func shareZero() *workload {
	n := quick(100_000, 20_000)
	t := &topicSpec{name: "share-zero", partitions: 8, n: n, valueSize: valueSize, keys: 1000}
	return &workload{
		name:  "share-zero",
		desc:  fmt.Sprintf("issue 26: %d records of %d B, 8 partitions, no work, MaxInFlight %d per process; share groups beside a consumer group", n, valueSize, shareConc),
		cols:  []string{"wall", "startup", "rate", "xgroup", "cpu", "cpupm", "rss", "endlag", "dups", "x:busiest", "x:givenback"},
		cases: shareCases(t, nil, 0),
		run:   runStandard,
		notes: append([]string{"Record i goes to partition i % 8."}, shareNotes...),
	}
}

func sharePoison() *workload {
	n := quick(20_000, 5_000)
	const every = 1000
	work := constWork(n, 2*time.Millisecond)
	t := &topicSpec{name: "share-poison", partitions: 1, n: n, valueSize: valueSize, keys: 1000}
	w := &workload{
		name:  "share-poison",
		desc:  fmt.Sprintf("issue 26: share-io with a poison record every %d (its handler fails after its 2 ms): %d records, 1 partition, MaxInFlight %d per process", every, n, shareConc),
		cols:  []string{"wall", "startup", "rate", "xideal", "xgroup", "cpu", "rss", "endlag", "dups", "x:poisoned", "x:busiest", "x:givenback"},
		cases: shareCases(t, work, every),
		run:   runStandard,
		notes: append([]string{
			fmt.Sprintf("Record i is poison when i %% %d = %d. Consumer group: safeack.PoisonQueue publishes it to a dead-letter topic (watermill-kafka publisher, synchronous) and the record is acked. Share: safeack.RejectPoison REJECTs it (archived by the broker, never delivered again). No Retry middleware: the first failure decides. A poison record counts as done when PoisonQueue returned nil (dead-lettered) or RejectPoison returned ErrRejected; poison handled = how many did.", every, every-1),
		}, shareNotes...),
	}
	w.setIdeal(work, shareConc)
	return w
}

func isPoison(i, every int) bool { return every > 0 && i >= 0 && i%every == every-1 }

// shareHandler is the bench handler of the share workloads, with mw (nil,
// PoisonQueue or RejectPoison) around the work: it works, fails a poison
// record, and reports a record done (done) when the chain's answer settles
// it for good: nil, or a rejection (rejected reports whether err is one).
func shareHandler(work time.Duration, every int, mw message.HandlerMiddleware, rejected func(error) bool,
	first func(), done func(i int, busy time.Duration, poisoned bool)) message.NoPublishHandlerFunc {
	inner := func(m *message.Message) ([]*message.Message, error) {
		if work > 0 {
			time.Sleep(work)
		}
		if isPoison(recordIndex(m.Payload), every) {
			return nil, errPoison
		}
		return nil, nil
	}
	h := message.HandlerFunc(inner)
	if mw != nil {
		h = mw(h)
	}
	return func(m *message.Message) error {
		first()
		began := time.Now()
		_, err := h(m)
		if err == nil || rejected(err) {
			i := recordIndex(m.Payload)
			done(i, time.Since(began), isPoison(i, every))
		}
		return err
	}
}

// workOf is a share workload's per-record work: every record takes the
// same (constWork) or none.
func workOf(c *caseSpec) time.Duration {
	if len(c.work) == 0 {
		return 0
	}
	return c.work[0]
}

// startGroupRouter runs the consumer-group row of a share workload:
// safeack.Subscriber through a Router, PoisonQueue in front of the handler
// when the workload has poison records.
func startGroupRouter(ctx context.Context, env *brokerEnv, c *caseSpec, t *topic, group string, tr *ackTracker) (*contender, error) {
	cfg, err := safeackConfig(env, c, group)
	if err != nil {
		return nil, err
	}
	sub, err := safeack.NewSubscriber(cfg, wmLogger(c.label))
	if err != nil {
		return nil, err
	}
	var mw message.HandlerMiddleware
	var pub message.Publisher
	if c.poisonEvery > 0 {
		dlq := group + ".dlq"
		if err := env.createTopic(ctx, dlq, 1); err != nil {
			_ = sub.Close()
			return nil, err
		}
		env.addTopic(dlq)
		if pub, err = wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: env.brokers, Marshaler: wmkafka.DefaultMarshaler{}}, nil); err != nil {
			_ = sub.Close()
			return nil, err
		}
		if mw, err = safeack.PoisonQueue(pub, dlq); err != nil {
			_ = sub.Close()
			_ = pub.Close()
			return nil, err
		}
	}
	var poisoned atomic.Int64
	h := shareHandler(workOf(c), c.poisonEvery, mw, func(error) bool { return false }, tr.delivered,
		func(i int, busy time.Duration, p bool) {
			if p {
				poisoned.Add(1)
			}
			tr.worked(busy)
			tr.acked(i)
		})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	router.AddConsumerHandler("bench", t.name, sub, h)
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(ctx) }()
	select {
	case <-router.Running():
	case <-done:
		_ = sub.Close()
		return nil, errors.New("the router stopped before running")
	}
	con := &contender{
		stop: func() error {
			err := router.Close()
			<-done
			_ = sub.Close()
			if pub != nil {
				_ = pub.Close()
			}
			return err
		},
		retained: func() int {
			n := 0
			for _, ps := range sub.Stats() {
				n += ps.Retained
			}
			return n
		},
	}
	con.extra = func() map[string]float64 {
		return map[string]float64{"poisoned": float64(poisoned.Load()), "busiest": 100}
	}
	return con, nil
}

// shareSupport caches whether the brokers serve share groups.
var shareSupport struct {
	once sync.Once
	err  error
}

// shareReady reports why the share rows cannot run on env's brokers, nil
// when they can: Kafka 4.2+ with share groups enabled, or kfake (see
// safeack.CheckShareGroups).
func shareReady(ctx context.Context, env *brokerEnv) error {
	shareSupport.once.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := safeack.CheckShareGroups(ctx, env.brokers); err != nil {
			shareSupport.err = fmt.Errorf("the broker (%s): %w", env.desc, err)
		}
	})
	return shareSupport.err
}

// shareMemberSpec is what a -share-member child runs.
type shareMemberSpec struct {
	Brokers     []string          `json:"brokers"`
	Topic       string            `json:"topic"`
	Group       string            `json:"group"`
	Conc        int               `json:"conc"`
	Work        time.Duration     `json:"work"`
	PoisonEvery int               `json:"poison_every"`
	Label       string            `json:"label"`
	Verbose     bool              `json:"verbose"`
	Set         map[string]string `json:"set"`
}

// startShare starts c.members child processes, one share group member
// each, and feeds their acks into tr.
func startShare(ctx context.Context, env *brokerEnv, c *caseSpec, t *topic, group string, tr *ackTracker) (*contender, error) {
	spec := shareMemberSpec{Brokers: env.brokers, Topic: t.name, Group: group, Conc: c.conc,
		Work: workOf(c), PoisonEvery: c.poisonEvery, Label: c.label, Verbose: opt.verbose, Set: c.shareSet}
	if c.javaShare {
		if err := jshareReady(); err != nil {
			return nil, err
		}
		return startShareProcs(c, tr, func() *exec.Cmd { return javaShareCommand(spec) })
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, _ := json.Marshal(spec)
	return startShareProcs(c, tr, func() *exec.Cmd { return exec.Command(exe, "-share-member", string(js)) })
}

// startShareProcs starts c.members child processes, each from newCmd,
// that speak runShareMember's protocol on stdout, and feeds their acks
// into tr.
func startShareProcs(c *caseSpec, tr *ackTracker, newCmd func() *exec.Cmd) (*contender, error) {
	con := &contender{failed: make(chan struct{}), ext: &extStats{}}
	var (
		failOnce sync.Once
		mu       sync.Mutex
		stdins   []io.Closer
		procs    []*os.Process
		exited   []chan struct{}
		poisoned atomic.Int64
		perChild = make([]atomic.Int64, c.members)
		// givenBack sums the members' ShareStats GivenBack (Go members
		// only: a Java member reports none, and givenBackTold stays false).
		givenBack     atomic.Int64
		givenBackTold atomic.Bool
	)
	fail := func(err error) {
		failOnce.Do(func() { con.failErr = err; close(con.failed) })
	}
	base := tr.base.UnixNano()
	stop := func() error {
		for _, s := range stdins {
			_ = s.Close()
		}
		for i, e := range exited {
			select {
			case <-e:
			case <-time.After(30 * time.Second):
				_ = procs[i].Kill() // a member that does not close; its reader ends with it
				<-e
			}
		}
		mu.Lock()
		defer mu.Unlock()
		con.ext.busy = time.Duration(tr.busy.Load())
		con.ext.dups = tr.total.Load() - tr.uniq.Load()
		return nil
	}
	for m := range c.members {
		cmd := newCmd()
		stdin, err := cmd.StdinPipe()
		if err != nil {
			_ = stop()
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			_ = stop()
			return nil, err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			_ = stop()
			return nil, err
		}
		ex := make(chan struct{})
		stdins, exited, procs = append(stdins, stdin), append(exited, ex), append(procs, cmd.Process)
		go func() {
			defer close(ex)
			sc := bufio.NewScanner(stdout)
			finished := false
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 0 {
					continue
				}
				num := func(k int) int64 {
					if k >= len(f) {
						return 0
					}
					n, _ := strconv.ParseInt(f[k], 10, 64)
					return n
				}
				switch f[0] {
				case "A": // A index unix-ns busy-ns poisoned
					tr.worked(time.Duration(num(3)))
					if num(4) == 1 {
						poisoned.Add(1)
					}
					perChild[m].Add(1)
					tr.ackedAfter(int(num(1)), time.Duration(num(2)-base))
				case "FIRST": // FIRST unix-ns
					tr.setFirst(time.Duration(num(1) - base))
				case "DONE": // DONE cpu-ns heap-bytes rss-bytes [given-back]
					if len(f) > 4 {
						givenBack.Add(num(4))
						givenBackTold.Store(true)
					}
					mu.Lock()
					con.ext.cpu += time.Duration(num(1))
					con.ext.heap += uint64(num(2))
					con.ext.rss += uint64(num(3))
					mu.Unlock()
					finished = true
				case "ERR":
					fail(fmt.Errorf("%s, process %d: %s", c.label, m, strings.Join(f[1:], " ")))
				}
			}
			_, _ = io.Copy(io.Discard, stdout)
			err := cmd.Wait()
			if !finished {
				fail(fmt.Errorf("%s, process %d exited before the run ended: %v", c.label, m, err))
			}
		}()
	}
	con.stop = stop
	con.extra = func() map[string]float64 {
		var top int64
		for i := range perChild {
			top = max(top, perChild[i].Load())
		}
		x := map[string]float64{"poisoned": float64(poisoned.Load()),
			"busiest": float64(int(100*float64(top)/float64(max(tr.total.Load(), 1)) + 0.5))}
		if givenBackTold.Load() {
			x["givenback"] = float64(givenBack.Load())
		}
		return x
	}
	return con, nil
}

// runShareMember is the child side of startShare: one ShareSubscriber
// member consuming through a Router, RejectPoison in front of the handler
// when the workload has poison records. It prints FIRST at the first
// delivery and a line per completed record (flushed every 2 ms), and when
// its stdin closes it closes the subscriber and prints its CPU and memory.
func runShareMember(js string) {
	var spec shareMemberSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fatalf("share member: %v", err)
	}
	opt.verbose = spec.Verbose
	var (
		mu  sync.Mutex
		out = bufio.NewWriterSize(os.Stdout, 64<<10)
	)
	emit := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		mu.Unlock()
	}
	flush := func() { mu.Lock(); _ = out.Flush(); mu.Unlock() }
	smp := startSampler(nil)
	cfg := safeack.ShareSubscriberConfig{
		Brokers:       spec.Brokers,
		ShareGroup:    spec.Group,
		MaxInFlight:   spec.Conc,
		InitialOffset: sarama.OffsetOldest,
	}
	if err := applySettings(&cfg, spec.Set); err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
	sub, err := safeack.NewShareSubscriber(cfg, wmLogger(spec.Label))
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
	var firstOnce sync.Once
	var mw message.HandlerMiddleware
	if spec.PoisonEvery > 0 {
		mw = safeack.RejectPoison
	}
	h := shareHandler(spec.Work, spec.PoisonEvery, mw, func(err error) bool { return errors.Is(err, safeack.ErrRejected) },
		func() { firstOnce.Do(func() { emit("FIRST %d", time.Now().UnixNano()); flush() }) },
		func(i int, busy time.Duration, p bool) {
			pf := 0
			if p {
				pf = 1
			}
			emit("A %d %d %d %d", i, time.Now().UnixNano(), int64(busy), pf)
		})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		fmt.Printf("ERR %v\n", err)
		os.Exit(1)
	}
	router.AddConsumerHandler("bench", spec.Topic, sub, h)
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(context.Background()) }()
	stopFlush := make(chan struct{})
	go func() {
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				flush()
			case <-stopFlush:
				return
			}
		}
	}()
	inDone := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(inDone) }()
	select {
	case <-inDone:
	case err := <-runDone:
		emit("ERR the router stopped: %v", err)
		flush()
		os.Exit(1)
	}
	cpu := cpuTime()
	heap, _, _ := smp.stop()
	_ = router.Close()
	_ = sub.Close()
	close(stopFlush)
	var givenBack uint64
	for _, st := range sub.Stats() {
		givenBack += st.GivenBack
	}
	emit("DONE %d %d %d %d", int64(cpu), heap, peakRSS(), givenBack)
	flush()
}
