package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// The steady workload: the bench produces at a fixed rate while a consumer
// runs, and measures end-to-end latency (produce → ack) per record.
//
// Each run gets a fresh topic. A producer child process (-steady-produce,
// so its CPU stays out of the consumer's figures) first writes one warm-up
// record every 10 ms (index -1: handlers skip them, nothing counts them)
// until steadySettle after the consumer delivered its first record, so
// joining the group and the client's start-up are not counted as latency;
// then it produces records 0..n-1 at the rate,
// stamping each with its produce time (also written to a file), record i to
// partition i % 8 with key i % 1000.

// zeroWorkRates holds the median rec/s of each zero-work contender when
// zero-work ran earlier in this invocation: steady offers each contender
// half of its own.
var zeroWorkRates map[string]float64

const steadyPartitions = 8

// steadySettle is how long warm-up records go on after the first delivery.
// Start-up is not steady: Sarama holds a consumer's first fetch from a
// broker 100 ms (partitionConsumersBatchTimeout), and a consumer that
// delivers before that (safeack's early fetch) would otherwise face the
// measured records' first 100 ms as a backlog; this is measured in the
// startup column instead.
const steadySettle = time.Second

func steadyWorkload() *workload {
	dur := quick(10*time.Second, 4*time.Second)
	if opt.steadyDuration > 0 {
		dur = opt.steadyDuration
	}
	fallback := quick(50_000.0, 20_000.0)
	const conc = 256
	var cases []*caseSpec
	var how []string
	base := &topicSpec{name: "steady", partitions: steadyPartitions, valueSize: valueSize, keys: 1000}
	for _, c := range withoutSlowPC(standardCases(base, conc, nil)) {
		if !c.kind.commits() || !selected(c.label) {
			continue
		}
		rate := float64(opt.steadyRate)
		switch {
		case rate > 0:
		case zeroWorkRates[c.label] > 0:
			rate = min(float64(opt.steadyMaxRate), math.Round(zeroWorkRates[c.label]/2/100)*100)
			how = append(how, fmt.Sprintf("%s %s (zero-work %s)", c.label, fmtRate(rate), fmtRate(zeroWorkRates[c.label])))
		default:
			rate = fallback
			how = append(how, fmt.Sprintf("%s %s (default: no zero-work figure)", c.label, fmtRate(rate)))
		}
		t := *base
		t.n = max(1, int(rate*dur.Seconds()))
		c.topic = &t
		c.rate = rate
		cases = append(cases, c)
	}
	desc := "half of each contender's own zero-work median rec/s (capped at -steady-max-rate)"
	note := "Offered rates: " + strings.Join(how, "; ") + "."
	if opt.steadyRate > 0 {
		desc = fmt.Sprintf("%s records/s (-steady-rate)", fmtRate(float64(opt.steadyRate)))
		note = "Offered rate: -steady-rate, the same for every contender."
	}
	return &workload{
		name:  "steady",
		desc:  fmt.Sprintf("%s offered for %v, 8 partitions, no work, concurrency %d; end-to-end latency produce → ack", desc, dur, conc),
		cols:  []string{"startup", "offered", "e2e", "e2emax", "cpu", "cpupm", "endlag", "cover", "dups"},
		cases: cases,
		run:   runSteady,
		notes: []string{
			note,
			"Each run has its own topic. A producer child process writes a warm-up record every 10 ms until 1 s after the consumer's first delivery (start-up is the startup column, not latency), then records 0..n-1 at the rate (record i to partition i % 8, key i % 1000), each stamped with its produce time; warm-up records are skipped by the handler and not counted. offered = the rate the producer achieved.",
			"e2e = produce time (just before the record goes to Sarama's async producer, flush every 1 ms) → the handler's ack; p50/p99/p99.9 over the records, median over reps; max over everything.",
			"CPU s = the consumer process's user+system CPU from its start to the last ack (idle time included); CPU s/M rec per million records at this load.",
			pcPartitionNote,
		},
	}
}

func runSteady(ctx context.Context, env *brokerEnv, w *workload) (*section, error) {
	sec := newSection(w)
	cases, err := selectedCases(ctx, env, w)
	if err != nil {
		return sec, err
	}
	failed, err := repeatCases(ctx, sec, cases, 26, func(c *caseSpec, rep int) (*result, error) {
		return steadyOnce(ctx, env, w, c, rep), nil
	}, func(r *result) string {
		return fmt.Sprintf("offered %s rec/s  startup %5.3fs  e2e p50/p99/p99.9/max %s/%s/%s/%s ms  end lag %s  ack→commit p50/p99 %s/%s ms  cpu %.2fs  dups %d",
			fmtRate(r.offered), r.startup.Seconds(),
			fmtMs(ms(r.e2e.p50)), fmtMs(ms(r.e2e.p99)), fmtMs(ms(r.e2e.p999)), fmtMs(ms(r.e2e.max)),
			fmtCommit(r.endLag), fmtMs(ms(r.cover.p50)), fmtMs(ms(r.cover.p99)), r.cpu.Seconds(), r.dups)
	})
	if err != nil {
		return sec, err
	}
	sec.noteCommitWatch()
	return sec, failed
}

