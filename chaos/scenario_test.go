//go:build chaos

package chaos

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// scenario is one chaos run: a cluster, a topic and a group, a producer,
// consumers, and the ledger of what they did.
type scenario struct {
	t          *testing.T
	name       string
	c          *kafkatest.Cluster
	topic      string
	group      string
	partitions int
	rng        *rand.Rand
	session    time.Duration
	coop       bool
	initial    int64 // Consumer.Offsets.Initial of every consumer
	work       workSpec
	topicID    [16]byte // consumer protocol only (see memberSpec.TopicID)

	led     *ledger
	commits *kafkatest.CommitLog // embedded broker only
	sent    *sentLog             // real cluster: the commit requests the consumers sent (see commitTap)
	sampler *sampler
	prod    *producer
	logger  watermill.LoggerAdapter
	logs    *tailBuffer

	mu       sync.Mutex
	children []*child
	members  []*member
	nextID   int

	fig      figures
	started  time.Time
	timeline []string

	churnEnd      time.Time // when the churn phase ended
	churnProduced int64     // records produced by then

	floor       map[int32]int64 // where the group started (see begin); nil: 0
	startIssues []string        // start positions not committed (see begin)

	// lastChange is when the harness last changed the group or the
	// cluster (a consumer started, killed or stopped; a broker failed), in
	// Unix nanoseconds: the group watch (watchGroup) counts from it.
	lastChange atomic.Int64
	failovers  []*failover // broker failures, for the stall figures
	// groupIssues are groups left unowned that count as violations (see
	// watchGroup); groupStalls counts every group left unowned.
	groupIssues []string
	groupStalls int
}

// changed records that the harness just changed the group or the cluster.
func (sc *scenario) changed() { sc.lastChange.Store(time.Now().UnixNano()) }

// endChurn marks the end of the churn phase: what was acked before it shows
// how much work the consumers did while the trouble went on.
func (sc *scenario) endChurn() {
	sc.churnEnd = time.Now()
	sc.churnProduced = sc.prod.sent.Load()
	sc.note("churn over: %d records produced", sc.churnProduced)
}

// note adds an entry to the scenario's timeline, shown when it fails.
func (sc *scenario) note(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.timeline = append(sc.timeline, fmt.Sprintf("%s +%v ", time.Now().Format("15:04:05.000"), time.Since(sc.started).Round(time.Millisecond))+fmt.Sprintf(format, args...))
}

type scenarioOpts struct {
	partitions int
	coop       bool
	// initial is the consumers' Consumer.Offsets.Initial: OffsetOldest
	// (the harness's, when 0) or OffsetNewest (see begin).
	initial int64
	cluster []kafkatest.Option
}

// initials are the Consumer.Offsets.Initial settings the crash and
// rebalance scenarios run at: the harness's, and Sarama's default.
var initials = []int64{sarama.OffsetOldest, sarama.OffsetNewest}

// initialName names a Consumer.Offsets.Initial setting in test names.
func initialName(initial int64) string {
	if initial == sarama.OffsetNewest {
		return "newest"
	}
	return "oldest"
}

// initialSuffix is appended to a scenario's name at OffsetNewest.
func initialSuffix(initial int64) string {
	if initial == sarama.OffsetNewest {
		return "-newest"
	}
	return ""
}

