package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/safeack/safeack"
)

// topicSpec describes the records of one topic.
type topicSpec struct {
	name       string // unique per invocation; part of the topic name
	partitions int
	n          int
	valueSize  int
	keys       int // record i gets key "k<i % keys>"; 0: no key (safeack/key then runs one at a time per partition); -1: a unique key per record
}

func (s *topicSpec) partition(i int) int32 { return int32(i % s.partitions) }

func (s *topicSpec) key(i int) []byte {
	switch {
	case s.keys == 0:
		return nil
	case s.keys < 0:
		return []byte("k" + strconv.Itoa(i))
	}
	return []byte("k" + strconv.Itoa(i%s.keys))
}

type contenderKind int

const (
	kindSafeack contenderKind = iota
	kindWatermill
	kindBare
	kindLocal   // no Kafka: the work alone, at the same concurrency
	kindCeiling // no Kafka: a Watermill router over an in-memory GoChannel
	kindPC      // Confluent Parallel Consumer, a Java child process
	kindShare   // safeack.ShareSubscriber members, one child process each
)

// commits reports whether the contender commits offsets to the group.
func (k contenderKind) commits() bool { return k != kindLocal && k != kindCeiling && k != kindShare }

// caseSpec is one row of a workload's table: a contender on a topic.
type caseSpec struct {
	label    string
	kind     contenderKind
	ordering safeack.Ordering
	topic    *topicSpec
	conc     int
	work     []time.Duration // per record index; nil: zero work
	settings map[string]string
	router   bool    // safeack: consumed through a message.Router instead of reading the channel
	rate     float64 // steady: records/s to offer
	// The share workloads (share.go): members = child processes of a
	// share contender, shareSet the ShareSubscriberConfig fields each
	// sets (by name, as -safeack-set); poisonEvery > 0 makes every poisonEvery-th record
	// (index % poisonEvery == poisonEvery-1) fail its handler; share marks
	// the consumer-group row of a share workload (read through a Router).
	members     int
	shareSet    map[string]string
	poisonEvery int
	share       bool
	// javaShare: a share contender whose processes run Kafka's Java
	// KafkaShareConsumer (jshare.go) instead of safeack's ShareSubscriber.
	javaShare bool
	// protocol is a safeack contender's SubscriberConfig.GroupProtocol.
	protocol safeack.GroupProtocol
	// churn: the churn workload's members (churn.go).
	churn *churnMode
}

// workload is a set of cases run the same way, and how to present them.
type workload struct {
	name  string
	desc  string
	cases []*caseSpec
	cols  []string // table columns after the contender label
	notes []string
	refs  []refRow // published figures, shown under the measured rows
	// ideal is the computed ideal (records/s and seconds), 0 when none.
	idealRate float64
	idealWall time.Duration
	run       func(ctx context.Context, env *brokerEnv, w *workload) (*section, error)
}

func workloadNames() []string {
	return []string{"pc-published", "io-scale", "zero-work", "steady", "slow-head", "restart-cost", "issue3a", "txn-router", "share-io", "share-zero", "share-poison", "churn"}
}

// buildWorkload returns the named workload, sized by -quick.
func buildWorkload(name string) *workload {
	switch name {
	case "pc-published":
		return pcPublished()
	case "io-scale":
		return ioScale()
	case "zero-work":
		return zeroWork()
	case "steady":
		return steadyWorkload()
	case "slow-head":
		return slowHead()
	case "restart-cost":
		return restartCost()
	case "issue3a":
		return issue3a()
	case "txn-router":
		return txnRouter()
	case "share-io":
		return shareIO()
	case "share-zero":
		return shareZero()
	case "share-poison":
		return sharePoison()
	case "churn":
		return churnWorkload()
	}
	panic("unknown workload " + name)
}

func quick[T any](full, q T) T {
	if opt.quick {
		return q
	}
	return full
}

