package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/safeack/safeack"
)

// Confluent's Parallel Consumer as a contender: bench/pc holds our own small
// Java driver (PcBench.java) and a pom that takes Parallel Consumer 0.5.3.2
// and kafka-clients from Maven Central. On first use the bench copies them
// into the cache directory (~/.cache/safeack/bench-pc) and builds them there
// with mvn -q; a stamp of the sources' hash skips the build next time.

//go:embed pc/pom.xml pc/src
var pcSources embed.FS

// pcVersion is the Parallel Consumer version the pom asks for.
const pcVersion = "0.5.3.2"

var pcBuild struct {
	once      sync.Once
	java      string
	classpath string
	err       error
}

// pcReady builds the driver once per invocation and says whether the PC
// contenders can run; the error says why not.
func pcReady() error {
	pcBuild.once.Do(func() {
		if opt.pc == "off" {
			pcBuild.err = errors.New("-pc off")
			return
		}
		pcBuild.java, pcBuild.classpath, pcBuild.err = buildPC()
		if pcBuild.err != nil {
			logf("Parallel Consumer contenders skipped: %v", pcBuild.err)
		}
	})
	return pcBuild.err
}

func pcCacheDir() (string, error) {
	return driverCacheDir("SAFEACK_BENCH_PC_DIR", "bench-pc")
}

func buildPC() (java, classpath string, err error) {
	return buildJavaDriver(pcSources, "pc", pcCacheDir, "the Parallel Consumer "+pcVersion+" driver")
}

// driverCacheDir is where a Java driver is built: $env, or name in the
// user's cache directory under safeack.
func driverCacheDir(env, name string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "safeack", name), nil
}

