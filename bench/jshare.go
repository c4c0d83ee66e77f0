package main

import (
	"embed"
	"errors"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Apache Kafka's own Java share consumer (KafkaShareConsumer, kafka-clients
// 4.4.0) as a contender of the share workloads: bench/jshare holds our
// small driver (ShareBench.java) and its pom, built like the Parallel
// Consumer driver (pc.go) on first use into ~/.cache/safeack/bench-jshare
// (SAFEACK_BENCH_JSHARE_DIR overrides it). Each process runs one
// KafkaShareConsumer and speaks the -share-member protocol on stdout, so
// startShare reads it as it reads the Go share members. -pc gates these
// rows too.

//go:embed jshare/pom.xml jshare/src
var jshareSources embed.FS

// jshareClients is the kafka-clients version the driver's pom asks for.
const jshareClients = "4.4.0"

var jshareBuild struct {
	once      sync.Once
	java      string
	classpath string
	err       error
}

// jshareReady builds the driver once per invocation and says whether the
// java-share contenders can run; the error says why not.
func jshareReady() error {
	jshareBuild.once.Do(func() {
		if opt.pc == "off" {
			jshareBuild.err = errors.New("-pc off")
			return
		}
		jshareBuild.java, jshareBuild.classpath, jshareBuild.err = buildJavaDriver(jshareSources, "jshare",
			func() (string, error) { return driverCacheDir("SAFEACK_BENCH_JSHARE_DIR", "bench-jshare") },
			"the Java share-consumer driver (kafka-clients "+jshareClients+")")
		if jshareBuild.err != nil {
			logf("Java share-consumer contenders skipped: %v", jshareBuild.err)
		}
	})
	return jshareBuild.err
}

// javaShareReady says why the java-share rows cannot run on env, nil when
// they can: the driver must build, and the broker must be a real one. The
// embedded kfake answers some ShareFetch requests with a partition whose
// records field is null; kafka-clients 4.4.0 refuses the whole response
// ("non-nullable field records was serialized as null"), its network thread
// stops, and the consumer's acks and close go nowhere.
func javaShareReady(env *brokerEnv) error {
	if err := jshareReady(); err != nil {
		return err
	}
	if len(opt.brokers) == 0 {
		return errors.New("the embedded kfake broker answers ShareFetch with a null records field kafka-clients " + jshareClients + " rejects (its network thread stops); run them with -brokers on Kafka 4.2+")
	}
	return nil
}

// javaShareCommand is the command line of one java-share process: the
// driver with spec's topic, group, concurrency, work and poison records;
// spec.Set holds KafkaShareConsumer properties (e.g. max.poll.records).
func javaShareCommand(spec shareMemberSpec) *exec.Cmd {
	// The Kafka client logs through slf4j-simple to stderr: warnings and
	// errors only (-v: info).
	level := "warn"
	if spec.Verbose {
		level = "info"
	}
	args := []string{"-Dorg.slf4j.simpleLogger.defaultLogLevel=" + level, "-Dorg.slf4j.simpleLogger.logFile=System.err",
		"-cp", jshareBuild.classpath, "safeack.bench.ShareBench",
		"brokers=" + strings.Join(spec.Brokers, ","), "topic=" + spec.Topic, "group=" + spec.Group,
		"conc=" + strconv.Itoa(spec.Conc), "work-ns=" + strconv.FormatInt(int64(spec.Work), 10),
		"poison-every=" + strconv.Itoa(spec.PoisonEvery), "verbose=" + strconv.FormatBool(spec.Verbose)}
	for _, k := range slices.Sorted(maps.Keys(spec.Set)) {
		args = append(args, "prop."+k+"="+spec.Set[k]) // consumer properties
	}
	return exec.Command(jshareBuild.java, args...)
}