func newScenario(t *testing.T, name string, o scenarioOpts) *scenario {
	t.Helper()
	c := kafkatest.Start(t, o.cluster...)
	name += protocolSuffix()
	if protocol == safeack.GroupProtocolConsumer {
		requireConsumerProtocol(t, c)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	if o.initial == 0 {
		o.initial = sarama.OffsetOldest
	}
	sc := &scenario{
		t:          t,
		name:       name,
		c:          c,
		partitions: o.partitions,
		rng:        rand.New(rand.NewPCG(seed, h.Sum64())),
		coop:       o.coop,
		initial:    o.initial,
		work:       defaultWork,
		led:        newLedger(),
		sent:       &sentLog{},
		logs:       newTailBuffer(4 << 20),
		started:    time.Now(),
	}
	// Debug: session starts (generation, partitions) and drains.
	sc.logger = watermill.NewStdLoggerWithOut(sc.logs, true, false)
	sc.fig = figures{Scenario: name, Broker: "embedded", Generations: -1}
	sc.session = kafkatest.EmbeddedSessionTimeout
	if !c.Embedded() {
		sc.fig.Broker = "kafka " + strings.Join(c.Brokers(), ",")
		sc.session = kafkatest.RealSessionTimeout
		if v := os.Getenv(envSessionTimeout); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s=%q: %v", envSessionTimeout, v, err)
			}
			sc.session = d
		}
	}
	sc.topic = c.NewTopic(t, o.partitions)
	sc.group = c.NewGroup(t)
	if protocol == safeack.GroupProtocolConsumer {
		sc.topicID = topicIDOf(t, c, sc.topic)
		shortenConsumerSessions(t, c, sc.group, sc.session)
	}
	sc.commits = c.ObserveCommits(t)
	sc.sampler = startSampler(t, c, sc.group, sc.topic, o.partitions)
	t.Cleanup(sc.cleanup)
	t.Logf("%s: topic %s, group %s (%s protocol), session %v, Offsets.Initial %s, seed %d", name, sc.topic, sc.group, protocol, sc.session, initialName(sc.initial), seed)
	return sc
}

// spec describes the next consumer.
func (sc *scenario) spec() memberSpec {
	sc.mu.Lock()
	sc.nextID++
	id := sc.nextID
	sc.mu.Unlock()
	return memberSpec{
		ID:          id,
		Brokers:     sc.c.Brokers(),
		Topic:       sc.topic,
		Group:       sc.group,
		Session:     sc.session,
		Cooperative: sc.coop,
		Initial:     sc.initial,
		Work:        sc.work,
		Tap:         !sc.c.Embedded(),
		Protocol:    protocol,
		TopicID:     sc.topicID,
	}
}

// cleanup stops whatever is still running and shows the consumers' logs
// when the scenario failed.
func (sc *scenario) cleanup() {
	if sc.prod != nil {
		sc.prod.stop()
	}
	sc.mu.Lock()
	children, members := slices.Clone(sc.children), slices.Clone(sc.members)
	sc.mu.Unlock()
	for _, ch := range children {
		ch.kill()
	}
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() { defer wg.Done(); m.leave() }()
	}
	wg.Wait()
	sc.sampler.close()
	if os.Getenv(envKeepLogs) != "" && !sc.t.Failed() {
		sc.mu.Lock()
		tl := strings.Join(sc.timeline, "\n")
		sc.mu.Unlock()
		saveArtifact(fmt.Sprintf("chaos-%s-timeline.txt", sc.name), tl+"\n")
		saveArtifact(fmt.Sprintf("chaos-%s-members-log.txt", sc.name), sc.logs.String())
		for _, ch := range children {
			saveArtifact(fmt.Sprintf("chaos-%s-consumer-%d-stderr.txt", sc.name, ch.id), ch.stderr.String())
		}
	}
	if sc.t.Failed() {
		sc.mu.Lock()
		sc.t.Logf("timeline:\n  %s", strings.Join(sc.timeline, "\n  "))
		sc.mu.Unlock()
		if s := sc.logs.String(); s != "" {
			path := saveArtifact(fmt.Sprintf("chaos-%s-members-log.txt", sc.name), s)
			sc.t.Logf("in-process members' log (all of it in %s) ends with:\n%s", path, s[max(0, len(s)-4096):])
		}
		for _, ch := range children {
			if s := ch.stderr.String(); s != "" {
				path := saveArtifact(fmt.Sprintf("chaos-%s-consumer-%d-stderr.txt", sc.name, ch.id), s)
				sc.t.Logf("consumer process %d stderr (all of it in %s) ends with:\n%s", ch.id, path, s[max(0, len(s)-2048):])
			}
		}
	}
}