// The standard contenders of a workload on one topic.
func standardCases(t *topicSpec, conc int, work []time.Duration) []*caseSpec {
	cases := []*caseSpec{
		{label: "safeack/partition", kind: kindSafeack, ordering: safeack.OrderByPartition, topic: t, conc: conc, work: work},
		{label: "safeack/key", kind: kindSafeack, ordering: safeack.OrderByKey, topic: t, conc: conc, work: work},
		{label: "safeack/unordered", kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: conc, work: work},
		{label: "pc/partition", kind: kindPC, ordering: safeack.OrderByPartition, topic: t, conc: conc, work: work},
		{label: "pc/key", kind: kindPC, ordering: safeack.OrderByKey, topic: t, conc: conc, work: work},
		{label: "pc/unordered", kind: kindPC, ordering: safeack.Unordered, topic: t, conc: conc, work: work},
		{label: "wm-kafka", kind: kindWatermill, topic: t, conc: conc, work: work},
		{label: "sarama-bare", kind: kindBare, topic: t},
	}
	if work != nil {
		cases = append(cases, &caseSpec{label: "ideal (measured, no Kafka)", kind: kindLocal, topic: t, conc: conc, work: work})
	}
	return cases
}

// setIdeal computes the ideal for IO-bound work: concurrency / mean work
// time, i.e. total work spread over conc workers. When one record alone takes
// longer (slow-head), that record is the bound.
func (w *workload) setIdeal(work []time.Duration, conc int) {
	var sum, longest time.Duration
	for _, d := range work {
		sum += d
		longest = max(longest, d)
	}
	if sum == 0 {
		return
	}
	wall := max(sum/time.Duration(conc), longest)
	w.idealWall = wall
	w.idealRate = float64(len(work)) / wall.Seconds()
}

func uniformWork(n int, lo, hi time.Duration, seed uint64) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0x5afeac))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = lo + time.Duration(r.Int64N(int64(hi-lo)+1))
	}
	return out
}

