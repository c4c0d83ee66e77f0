package main

// The churn workload (issue 43, "Measured"): a group of steady members
// while one more member joins and leaves every period, on each group
// protocol. It measures what a member coming and going costs the partitions
// that stay where they are (they should never stop), the partitions that
// move (how long until they resume at the new owner), and the group's rate.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
)

const (
	churnPartitions = 12
	churnSteady     = 3 // members present throughout
	churnConc       = 64
	churnWork       = 2 * time.Millisecond
)

// churnMode is how a churn contender's members form their group.
type churnMode struct {
	protocol    safeack.GroupProtocol
	cooperative bool // classic: Sarama's cooperative-sticky instead of its default (range, eager)
}

// The churn contenders' labels.
const (
	churnEager       = "classic eager (range)"
	churnCooperative = "classic cooperative-sticky"
	churnConsumer    = "consumer protocol (uniform)"
)

func churnWorkload() *workload {
	period, dur := churnTimes()
	t := &topicSpec{name: "churn", partitions: churnPartitions, valueSize: valueSize, keys: 1000}
	w := &workload{
		name: "churn",
		desc: fmt.Sprintf("%d partitions fed by a live producer, %d members steady, a %dth joining and leaving every %v for %v (%d events), handlers %v, MaxInFlight %d per member, Unordered",
			churnPartitions, churnSteady, churnSteady+1, period, dur, churnEvents(), churnWork, churnConc),
		cols: []string{"rate", "x:ready", "x:basegap", "x:basestall", "x:gapp99", "x:gapmax", "x:stall", "x:gapbeyond", "x:unmoved", "x:moved", "x:resp50", "x:resp99", "x:resmax", "x:xdrainmax", "x:drainmax", "x:assignp50", "x:assignmax", "x:firstp50", "x:firstmax", "x:minlag", "x:churndups", "x:load"},
		run:  runChurn,
		cases: []*caseSpec{
			{label: churnEager, kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: churnConc, churn: &churnMode{}},
			{label: churnCooperative, kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: churnConc, churn: &churnMode{cooperative: true}},
			{label: churnConsumer, kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: churnConc, churn: &churnMode{protocol: safeack.GroupProtocolConsumer}},
		},
	}
	w.notes = append(w.notes, churnNotes()...)
	return w
}

// churnTimes are the churn period and the measured window (-churn-period,
// -churn-duration; -quick shortens both).
func churnTimes() (period, dur time.Duration) {
	period, dur = opt.churnPeriod, opt.churnDuration
	if period <= 0 {
		period = quick(10*time.Second, 6*time.Second)
	}
	if dur <= 0 {
		dur = quick(2*time.Minute, 24*time.Second)
	}
	return period, dur
}

// churnEvents is the number of churn events in the window: a join at every
// even period, a leave at every odd one.
func churnEvents() int {
	period, dur := churnTimes()
	return max(1, int(dur/period))
}