// At OffsetNewest: each partition holds historyPerPartition records before
// the first consumer joins, and every delivery of the first record after
// them is held holdFirst (workSpec.HoldOffset), so that the trouble starts
// while each partition's start is unfinished. holdFirst stays below the
// members' DrainTimeout (newMember): a handler that outlives the drain of
// its revoked partition can still be running when the same member gets the
// partition back and is handed the record again, and the key-order check
// would report the two runs of one key.
const (
	historyPerPartition = 50
	holdFirst           = 1500 * time.Millisecond
)

// begin starts the producer, writing about rate records a second, and the
// first consumers: start starts them, owned returns the partitions each of
// them owns now. When begin returns, the trouble may start.
//
// At OffsetOldest the producer starts first, and begin returns at once.
//
// At OffsetNewest each partition first gets historyPerPartition records
// that no consumer may ever handle; then start runs and, once the
// consumers own every partition (each some, none twice: the group is
// settled, and each claim has resolved where it fetches from), the end of
// every partition becomes its floor: where the group started, the first
// record the checks count, and the lowest offset any commit may hold.
// Nothing is produced between the two; then the producer starts. begin
// returns once a handler started on every partition: safeack commits a
// partition's start before it hands out the first record (at the latest:
// fixStart), and begin checks that the broker holds a position on every
// partition. Those first records are held holdFirst, so the crashes and
// rebalances that follow find every partition's start unfinished: without
// that commit the next owner would start at the newest offset and skip
// them. The trouble does not start earlier, so that the scenario does not
// depend on how early safeack commits a start (before any record is
// fetched, or with the first one): a partition that changes hands before
// its start is committed starts over at the newest offset, past the
// records produced in between, as with any consumer at OffsetNewest.
func (sc *scenario) begin(rate int, start func(), owned func() [][]int32) {
	t := sc.t
	t.Helper()
	if sc.initial != sarama.OffsetNewest {
		sc.startProducer(rate)
		start()
		return
	}
	sc.c.ProduceN(t, sc.topic, sc.partitions, sc.partitions*historyPerPartition, nil)
	sc.note("history produced: %d records a partition", historyPerPartition)
	sc.work.HoldOffset, sc.work.HoldFor = historyPerPartition, holdFirst
	start()
	t0 := time.Now()
	if !waitCond(2*time.Minute, func() bool { return ownsAll(owned(), sc.partitions) }) {
		t.Fatalf("%s: the first consumers did not come to own every partition within 2m (they own %v)", sc.name, owned())
	}
	sc.note("the group owns every partition: %v", owned())
	sc.floor = sc.sampler.ends(t)
	for p, f := range sc.floor {
		if f != historyPerPartition {
			t.Fatalf("%s: partition %d ends at %d before the producer starts, not after its %d records of history", sc.name, p, f, historyPerPartition)
		}
	}
	sc.led.setFloor(sc.floor)
	sc.note("floor %v; producer starts", sc.floor)
	sc.startProducer(rate)
	t1 := time.Now()
	if !waitCond(time.Minute, func() bool { return sc.led.deliveredFrom(sc.floor) }) {
		t.Fatalf("%s: not every partition delivered a record within 1m of the producer's start", sc.name)
	}
	sc.note("every partition delivered its first record")
	t2 := time.Now()
	// The start was committed before the first record was handed out (a
	// failed commit is retried at the next commit interval): the broker
	// must hold a position on every partition. That it is not below the
	// floor nor past an unacked record, the commit checks see: these polls
	// are among the commits they check. While the first record is held, a
	// position can only come from that commit. A short look, so that the
	// trouble still finds the starts unfinished.
	const look = 500 * time.Millisecond
	seen := make(map[int32][]int64)
	var co map[int32]kafkatest.CommittedOffset
	waitCond(look, func() bool {
		got, err := sc.sampler.poll()
		if err != nil {
			return false
		}
		co = got
		all := true
		for p := range sc.floor {
			if o := co[p].Offset; len(seen[p]) == 0 || seen[p][len(seen[p])-1] != o {
				seen[p] = append(seen[p], o)
			}
			all = all && co[p].Offset >= 0
		}
		return all
	})
	for p := range int32(sc.partitions) {
		switch c, ok := co[p]; {
		case !ok:
			sc.startIssues = append(sc.startIssues, fmt.Sprintf("partition %d: the committed offsets could not be read within %v of every partition delivering a record", p, look))
		case c.Offset < 0:
			sc.startIssues = append(sc.startIssues, fmt.Sprintf(
				"partition %d delivered its first record (offset %d, held %v), but in the %v after that the group had no committed position on it (polls saw %v; -1: none): a member that died then would have left the next owner to start at the newest offset, past the records since",
				p, sc.floor[p], holdFirst, look, seen[p]))
		}
	}
	sc.note("start positions checked: %v", co)
	t.Logf("%s: the group owned every partition %v after the first consumers started; floor %v; every partition delivered a record %v after the producer started",
		sc.name, t1.Sub(t0).Round(time.Millisecond), sc.floor, t2.Sub(t1).Round(time.Millisecond))
}

