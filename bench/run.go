package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// result is one run of one case.
type result struct {
	n        int
	wall     time.Duration // consumer start → last ack
	startup  time.Duration // consumer start → first delivery
	active   time.Duration // first delivery → last ack
	commit   time.Duration // consumer start → committed offsets at the end; <0: not reached
	cpu      time.Duration // process user+sys CPU, consumer start → last ack
	heapPeak uint64
	livePeak uint64 // peak live heap a GC marked (the log shows it less heapBase): what heapPeak is without the garbage awaiting the next GC
	gcs      uint32
	rssPeak  uint64
	retained int // peak sum of Retained; -1 when not applicable
	dups     int64
	err      error
	extra    map[string]float64 // workload-specific (restart-cost)
	noKafka  bool               // the local ideal: nothing to commit
	busy     time.Duration      // handler time summed over all records
	conc     int                // the case's concurrency; 0 when unbounded

	// Commit lag, from the commit watcher (commitwatch.go).
	endLag      time.Duration  // last ack → committed offsets at the end of every partition; <0: not reached
	cover       lagStats       // per record: its ack → the first observed commit covering it by offset or by safeack's completed tail
	coverOffset lagStats       // the same, by offset alone
	rtt         time.Duration  // median OffsetFetch round trip of the watcher
	heapBase    uint64         // HeapInuse after the pre-run GC (the bench's own tracking arrays)
	allocs      float64        // heap allocations (MemStats.Mallocs delta) per record, consumer start → last ack; <0: unknown
	e2e         lagStats       // steady: produce → ack per record
	offered     float64        // steady: the producer's achieved rate, records/s
	churn       *churnAnalysis // churn: the gaps and handovers of the run
}

// occupancy is the mean number of handlers running while records flowed, as
// a fraction of the concurrency: how well the consumer kept its handlers fed.
func (r *result) occupancy() float64 {
	if r.active <= 0 || r.conc <= 0 {
		return 0
	}
	return r.busy.Seconds() / (r.active.Seconds() * float64(r.conc))
}

func (r *result) rate() float64 {
	if r.active <= 0 {
		return 0
	}
	return float64(r.n) / r.active.Seconds()
}

// groupName is a fresh consumer group for one run.
func groupName(env *brokerEnv, w, label string, rep int) string {
	clean := regexp.MustCompile(`[^a-zA-Z0-9._-]+`).ReplaceAllString(label, "_")
	return fmt.Sprintf("bench-%s-%s-%s-r%d-%d", env.runID, w, clean, rep, time.Now().UnixNano()%1e6)
}

func selected(label string) bool {
	if len(opt.contenders) == 0 {
		return true
	}
	for _, c := range opt.contenders {
		if strings.HasPrefix(label, c) {
			return true
		}
	}
	return false
}