func churnNotes() []string {
	hb := "each protocol's defaults: classic members heartbeat every 3 s (Sarama's Consumer.Group.Heartbeat.Interval), consumer-protocol members as the broker says (group.consumer.heartbeat.interval.ms, 5 s on Kafka and on kfake unless the broker sets another)"
	if opt.churnHeartbeat > 0 {
		hb = fmt.Sprintf("heartbeats every %v on both protocols (-churn-heartbeat): Sarama's Consumer.Group.Heartbeat.Interval for classic members, the group's consumer.heartbeat.interval.ms (IncrementalAlterConfigs on the GROUP resource before the members start) for the consumer protocol (on the embedded kfake, which reads it from its broker config only, group.consumer.heartbeat.interval.ms of the whole broker)", opt.churnHeartbeat)
	}
	return []string{
		"Each run: a fresh topic and group; the producer fills every partition with -churn-backlog records, then the steady members start; once each partition is delivered by exactly one member, 4 each, the window starts (ready s = start to then; the 2 s before the first event give the steady gap). Event k at k × period: a new member (a new Subscriber) joins at even k, and that member leaves (Close) at odd k. The window ends one period after the last event. Every member: safeack.Subscriber, Unordered, MaxInFlight 64, handler = a goroutine per message sleeping 2 ms then acking; the Sarama config is the bench's usual one. " + hb + ".",
		"A delivery is the bench reading a message from a member's Subscribe channel (its partition from MessagePartitionFromCtx). A gap is the time between two consecutive deliveries of one partition by the same member with no delivery of that partition by another member in between: it lies within that member's ownership.",
		"For event k, a partition did not move when every delivery of it from event k to event k+1 (or the window's end), and the last one before event k, came from one member: its ownership spans the event. Its gap for the event is the longest gap ending in that interval; gap p99/max are over all (unmoved partition, event) pairs, and unmoved counts them. steady gap is the longest gap of any partition in the 2 s before the first event, with no churn. stall is the longest time in which no member delivered anything at all (in the steady 2 s, and over the window): a gap no longer than the stall is the process's (scheduling, GC, a loaded machine), not the group protocol's. gap beyond stall = the largest, over the unmoved gaps, of the gap less the longest time inside it in which the whole process delivered nothing.",
		"A partition moved at event k otherwise. Its stop is the old owner's last delivery of it before the first delivery by another member (with a fed partition an owner delivers every few ms until it is told to stop, so this is the revocation to within a few ms); resume = that first delivery by another member; stop→resume p50/p99/max over the moved (partition, event) pairs. drain = the stop → the old owner's final commit of the partition (Observer CommitEvent.Final, when answered): the time the protocol lets the old owner finish. (stop→resume) − drain is what the handover added beyond the drain (max shown); with no final commit seen, drain counts as 0. stop→assigned = the stop → the new owner's PartitionStats.AssignedAt (when its engine took the partition; Stats read every 20 ms), assigned→first = from then to its first delivery: the protocol's part and the engine's part of the handover.",
		"rec/s = records acked for the first time in the window / window length (all members). dups = acks of records acked before (redeliveries after a rebalance). min lag = the smallest backlog of any partition over the window: records the broker had acknowledged to the producer beyond the furthest offset delivered, sampled every 20 ms. Acknowledgements arrive after the broker appended, so this is a lower bound: above 0 proves no partition ran dry (no gap came from an empty partition); at or below 0 it proves nothing. The producer (a Sarama async producer in the bench process) tops every partition up to -churn-backlog records ahead of delivery every 10 ms.",
		"All members, the producer and the bookkeeping run in the bench process; the broker (kfake) is a child process, or a real broker. The machine is shared with other work: load = the 1-minute load average as each run started (and the workload's before/after below).",
	}
}

// churnRecorder collects the deliveries, acks, final commits and backlog
// of one churn run. Times are ns since base.
type churnRecorder struct {
	base time.Time

	mu    [churnPartitions]sync.Mutex
	dels  [churnPartitions][]churnDelivery
	acked [churnPartitions][]bool
	// maxDelivered is the highest offset delivered per partition, +1.
	maxDelivered [churnPartitions]atomic.Int64
	// produced is the offset after the last record the broker acknowledged,
	// per partition.
	produced [churnPartitions]atomic.Int64

	windowFrom, windowTo atomic.Int64 // the measured window, ns since base (0: not yet)
	firstAcks, dups      atomic.Int64 // in the window / overall

	fmu    sync.Mutex
	finals map[[2]int][]int64 // {member, partition} → final commit answered

	smu      sync.Mutex
	subs     map[int]*safeack.Subscriber // the live members, by index
	assigned map[[2]int][]int64          // {member, partition} → PartitionStats.AssignedAt seen
}

type churnDelivery struct {
	at     int64
	member int
}

func newChurnRecorder() *churnRecorder {
	return &churnRecorder{base: time.Now(), finals: map[[2]int][]int64{}, subs: map[int]*safeack.Subscriber{}, assigned: map[[2]int][]int64{}}
}

