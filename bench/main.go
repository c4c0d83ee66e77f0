// Command bench measures safeack against watermill-kafka's subscriber, a
// bare Sarama consumer-group loop and the computed ideal, on the same broker
// and the same workloads, in one invocation.
//
//	go -C bench run .                      # everything, embedded kfake, 3 reps
//	go -C bench run . -quick -reps 1         # smoke run
//	go -C bench run . -workloads issue3      # the two comparisons of issue 3
//	go -C bench run . -brokers host:9092     # a real cluster
//
// See bench/README.md for what each workload does and what is measured.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

type options struct {
	brokers        []string
	inprocBroker   bool
	workloads      []string
	contenders     []string
	reps           int
	quick          bool
	markdown       string
	chartData      string
	cpuprofile     string
	exectrace      string
	memprofile     string
	safeackSet     map[string]string
	restartWith    []variant
	restartCrash   string
	restartLead    int
	txnInterval    time.Duration
	runTimeout     time.Duration
	commitTimeout  time.Duration
	commitPoll     time.Duration
	keepTopics     bool
	pcKeys         []int
	pc             string
	pcWarmup       int
	saramaMaxWait  time.Duration
	steadyRate     int
	steadyDuration time.Duration
	steadyMaxRate  int
	verbose        bool
	wiretap        bool
	churnPeriod    time.Duration
	churnDuration  time.Duration
	churnBacklog   int
	churnHeartbeat time.Duration
}

var opt options

