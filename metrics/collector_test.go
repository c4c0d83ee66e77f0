package metrics_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
	"github.com/safeack/safeack/metrics"
)

func testLogger() watermill.LoggerAdapter { return safeacktest.Logger() }

type po struct {
	p int32
	o int64
}

// consumer acks every message it gets except the held ones (kept unacked
// until release) and the nack-once ones (nacked on their first delivery).
type consumer struct {
	mu       sync.Mutex
	hold     map[po]bool
	nackOnce map[po]bool
	held     []*message.Message
}

func (c *consumer) run(msgs <-chan *message.Message) {
	for m := range msgs {
		p, _ := safeack.MessagePartitionFromCtx(m.Context())
		o, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
		k := po{p, o}
		c.mu.Lock()
		switch {
		case c.hold[k]:
			c.held = append(c.held, m)
			c.mu.Unlock()
		case c.nackOnce[k]:
			delete(c.nackOnce, k)
			c.mu.Unlock()
			m.Nack()
		default:
			c.mu.Unlock()
			m.Ack()
		}
	}
}

func (c *consumer) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = nil
	for _, m := range c.held {
		m.Ack()
	}
	c.held = nil
}

func newSubscriber(t *testing.T, c *kafkatest.Cluster, group string) *safeack.Subscriber {
	t.Helper()
	return safeacktest.NewSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Return.Errors = true
	})
}

// settled reports whether the subscriber owns want partitions of topic and
// each has taken every record up to hwm, answered all but held of them, and
// has its safe offset confirmed by the broker.
func settled(sub *safeack.Subscriber, topic string, hwm int64, held map[int32]int) bool {
	stats := sub.Stats()
	if len(stats) != len(held) {
		return false
	}
	for _, s := range stats {
		h, ok := held[s.Partition]
		if s.Topic != topic || !ok || s.Delivered != hwm || s.HighWaterMark != hwm ||
			s.InFlight != h || s.Completed != uint64(hwm)-uint64(h) || s.ConfirmedOffset != s.SafeOffset {
			return false
		}
	}
	return true
}

// stable strips what changes with the clock alone.
func stable(stats []safeack.PartitionStats) []safeack.PartitionStats {
	out := slices.Clone(stats)
	for i := range out {
		out[i].OldestUnfinishedAge = 0
		out[i].PausedFor = 0
	}
	return out
}

// expected renders what the collector must report for stats and totals, in
// the text exposition format, with the help texts the collector declared.
type expected struct {
	help  map[string]string
	types map[string]string
	lines map[string][]string
}

