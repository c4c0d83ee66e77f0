//go:build chaos

package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/safeack/safeack"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "length of each scenario's churn phase (0: 10s with -short, 60s otherwise)")
	flagKills    = flag.Int("chaos.kills", 0, "SIGKILLs in the crash loop (0: 5 with -short, 25 otherwise)")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the scenarios' random choices (0: from the clock)")
	flagFailures = flag.Int("chaos.failures", 0, "node failures in each TestCluster scenario, rounds of the rolling restart (0: the scenario's own, fewer with -short)")
	flagProtocol = flag.String("chaos.protocol", "", "the consumer group protocol every scenario's consumers run: classic (Sarama) or consumer (KIP-848 on franz-go); empty: "+envGroupProtocol+", else classic")
)

// envGroupProtocol is the root suite's switch of group protocol; the chaos
// suite takes it too when -chaos.protocol is not given.
const envGroupProtocol = "SAFEACK_TEST_GROUP_PROTOCOL"

// protocol is the run's group protocol (see -chaos.protocol), set by
// TestMain. Consumer processes get it in their memberSpec.
var protocol safeack.GroupProtocol

// parseProtocol reads a -chaos.protocol value.
func parseProtocol(s string) (safeack.GroupProtocol, error) {
	switch s {
	case "", "classic":
		return safeack.GroupProtocolClassic, nil
	case "consumer":
		return safeack.GroupProtocolConsumer, nil
	}
	return 0, fmt.Errorf("-chaos.protocol=%q: want classic or consumer", s)
}

// protocolSuffix is appended to a scenario's name on the consumer
// protocol, so that the figures and artifacts of the two runs differ.
func protocolSuffix() string {
	if protocol == safeack.GroupProtocolConsumer {
		return "-consumer"
	}
	return ""
}

// skipOnConsumerProtocol skips a scenario that does not run consumer
// groups of the chosen protocol (share groups; transactions, which are
// classic only: docs/group-protocols.md) in a consumer-protocol run: the
// classic run has it.
func skipOnConsumerProtocol(t *testing.T, why string) {
	t.Helper()
	if protocol == safeack.GroupProtocolConsumer {
		t.Skip("runs in the classic-protocol run only: " + why)
	}
}

// Environment.
const (
	// envChild is set to "1" in a consumer process of the crash loop.
	envChild = "SAFEACK_CHAOS_CHILD"
	// envChildSpec carries the child's memberSpec as JSON.
	envChildSpec = "SAFEACK_CHAOS_CHILD_SPEC"
	// envSessionTimeout overrides the group session timeout on a real
	// cluster (default kafkatest.RealSessionTimeout, which any default
	// broker accepts; scripts/kafka.sh's broker accepts down to 1s).
	envSessionTimeout = "SAFEACK_CHAOS_SESSION_TIMEOUT"
	// envRestart names a command that restarts the real broker keeping its
	// data (run with bash -c); TestBrokerRestart is skipped without it.
	envRestart = "SAFEACK_CHAOS_RESTART"
	// envArtifacts names a directory for the stderr of consumer processes
	// that hang (default: the system's temporary directory).
	envArtifacts = "SAFEACK_CHAOS_ARTIFACTS"
	// envCluster names the control script of a three-node cluster
	// (scripts/kafka-cluster.sh writes it: DIR/ctl), the one
	// SAFEACK_KAFKA_BROKERS points at; the TestCluster scenarios are
	// skipped without it. See clusterCtl.
	envCluster = "SAFEACK_CHAOS_CLUSTER"
	// envKeepLogs, when set, keeps the timeline and the consumers' logs of
	// passing scenarios too, in the artifacts directory.
	envKeepLogs = "SAFEACK_CHAOS_KEEP_LOGS"
	// envSaramaLog, when set, sends Sarama's own log of consumer processes
	// to their stderr (very verbose; for debugging a stall).
	envSaramaLog = "SAFEACK_CHAOS_SARAMA_LOG"
)

// saveArtifact writes content to a file named name in the artifacts
// directory and returns its path (or why it could not).
func saveArtifact(name, content string) string {
	dir := os.Getenv(envArtifacts)
	if dir == "" {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return fmt.Sprintf("(not saved: %v)", err)
	}
	return path
}

// seed is the run's seed; each scenario derives its own from it.
var seed uint64