// selectedCases returns w's cases that -contenders selects. Parallel
// Consumer's are left out, with a note on w, where it cannot run; where it
// can, its warm-up topic is produced first (with -pc-warmup).
func selectedCases(ctx context.Context, env *brokerEnv, w *workload) ([]*caseSpec, error) {
	var cases []*caseSpec
	pcSkipped, shareSkipped, jshareSkipped := false, false, false
	for _, c := range w.cases {
		if !selected(c.label) {
			continue
		}
		if c.kind == kindShare {
			if err := shareReady(ctx, env); err != nil {
				if !shareSkipped {
					w.notes = append(w.notes, fmt.Sprintf("share rows skipped: %v.", err))
					shareSkipped = true
				}
				continue
			}
			if c.javaShare {
				if err := javaShareReady(env); err != nil {
					if !jshareSkipped {
						w.notes = append(w.notes, fmt.Sprintf("Java share-consumer rows (java-share/*) skipped: %v.", err))
						jshareSkipped = true
					}
					continue
				}
			}
		}
		if c.kind == kindPC {
			if err := pcReady(); err != nil {
				if !pcSkipped {
					w.notes = append(w.notes, fmt.Sprintf("Parallel Consumer rows (pc/*) skipped: %v.", err))
					pcSkipped = true
				}
				continue
			}
			if opt.pcWarmup > 0 {
				if _, err := env.topicFor(ctx, pcWarmupTopic()); err != nil {
					return nil, err
				}
			}
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// runStandard runs every selected case of w, -reps times, interleaving the
// cases within each repetition so drift hits them all alike.
func runStandard(ctx context.Context, env *brokerEnv, w *workload) (*section, error) {
	sec := newSection(w)
	cases, err := selectedCases(ctx, env, w)
	if err != nil {
		return sec, err
	}
	// Produce every topic first, so producing never overlaps a measurement.
	for _, c := range cases {
		if _, err := env.topicFor(ctx, c.topic); err != nil {
			return sec, err
		}
	}
	failed, err := repeatCases(ctx, sec, cases, 26, func(c *caseSpec, rep int) (*result, error) {
		t, _ := env.topicFor(ctx, c.topic)
		return runCase(ctx, env, w, c, t, rep), nil
	}, func(r *result) string {
		return fmt.Sprintf("%7.3fs  %9.0f rec/s  startup %5.3fs  commit %s  end lag %s  ack→commit p50/p99 %s/%s ms (by offset %s/%s)  cpu %.2fs  heap %s  live %s  gcs %d  allocs/rec %.1f  dups %d  occupancy %.2f  mean handler %s",
			r.wall.Seconds(), r.rate(), r.startup.Seconds(), fmtCommit(r.commit), fmtCommit(r.endLag), fmtMs(ms(r.cover.p50)), fmtMs(ms(r.cover.p99)), fmtMs(ms(r.coverOffset.p50)), fmtMs(ms(r.coverOffset.p99)),
			r.cpu.Seconds(), fmtMB(r.heapPeak-min(r.heapBase, r.heapPeak)), fmtMB(r.livePeak-min(r.heapBase, r.livePeak)), r.gcs, r.allocs, r.dups,
			r.occupancy(), time.Duration(int64(r.busy)/int64(max(r.n, 1))).Round(time.Microsecond))
	})
	if err != nil {
		return sec, err
	}
	sec.noteCommitWatch()
	return sec, failed
}

// repeatCases is the repetition loop of every workload: it runs each case
// once per repetition, -reps times, interleaving the cases within a
// repetition so drift hits them all alike, and adds every result to sec.
// once runs one case; an error from it (a topic that cannot be made) stops
// the loop and is returned as err, as is the error of an ended ctx. A run
// that failed (its result's err) is logged and the loop goes on; failed is
// the first such failure. line formats the progress line of a run that
// succeeded, after its label (padded to width) and repetition.
func repeatCases(ctx context.Context, sec *section, cases []*caseSpec, width int,
	once func(c *caseSpec, rep int) (*result, error), line func(r *result) string) (failed, err error) {
	for rep := 1; rep <= opt.reps; rep++ {
		for _, c := range cases {
			if ctx.Err() != nil {
				return failed, ctx.Err()
			}
			r, err := once(c, rep)
			if err != nil {
				return failed, err
			}
			sec.add(c.label, r)
			if r.err != nil {
				logf("  %-*s rep %d: ERROR %v", width, c.label, rep, r.err)
				if failed == nil {
					failed = fmt.Errorf("%s: %w", c.label, r.err)
				}
				continue
			}
			logf("  %-*s rep %d: %s", width, c.label, rep, line(r))
		}
	}
	return failed, nil
}

// selectedOnly returns w's cases that -contenders selects.
func selectedOnly(w *workload) []*caseSpec {
	var cases []*caseSpec
	for _, c := range w.cases {
		if selected(c.label) {
			cases = append(cases, c)
		}
	}
	return cases
}

// noteCommitWatch states how commit times were observed.
func (s *section) noteCommitWatch() {
	var rtts []float64
	for _, rs := range s.results {
		for _, r := range rs {
			if r.rtt > 0 {
				rtts = append(rtts, ms(r.rtt))
			}
		}
	}
	if len(rtts) == 0 {
		return
	}
	s.w.notes = append(s.w.notes, fmt.Sprintf("end lag = last ack → the group's committed offsets at the end of every partition; ack→commit = per record, its ack → the first commit covering it: the committed offset passed it, or safeack's completed tail in the commit metadata lists it (p50/p99 over records, median over reps; by offset alone in the progress log). "+
		"Commits are seen by a child process polling OffsetFetch every %v (round trip median %s ms over the runs): lags are upper bounds, late by up to one poll plus one round trip.",
		opt.commitPoll, fmtMs(median(rtts))))
}

func fmtCommit(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}

// runHooks let a workload act during a run (steady: start producing at the
// first delivery; learn where the records landed).
type runHooks struct {
	started  func(tr *ackTracker) // after the contender started
	produced func() error         // after the last ack, before waiting for the commits
	tr       *ackTracker          // set by runCaseWith
}

// runCase consumes t from the start with a fresh group and measures.
func runCase(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, t *topic, rep int) *result {
	return runCaseWith(ctx, env, w, c, t, rep, &runHooks{})
}

func runCaseWith(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, t *topic, rep int, hooks *runHooks) *result {
	r := &result{n: c.topic.n, retained: -1, commit: -1, endLag: -1, allocs: -1}
	group := groupName(env, w.name, c.label, rep)
	tr := newAckTracker(c.topic.n)
	hooks.tr = tr

	var watch *commitWatch
	if c.kind.commits() {
		var err error
		if watch, err = startCommitWatch(env, t, group); err != nil {
			r.err = err
			return r
		}
		defer watch.close()
	}

	settle()
	resetPeakRSS()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	r.heapBase = ms0.HeapInuse
	cpu0 := cpuTime()
	stopProf := startProfile(w.name, c.label, rep)

	tr.start()
	tapStart(tr.base)
	con, err := startContender(ctx, env, c, t, group, tr)
	if err != nil {
		stopProf()
		r.err = err
		return r
	}
	smp := startSampler(con.retained)
	if hooks.started != nil {
		hooks.started(tr)
	}

	timeout := time.NewTimer(opt.runTimeout)
	select {
	case <-tr.done:
	case <-timeout.C:
		r.err = fmt.Errorf("timed out after %v with %d of %d records acked", opt.runTimeout, tr.uniq.Load(), tr.n)
	case <-ctx.Done():
		r.err = ctx.Err()
	case <-con.failed:
		r.err = con.err()
	}
	timeout.Stop()
	cpu1 := cpuTime()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	stopProf()
	if opt.memprofile != "" && r.err == nil && con.ext == nil {
		if f := createProfile(opt.memprofile, "heap.pprof", w.name, c.label, rep); f != nil {
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				logf("heap profile: %v", err)
			}
			f.Close()
		}
	}

	if r.err == nil {
		r.wall = time.Duration(tr.last.Load())
		r.startup = time.Duration(tr.first.Load() - 1)
		tapReport(c.label, r.startup)
		r.active = r.wall - r.startup
		r.cpu = cpu1 - cpu0
		r.allocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(r.n)
		r.gcs = ms1.NumGC - ms0.NumGC
		r.busy, r.conc = time.Duration(tr.busy.Load()), c.conc
		if hooks.produced != nil {
			r.err = hooks.produced()
		}
		switch {
		case r.err != nil:
		case watch == nil:
			r.noKafka, r.commit = true, 0
		default:
			if at, ok := watch.waitEnds(t.ends, opt.commitTimeout); ok {
				r.commit = time.Duration(at - tr.base.UnixNano())
				r.endLag = time.Duration(at - tr.base.UnixNano() - tr.last.Load())
			}
		}
	}
	if err := con.stop(); err != nil {
		vlogf("%s: close: %v", c.label, err)
	}
	r.heapPeak, r.livePeak, r.retained = smp.stop()
	if con.retained == nil {
		r.retained = -1
	}
	r.rssPeak = peakRSS()
	r.dups = tr.total.Load() - tr.uniq.Load()
	if con.extra != nil {
		r.extra = con.extra()
	}
	if x := con.ext; x != nil { // another process: its own figures
		r.cpu, r.heapPeak, r.rssPeak, r.heapBase, r.allocs = x.cpu, x.heap, x.rss, 0, -1
		r.busy, r.dups = x.busy, x.dups
	}
	if watch != nil {
		watch.close()
		r.rtt = watch.rttMed
		if r.err == nil && t.offBase != nil {
			changes := watch.snapshot()
			r.coverOffset, r.cover = coverLags(tr, t, changes)
			if opt.verbose {
				lastAck := tr.base.UnixNano() + tr.last.Load()
				for p, ch := range changes {
					var b strings.Builder
					for _, c := range ch {
						fmt.Fprintf(&b, " %d@%+.3fs", c.off, float64(c.at-lastAck)/1e9)
					}
					logf("  %s: partition %d commits (offset@time after the last ack):%s", c.label, p, b.String())
				}
			}
		}
	}
	return r
}

// settle collects garbage left by the previous run so the heap peak is this
// run's.
func settle() {
	runtime.GC()
	debug.FreeOSMemory()
}

// sampler polls heap in use and safeack's retained records every 50 ms.
type sampler struct {
	stopC    chan struct{}
	wg       sync.WaitGroup
	heap     uint64
	live     uint64 // peak of the live heap the last GC marked
	retained int
}

func startSampler(retained func() int) *sampler {
	s := &sampler{stopC: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			runtime.ReadMemStats(&ms)
			s.heap = max(s.heap, ms.HeapInuse)
			metrics.Read(live)
			s.live = max(s.live, live[0].Value.Uint64())
			if retained != nil {
				s.retained = max(s.retained, retained())
			}
			select {
			case <-t.C:
			case <-s.stopC:
				return
			}
		}
	}()
	return s
}

func (s *sampler) stop() (heap, live uint64, retained int) {
	close(s.stopC)
	s.wg.Wait()
	return s.heap, s.live, s.retained
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var rssResettable = func() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}()

// resetPeakRSS resets the kernel's peak-RSS mark (Linux), so peakRSS
// reports this run's peak rather than the process lifetime's.
func resetPeakRSS() {
	if rssResettable {
		_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	}
}

// peakRSS is VmHWM when it can be reset, else getrusage's Maxrss (the
// process lifetime peak).
func peakRSS() uint64 {
	if rssResettable {
		if f, err := os.Open("/proc/self/status"); err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
					kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
					if err == nil {
						return kb << 10
					}
				}
			}
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return uint64(ru.Maxrss) << 10 // kB on Linux
}