// ownsAll reports whether sets, the partitions each consumer owns, cover
// partitions 0..n-1, each consumer owning some and no partition owned
// twice.
func ownsAll(sets [][]int32, n int) bool {
	seen := make(map[int32]bool, n)
	for _, s := range sets {
		if len(s) == 0 {
			return false
		}
		for _, p := range s {
			if seen[p] || p < 0 || p >= int32(n) {
				return false
			}
			seen[p] = true
		}
	}
	return len(seen) == n
}

// between returns a random duration in [lo, hi].
func (sc *scenario) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(sc.rng.Int64N(int64(hi-lo)+1))
}

// finish stops the producer, waits until every record of the topic has
// been acked and the group has committed the end of every partition, then
// stops the consumers with stop (which must leave none running), checks
// the invariants and reports the figures.
func (sc *scenario) finish(drainTimeout time.Duration, stop func()) {
	t := sc.t
	t.Helper()
	sc.prod.stop()
	end := sc.sampler.ends(t)
	sc.fig.Records = 0
	history := 0
	for p, e := range end {
		sc.fig.Records += int(e - sc.floor[p])
		history += int(sc.floor[p])
	}
	if history > 0 {
		t.Logf("%s: producer stopped: %d records from the floor, after %d of history (%d sends failed and were retried); draining",
			sc.name, sc.fig.Records, history, sc.prod.failed.Load())
	} else {
		t.Logf("%s: producer stopped: %d records (%d sends failed and were retried); draining", sc.name, sc.fig.Records, sc.prod.failed.Load())
	}

	sc.note("producer stopped at %v", end)
	drained := waitCond(drainTimeout, func() bool { return len(sc.led.missing(end)) == 0 })
	sc.note("every record acked: %v", drained)
	if !drained {
		miss := sc.led.missing(end)
		t.Errorf("%s: %d records never acked within %v of the end; first: %v", sc.name, len(miss), drainTimeout, miss[:min(10, len(miss))])
	} else {
		committed := waitCond(drainTimeout, func() bool {
			co, err := sc.sampler.poll()
			if err != nil {
				return false
			}
			for p, e := range end {
				if co[p].Offset != e {
					return false
				}
			}
			return true
		})
		if !committed {
			co, err := sc.sampler.poll()
			t.Errorf("%s: the group did not commit the end of every partition within %v: end %v, committed %v (%v)", sc.name, drainTimeout, end, co, err)
		}
	}
	sc.note("end committed")
	stop()
	sc.note("consumers stopped")
	sc.sampler.close()
	sc.verify(end)
}