func steadyOnce(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, rep int) *result {
	clean := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(c.label, "_")
	name := fmt.Sprintf("bench-%s-steady-%s-r%d-%d", env.runID, clean, rep, time.Now().UnixNano()%1e6)
	if err := env.createTopic(ctx, name, steadyPartitions); err != nil {
		return &result{n: c.topic.n, err: err, commit: -1, endLag: -1, allocs: -1}
	}
	defer func() {
		if err := env.admin.DeleteTopic(name); err != nil {
			vlogf("delete topic %s: %v", name, err)
		}
	}()
	t := &topic{name: name, spec: c.topic, ends: make([]int64, steadyPartitions)}
	prod, err := startSteadyProducer(env, t, c.rate)
	if err != nil {
		return &result{n: c.topic.n, err: err, commit: -1, endLag: -1, allocs: -1}
	}
	defer prod.close()
	hooks := &runHooks{
		started: func(tr *ackTracker) {
			go func() {
				select {
				case <-tr.firstC:
				case <-tr.done:
					return
				case <-ctx.Done():
					return
				}
				settle := time.NewTimer(steadySettle)
				defer settle.Stop()
				select {
				case <-settle.C:
					prod.go_()
				case <-tr.done:
				case <-ctx.Done():
				}
			}()
		},
		produced: func() error {
			if err := prod.wait(); err != nil {
				return err
			}
			t.offBase = prod.base
			for p := range t.ends {
				t.ends[p] = prod.base[p] + int64((c.topic.n-p+steadyPartitions-1)/steadyPartitions)
			}
			return nil
		},
	}
	r := runCaseWith(ctx, env, w, c, t, rep, hooks)
	if r.err == nil {
		r.offered = prod.rate
		times, err := prod.times(c.topic.n)
		if err != nil {
			r.err = err
		} else {
			r.e2e = e2eLags(hooks.tr, times)
		}
	}
	return r
}

// e2eLags is, per record, produce → first ack.
func e2eLags(tr *ackTracker, produced []int64) lagStats {
	vals := make([]int64, 0, tr.n)
	missing := 0
	for i := range tr.n {
		a := tr.ackUnixNano(i)
		if a == 0 || produced[i] == 0 {
			missing++
			continue
		}
		vals = append(vals, max(0, a-produced[i]))
	}
	return summarize(vals, missing)
}

// steadyProducer is the parent's handle on the producer child.
type steadyProducer struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	dir       string
	lines     chan string
	exited    chan struct{}
	goOnce    sync.Once
	base      []int64
	rate      float64
	closeOnce sync.Once
}

type steadySpec struct {
	Brokers    []string `json:"brokers"`
	Topic      string   `json:"topic"`
	Partitions int      `json:"partitions"`
	N          int      `json:"n"`
	Rate       float64  `json:"rate"`
	Keys       int      `json:"keys"`
	ValueSize  int      `json:"value_size"`
	TimesFile  string   `json:"times_file"`
}

func startSteadyProducer(env *brokerEnv, t *topic, rate float64) (*steadyProducer, error) {
	dir, err := os.MkdirTemp("", "safeack-bench-steady-")
	if err != nil {
		return nil, err
	}
	spec := steadySpec{Brokers: env.brokers, Topic: t.name, Partitions: t.spec.partitions, N: t.spec.n, Rate: rate,
		Keys: t.spec.keys, ValueSize: t.spec.valueSize, TimesFile: filepath.Join(dir, "times")}
	js, _ := json.Marshal(spec)
	cmd, stdin, stdout, err := startSelf("-steady-produce", string(js))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p := &steadyProducer{cmd: cmd, stdin: stdin, dir: dir, lines: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		_ = cmd.Wait()
	}()
	if l, ok := p.next(30 * time.Second); !ok || l != "READY" {
		p.close()
		return nil, fmt.Errorf("steady producer did not start: %q", l)
	}
	return p, nil
}

func (p *steadyProducer) next(timeout time.Duration) (string, bool) {
	select {
	case l, ok := <-p.lines:
		return l, ok
	case <-time.After(timeout):
		return "", false
	}
}

// go_ ends the warm-up and starts the steady records.
func (p *steadyProducer) go_() {
	p.goOnce.Do(func() { _, _ = io.WriteString(p.stdin, "GO\n") })
}

