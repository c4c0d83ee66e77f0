package safeack_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// goroutineLabel is the pprof label key under which a test marks the
// goroutines of the code it starts (see inScope).
const goroutineLabel = "safeack_test_scope"

var scopeSeq atomic.Uint64

// goroutineScope names the goroutines one test started through inScope:
// the runtime hands a goroutine's pprof labels down to every goroutine it
// starts, so the subscriber's goroutines (and Sarama's, started by them)
// carry the label, and the tests running beside it do not.
type goroutineScope struct {
	name string
}

func newGoroutineScope(t *testing.T) goroutineScope {
	return goroutineScope{name: fmt.Sprintf("%s#%d", t.Name(), scopeSeq.Add(1))}
}

// inScope runs f with the scope's label; every goroutine f starts, and
// each one they start in turn, carries it.
func (s goroutineScope) inScope(f func()) {
	pprof.Do(context.Background(), pprof.Labels(goroutineLabel, s.name), func(context.Context) { f() })
}

// records returns the goroutine profile's records of the scope's
// goroutines: each one stack, with how many goroutines have it.
func (s goroutineScope) records() []string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	// Each record: "N @ 0x...", then "# labels: {...}" when labelled,
	// then its frames; records are separated by a blank line.
	want := strconv.Quote(goroutineLabel) + ":" + strconv.Quote(s.name)
	var own []string
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(rec, want) {
			own = append(own, rec)
		}
	}
	return own
}

// in returns the records of the scope's goroutines that are in any of
// the given functions (matched against the frames, e.g.
// "partition.(*Worker).await").
func (s goroutineScope) in(funcs ...string) []string {
	var found []string
	for _, rec := range s.records() {
		for _, f := range funcs {
			if strings.Contains(rec, f) {
				found = append(found, rec)
				break
			}
		}
	}
	return found
}

// running returns how many goroutines of the scope are alive, and their
// stacks.
func (s goroutineScope) running() (int, string) {
	n := 0
	var stacks strings.Builder
	for _, rec := range s.records() {
		if strings.Contains(rec, breakerTimer) {
			continue
		}
		if m := countRe.FindStringSubmatch(rec); m != nil {
			c, _ := strconv.Atoi(m[1])
			n += c
		}
		stacks.WriteString(rec)
		stacks.WriteString("\n\n")
	}
	return n, stacks.String()
}

var countRe = regexp.MustCompile(`(?m)^(\d+) @`)

// breakerTimer is the one goroutine a closed client may leave: the
// circuit breaker of Sarama's producer (go-resiliency) sleeps out its
// timeout in a goroutine of its own that nothing can stop; it only flips
// the dropped breaker's state when it wakes.
const breakerTimer = "go-resiliency/breaker.(*Breaker).timer"

// requireNoneLeft fails t unless every goroutine of the scope ended within
// grace (the few steps a goroutine takes after closing what Close waits
// for: returning, running its defers). The stacks of those left are
// written to a file named in the failure.
func (s goroutineScope) requireNoneLeft(t *testing.T, grace time.Duration, after string) {
	t.Helper()
	var n int
	var stacks string
	deadline := time.Now().Add(grace)
	for {
		if n, stacks = s.running(); n == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d goroutines started by the subscriber still run %v after %s; their stacks: %s",
		n, grace, after, writeArtifact(t, "goroutines-left", stacks))
}

// dumpGoroutines writes every goroutine's stack to a file and returns its
// path, for a failure message: the dump of a whole test process runs to
// hundreds of lines, which would bury the failure itself.
func dumpGoroutines(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	return writeArtifact(t, "goroutines", buf.String())
}

// writeArtifact writes text to a file that outlives the test, in
// $SAFEACK_TEST_ARTIFACTS (CI keeps it) or else the system's temporary
// directory, and returns its path.
func writeArtifact(t testing.TB, what, text string) string {
	t.Helper()
	dir := os.Getenv("SAFEACK_TEST_ARTIFACTS")
	if dir == "" {
		dir = os.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Sprintf("(not written: %v)", err)
	}
	name := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(t.Name())
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s-%s-*.txt", name, what))
	if err != nil {
		return fmt.Sprintf("(not written: %v)", err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		return fmt.Sprintf("(not written: %v)", err)
	}
	path, _ := filepath.Abs(f.Name())
	return path
}