func (c *churnRecorder) now() int64 { return int64(time.Since(c.base)) }

func (c *churnRecorder) delivered(member int, p int32, off int64) {
	at := c.now()
	c.mu[p].Lock()
	c.dels[p] = append(c.dels[p], churnDelivery{at: at, member: member})
	c.mu[p].Unlock()
	for {
		cur := c.maxDelivered[p].Load()
		if off+1 <= cur || c.maxDelivered[p].CompareAndSwap(cur, off+1) {
			return
		}
	}
}

func (c *churnRecorder) ackedRecord(p int32, off int64) {
	at := c.now()
	c.mu[p].Lock()
	a := c.acked[p]
	for int64(len(a)) <= off {
		a = append(a, make([]bool, max(1024, len(a)))...)
	}
	dup := a[off]
	a[off] = true
	c.acked[p] = a
	c.mu[p].Unlock()
	if dup {
		c.dups.Add(1)
		return
	}
	if from, to := c.windowFrom.Load(), c.windowTo.Load(); from > 0 && at >= from && (to == 0 || at < to) {
		c.firstAcks.Add(1)
	}
}

func (c *churnRecorder) finalCommit(member int, e safeack.CommitEvent) {
	if !e.Final || e.Err != nil {
		return
	}
	at := int64(e.Start.Add(e.Duration).Sub(c.base))
	c.fmu.Lock()
	for _, p := range e.Partitions {
		k := [2]int{member, int(p.Partition)}
		c.finals[k] = append(c.finals[k], at)
	}
	c.fmu.Unlock()
}

// churnObserver reports a member's final commits to the recorder.
type churnObserver struct {
	rec    *churnRecorder
	member int
}

func (o churnObserver) Delivered(ctx context.Context, _ safeack.Delivery) (context.Context, safeack.DeliveryObserver) {
	return ctx, nil
}
func (o churnObserver) Committed(e safeack.CommitEvent) { o.rec.finalCommit(o.member, e) }

// churnMember is one running Subscriber of a churn run.
type churnMember struct {
	sub  *safeack.Subscriber
	done <-chan struct{}
}

func startChurnMember(ctx context.Context, env *brokerEnv, c *caseSpec, topic, group string, idx int, rec *churnRecorder) (*churnMember, error) {
	cfg, err := safeackConfig(env, c, group)
	if err != nil {
		return nil, err
	}
	cfg.Observer = churnObserver{rec: rec, member: idx}
	if c.churn.cooperative {
		cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	if opt.churnHeartbeat > 0 && c.churn.protocol == safeack.GroupProtocolClassic {
		cfg.OverwriteSaramaConfig.Consumer.Group.Heartbeat.Interval = opt.churnHeartbeat
	}
	s, err := safeack.NewSubscriber(cfg, wmLogger(fmt.Sprintf("%s/m%d", c.label, idx)))
	if err != nil {
		return nil, err
	}
	ch, err := s.Subscribe(ctx, topic)
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range ch {
			p, _ := safeack.MessagePartitionFromCtx(msg.Context())
			off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context())
			rec.delivered(idx, p, off)
			go func(m *message.Message) {
				time.Sleep(churnWork)
				if m.Ack() {
					rec.ackedRecord(p, off)
				}
			}(msg)
		}
	}()
	rec.smu.Lock()
	rec.subs[idx] = s
	rec.smu.Unlock()
	return &churnMember{sub: s, done: done}, nil
}

// sampleAssignments reads every live member's Stats every 20 ms until stop
// and keeps each partition's AssignedAt per member: when the member's
// engine took the partition, which splits a handover into the protocol's
// part (until the new owner has it) and the engine's (until its first
// delivery).
func (c *churnRecorder) sampleAssignments(stop <-chan struct{}) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		c.smu.Lock()
		for idx, s := range c.subs {
			for _, ps := range s.Stats() {
				if ps.AssignedAt.IsZero() {
					continue
				}
				k := [2]int{idx, int(ps.Partition)}
				at := int64(ps.AssignedAt.Sub(c.base))
				if l := c.assigned[k]; len(l) == 0 || l[len(l)-1] != at {
					c.assigned[k] = append(l, at)
				}
			}
		}
		c.smu.Unlock()
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

