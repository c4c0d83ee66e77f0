package partition

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestWorkerFirstHandOutRunsTheConsumerFirst: the consumer parked on the
// output runs as soon as run hands it the assignment's first message, not
// after every goroutine that was already runnable (issue 17: at start-up,
// Sarama's parsing of the first fetch kept the first message from its
// consumer for 3-58 ms). On one P, goroutines that spin for a few
// milliseconds are queued before the first record arrives; the consumer
// must see its message before any of them finishes. Go's scheduler checks
// the global run queue first on one pass in 61, which can put run back
// ahead of the consumer by chance, so the test allows three assignments.
func TestWorkerFirstHandOutRunsTheConsumerFirst(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector randomizes the order of the run queue")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 3 {
		if consumerRanBeforeHogs(t) {
			return
		}
	}
	t.Fatal("the consumer ran only after every goroutine queued before the first record, in three assignments out of three")
}

// consumerRanBeforeHogs starts a worker, queues goroutines that spin
// behind the parked worker and consumer, sends one record and reports
// whether the consumer received it before any spinner finished.
func consumerRanBeforeHogs(t *testing.T) bool {
	r := newRig(t, rigOptions{maxInFlight: 4})
	defer r.shutdown()
	var hogsDone atomic.Int32
	first := make(chan bool, 1)
	go func() {
		m := <-r.out
		first <- hogsDone.Load() == 0
		m.Ack()
	}()
	waitUntil(t, "run and the consumer are parked", func() bool {
		return parked("(*Worker).Run(", "[select") && parked("consumerRanBeforeHogs.func", "[chan receive")
	})
	for range 4 {
		go func() {
			for start := time.Now(); time.Since(start) < 3*time.Millisecond; {
			}
			hogsDone.Add(1)
		}()
	}
	r.sendN(1) // readies run; this goroutine then parks below
	select {
	case ok := <-first:
		return ok
	case <-time.After(waitLimit):
		t.Fatal("no message handed out")
		return false
	}
}

// parked reports whether a goroutine whose stack mentions fn is blocked in
// the given state (as runtime.Stack prints it, e.g. "[select").
func parked(fn, state string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, fn) && strings.Contains(header, state) {
			return true
		}
	}
	return false
}