func (e *expected) add(name, typ string, v float64, labels ...string) {
	if e.types == nil {
		e.types, e.lines = map[string]string{}, map[string][]string{}
	}
	e.types[name] = typ
	var lb []string
	for i := 0; i < len(labels); i += 2 {
		lb = append(lb, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
	}
	slices.Sort(lb) // as the registry orders them
	e.lines[name] = append(e.lines[name], fmt.Sprintf("%s{%s} %s", name, strings.Join(lb, ","), strconv.FormatFloat(v, 'g', -1, 64)))
}

func (e *expected) names() []string {
	var out []string
	for n := range e.types {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (e *expected) String() string {
	var b strings.Builder
	for _, n := range e.names() {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", n, e.help[n], n, e.types[n])
		for _, l := range e.lines[n] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func b01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// want builds the expected exposition of everything but the age gauge,
// which moves with the clock.
func want(help map[string]string, stats []safeack.PartitionStats, totals []safeack.PartitionTotals) *expected {
	e := &expected{help: help}
	e.add("safeack_owned_partitions", "gauge", float64(len(stats)))
	for _, s := range stats {
		tp := []string{"partition", strconv.Itoa(int(s.Partition)), "topic", s.Topic}
		g := func(name string, v float64) { e.add("safeack_"+name, "gauge", v, tp...) }
		g("safe_offset", float64(s.SafeOffset))
		g("marked_offset", float64(s.MarkedOffset))
		if s.ConfirmedOffset >= 0 {
			g("confirmed_offset", float64(s.ConfirmedOffset))
		}
		if s.HighWaterMark >= 0 {
			g("high_water_mark", float64(s.HighWaterMark))
		}
		g("delivered_offset", float64(s.Delivered))
		g("lag_records", float64(s.Lag))
		g("retained_records", float64(s.Retained))
		g("blocked_records", float64(s.Blocked))
		g("in_flight_messages", float64(s.InFlight))
		g("waiting_for_key_records", float64(s.WaitingForKey))
		if s.HasUnfinished {
			g("oldest_unfinished_offset", float64(s.OldestUnfinished))
		}
		g("stuck", b01(s.Stuck))
		g("paused", b01(s.Paused))
		g("tail_metadata_bytes", float64(s.TailBytes))
		g("tail_truncated", b01(s.TailTruncated))
		g("assigned_timestamp_seconds", float64(s.AssignedAt.UnixNano())/1e9)
	}
	for _, t := range totals {
		tp := []string{"partition", strconv.Itoa(int(t.Partition)), "topic", t.Topic}
		c := func(name string, v float64, extra ...string) {
			e.add("safeack_"+name, "counter", v, append(slices.Clone(tp), extra...)...)
		}
		c("assignments_total", float64(t.Assignments))
		c("offered_records_total", float64(t.Offered))
		c("completed_records_total", float64(t.Completed))
		c("redeliveries_total", float64(t.Redeliveries))
		c("unmarshal_failures_total", float64(t.UnmarshalFailures))
		c("skipped_records_total", float64(t.SkippedTail), "reason", "tail")
		c("skipped_records_total", float64(t.SkippedRevoked), "reason", "revoked")
		c("dead_lettered_records_total", float64(t.DeadLettered))
		c("ignored_metadata_total", float64(t.IgnoredMetadata))
		c("log_truncations_total", float64(t.LogTruncations))
		c("deferred_completions_total", float64(t.Deferred))
		c("paused_seconds_total", t.PausedFor.Seconds())
	}
	return e
}

// allNames lists every metric the collector declares.
var allNames = []string{
	"safeack_owned_partitions",
	"safeack_safe_offset", "safeack_marked_offset", "safeack_confirmed_offset",
	"safeack_high_water_mark", "safeack_delivered_offset", "safeack_lag_records",
	"safeack_retained_records", "safeack_blocked_records", "safeack_in_flight_messages",
	"safeack_waiting_for_key_records", "safeack_oldest_unfinished_offset",
	"safeack_oldest_unfinished_age_seconds", "safeack_stuck", "safeack_paused",
	"safeack_tail_metadata_bytes", "safeack_tail_truncated", "safeack_assigned_timestamp_seconds",
	"safeack_unclaimed_seconds",
	"safeack_assignments_total", "safeack_offered_records_total", "safeack_completed_records_total",
	"safeack_redeliveries_total", "safeack_unmarshal_failures_total", "safeack_skipped_records_total", "safeack_dead_lettered_records_total",
	"safeack_ignored_metadata_total", "safeack_log_truncations_total", "safeack_deferred_completions_total", "safeack_paused_seconds_total",
}

// helpTexts gathers the collector for the help text of each family it
// exports now, and checks that it describes exactly allNames.
func helpTexts(t *testing.T, col prometheus.Collector) map[string]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	ch := make(chan *prometheus.Desc, 64)
	col.Describe(ch)
	close(ch)
	var described []string
	for d := range ch {
		s := d.String()
		i := strings.Index(s, `fqName: "`)
		if i < 0 {
			t.Fatalf("cannot read descriptor %s", s)
		}
		name := s[i+len(`fqName: "`):]
		described = append(described, name[:strings.IndexByte(name, '"')])
	}
	slices.Sort(described)
	names := slices.Sorted(slices.Values(allNames))
	if !slices.Equal(described, names) {
		t.Fatalf("Describe sent %v; want %v", described, names)
	}
	return help
}

// compareNow checks the collector against Stats and Totals read around it:
// the clock-bound age gauge must lie between the two reads, everything else
// must equal them exactly.
func compareNow(t *testing.T, sub *safeack.Subscriber, col prometheus.Collector) {
	t.Helper()
	var lastErr error
	for range 20 {
		help := helpTexts(t, col)
		before := sub.Stats()
		totals := sub.Totals()
		e := want(help, before, totals)
		// Every partition here is consumed: none is unclaimed (its gauge
		// is checked by TestCollectorUnclaimed).
		names := slices.DeleteFunc(slices.Clone(allNames), func(n string) bool {
			return n == "safeack_oldest_unfinished_age_seconds" || n == "safeack_paused_seconds_total" ||
				n == "safeack_unclaimed_seconds"
		})
		for _, n := range names {
			if _, ok := e.types[n]; !ok && len(before) > 0 && n != "safeack_oldest_unfinished_offset" && n != "safeack_confirmed_offset" && n != "safeack_high_water_mark" {
				t.Fatalf("expected exposition lacks %s", n)
			}
		}
		err := testutil.CollectAndCompare(col, strings.NewReader(e.String()), names...)
		after := sub.Stats()
		if err == nil && slices.Equal(stable(before), stable(after)) {
			checkAges(t, sub, col)
			return
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("collector never matched Stats/Totals: %v", lastErr)
}

// checkAges checks the age gauge, which moves with the clock, against
// Stats read just before and just after the scrape.
func checkAges(t *testing.T, sub *safeack.Subscriber, col prometheus.Collector) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	ages := func() map[string]float64 {
		out := map[string]float64{}
		for _, s := range sub.Stats() {
			out[strconv.Itoa(int(s.Partition))] = s.OldestUnfinishedAge.Seconds()
		}
		return out
	}
	lo := ages()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hi := ages()
	found := 0
	for _, mf := range mfs {
		if mf.GetName() != "safeack_oldest_unfinished_age_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var p string
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" {
					p = l.GetValue()
				}
			}
			v := m.GetGauge().GetValue()
			if v < lo[p] || v > hi[p] {
				t.Errorf("partition %s: oldest unfinished age %v outside [%v, %v]", p, v, lo[p], hi[p])
			}
			found++
		}
	}
	if found != len(lo) {
		t.Errorf("%d age series; want %d", found, len(lo))
	}
}

func TestCollectorReportsStats(t *testing.T) {
	c := kafkatest.Start(t)
	const partitions, perPartition = 3, 10
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)

	sub := newSubscriber(t, c, group)
	col := metrics.NewCollector(sub)
	helpTexts(t, col)

	// Nothing owned yet: only the owned-partitions gauge, at zero.
	if n := testutil.CollectAndCount(col); n != 1 {
		t.Fatalf("before Subscribe: %d series; want 1", n)
	}

	// Partition 0 holds 3 and 7 unacked (5 completed records blocked
	// behind 3, one behind 7), partition 1 holds 5, partition 2 completes
	// everything after one redelivery of 4.
	cons := &consumer{
		hold:     map[po]bool{{0, 3}: true, {0, 7}: true, {1, 5}: true},
		nackOnce: map[po]bool{{2, 4}: true},
	}
	held := map[int32]int{0: 2, 1: 1, 2: 0}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		cons.run(msgs)
	}()

	kafkatest.WaitFor(t, 30*time.Second, "partitions to settle with held records", func() bool {
		return settled(sub, topic, perPartition, held)
	})
	stats := sub.Stats()
	byP := map[int32]safeack.PartitionStats{}
	for _, s := range stats {
		byP[s.Partition] = s
	}
	if s := byP[0]; s.SafeOffset != 3 || s.Retained != 7 || s.Blocked != 5 || !s.HasUnfinished || s.OldestUnfinished != 3 || s.Lag != 7 {
		t.Fatalf("partition 0: %+v", s)
	}
	if s := byP[2]; s.SafeOffset != perPartition || s.Retained != 0 || s.Redeliveries != 1 {
		t.Fatalf("partition 2: %+v", s)
	}
	time.Sleep(200 * time.Millisecond) // let a last commit interval encode the tails

	compareNow(t, sub, col)

	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}

	// End the assignment with records still held: the gauges go, the
	// counters stay.
	first := sub.Totals()
	cancel()
	<-consumed
	kafkatest.WaitFor(t, 10*time.Second, "partitions to be released", func() bool { return len(sub.Stats()) == 0 })
	cons.release() // late acks of abandoned messages change nothing
	ended := sub.Totals()
	if len(ended) != partitions {
		t.Fatalf("Totals after the assignment ended: %+v", ended)
	}
	for i, tt := range ended {
		if tt.Owned || tt.Assignments != 1 || tt.Offered != first[i].Offered || tt.Completed != first[i].Completed {
			t.Fatalf("totals of partition %d after the assignment ended: %+v; before: %+v", tt.Partition, tt, first[i])
		}
	}
	compareNow(t, sub, col)
	if n := testutil.CollectAndCount(col, "safeack_safe_offset"); n != 0 {
		t.Fatalf("%d safe-offset series without an assignment; want 0", n)
	}

	// A second assignment of the same partitions to the same Subscriber
	// resumes from the committed offsets: the held records are delivered
	// again and the counters keep counting from where they were.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	msgs, err = sub.Subscribe(ctx2, topic)
	if err != nil {
		t.Fatal(err)
	}
	cons2 := &consumer{}
	consumed2 := make(chan struct{})
	go func() {
		defer close(consumed2)
		cons2.run(msgs)
	}()
	kafkatest.WaitFor(t, 30*time.Second, "second assignment to complete everything", func() bool {
		stats := sub.Stats()
		if len(stats) != partitions {
			return false
		}
		for _, s := range stats {
			if s.SafeOffset != perPartition || s.ConfirmedOffset != perPartition || s.InFlight != 0 || s.HighWaterMark != perPartition {
				return false
			}
		}
		return true
	})
	compareNow(t, sub, col)
	for _, tt := range sub.Totals() {
		var prev safeack.PartitionTotals
		for _, e := range ended {
			if e.Partition == tt.Partition {
				prev = e
			}
		}
		if ps := byPartition(sub.Stats(), tt.Partition); tt.Assignments != 2 || !tt.Owned ||
			tt.Offered != prev.Offered+ps.Offered || tt.Completed != prev.Completed+ps.Completed ||
			tt.Redeliveries != prev.Redeliveries+ps.Redeliveries {
			t.Fatalf("partition %d: totals %+v; first assignment %+v, current %+v", tt.Partition, tt, prev, ps)
		}
		if tt.Completed < prev.Completed || tt.Offered < prev.Offered {
			t.Fatalf("partition %d: a counter went down: %+v after %+v", tt.Partition, tt, prev)
		}
	}
	// Partition 0 resumed at 3: 7 records again; partition 2 at 10: none.
	if tt := sub.Totals(); tt[0].Offered != 10+7 || tt[2].Offered != 10 {
		t.Fatalf("offered after the second assignment: %+v", tt)
	}
	cancel2()
	<-consumed2
}