func churn() time.Duration {
	switch {
	case *flagDuration > 0:
		return *flagDuration
	case testing.Short():
		return 10 * time.Second
	}
	return 60 * time.Second
}

func crashes() int {
	switch {
	case *flagKills > 0:
		return *flagKills
	case testing.Short():
		return 5
	}
	return 25
}

func TestMain(m *testing.M) {
	flag.Parse()
	seed = *flagSeed
	p := *flagProtocol
	if p == "" {
		p = os.Getenv(envGroupProtocol)
	}
	var err error
	if protocol, err = parseProtocol(p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	code := m.Run()
	if os.Getenv(envChild) == "" {
		printFigures()
	}
	os.Exit(code)
}

// figures are one scenario's numbers, for the table printed at the end.
type figures struct {
	Scenario string
	Broker   string
	Elapsed  time.Duration
	// Records in the topic at the end; Consumers started (processes or
	// members); Crashes (SIGKILLs); MemberChanges (joins and leaves,
	// crashes included); Generations (distinct group generations seen in
	// commits, embedded broker only; -1 unknown).
	Records, Consumers, Crashes, MemberChanges, Generations int
	// Faults injected (counted where the broker applied them).
	Faults      int
	FaultDetail string
	// Commits checked (observed requests on the embedded broker plus polled
	// offsets; polled offsets only on a real cluster).
	Commits int
	// Twice: records handled (acked) more than once; Extra: acks beyond the
	// first, summed; Nacks: deliberate nacks (each redelivered).
	Twice, Extra, Nacks int
	// Lost: records never acked. Violations: failed invariant checks.
	Lost, Violations int
	// Stalls: per broker failure, from the failure until every partition
	// it affected acked a record produced after it (see failover); -1
	// when none was produced after it.
	Stalls []time.Duration
	Passed bool
}

var results struct {
	mu   sync.Mutex
	rows []figures
}

func report(f figures) {
	results.mu.Lock()
	results.rows = append(results.rows, f)
	results.mu.Unlock()
}

func (f figures) row() string {
	gens := "n/a"
	if f.Generations >= 0 {
		gens = fmt.Sprint(f.Generations)
	}
	status := "ok"
	if !f.Passed {
		status = "FAIL"
	}
	faults := fmt.Sprint(f.Faults)
	if f.FaultDetail != "" {
		faults += " (" + f.FaultDetail + ")"
	}
	return fmt.Sprintf("| %s | %s | %.0fs | %d | %d | %d | %d | %s | %s | %s | %d | %d | %d | %d | %d | %d | %s |",
		f.Scenario, f.Broker, f.Elapsed.Seconds(), f.Records, f.Consumers, f.Crashes, f.MemberChanges, gens,
		faults, stallsField(f.Stalls), f.Commits, f.Twice, f.Extra, f.Nacks, f.Lost, f.Violations, status)
}

// stallsField writes stalls as "8.1/6.9/7.7 s" ("-" for a failure after
// which nothing was produced), or "" when there were none.
func stallsField(stalls []time.Duration) string {
	if len(stalls) == 0 {
		return ""
	}
	f := make([]string, len(stalls))
	for i, d := range stalls {
		if d < 0 {
			f[i] = "-"
		} else {
			f[i] = fmt.Sprintf("%.1f", d.Seconds())
		}
	}
	return strings.Join(f, "/") + " s"
}

const figuresHeader = "| scenario | broker | time | records | consumers | crashes | member changes | generations | faults | stall after each failure | commits checked | handled twice | extra acks | nacks | lost | violations | result |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

func printFigures() {
	results.mu.Lock()
	defer results.mu.Unlock()
	if len(results.rows) == 0 {
		return
	}
	mode := "long"
	if testing.Short() {
		mode = "short"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nchaos figures (%s; %s group protocol; churn %v per scenario, %d crashes in the crash loop; -chaos.seed=%d):\n",
		mode, protocol, churn(), crashes(), seed)
	b.WriteString(figuresHeader + "\n")
	for _, r := range results.rows {
		b.WriteString(r.row() + "\n")
	}
	fmt.Print(b.String())
}

// tailBuffer keeps the last max bytes written to it: logs of consumers,
// shown when a scenario fails.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2*b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf
	if len(s) > b.max {
		s = s[len(s)-b.max:]
	}
	return string(s)
}