// startProfile writes a CPU profile and an execution trace of one run's
// consume phase when -cpuprofile or -trace is set.
func startProfile(workload, label string, rep int) func() {
	var stops []func()
	profile := func(file, ext string, start func(io.Writer) error, stop func()) {
		if file == "" {
			return
		}
		f := createProfile(file, ext, workload, label, rep)
		if f == nil {
			return
		}
		if err := start(f); err != nil {
			logf("%s: %v", ext, err)
			f.Close()
			return
		}
		stops = append(stops, func() { stop(); f.Close(); vlogf("wrote %s", f.Name()) })
	}
	profile(opt.cpuprofile, "pprof", pprof.StartCPUProfile, pprof.StopCPUProfile)
	profile(opt.exectrace, "trace", trace.Start, trace.Stop)
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// createProfile creates stem.<workload>.<label>.r<rep>.<ext> next to file.
func createProfile(file, ext, workload, label string, rep int) *os.File {
	stem := strings.TrimSuffix(file, filepath.Ext(file))
	clean := regexp.MustCompile(`[^a-zA-Z0-9._=-]+`).ReplaceAllString(label, "_")
	f, err := os.Create(fmt.Sprintf("%s.%s.%s.r%d.%s", stem, workload, clean, rep, ext))
	if err != nil {
		logf("%s: %v", ext, err)
		return nil
	}
	return f
}