func byPartition(stats []safeack.PartitionStats, p int32) safeack.PartitionStats {
	for _, s := range stats {
		if s.Partition == p {
			return s
		}
	}
	return safeack.PartitionStats{}
}

func TestCollectorOptions(t *testing.T) {
	c := kafkatest.Start(t)
	sub := newSubscriber(t, c, c.NewGroup(t))
	col := metrics.NewCollector(sub, metrics.WithNamespace("orders"), metrics.WithConstLabels(prometheus.Labels{"group": "g1"}))
	err := testutil.CollectAndCompare(col, strings.NewReader(`
# HELP orders_owned_partitions Partitions the subscriber owns.
# TYPE orders_owned_partitions gauge
orders_owned_partitions{group="g1"} 0
`))
	if err != nil {
		t.Fatal(err)
	}
	// Two subscribers in one registry need telling apart.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	if err := reg.Register(metrics.NewCollector(sub, metrics.WithNamespace("orders"), metrics.WithConstLabels(prometheus.Labels{"group": "g2"}))); err != nil {
		t.Fatalf("second collector with other const labels: %v", err)
	}
	if err := reg.Register(metrics.NewCollector(sub, metrics.WithNamespace("orders"), metrics.WithConstLabels(prometheus.Labels{"group": "g2"}))); err == nil {
		t.Fatal("a duplicate collector registered")
	}
}

// TestCollectorCountsDeadLetters: a record safeack.PoisonQueue publishes
// to a dead-letter topic is counted in safeack_dead_lettered_records_total.
func TestCollectorCountsDeadLetters(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 1)
	sub := newSubscriber(t, c, group)
	safeacktest.DeadLetterOne(t, c, sub, topic)
	want := `
# HELP safeack_dead_lettered_records_total Records published to a dead-letter topic by safeack.PoisonQueue (counted in completed_records_total too).
# TYPE safeack_dead_lettered_records_total counter
safeack_dead_lettered_records_total{partition="0",topic="` + topic + `"} 1
`
	if err := testutil.CollectAndCompare(metrics.NewCollector(sub), strings.NewReader(want), "safeack_dead_lettered_records_total"); err != nil {
		t.Fatal(err)
	}
}