func constWork(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

const valueSize = 100

func pcPublished() *workload {
	n := quick(10_000, 2_000)
	const conc = 100
	work := uniformWork(n, 0, 5*time.Millisecond, 1)
	w := &workload{
		name: "pc-published",
		desc: fmt.Sprintf("Confluent Parallel Consumer's published run: %d records, 1 partition, work uniform 0–5 ms, concurrency %d", n, conc),
		cols: []string{"wall", "startup", "rate", "xideal", "xwmk", "endlag", "cover", "dups"},
		run:  runStandard,
	}
	w.setIdeal(work, conc)
	// Partition and unordered modes, watermill-kafka and the bare loop read
	// the 1,000-key topic; key mode runs once per key count.
	base := &topicSpec{name: "pc-k1000", partitions: 1, n: n, valueSize: valueSize, keys: 1000}
	keyTopics := map[int]*topicSpec{1000: base}
	for _, c := range standardCases(base, conc, work) {
		if c.ordering == safeack.OrderByKey && (c.kind == kindSafeack || c.kind == kindPC) {
			for _, k := range opt.pcKeys {
				t := keyTopics[k]
				if t == nil {
					t = &topicSpec{name: fmt.Sprintf("pc-k%d", k), partitions: 1, n: n, valueSize: valueSize, keys: k}
					keyTopics[k] = t
				}
				w.cases = append(w.cases, &caseSpec{label: fmt.Sprintf("%s keys=%d", c.label, k), kind: c.kind,
					ordering: safeack.OrderByKey, topic: t, conc: conc, work: work})
			}
			continue
		}
		w.cases = append(w.cases, c)
	}
	w.notes = append(w.notes,
		"Record i has key i % keys; partition/unordered/wm-kafka/sarama-bare read the 1,000-key topic.",
		"Published by Confluent for 10,000 records: PARTITION 22.2 s, UNORDERED 2.83 s, KEY (1,000 keys) 2.06 s; ideal ≈ 0.25 s.")
	if !opt.quick {
		w.refs = []refRow{
			{label: "PC PARTITION (published)", wall: 22200 * time.Millisecond, n: n},
			{label: "PC UNORDERED (published)", wall: 2830 * time.Millisecond, n: n},
			{label: "PC KEY 1,000 keys (published)", wall: 2060 * time.Millisecond, n: n},
		}
	} else {
		w.notes = append(w.notes, "-quick: 2,000 records instead of 10,000, so the published times do not compare directly.")
	}
	return w
}

func ioScale() *workload {
	n := quick(100_000, 20_000)
	const conc = 256
	work := constWork(n, 2*time.Millisecond)
	t := &topicSpec{name: "io", partitions: 8, n: n, valueSize: valueSize, keys: 1000}
	w := &workload{
		name:  "io-scale",
		desc:  fmt.Sprintf("%d records, 8 partitions, 2 ms work each, concurrency %d", n, conc),
		cols:  []string{"wall", "startup", "rate", "xideal", "xwmk", "cpu", "cpupm", "endlag", "cover", "dups"},
		cases: withConsumerProtocol(standardCases(t, conc, work)),
		run:   runStandard,
		notes: []string{"Record i goes to partition i % 8 with key i % 1000 (125 keys per partition).", consumerProtocolNote},
	}
	w.setIdeal(work, conc)
	return w
}

func zeroWork() *workload {
	n := quick(1_000_000, 100_000)
	const conc = 256
	t := &topicSpec{name: "zero", partitions: 8, n: n, valueSize: valueSize, keys: 1000}
	return &workload{
		name: "zero-work",
		desc: fmt.Sprintf("%d records of %d B, 8 partitions, no work (handler goroutine acks at once), MaxInFlight %d", n, valueSize, conc),
		cols: []string{"wall", "startup", "rate", "xwmk", "xbare", "xceil", "xrouter", "cpu", "cpupm", "allocs", "heap", "rss", "endlag", "cover", "dups"},
		cases: append(withConsumerProtocol(withoutSlowPC(standardCases(t, conc, nil))),
			&caseSpec{label: "safeack/unordered (router)", kind: kindSafeack, ordering: safeack.Unordered, topic: t, conc: conc, router: true},
			&caseSpec{label: wmkRouterLabel, kind: kindWatermill, topic: t, conc: conc, router: true},
			&caseSpec{label: ceilingLabel, kind: kindCeiling, topic: t, conc: conc},
			&caseSpec{label: routerCeilingLabel, kind: kindCeiling, topic: t, conc: conc}),
		run: runStandard,
		notes: []string{
			"CPU s = user+system CPU of this process (getrusage) from consumer start to the last ack; CPU s/M = per million records.",
			"allocs/rec = runtime MemStats.Mallocs from consumer start to the last ack, per record (the bench's handler goroutine and tracking included, the same for every Go contender).",
			"heap MB = peak HeapInuse (50 ms samples) minus HeapInuse after the pre-run GC (the bench's own per-record arrays); RSS MB = peak resident set of the whole process (VmHWM, reset before each run), bench arrays included.",
			"safeack/unordered (router) and wm-kafka (router) consume through a message.Router, as the ceilings do; the other rows read the Subscribe channel with a goroutine per message. The router rows' memory is compared with each other.",
			"Watermill ceiling: one goroutine publishes (batches of up to 64) into a gochannel.GoChannel with at most 256 messages unacked, and a Router runs the same handler: no Kafka. ×ceiling = rec/s over its rec/s.",
			"Router ceiling: the same Router over a minimal Subscriber (one goroutine builds the records and sends them on the channel, 256 unacked at most): the router's own cost. GoChannel adds two goroutines, two message copies and a context per message, so a Kafka subscriber can beat the GoChannel row; ×router = rec/s over this row's.",
			"Record i goes to partition i % 8 with key i % 1000.",
			consumerProtocolNote,
			pcPartitionNote,
		},
	}
}

// consumerProtocolLabel is safeack/unordered on the consumer group
// protocol (KIP-848, franz-go) instead of the classic one (Sarama).
const consumerProtocolLabel = "safeack/unordered (consumer protocol)"

const consumerProtocolNote = "safeack/unordered (consumer protocol) is the safeack/unordered row with GroupProtocol = GroupProtocolConsumer (KIP-848: franz-go fetches and the group coordinator assigns; the remote assignor's default, uniform) instead of the classic protocol on Sarama; everything else the same. Issue 43's goal: at least the classic row's rate at no more CPU (CPU s/M = the consumer process's CPU per million records; the broker runs in another process)."

// withConsumerProtocol adds safeack/unordered on the consumer group
// protocol after the classic safeack/unordered row.
func withConsumerProtocol(cases []*caseSpec) []*caseSpec {
	i := slices.IndexFunc(cases, func(c *caseSpec) bool { return c.label == "safeack/unordered" })
	if i < 0 {
		return cases
	}
	cp := *cases[i]
	cp.label, cp.protocol = consumerProtocolLabel, safeack.GroupProtocolConsumer
	return slices.Insert(cases, i+1, &cp)
}

// wmkRouterLabel is watermill-kafka read through a message.Router, the
// row safeack's router row is held to.
const wmkRouterLabel = "wm-kafka (router)"

// pcPartitionNote explains why pc/partition is left out of zero-work and
// steady unless asked for.
const pcPartitionNote = "pc/partition runs here only when named in -contenders: Parallel Consumer in PARTITION order handles one record at a time per partition with a per-record overhead of its own (about 2,000 rec/s over 8 partitions at zero work here), so 1,000,000 records would take minutes per rep."

// withoutSlowPC drops pc/partition unless -contenders names it.
func withoutSlowPC(cases []*caseSpec) []*caseSpec {
	for _, c := range opt.contenders {
		if strings.HasPrefix("pc/partition", c) && len(c) > len("pc/") {
			return cases
		}
	}
	return slices.DeleteFunc(cases, func(c *caseSpec) bool { return c.label == "pc/partition" })
}

func slowHead() *workload {
	n := quick(50_000, 10_000)
	const conc = 256
	r := rand.New(rand.NewPCG(3, 0x5afeac))
	work := uniformWork(n, 0, time.Millisecond, 2)
	// Exactly one record in 1,000 is slow, at random positions (so spread
	// over the partitions).
	for _, i := range r.Perm(n)[:n/1000] {
		work[i] = 2 * time.Second
	}
	t := &topicSpec{name: "slowhead", partitions: 8, n: n, valueSize: valueSize, keys: 1000}
	w := &workload{
		name:  "slow-head",
		desc:  fmt.Sprintf("%d records, 8 partitions, 1 in 1,000 takes 2 s, the rest 0–1 ms, concurrency %d", n, conc),
		cols:  []string{"wall", "startup", "rate", "xideal", "xwmk", "retained", "heap", "rss", "endlag", "cover", "dups"},
		cases: standardCases(t, conc, work),
		run:   runStandard,
		notes: []string{
			"retained = peak over 50 ms samples of the sum of Subscriber.Stats()[].Retained (safeack only).",
			"heap = peak runtime HeapInuse sampled every 50 ms; RSS = peak resident set of the run (VmHWM after resetting it through /proc/self/clear_refs; getrusage Maxrss, a process-lifetime peak, where that is unavailable).",
			"ideal = max(total work / concurrency, longest record).",
		},
	}
	w.setIdeal(work, conc)
	return w
}

func issue3a() *workload {
	const n, conc = 5_000, 100
	work := constWork(n, 2*time.Millisecond)
	t := &topicSpec{name: "issue3a", partitions: 1, n: n, valueSize: valueSize, keys: 1000}
	w := &workload{
		name:  "issue3a",
		desc:  fmt.Sprintf("issue 3 (a): 1 partition, %d records, handler sleeps 2 ms, MaxInFlight %d; ideal %d / 2 ms = 50,000/s", n, conc, conc),
		cols:  []string{"wall", "startup", "rate", "xideal", "xwmk", "cpu", "cpupm", "endlag", "cover", "dups"},
		cases: withConsumerProtocol(standardCases(t, conc, work)),
		run:   runStandard,
		notes: []string{"Record i has key i % 1000. The issue's second comparison (b) is the zero-work workload (columns ×wmk and ×bare).", consumerProtocolNote},
	}
	w.setIdeal(work, conc)
	return w
}

// variant is a named set of SubscriberConfig settings.
type variant struct {
	name     string
	settings map[string]string
}

// parseSettings parses Field=value,Field=value.
func parseSettings(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q is not Field=value", kv)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// parseVariants parses name:Field=value,...;name:...
func parseVariants(s string) ([]variant, error) {
	var out []variant
	for _, part := range strings.Split(s, ";") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, rest, ok := strings.Cut(part, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q is not name:Field=value[,Field=value]", part)
		}
		set, err := parseSettings(rest)
		if err != nil {
			return nil, err
		}
		out = append(out, variant{name: name, settings: set})
	}
	return out, nil
}
