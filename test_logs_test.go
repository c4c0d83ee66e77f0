package safeack_test

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

// keptLogLines bounds the lines keptLogger holds for one test.
const keptLogLines = 5000

// keptLogger is the logger of one test's subscribers and routers. With
// SAFEACK_TEST_DEBUG set it is testLogger (everything, to stderr, as it
// comes). Otherwise it keeps the Info and Error lines (the last
// keptLogLines, one tail for all the loggers of a test) and, if the test
// fails, writes them to a file named in the failure: a test that passes
// prints nothing, and one that fails in CI comes with what its
// subscribers said.
func keptLogger(t testing.TB) watermill.LoggerAdapter {
	if os.Getenv("SAFEACK_TEST_DEBUG") != "" {
		return testLogger()
	}
	tail, loaded := logTails.LoadOrStore(t, &logTail{})
	if !loaded {
		t.Cleanup(func() {
			logTails.Delete(t)
			if t.Failed() {
				t.Logf("the Info and Error lines its subscribers and routers logged: %s",
					writeArtifact(t, "log", tail.(*logTail).String()))
			}
		})
	}
	return watermill.NewStdLoggerWithOut(tail.(*logTail), false, false)
}

// logTails holds each running test's logTail.
var logTails sync.Map // testing.TB -> *logTail

// logTail is an io.Writer that keeps the last keptLogLines lines written.
type logTail struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		l.lines = append(l.lines, line)
	}
	// Dropped in bulk, not line by line, so that a chatty test does not
	// copy the whole tail on every line it logs.
	if len(l.lines) >= 2*keptLogLines {
		l.lines = append(l.lines[:0], l.lines[len(l.lines)-keptLogLines:]...)
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-keptLogLines):], "\n") + "\n"
}
