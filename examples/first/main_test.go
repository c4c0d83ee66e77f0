package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack/internal/docscheck"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
)

// runMain makes the test binary run main instead of the tests: the test
// starts the program as a process of its own, so that it gets real
// signals and exits as a user's would.
const runMain = "SAFEACK_FIRST_PROGRAM_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReadmeShowsTheProgram: the README's first program is this
// directory's main.go, byte for byte, so that what the README shows is
// what TestFirstProgram compiles and runs.
func TestReadmeShowsTheProgram(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var found []docscheck.Block
	for _, b := range docscheck.Parse("README.md", readme).GoBlocks {
		if strings.HasPrefix(b.Code, "package main\n") && strings.Contains(b.Code, "safeack.NewSubscriber") {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("README.md has %d Go blocks holding a program with safeack.NewSubscriber, want 1 (examples/first/main.go)", len(found))
	}
	if got := found[0].Code; got != string(src) {
		t.Errorf("README.md:%d differs from examples/first/main.go at line %d: copy main.go into the README's block",
			found[0].Line, firstDiff(got, string(src)))
	}
}

// firstDiff returns the first line (from 1) at which a and b differ.
func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

// TestFirstProgram runs the README's program on an embedded broker with
// the topic it reads, told of the broker as scripts/kafka.sh says it
// (SAFEACK_KAFKA_BROKERS): it bills the orders produced before its first
// run and those produced while it runs, says at start where the new group
// starts on each partition, and on SIGTERM it closes, commits every billed
// order and exits with status 0.
func TestFirstProgram(t *testing.T) {
	t.Parallel()
	runFirstProgram(t, "SAFEACK_KAFKA_BROKERS")
}

// TestFirstProgramKafkaBrokers: the program also reads KAFKA_BROKERS.
func TestFirstProgramKafkaBrokers(t *testing.T) {
	t.Parallel()
	runFirstProgram(t, "KAFKA_BROKERS")
}

func runFirstProgram(t *testing.T, brokersVar string) {
	c := kafkatest.Start(t, kafkatest.Embedded(), kafkatest.WithKfakeOpts(kfake.SeedTopics(2, "orders")))
	// Orders produced before the program's first run.
	n := 0
	produce := func() {
		n++
		c.Produce(t, "orders", kafkatest.Record{Partition: int32(n % 2), Value: fmt.Appendf(nil, "order-%d", n)})
	}
	const before = 10
	for range before {
		produce()
	}

	var out safeacktest.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "SAFEACK_KAFKA_BROKERS=") || strings.HasPrefix(kv, "KAFKA_BROKERS=")
	})
	cmd.Env = append(env, runMain+"=1", brokersVar+"="+strings.Join(c.Brokers(), ","))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	billed := func() int { return strings.Count(out.String(), "billing order ") }
	kafkatest.WaitFor(t, 60*time.Second, "the orders produced before the first run to be billed", func() bool {
		return billed() >= before
	})
	for i := 1; i <= before; i++ {
		if !strings.Contains(out.String(), fmt.Sprintf("billing order order-%d\n", i)) {
			t.Errorf("order-%d, produced before the first run, was not billed; output:\n%s", i, out.String())
		}
	}
	// The first screen says where the new group starts, and why.
	if got := strings.Count(out.String(), "it starts at its oldest record (Consumer.Offsets.Initial = OffsetOldest)"); got != 2 {
		t.Errorf("%d lines say where a partition of the new group starts, want 2 (one per partition); output:\n%s", got, out.String())
	}
	for range 4 {
		produce()
	}
	hwm := c.HighWaterMarks(t, "orders")
	kafkatest.WaitFor(t, 30*time.Second, "the last orders to be billed", func() bool {
		return strings.Contains(out.String(), fmt.Sprintf("billing order order-%d\n", n))
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the program ended with %v after SIGTERM; its output:\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the program did not exit within 60 s of SIGTERM; its output:\n%s", out.String())
	}
	committed := c.CommittedOffsets(t, "billing", "orders")
	for p, end := range hwm {
		if got := committed[p].Offset; got != end {
			t.Errorf("partition %d: committed %d after SIGTERM, want %d (its end: every order billed); output:\n%s", p, got, end, out.String())
		}
	}
	t.Logf("%d orders produced (%d before the first run), %d billed", n, before, billed())
}