func (m *churnMember) close() error {
	err := m.sub.Close()
	<-m.done
	return err
}

// churnProducer keeps every partition -churn-backlog records ahead of the
// furthest delivered offset.
type churnProducer struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    atomic.Pointer[error]
}

func startChurnProducer(ctx context.Context, env *brokerEnv, topic string, rec *churnRecorder) (*churnProducer, error) {
	p, err := sarama.NewAsyncProducerFromClient(env.client)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	cp := &churnProducer{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for m := range p.Successes() {
			for {
				cur := rec.produced[m.Partition].Load()
				if m.Offset+1 <= cur || rec.produced[m.Partition].CompareAndSwap(cur, m.Offset+1) {
					break
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		for e := range p.Errors() {
			err := e.Err
			cp.err.CompareAndSwap(nil, &err)
		}
	}()
	backlog := int64(opt.churnBacklog)
	var sent [churnPartitions]int64
	index := 0
	fill := func() bool {
		for part := range churnPartitions {
			want := backlog - (sent[part] - rec.maxDelivered[part].Load())
			for ; want > 0; want-- {
				v := make([]byte, valueSize)
				binary.BigEndian.PutUint64(v, uint64(index))
				m := &sarama.ProducerMessage{Topic: topic, Partition: int32(part), Key: sarama.StringEncoder(fmt.Sprintf("k%d", index%1000)), Value: sarama.ByteEncoder(v)}
				select {
				case p.Input() <- m:
				case <-ctx.Done():
					return false
				}
				sent[part]++
				index++
			}
		}
		return true
	}
	go func() {
		defer close(cp.done)
		defer func() { p.AsyncClose(); wg.Wait() }()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for fill() {
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	// The backlog is in place before any member starts.
	deadline := time.Now().Add(60 * time.Second)
	for {
		full := true
		for part := range churnPartitions {
			if rec.produced[part].Load() < backlog {
				full = false
			}
		}
		if full {
			return cp, nil
		}
		if e := cp.err.Load(); e != nil {
			cp.stop()
			return nil, fmt.Errorf("producing the backlog: %w", *e)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cp.stop()
			return nil, fmt.Errorf("the backlog of %d records per partition was not produced within 60 s", backlog)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (cp *churnProducer) stop() error {
	cp.cancel()
	<-cp.done
	if e := cp.err.Load(); e != nil {
		return *e
	}
	return nil
}

// setGroupHeartbeat sets a consumer-protocol group's
// consumer.heartbeat.interval.ms (a group config, KIP-848) before its
// members join.
func setGroupHeartbeat(ctx context.Context, env *brokerEnv, group string, d time.Duration) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = "consumer.heartbeat.interval.ms"
	v := fmt.Sprint(d.Milliseconds())
	cfg.Value = &v
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = *r.ErrorMessage
			}
			return fmt.Errorf("group %s consumer.heartbeat.interval.ms=%s: %w %s", group, v, err, msg)
		}
	}
	return nil
}

func runChurn(ctx context.Context, env *brokerEnv, w *workload) (*section, error) {
	sec := newSection(w)
	cases := selectedOnly(w)
	failed, err := repeatCases(ctx, sec, cases, 28, func(c *caseSpec, rep int) (*result, error) {
		return runChurnCase(ctx, env, w, c, rep), nil
	}, func(r *result) string {
		x := r.extra
		return fmt.Sprintf("%9.0f rec/s  ready %.1fs  steady gap %s ms (stall %s)  unmoved gap p99/max %s/%s ms (%0.f pairs, stall %s ms, beyond stall %s ms)  moved %0.f: stop→resume p50/p99/max %s/%s/%s ms, drain max %s ms, stop→assigned p50/max %s/%s ms, assigned→first delivery p50/max %s/%s ms  min lag %.0f  dups %.0f  load %.2f",
			r.rate(), x["ready"], fmtMs(x["basegap"]), fmtMs(x["basestall"]), fmtMs(x["gapp99"]), fmtMs(x["gapmax"]), x["unmoved"], fmtMs(x["stall"]), fmtMs(x["gapbeyond"]), x["moved"],
			fmtMs(x["resp50"]), fmtMs(x["resp99"]), fmtMs(x["resmax"]), fmtMs(x["drainmax"]), fmtMs(x["assignp50"]), fmtMs(x["assignmax"]), fmtMs(x["firstp50"]), fmtMs(x["firstmax"]), x["minlag"], x["churndups"], x["load"])
	})
	if err != nil {
		return sec, err
	}
	return sec, failed
}

func runChurnCase(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, rep int) *result {
	r := &result{retained: -1, commit: -1, endLag: -1, allocs: -1}
	period, dur := churnTimes()
	events := churnEvents()
	clean := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(c.label, "_")
	topic := fmt.Sprintf("bench-%s-churn-%s-r%d", env.runID, clean, rep)
	if err := env.createTopic(ctx, topic, churnPartitions); err != nil {
		r.err = err
		return r
	}
	// Each run writes a few million records: the topic goes at once (kfake
	// keeps every record in memory), unless -keep-topics.
	defer func() {
		if opt.keepTopics {
			return
		}
		if err := env.admin.DeleteTopic(topic); err != nil {
			logf("delete topic %s: %v", topic, err)
		}
	}()
	group := groupName(env, w.name, c.label, rep)
	if opt.churnHeartbeat > 0 && c.churn.protocol == safeack.GroupProtocolConsumer {
		if err := setGroupHeartbeat(ctx, env, group, opt.churnHeartbeat); err != nil {
			r.err = err
			return r
		}
	}
	load := loadAvg()
	rec := newChurnRecorder()
	prod, err := startChurnProducer(ctx, env, topic, rec)
	if err != nil {
		r.err = err
		return r
	}
	var members []*churnMember
	defer func() {
		var wg sync.WaitGroup
		for _, m := range members {
			if m != nil {
				wg.Add(1)
				go func() { defer wg.Done(); _ = m.close() }()
			}
		}
		wg.Wait()
		if err := prod.stop(); err != nil && r.err == nil {
			r.err = fmt.Errorf("producer: %w", err)
		}
	}()
	start := rec.now()
	for i := range churnSteady {
		m, err := startChurnMember(ctx, env, c, topic, group, i, rec)
		if err != nil {
			r.err = err
			return r
		}
		members = append(members, m)
	}
	// Ready: every partition delivered by exactly one member in the last
	// 500 ms, each steady member holding its share.
	readyBy := time.Now().Add(90 * time.Second)
	for !rec.balanced(500*time.Millisecond, churnSteady) {
		if time.Now().After(readyBy) || ctx.Err() != nil {
			r.err = fmt.Errorf("the %d steady members did not settle on %d partitions each within 90 s", churnSteady, churnPartitions/churnSteady)
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
	ready := rec.now()
	time.Sleep(2 * time.Second) // the steady gap's window
	t0 := rec.now()
	rec.windowFrom.Store(t0)
	lagStop := make(chan struct{})
	lagDone := make(chan int64)
	go func() { lagDone <- rec.sampleMinLag(lagStop) }()
	assignDone := make(chan struct{})
	go func() { rec.sampleAssignments(lagStop); close(assignDone) }()
	eventAt := make([]int64, events)
	var closing sync.WaitGroup
	var churner *churnMember
	for k := range events {
		if d := time.Duration(t0 + int64(k)*int64(period) - rec.now()); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			r.err = ctx.Err()
			break
		}
		eventAt[k] = rec.now()
		if k%2 == 0 {
			m, err := startChurnMember(ctx, env, c, topic, group, churnSteady+k/2, rec)
			if err != nil {
				r.err = err
				break
			}
			churner = m
			members = append(members, m)
		} else {
			m := churner
			churner = nil
			members = slices.DeleteFunc(members, func(x *churnMember) bool { return x == m })
			rec.smu.Lock()
			delete(rec.subs, churnSteady+k/2)
			rec.smu.Unlock()
			closing.Add(1)
			go func() {
				defer closing.Done()
				began := time.Now()
				if err := m.close(); err != nil {
					vlogf("%s: close: %v", c.label, err)
				}
				vlogf("%s: member closed in %v", c.label, time.Since(began).Round(time.Millisecond))
			}()
		}
	}
	if r.err == nil {
		if d := time.Duration(t0 + int64(dur) - rec.now()); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				r.err = ctx.Err()
			}
		}
	}
	tEnd := rec.now()
	rec.windowTo.Store(tEnd)
	close(lagStop)
	minLag := <-lagDone
	<-assignDone
	closing.Wait()
	if r.err != nil {
		return r
	}
	r.n = int(rec.firstAcks.Load())
	r.active = time.Duration(tEnd - t0)
	r.startup = time.Duration(ready - start)
	a := rec.analyse(ready+int64(0), t0, eventAt, tEnd)
	a.extra["ready"] = time.Duration(ready - start).Seconds()
	a.extra["minlag"] = float64(minLag)
	a.extra["churndups"] = float64(rec.dups.Load())
	if l, err := strconv.ParseFloat(strings.Fields(load + " ?")[0], 64); err == nil {
		a.extra["load"] = l
	}
	r.extra = a.extra
	r.churn = a
	return r
}

// balanced reports whether, over the last d, every partition was delivered
// by exactly one member and each of n members delivered an equal share.
func (c *churnRecorder) balanced(d time.Duration, n int) bool {
	since := c.now() - int64(d)
	per := map[int]int{}
	for p := range churnPartitions {
		c.mu[p].Lock()
		owners := map[int]bool{}
		for i := len(c.dels[p]) - 1; i >= 0 && c.dels[p][i].at >= since; i-- {
			owners[c.dels[p][i].member] = true
		}
		c.mu[p].Unlock()
		if len(owners) != 1 {
			return false
		}
		for m := range owners {
			per[m]++
		}
	}
	if len(per) != n {
		return false
	}
	for _, k := range per {
		if k != churnPartitions/n {
			return false
		}
	}
	return true
}

// sampleMinLag samples every partition's backlog every 20 ms until stop
// and returns the smallest seen.
func (c *churnRecorder) sampleMinLag(stop <-chan struct{}) int64 {
	minLag := int64(math.MaxInt64)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		for p := range churnPartitions {
			minLag = min(minLag, c.produced[p].Load()-c.maxDelivered[p].Load())
		}
		select {
		case <-t.C:
		case <-stop:
			return minLag
		}
	}
}

// churnGap is where an unmoved partition's longest gap of an event lay.
type churnGap struct {
	p, member, event int
	from, to         int64
}

// churnAnalysis is what one churn run measured.
type churnAnalysis struct {
	gaps    []time.Duration // per (unmoved partition, event): its longest gap
	resumes []time.Duration // per (moved partition, event): stop → resume
	drains  []time.Duration // per moved pair with a final commit seen: stop → final commit
	excess  []time.Duration // per moved pair: (stop → resume) − drain
	gapAt   []churnGap      // where each of gaps lies
	// Per moved pair whose new owner's AssignedAt was seen: stop → the
	// new owner's engine has the partition, and from then to its first
	// delivery.
	toAssigned, toFirst []time.Duration
	extra               map[string]float64
}

// analyse applies the definitions of the notes to the recorded deliveries.
// events are the churn events' times, end the window's end, steadyFrom the
// start of the steady-gap window (which ends at the first event).
func (c *churnRecorder) analyse(steadyFrom, steadyTo int64, events []int64, end int64) *churnAnalysis {
	a := &churnAnalysis{extra: map[string]float64{}}
	var baseGap int64
	bounds := append(slices.Clone(events), end)
	var all []int64 // every delivery's time, for the process-wide stalls
	for p := range churnPartitions {
		c.mu[p].Lock()
		dels := slices.Clone(c.dels[p])
		c.mu[p].Unlock()
		for _, d := range dels {
			all = append(all, d.at)
		}
		slices.SortStableFunc(dels, func(x, y churnDelivery) int { return int(x.at - y.at) })
		baseGap = max(baseGap, longestGap(dels, steadyFrom+1, steadyTo))
		for k := range events {
			from, to := bounds[k], bounds[k+1]
			first, _ := slices.BinarySearchFunc(dels, from, func(d churnDelivery, t int64) int { return int(d.at - t) })
			last, _ := slices.BinarySearchFunc(dels, to, func(d churnDelivery, t int64) int { return int(d.at - t) })
			lo := max(first-1, 0) // the last delivery before the event
			in := dels[lo:last]
			if len(in) == 0 {
				continue
			}
			owner := in[0].member
			moved := slices.ContainsFunc(in, func(d churnDelivery) bool { return d.member != owner })
			if !moved {
				g, gEnd := longestGapAt(in, math.MinInt64, to)
				if last == first { // nothing delivered since the event: stopped until the window's end at least
					g, gEnd = to-in[0].at, to
				}
				a.gaps = append(a.gaps, time.Duration(g))
				a.gapAt = append(a.gapAt, churnGap{p: p, member: owner, event: k, from: gEnd - g, to: gEnd})
				continue
			}
			// Moved: the first delivery by another member, and the old
			// owner's last delivery before it.
			j := slices.IndexFunc(in, func(d churnDelivery) bool { return d.member != owner })
			resume := in[j].at
			stop := in[j-1].at // in[j-1] is the old owner's: every delivery before j is
			a.resumes = append(a.resumes, time.Duration(resume-stop))
			if opt.verbose {
				logf("    moved: partition %d, member %d → %d at event %d: stop %+.3fs, resume %+.3fs after the event", p, owner, in[j].member, k, float64(stop-from)/1e9, float64(resume-from)/1e9)
			}
			drain := int64(0)
			c.fmu.Lock()
			for _, f := range c.finals[[2]int{owner, p}] {
				if f >= stop {
					drain = f - stop
					a.drains = append(a.drains, time.Duration(drain))
					break
				}
			}
			c.fmu.Unlock()
			a.excess = append(a.excess, time.Duration(resume-stop-min(drain, resume-stop)))
			// The new owner's engine took the partition at its latest
			// AssignedAt before the resume.
			c.smu.Lock()
			var got int64 = -1
			for _, x := range c.assigned[[2]int{in[j].member, p}] {
				if x <= resume && x >= stop-int64(time.Second) {
					got = x
				}
			}
			c.smu.Unlock()
			if got >= 0 {
				a.toAssigned = append(a.toAssigned, time.Duration(got-stop))
				a.toFirst = append(a.toFirst, time.Duration(resume-got))
			}
		}
	}
	slices.Sort(all)
	stall := func(from, to int64) int64 {
		var g int64
		for i := 1; i < len(all); i++ {
			if all[i] > from && all[i] < to {
				g = max(g, all[i]-all[i-1])
			}
		}
		return g
	}
	msOf := func(d time.Duration) float64 { return float64(d) / 1e6 }
	// Each unmoved gap beyond the longest silence of the whole process
	// inside it: what is left once the machine's stalls are taken out.
	var beyond time.Duration
	for i, g := range a.gapAt {
		lo, _ := slices.BinarySearch(all, g.from)
		hi, _ := slices.BinarySearch(all, g.to+1)
		var silence int64
		for j := lo + 1; j < hi; j++ {
			silence = max(silence, all[j]-all[j-1])
		}
		beyond = max(beyond, a.gaps[i]-time.Duration(silence))
	}
	a.extra["gapbeyond"] = msOf(beyond)
	if opt.verbose {
		c.logLongestGaps(a, events)
	}
	a.extra["basestall"] = msOf(time.Duration(stall(steadyFrom, steadyTo)))
	a.extra["stall"] = msOf(time.Duration(stall(events[0], end)))
	pct := func(ds []time.Duration, q float64) float64 {
		if len(ds) == 0 {
			return math.NaN()
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return msOf(s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)])
	}
	a.extra["basegap"] = msOf(time.Duration(baseGap))
	a.extra["unmoved"] = float64(len(a.gaps))
	a.extra["moved"] = float64(len(a.resumes))
	a.extra["gapp99"] = pct(a.gaps, 0.99)
	a.extra["gapmax"] = pct(a.gaps, 1)
	a.extra["resp50"] = pct(a.resumes, 0.5)
	a.extra["resp99"] = pct(a.resumes, 0.99)
	a.extra["resmax"] = pct(a.resumes, 1)
	a.extra["drainmax"] = pct(a.drains, 1)
	a.extra["xdrainmax"] = pct(a.excess, 1)
	a.extra["assignp50"] = pct(a.toAssigned, 0.5)
	a.extra["assignmax"] = pct(a.toAssigned, 1)
	a.extra["firstp50"] = pct(a.toFirst, 0.5)
	a.extra["firstmax"] = pct(a.toFirst, 1)
	for k, v := range a.extra {
		switch {
		case math.IsNaN(v):
			delete(a.extra, k)
		case v >= 10: // milliseconds: whole ones from 10 ms up, tenths below
			a.extra[k] = math.Round(v)
		default:
			a.extra[k] = math.Round(v*10) / 10
		}
	}
	return a
}

// longestGap is the longest time between consecutive deliveries by the
// same member, among dels (sorted by time) whose later delivery lies in
// (from, to).
func longestGap(dels []churnDelivery, from, to int64) int64 {
	g, _ := longestGapAt(dels, from, to)
	return g
}

// longestGapAt is longestGap and the time its later delivery happened.
func longestGapAt(dels []churnDelivery, from, to int64) (g, end int64) {
	for i := 1; i < len(dels); i++ {
		prev, cur := dels[i-1], dels[i]
		if cur.at <= from || cur.at >= to || cur.member != prev.member {
			continue
		}
		if cur.at-prev.at > g {
			g, end = cur.at-prev.at, cur.at
		}
	}
	return g, end
}

// logLongestGaps logs the five longest unmoved gaps (-v): where they lay,
// and what the same member delivered of its other partitions meanwhile (a
// member busy elsewhere points at its hand-out or fetching, a member silent
// everywhere at the process or the protocol).
func (c *churnRecorder) logLongestGaps(a *churnAnalysis, events []int64) {
	idx := make([]int, len(a.gapAt))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int { return int(a.gaps[y] - a.gaps[x]) })
	for _, i := range idx[:min(5, len(idx))] {
		g := a.gapAt[i]
		others, otherParts := 0, map[int]bool{}
		for p := range churnPartitions {
			if p == g.p {
				continue
			}
			c.mu[p].Lock()
			for _, d := range c.dels[p] {
				if d.member == g.member && d.at > g.from && d.at < g.to {
					others++
					otherParts[p] = true
				}
			}
			c.mu[p].Unlock()
		}
		logf("    gap %v: partition %d at member %d, event %d, %+.3fs → %+.3fs after the event; the member delivered %d records of %d other partitions meanwhile",
			a.gaps[i].Round(time.Millisecond), g.p, g.member, g.event, float64(g.from-events[g.event])/1e9, float64(g.to-events[g.event])/1e9, others, len(otherParts))
	}
}