// verify checks the invariants over the whole run and reports the figures.
func (sc *scenario) verify(end map[int32]int64) {
	t := sc.t
	var v verdict
	miss := sc.led.missing(end)
	sc.fig.Lost = len(miss)
	for _, k := range miss[:min(10, len(miss))] {
		v.add("record %v was never acked", k)
	}

	var views []commitView
	gens := map[int32]bool{}
	if sc.commits != nil {
		for _, o := range sc.commits.Commits() {
			if o.Group != sc.group {
				continue
			}
			cv := commitView{
				source:  fmt.Sprintf("commit request #%d (gen %d, member %s)", o.Seq, o.Generation, o.MemberID),
				at:      o.At,
				gen:     o.Generation,
				offsets: make(map[int32]kafkatest.CommittedOffset),
			}
			for tp, co := range o.Offsets {
				if tp.Topic == sc.topic {
					cv.offsets[tp.Partition] = co
				}
			}
			if len(cv.offsets) > 0 {
				views = append(views, cv)
				gens[o.Generation] = true
			}
		}
		sc.fig.Generations = len(gens)
	}
	sent, polled := sc.sent.all(), sc.sampler.views()
	t.Logf("%s: commits checked: %d requests the broker received, %d requests the consumers sent, %d polled",
		sc.name, len(views), len(sent), len(polled))
	views = append(views, sent...)
	views = append(views, polled...)
	sc.fig.Commits = len(views)
	if len(views) == 0 {
		v.add("no commit was observed")
	}
	if !sc.c.Embedded() && len(sent) == 0 {
		// The polls alone would pass: the tap must see the requests.
		v.add("the commit tap saw no OffsetCommit request of the consumers (%s protocol): it cannot read their commits", protocol)
	}
	for _, m := range sc.startIssues {
		v.add("%s", m)
	}
	sc.mu.Lock()
	for _, m := range sc.groupIssues {
		v.add("%s", m)
	}
	sc.mu.Unlock()
	sc.led.checkCommits(&v, views, end)
	sc.led.checkHistory(&v)
	keyed := sc.led.checkKeyOrder(&v)
	sc.fig.Twice, sc.fig.Extra = sc.led.duplicates()
	sc.led.mu.Lock()
	sc.fig.Nacks = sc.led.nacks
	sc.led.mu.Unlock()
	sc.fig.Stalls = sc.stalls(end)
	sc.mu.Lock()
	if sc.groupStalls > 0 {
		g := fmt.Sprintf("group left unowned %dx, a consumer restarted", sc.groupStalls)
		if sc.fig.FaultDetail != "" {
			g = sc.fig.FaultDetail + "; " + g
		}
		sc.fig.FaultDetail = g
	}
	sc.mu.Unlock()
	sc.fig.Violations = v.n
	sc.fig.Elapsed = time.Since(sc.started)
	for _, m := range v.msgs {
		t.Error(m)
	}
	if v.n > len(v.msgs) {
		t.Errorf("... and %d more violations", v.n-len(v.msgs))
	}
	sc.fig.Passed = !t.Failed()
	report(sc.fig)
	t.Logf("%s: %d handler starts checked for key order (key-less ones per partition)", sc.name, keyed)
	if !sc.churnEnd.IsZero() {
		t.Logf("%s: during the churn (%v) %d records were acked, of %d produced",
			sc.name, sc.churnEnd.Sub(sc.started).Round(time.Second), sc.led.ackedBefore(sc.churnEnd), sc.churnProduced)
	}
	if sc.fig.Twice > 0 {
		t.Logf("%s: some records handled more than once (consumer numbers; times from the first ack):\n  %s",
			sc.name, strings.Join(sc.led.dupSamples(8), "\n  "))
		sc.debugDupCommits()
	}
	t.Log("\n" + figuresHeader + "\n" + sc.fig.row())
}

// waitCond polls cond every 20ms until it holds or timeout passes; cond
// gets one look after the deadline.
func waitCond(timeout time.Duration, cond func() bool) bool {
	return kafkatest.Poll(timeout, 20*time.Millisecond, cond)
}

// ------------------------------------------------------------- producer --