// wait reads the producer's BASE and PRODUCED lines.
func (p *steadyProducer) wait() error {
	for {
		l, ok := p.next(opt.runTimeout)
		if !ok {
			return fmt.Errorf("steady producer: no report (%q)", l)
		}
		k, v, _ := strings.Cut(l, " ")
		switch k {
		case "BASE":
			for _, f := range strings.Fields(v) {
				n, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					return fmt.Errorf("steady producer: bad BASE %q", v)
				}
				p.base = append(p.base, n)
			}
		case "PRODUCED":
			p.rate, _ = strconv.ParseFloat(v, 64)
			if p.base == nil {
				return fmt.Errorf("steady producer: PRODUCED before BASE")
			}
			return nil
		case "ERROR":
			return fmt.Errorf("steady producer: %s", v)
		}
	}
}

// times reads the produce time (unix ns) of every record.
func (p *steadyProducer) times(n int) ([]int64, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, "times"))
	if err != nil {
		return nil, err
	}
	if len(b) != 8*n {
		return nil, fmt.Errorf("steady producer: times file holds %d bytes, want %d", len(b), 8*n)
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(binary.BigEndian.Uint64(b[8*i:]))
	}
	return out, nil
}

func (p *steadyProducer) close() {
	p.closeOnce.Do(func() {
		stopSelf(p.cmd, p.stdin, p.exited, 10*time.Second)
		_ = os.RemoveAll(p.dir)
	})
}

// runSteadyProducer is the child side.
func runSteadyProducer(js string) {
	var spec steadySpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fatalf("steady producer: %v", err)
	}
	fail := func(err error) {
		fmt.Printf("ERROR %v\n", err)
		os.Exit(1)
	}
	cfg := benchClientConfig()
	cfg.ClientID = "safeack-bench-steady-producer"
	cfg.Producer.Flush.Frequency = time.Millisecond
	client, err := sarama.NewClient(spec.Brokers, cfg)
	if err != nil {
		fail(err)
	}
	defer client.Close()
	p, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		fail(err)
	}
	var acked sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	go func() {
		for range p.Successes() {
			acked.Done()
		}
	}()
	go func() {
		for e := range p.Errors() {
			errMu.Lock()
			if firstErr == nil {
				firstErr = e.Err
			}
			errMu.Unlock()
			acked.Done()
		}
	}()
	value := func(i int64, at int64) []byte {
		v := make([]byte, max(spec.ValueSize, 16))
		binary.BigEndian.PutUint64(v, uint64(i))
		binary.BigEndian.PutUint64(v[8:], uint64(at))
		for j := 16; j < len(v); j++ {
			v[j] = byte('a' + (int(i)+j)%26)
		}
		return v
	}
	in := p.Input()
	fmt.Println("READY")

	// Warm-up until GO.
	goC := make(chan struct{})
	eof := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "GO" {
				close(goC)
				break
			}
		}
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	for w := 0; ; w++ {
		select {
		case <-tick.C:
			acked.Add(1)
			in <- &sarama.ProducerMessage{Topic: spec.Topic, Partition: int32(w % spec.Partitions), Key: sarama.StringEncoder("warmup"),
				Value: sarama.ByteEncoder(value(-1, time.Now().UnixNano()))}
			continue
		case <-goC:
		case <-eof:
			p.AsyncClose()
			return
		}
		break
	}
	tick.Stop()
	acked.Wait()
	base := make([]string, spec.Partitions)
	for i := range base {
		off, err := client.GetOffset(spec.Topic, int32(i), sarama.OffsetNewest)
		if err != nil {
			fail(err)
		}
		base[i] = strconv.FormatInt(off, 10)
	}
	fmt.Println("BASE " + strings.Join(base, " "))

	times := make([]int64, spec.N)
	interval := float64(time.Second) / spec.Rate
	t0 := time.Now()
	for i := range spec.N {
		due := t0.Add(time.Duration(float64(i) * interval))
		if d := time.Until(due); d > time.Millisecond {
			time.Sleep(d)
		}
		m := &sarama.ProducerMessage{Topic: spec.Topic, Partition: int32(i % spec.Partitions)}
		if spec.Keys > 0 {
			m.Key = sarama.StringEncoder("k" + strconv.Itoa(i%spec.Keys))
		}
		now := time.Now().UnixNano()
		times[i] = now
		m.Value = sarama.ByteEncoder(value(int64(i), now))
		acked.Add(1)
		in <- m
	}
	sent := time.Since(t0)
	acked.Wait()
	errMu.Lock()
	err = firstErr
	errMu.Unlock()
	if err != nil {
		fail(err)
	}
	b := make([]byte, 8*spec.N)
	for i, t := range times {
		binary.BigEndian.PutUint64(b[8*i:], uint64(t))
	}
	if err := os.WriteFile(spec.TimesFile, b, 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("PRODUCED %.0f\n", float64(spec.N)/sent.Seconds())
	<-eof
	p.AsyncClose()
}