func main() {
	var (
		brokers     = flag.String("brokers", "", "comma-separated bootstrap brokers of a real cluster; empty starts an embedded kfake broker")
		inproc      = flag.Bool("inproc-broker", false, "run the embedded kfake broker inside this process instead of a child process (its CPU and memory then count in every measurement)")
		workloads   = flag.String("workloads", "all", "comma-separated workloads: "+strings.Join(workloadNames(), ", ")+"; aliases: all, issue3 (= issue3a,zero-work), share (= share-io,share-zero,share-poison)")
		contenders  = flag.String("contenders", "", "comma-separated prefixes of contender labels to run (e.g. safeack/unordered,wm-kafka); empty runs all")
		reps        = flag.Int("reps", 3, "repetitions of every run; the table shows the median and min–max")
		quick       = flag.Bool("quick", false, "smaller record counts for a fast smoke run")
		markdown    = flag.String("markdown", "", "also write the tables as Markdown to this file")
		chartData   = flag.String("chart-data", "", "write the records/s of each workload as JSON to this file, for bench/chart (a module of its own) to draw")
		cpuprofile  = flag.String("cpuprofile", "", "write a CPU profile of each run's consume phase to FILE-stem.<workload>.<contender>.r<rep>.pprof")
		memprofile  = flag.String("memprofile", "", "write a heap profile (inuse and alloc, 512 KiB sampling) of each run just after its last ack to FILE-stem.<workload>.<contender>.r<rep>.heap.pprof")
		exectrace   = flag.String("trace", "", "write a runtime execution trace of each run's consume phase to FILE-stem.<workload>.<contender>.r<rep>.trace (go tool trace)")
		safeackSet  = flag.String("safeack-set", "", "Field=value,... set on every safeack SubscriberConfig (by reflection, e.g. MaxPendingPerPartition=50000)")
		restartWith = flag.String("restart-with", "no-tail:DisableCompletedTail=true", "extra safeack variants for restart-cost, name:Field=value,...; separate variants with ';'. Variants naming a field SubscriberConfig lacks are skipped")
		crash       = flag.String("restart-crash", "close", "how restart-cost crashes the first consumer: close (Close with a 1 ms DrainTimeout, in-process) or kill (SIGKILL of a child process)")
		restartLead = flag.Int("restart-lead", 0, "restart-cost: records acked before the head (0: the head is the partition's first record)")
		txnInterval = flag.Duration("txn-interval", 100*time.Millisecond, "txn-router: safeack.TxnConfig.CommitInterval")
		runTimeout  = flag.Duration("run-timeout", 5*time.Minute, "give up on a run after this long")
		commitTO    = flag.Duration("commit-timeout", 15*time.Second, "after the last ack, wait this long at most for the committed offsets to reach the end")
		commitPoll  = flag.Duration("commit-poll", 5*time.Millisecond, "how often the commit watcher (a child process) reads the group's committed offsets (OffsetFetch)")
		keepTopics  = flag.Bool("keep-topics", false, "do not delete the benchmark topics at the end (real clusters)")
		pcKeys      = flag.String("pc-keys", "1,2,5,10,20,1000", "key counts for pc-published in by-key mode")
		verbose     = flag.Bool("v", false, "log progress details to stderr")
		wiretapF    = flag.Bool("wiretap", false, "log every Kafka request and response of each Sarama-based contender up to its first delivery, with times since the run's start (start-up phases)")
		pc          = flag.String("pc", "auto", "Java contenders, Confluent Parallel Consumer (pc/*) and Kafka's share consumer (java-share/*): auto (build with Maven on first use, skip with a note where java or mvn is missing) or off")
		pcWarmup    = flag.Int("pc-warmup", 20000, "Parallel Consumer: records of an unmeasured warm-up pass (own group, no work) in the same JVM before the measured pass, so it runs on JIT-compiled code; 0: a cold JVM")
		maxWait     = flag.Duration("sarama-max-wait", 0, "Consumer.MaxWaitTime of every Sarama-based contender (0: Sarama's default, 500 ms). A fetch that waits for data holds up requests queued behind it on the same broker connection, commits included (safeack reaches the group coordinator over a connection of its own)")
		steadyRate  = flag.Int("steady-rate", 0, "steady: records/s to offer every contender (0: half of each contender's own zero-work median when zero-work ran before it, else 50,000; -quick 20,000)")
		steadyMax   = flag.Int("steady-max-rate", 100_000, "steady: highest rate derived from zero-work (the producer child's own limit)")
		steadyDur   = flag.Duration("steady-duration", 0, "steady: how long to produce (0: 10 s; -quick 4 s)")
		steadyChild = flag.String("steady-produce", "", "internal: the steady workload's producer (JSON spec)")
		churnPeriod = flag.Duration("churn-period", 0, "churn: time between a member's join and its leave, and between its leave and the next join (0: 10 s; -quick 6 s)")
		churnDur    = flag.Duration("churn-duration", 0, "churn: the measured window (0: 2 min; -quick 24 s); events happen every -churn-period in it")
		churnBack   = flag.Int("churn-backlog", 4000, "churn: records per partition the producer keeps ahead of the furthest delivered offset")
		churnHB     = flag.Duration("churn-heartbeat", 0, "churn: heartbeat interval on both protocols (classic: Sarama's Consumer.Group.Heartbeat.Interval; consumer: the group's consumer.heartbeat.interval.ms); 0 keeps each protocol's default")
		pcBuildOnly = flag.Bool("pc-build", false, "build the Java drivers (Parallel Consumer, Kafka share consumer) into the cache directory and exit")

		serveKfake   = flag.Bool("kfake-serve", false, "internal: serve an embedded kfake broker and print its address")
		restartChild = flag.String("restart-child", "", "internal: run the first consumer of restart-cost (JSON spec)")
		commitWatch  = flag.String("commit-watch", "", "internal: watch a group's committed offsets (JSON spec)")
		shareMember  = flag.String("share-member", "", "internal: run one share group member of a share contender (JSON spec)")
	)
	flag.Parse()

	if *steadyChild != "" {
		runSteadyProducer(*steadyChild)
		return
	}
	if *shareMember != "" {
		runShareMember(*shareMember)
		return
	}
	if *commitWatch != "" {
		runCommitWatchChild(*commitWatch)
		return
	}

	if *serveKfake {
		serveKfakeChild(*churnHB)
		return
	}
	if *restartChild != "" {
		runRestartChild(*restartChild)
		return
	}

	opt = options{
		wiretap:        *wiretapF,
		inprocBroker:   *inproc,
		reps:           *reps,
		quick:          *quick,
		markdown:       *markdown,
		chartData:      *chartData,
		cpuprofile:     *cpuprofile,
		exectrace:      *exectrace,
		memprofile:     *memprofile,
		restartCrash:   *crash,
		restartLead:    *restartLead,
		txnInterval:    *txnInterval,
		runTimeout:     *runTimeout,
		commitTimeout:  *commitTO,
		commitPoll:     *commitPoll,
		keepTopics:     *keepTopics,
		verbose:        *verbose,
		pc:             *pc,
		pcWarmup:       *pcWarmup,
		saramaMaxWait:  *maxWait,
		steadyRate:     *steadyRate,
		steadyDuration: *steadyDur,
		steadyMaxRate:  *steadyMax,
		churnPeriod:    *churnPeriod,
		churnDuration:  *churnDur,
		churnBacklog:   *churnBack,
		churnHeartbeat: *churnHB,
	}
	if opt.churnBacklog < 1 {
		fatalf("-churn-backlog must be at least 1")
	}
	if opt.pc != "auto" && opt.pc != "off" {
		fatalf("-pc must be auto or off")
	}
	if *pcBuildOnly {
		if err := pcReady(); err != nil {
			fatalf("%v", err)
		}
		if err := jshareReady(); err != nil {
			fatalf("%v", err)
		}
		fmt.Printf("java %s\nclasspath %s\njava-share classpath %s\n", pcBuild.java, pcBuild.classpath, jshareBuild.classpath)
		return
	}
	opt.brokers = splitList(*brokers)
	opt.contenders = splitList(*contenders)
	var err error
	if opt.workloads, err = resolveWorkloads(splitList(*workloads)); err != nil {
		fatalf("%v", err)
	}
	if opt.safeackSet, err = parseSettings(*safeackSet); err != nil {
		fatalf("-safeack-set: %v", err)
	}
	if opt.restartWith, err = parseVariants(*restartWith); err != nil {
		fatalf("-restart-with: %v", err)
	}
	if opt.pcKeys, err = parseInts(*pcKeys); err != nil {
		fatalf("-pc-keys: %v", err)
	}
	if opt.reps < 1 {
		fatalf("-reps must be at least 1")
	}
	if opt.restartCrash != "close" && opt.restartCrash != "kill" {
		fatalf("-restart-crash must be close or kill")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	env, err := setupBroker(ctx)
	if err != nil {
		fatalf("broker: %v", err)
	}
	code := run(ctx, env)
	env.close()
	os.Exit(code)
}

func run(ctx context.Context, env *brokerEnv) int {
	h := header(env)
	fmt.Print(h)

	var sections []*section
	failed := false
	for _, name := range opt.workloads {
		if ctx.Err() != nil {
			break
		}
		w := buildWorkload(name)
		logf("== workload %s: %s", w.name, w.desc)
		load0 := loadAvg()
		sec, err := w.run(ctx, env, w)
		w.notes = append(w.notes, fmt.Sprintf("load average (1/5/15 min) %s before, %s after this workload, on %d CPUs.", load0, loadAvg(), runtime.NumCPU()))
		if err != nil {
			logf("workload %s failed: %v", w.name, err)
			failed = true
		}
		if sec != nil {
			fmt.Print(sec.text())
			sections = append(sections, sec)
			if w.name == "zero-work" {
				zeroWorkRates = map[string]float64{}
				for _, l := range sec.order {
					zeroWorkRates[l] = sec.medianRate(l)
				}
			}
		}
	}
	g := goals(sections)
	fmt.Print(g)
	if opt.markdown != "" {
		if err := writeMarkdown(opt.markdown, h, sections, g); err != nil {
			logf("markdown: %v", err)
			failed = true
		} else {
			logf("wrote %s", opt.markdown)
		}
	}
	if opt.chartData != "" {
		if err := writeChartData(opt.chartData, sections); err != nil {
			logf("chart data: %v", err)
			failed = true
		} else {
			logf("wrote %s (draw it with: go -C bench/chart run . -o FILE.svg %s)", opt.chartData, opt.chartData)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// header states the machine and the broker.
func header(env *brokerEnv) string {
	var b strings.Builder
	fmt.Fprintf(&b, "safeack bench  %s\n", time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "machine: %d CPUs (%s), %s/%s, %s, GOMAXPROCS=%d\n",
		runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&b, "broker:  %s\n", env.desc)
	fmt.Fprintf(&b, "load:    %s at start (other processes on this machine skew every figure)\n", loadAvg())
	fmt.Fprintf(&b, "reps:    %d per contender (median, min–max)%s\n", opt.reps, map[bool]string{true: "; -quick sizes", false: ""}[opt.quick])
	b.WriteString("rec/s counts from the first delivery to the last ack; wall is consumer start to last ack;\n")
	b.WriteString("end lag is the last ack to the group's committed offsets reaching the end of every partition.\n")
	if len(opt.safeackSet) > 0 {
		fmt.Fprintf(&b, "safeack settings: %v\n", opt.safeackSet)
	}
	if opt.saramaMaxWait > 0 {
		fmt.Fprintf(&b, "Sarama Consumer.MaxWaitTime: %v (-sarama-max-wait)\n", opt.saramaMaxWait)
	}
	b.WriteString("\n")
	return b.String()
}

// loadAvg is the 1/5/15-minute load average (Linux), or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// serveKfakeChild runs the embedded broker for the parent process: it prints
// the listen addresses on one line and serves until its stdin closes (the
// parent exited or closed the pipe).
func serveKfakeChild(consumerHeartbeat time.Duration) {
	c, err := kfake.NewCluster(kfakeOpts(consumerHeartbeat)...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kfake: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("ADDRS %s\n", strings.Join(c.ListenAddrs(), ","))
	_, _ = io.Copy(io.Discard, os.Stdin)
	c.Close()
}

// kfakeOpts are the embedded broker's options: one broker, and with
// -churn-heartbeat the consumer-protocol heartbeat interval as a broker
// config (kfake takes it from there only, not from a group's config).
func kfakeOpts(consumerHeartbeat time.Duration) []kfake.Opt {
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	if consumerHeartbeat > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{
			"group.consumer.heartbeat.interval.ms": fmt.Sprint(consumerHeartbeat.Milliseconds()),
		}))
	}
	return opts
}

// startSelf starts this binary again with args, for work that runs in a
// process of its own (a broker, a producer, a commit watcher). The child's
// stderr is ours; its stdin and stdout are pipes: it serves until its stdin
// closes (our exit closes it too), and reports on stdout.
func startSelf(args ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := exec.Command(exe, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, stdin, stdout, nil
}

// startKfakeChild starts this binary as a kfake broker process.
func startKfakeChild() (addrs []string, cmd *exec.Cmd, closeFn func(), err error) {
	args := []string{"-kfake-serve"}
	if opt.churnHeartbeat > 0 {
		args = append(args, "-churn-heartbeat", opt.churnHeartbeat.String())
	}
	cmd, stdin, stdout, err := startSelf(args...)
	if err != nil {
		return nil, nil, nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDRS ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, nil, nil, fmt.Errorf("kfake child did not report its address: %q %v", line, err)
	}
	addrs = splitList(strings.TrimSpace(strings.TrimPrefix(line, "ADDRS ")))
	closeFn = func() {
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		stopSelf(cmd, stdin, done, 5*time.Second)
	}
	return addrs, cmd, closeFn, nil
}

// stopSelf ends a child started by startSelf: it closes the child's stdin,
// which tells it to finish, and kills it when exited is not closed within
// grace; it returns once exited is closed.
func stopSelf(cmd *exec.Cmd, stdin io.Closer, exited <-chan struct{}, grace time.Duration) {
	_ = stdin.Close()
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		var n int
		if _, err := fmt.Sscan(p, &n); err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", p)
		}
		out = append(out, n)
	}
	return out, nil
}

func resolveWorkloads(names []string) ([]string, error) {
	var out []string
	add := func(n string) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, n := range names {
		switch n {
		case "all":
			for _, w := range workloadNames() {
				add(w)
			}
		case "issue3":
			add("issue3a")
			add("zero-work")
		case "issue3b":
			add("zero-work")
		case "share":
			add("share-io")
			add("share-zero")
			add("share-poison")
		default:
			if !slices.Contains(workloadNames(), n) {
				return nil, fmt.Errorf("unknown workload %q (have %s, all, issue3)", n, strings.Join(workloadNames(), ", "))
			}
			add(n)
		}
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func vlogf(format string, args ...any) {
	if opt.verbose {
		logf(format, args...)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}