// producer writes records to every partition at a steady rate until
// stopped, retrying failed sends (a failed send may still have been
// written: the log, read at the end, is what the checks count).
type producer struct {
	halt   chan struct{}
	done   chan struct{}
	once   sync.Once
	sent   atomic.Int64
	failed atomic.Int64
	// confirmed is, per partition, the highest offset a send was
	// confirmed at (-1: none yet): what had been produced when a broker
	// failed (see failover).
	confirmed []atomic.Int64
}

// confirm records the offsets of sent messages.
func (pr *producer) confirm(ms ...*sarama.ProducerMessage) {
	for _, m := range ms {
		c := &pr.confirmed[m.Partition]
		for {
			cur := c.Load()
			if m.Offset <= cur || c.CompareAndSwap(cur, m.Offset) {
				break
			}
		}
	}
}

// confirmedNow returns confirmed, per partition.
func (pr *producer) confirmedNow() []int64 {
	out := make([]int64, len(pr.confirmed))
	for i := range pr.confirmed {
		out[i] = pr.confirmed[i].Load()
	}
	return out
}

const numKeys = 48

// startProducer writes about rate records a second. Records of key k go to
// partition k % partitions; one in twenty has no key.
func (sc *scenario) startProducer(rate int) {
	t := sc.t
	cfg := sc.c.SaramaConfig()
	cfg.ClientID = "chaos-producer"
	// A hung broker holds a request until this read timeout: above the
	// broker's wait for in-sync replicas (Producer.Timeout, 10 s), far
	// below Sarama's default 30 s.
	cfg.Net.ReadTimeout = 15 * time.Second
	cfg.Producer.Retry.Max = 3
	cfg.Producer.Retry.Backoff = 100 * time.Millisecond
	p, err := sarama.NewSyncProducer(sc.c.Brokers(), cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	pr := &producer{halt: make(chan struct{}), done: make(chan struct{}), confirmed: make([]atomic.Int64, sc.partitions)}
	for i := range pr.confirmed {
		pr.confirmed[i].Store(-1)
	}
	sc.prod = pr
	rng := rand.New(rand.NewPCG(sc.rng.Uint64(), sc.rng.Uint64()))
	const tick = 50 * time.Millisecond
	go func() {
		defer close(pr.done)
		defer p.Close()
		tk := time.NewTicker(tick)
		defer tk.Stop()
		start := time.Now()
		var n int64
		for {
			select {
			case <-pr.halt:
				return
			case <-tk.C:
			}
			// Catch up with the rate when sends were slow (a loaded
			// broker, a restart), a bounded batch at a time.
			due := int64(time.Since(start).Seconds()*float64(rate)) - n
			if due <= 0 {
				continue
			}
			batch := make([]*sarama.ProducerMessage, min(due, int64(max(rate/2, 1))))
			for i := range batch {
				n++
				m := &sarama.ProducerMessage{Topic: sc.topic, Value: sarama.StringEncoder(fmt.Sprintf("chaos-%d", n))}
				if rng.IntN(20) == 0 {
					m.Partition = rng.Int32N(int32(sc.partitions))
				} else {
					k := rng.IntN(numKeys)
					m.Key = sarama.StringEncoder(fmt.Sprintf("k%02d", k))
					m.Partition = int32(k % sc.partitions)
				}
				batch[i] = m
			}
			for len(batch) > 0 {
				err := p.SendMessages(batch)
				if err == nil {
					pr.sent.Add(int64(len(batch)))
					pr.confirm(batch...)
					break
				}
				var perrs sarama.ProducerErrors
				if !errors.As(err, &perrs) {
					pr.failed.Add(int64(len(batch)))
				} else {
					pr.sent.Add(int64(len(batch) - len(perrs)))
					pr.failed.Add(int64(len(perrs)))
					bad := make(map[*sarama.ProducerMessage]bool, len(perrs))
					for _, pe := range perrs {
						bad[pe.Msg] = true
					}
					for _, m := range batch {
						if !bad[m] {
							pr.confirm(m)
						}
					}
					batch = batch[:0]
					for _, pe := range perrs {
						m := pe.Msg
						batch = append(batch, &sarama.ProducerMessage{Topic: m.Topic, Key: m.Key, Value: m.Value, Partition: m.Partition})
					}
				}
				select {
				case <-pr.halt:
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}()
}

func (pr *producer) stop() {
	pr.once.Do(func() { close(pr.halt) })
	<-pr.done
}

// -------------------------------------------------------------- sampler --

// sampler polls the group's committed offsets a few times a second: on a
// real cluster the only view of commits there is, on the embedded broker a
// second one. Each sample is checked against the acks made before it was
// read.
type sampler struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
	group  string
	topic  string
	parts  []int32

	mu      sync.Mutex
	samples []commitView
	errs    int

	halt chan struct{}
	done chan struct{}
	once sync.Once
}

func startSampler(t *testing.T, c *kafkatest.Cluster, group, topic string, partitions int) *sampler {
	cfg := c.SaramaConfig()
	cfg.ClientID = "chaos-sampler"
	cfg.Net.ReadTimeout = 10 * time.Second // a hung coordinator
	client, err := sarama.NewClient(c.Brokers(), cfg)
	if err != nil {
		t.Fatalf("sampler client: %v", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		t.Fatalf("sampler admin: %v", err)
	}
	s := &sampler{client: client, admin: admin, group: group, topic: topic, halt: make(chan struct{}), done: make(chan struct{})}
	for p := range int32(partitions) {
		s.parts = append(s.parts, p)
	}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.halt:
				return
			case <-tk.C:
				_, _ = s.poll()
			}
		}
	}()
	return s
}

// poll reads the committed offsets once and records them as a sample.
func (s *sampler) poll() (map[int32]kafkatest.CommittedOffset, error) {
	resp, err := s.admin.ListConsumerGroupOffsets(s.group, map[string][]int32{s.topic: s.parts})
	if err == nil && resp.Err != sarama.ErrNoError {
		err = resp.Err
	}
	if err != nil {
		s.failed()
		if !errors.Is(err, sarama.ErrGroupIDNotFound) {
			_ = s.client.RefreshCoordinator(s.group)
		}
		return nil, err
	}
	at := time.Now()
	out := make(map[int32]kafkatest.CommittedOffset, len(s.parts))
	for _, p := range s.parts {
		co := kafkatest.CommittedOffset{Offset: -1}
		if b := resp.GetBlock(s.topic, p); b != nil {
			if b.Err != sarama.ErrNoError {
				s.failed()
				return nil, b.Err
			}
			co = kafkatest.CommittedOffset{Offset: b.Offset, Metadata: b.Metadata}
		}
		out[p] = co
	}
	s.mu.Lock()
	s.samples = append(s.samples, commitView{source: fmt.Sprintf("polled offsets #%d", len(s.samples)+1), at: at, offsets: out})
	s.mu.Unlock()
	return out, nil
}

func (s *sampler) failed() {
	s.mu.Lock()
	s.errs++
	s.mu.Unlock()
}

func (s *sampler) views() []commitView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// ends returns the end (high-water mark) of every partition, retrying
// while the broker is unavailable.
func (s *sampler) ends(t *testing.T) map[int32]int64 {
	t.Helper()
	out := make(map[int32]int64)
	var lastErr error
	ok := waitCond(2*time.Minute, func() bool {
		for _, p := range s.parts {
			if _, done := out[p]; done {
				continue
			}
			off, err := s.client.GetOffset(s.topic, p, sarama.OffsetNewest)
			if err != nil {
				lastErr = err
				_ = s.client.RefreshMetadata(s.topic)
				return false
			}
			out[p] = off
		}
		return true
	})
	if !ok {
		t.Fatalf("reading the end of %s: %v", s.topic, lastErr)
	}
	return out
}

func (s *sampler) close() {
	s.once.Do(func() {
		close(s.halt)
		<-s.done
		_ = s.client.Close()
	})
}