// buildJavaDriver builds the Maven project under root in srcs (a pom.xml
// and src) in the directory cacheDir names, unless its stamp (the sources'
// hash) says it is built, and returns java and the classpath to run it.
func buildJavaDriver(srcs embed.FS, root string, cacheDir func() (string, error), what string) (java, classpath string, err error) {
	java, err = exec.LookPath("java")
	if err != nil {
		return "", "", errors.New("java not found on PATH (needs Java 17+ and Maven)")
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", "", errors.New("mvn not found on PATH (needs Java 17+ and Maven)")
	}
	dir, err := cacheDir()
	if err != nil {
		return "", "", err
	}
	h := sha256.New()
	err = fs.WalkDir(srcs, root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := srcs.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", "", err
	}
	stamp := hex.EncodeToString(h.Sum(nil))
	src := filepath.Join(dir, "src")
	classpath = filepath.Join(src, "target", "classes") + string(os.PathListSeparator) + filepath.Join(src, "target", "lib", "*")
	if b, err := os.ReadFile(filepath.Join(dir, "stamp")); err == nil && strings.TrimSpace(string(b)) == stamp {
		return java, classpath, nil
	}
	logf("building %s with Maven into %s (first use; Maven Central)", what, src)
	if err := os.RemoveAll(src); err != nil {
		return "", "", err
	}
	err = fs.WalkDir(srcs, root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		out := filepath.Join(src, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := srcs.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		return "", "", err
	}
	var log bytes.Buffer
	cmd := exec.Command(mvn, "-q", "-B", "-f", filepath.Join(src, "pom.xml"), "package")
	cmd.Stdout, cmd.Stderr = &log, &log
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("mvn package failed (%v):\n%s", err, lastLines(log.String(), 30))
	}
	if err := os.WriteFile(filepath.Join(dir, "stamp"), []byte(stamp+"\n"), 0o644); err != nil {
		return "", "", err
	}
	logf("built %s in %v", what, time.Since(start).Round(time.Second))
	return java, classpath, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func pcOrdering(o safeack.Ordering) string {
	switch o {
	case safeack.OrderByPartition:
		return "PARTITION"
	case safeack.Unordered:
		return "UNORDERED"
	}
	return "KEY"
}

// startPC runs the Java driver as a child process. Its stdout lines fill tr:
// T0 rebases tr on the driver's clock (start-up and wall count from the
// KafkaConsumer's construction, the JVM already running), FIRST is the first
// delivery, DONE carries the last ack, CPU and memory, and the acks file the
// per-record ack times.
func startPC(c *caseSpec, env *brokerEnv, t *topic, group string, tr *ackTracker) (*contender, error) {
	if err := pcReady(); err != nil {
		return nil, err
	}
	var warm *topic
	if opt.pcWarmup > 0 {
		var err error
		if warm, err = env.topicFor(context.Background(), pcWarmupTopic()); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "safeack-bench-pc-")
	if err != nil {
		return nil, err
	}
	workFile := ""
	if c.work != nil {
		workFile = filepath.Join(tmp, "work")
		b := make([]byte, 8*len(c.work))
		for i, d := range c.work {
			binary.BigEndian.PutUint64(b[8*i:], uint64(d))
		}
		if err := os.WriteFile(workFile, b, 0o644); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
	}
	acksFile := filepath.Join(tmp, "acks")
	// Parallel Consumer and the Kafka client log through slf4j-simple to
	// stderr: warnings and errors only (-v: info).
	level := "warn"
	if opt.verbose {
		level = "info"
	}
	args := []string{"-Dorg.slf4j.simpleLogger.defaultLogLevel=" + level, "-Dorg.slf4j.simpleLogger.logFile=System.err",
		// It warns on every start that it cannot check the auto-commit
		// setting of kafka-clients 3.9's KafkaConsumer (auto-commit is off).
		"-Dorg.slf4j.simpleLogger.log.io.confluent.parallelconsumer.internal.AbstractParallelEoSStreamProcessor=error",
		"-cp", pcBuild.classpath, "safeack.bench.PcBench",
		"brokers=" + strings.Join(env.brokers, ","), "topic=" + t.name, "group=" + group,
		"ordering=" + pcOrdering(c.ordering), "concurrency=" + strconv.Itoa(c.conc), "n=" + strconv.Itoa(c.topic.n),
		"work=" + workFile, "acks=" + acksFile, "commit-interval-ms=" + strconv.FormatInt(commitInterval().Milliseconds(), 10),
		"warmup=" + strconv.Itoa(opt.pcWarmup)}
	if warm != nil {
		args = append(args, "warmup-topic="+warm.name)
	}
	cmd := exec.Command(pcBuild.java, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	con := &contender{failed: make(chan struct{}), ext: &extStats{}}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		done := false
		for sc.Scan() {
			line := sc.Text()
			vlogf("%s: %s", c.label, line)
			k, v, _ := strings.Cut(line, " ")
			switch k {
			case "T0":
				ns, _ := strconv.ParseInt(v, 10, 64)
				tr.base = time.Unix(0, ns)
			case "FIRST":
				ns, _ := strconv.ParseInt(v, 10, 64)
				tr.setFirst(time.Duration(ns))
			case "DONE":
				if err := pcDone(v, acksFile, tr, con.ext); err != nil {
					con.failErr = err
					close(con.failed)
				} else {
					close(tr.done)
				}
				done = true
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		waitErr = cmd.Wait()
		if !done {
			con.failErr = fmt.Errorf("the Parallel Consumer driver exited before acking every record: %v", waitErr)
			close(con.failed)
		}
	}()
	con.stop = func() error {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = os.RemoveAll(tmp)
		return waitErr
	}
	return con, nil
}

// pcWarmupTopic holds the records of the JVM's unmeasured warm-up pass:
// like zero-work's, -pc-warmup of them.
func pcWarmupTopic() *topicSpec {
	return &topicSpec{name: fmt.Sprintf("pc-warmup-%d", opt.pcWarmup), partitions: 8, n: opt.pcWarmup, valueSize: valueSize, keys: 1000}
}

// pcDone parses "last=… cpu=… heap=… rss=… busy=… dups=…" and the acks file.
func pcDone(kv, acksFile string, tr *ackTracker, x *extStats) error {
	vals := map[string]int64{}
	for _, f := range strings.Fields(kv) {
		k, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("the Parallel Consumer driver: bad DONE field %q", f)
		}
		vals[k] = n
	}
	b, err := os.ReadFile(acksFile)
	if err != nil {
		return err
	}
	if len(b) != 8*tr.n {
		return fmt.Errorf("the Parallel Consumer driver: acks file holds %d bytes, want %d", len(b), 8*tr.n)
	}
	for i := range tr.n {
		ns := int64(binary.BigEndian.Uint64(b[8*i:]))
		if ns <= 0 {
			return fmt.Errorf("the Parallel Consumer driver: record %d not acked", i)
		}
		tr.seen[i].Store(1)
		tr.ackAt[i].Store(uint32((ns-1)/int64(time.Microsecond)) + 1)
	}
	tr.uniq.Store(int64(tr.n))
	tr.total.Store(int64(tr.n) + vals["dups"])
	tr.last.Store(vals["last"])
	tr.busy.Store(vals["busy"])
	x.cpu = time.Duration(vals["cpu"])
	x.heap = uint64(vals["heap"])
	x.rss = uint64(vals["rss"])
	x.busy = time.Duration(vals["busy"])
	x.dups = vals["dups"]
	return nil
}

// commitInterval is the commit interval every contender gets: Sarama's
// auto-commit interval of the shared consumer config.
func commitInterval() time.Duration {
	return consumerConfig().Consumer.Offsets.AutoCommit.Interval
}
