package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// The commit watcher is a child process of the bench binary (-commit-watch)
// that polls one group's committed offsets for one topic with OffsetFetch
// every -commit-poll and prints a line whenever a partition's committed
// offset or metadata changes:
//
//	C <unix ns when the answer arrived> <partition> <offset> <metadata, Go-quoted>
//
// It runs in its own process so its CPU and memory stay out of the
// consumer's figures, and it works the same on kfake and on a real cluster.
// A commit is therefore seen at most one poll interval plus one round trip
// after the broker stored it: the times are upper bounds. On stdin EOF it
// prints "RTT <median ns> <p99 ns> <polls>" and exits.

type watchSpec struct {
	Brokers    []string      `json:"brokers"`
	Topic      string        `json:"topic"`
	Group      string        `json:"group"`
	Partitions int           `json:"partitions"`
	Poll       time.Duration `json:"poll"`
}

// commitChange is one observed change of a partition's committed offset.
type commitChange struct {
	at   int64 // unix ns
	off  int64
	meta string // the committed metadata (safeack: the completed tail)
}

// commitWatch is the parent's view of a running watcher.
type commitWatch struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{} // the reader goroutine ended
	closed sync.Once

	mu      sync.Mutex
	changes [][]commitChange // per partition, in order
	notify  chan struct{}    // closed and replaced on every change
	rttMed  time.Duration
	rttP99  time.Duration
	polls   int
	poll    time.Duration
}

// startCommitWatch starts a watcher for group on t and returns once it
// polled for the first time.
func startCommitWatch(env *brokerEnv, t *topic, group string) (*commitWatch, error) {
	spec := watchSpec{Brokers: env.brokers, Topic: t.name, Group: group, Partitions: len(t.ends), Poll: opt.commitPoll}
	js, _ := json.Marshal(spec)
	cmd, stdin, stdout, err := startSelf("-commit-watch", string(js))
	if err != nil {
		return nil, err
	}
	w := &commitWatch{cmd: cmd, stdin: stdin, done: make(chan struct{}), notify: make(chan struct{}),
		changes: make([][]commitChange, spec.Partitions), poll: spec.Poll}
	br := bufio.NewReader(stdout)
	var line string
	got := make(chan struct{})
	go func() { line, err = br.ReadString('\n'); close(got) }()
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-got
	}
	if err != nil || strings.TrimSpace(line) != "READY" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("commit watcher did not start: %q %v", line, err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(br)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 5)
			switch {
			case len(f) == 5 && f[0] == "C":
				at, _ := strconv.ParseInt(f[1], 10, 64)
				p, _ := strconv.Atoi(f[2])
				off, _ := strconv.ParseInt(f[3], 10, 64)
				meta, _ := strconv.Unquote(f[4])
				w.mu.Lock()
				if p >= 0 && p < len(w.changes) {
					w.changes[p] = append(w.changes[p], commitChange{at: at, off: off, meta: meta})
				}
				close(w.notify)
				w.notify = make(chan struct{})
				w.mu.Unlock()
			case len(f) == 4 && f[0] == "RTT":
				med, _ := strconv.ParseInt(f[1], 10, 64)
				p99, _ := strconv.ParseInt(f[2], 10, 64)
				n, _ := strconv.Atoi(f[3])
				w.mu.Lock()
				w.rttMed, w.rttP99, w.polls = time.Duration(med), time.Duration(p99), n
				w.mu.Unlock()
			}
		}
	}()
	return w, nil
}

// waitEnds waits until every partition's committed offset reached ends[p]
// (partitions with nothing to consume count as reached) and returns the
// unix ns of the observation that completed it.
func (w *commitWatch) waitEnds(ends []int64, timeout time.Duration) (int64, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		at, ok := w.endsAt(ends)
		ch := w.notify
		w.mu.Unlock()
		if ok {
			return at, true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return 0, false
		case <-w.done:
			return 0, false
		}
	}
}

func (w *commitWatch) endsAt(ends []int64) (int64, bool) {
	var last int64
	for p, end := range ends {
		if end <= 0 {
			continue
		}
		at, ok := coveredAt(w.changes[p], end-1)
		if !ok {
			return 0, false
		}
		last = max(last, at)
	}
	return last, true
}

// coveredAt is when the committed offset of a partition first passed off.
func coveredAt(ch []commitChange, off int64) (int64, bool) {
	i, _ := slices.BinarySearchFunc(ch, off, func(c commitChange, off int64) int {
		if c.off > off {
			return 1
		}
		return -1
	})
	// Committed offsets only grow in these runs (a fresh group, no
	// rebalance); should one go back, take the first change past off.
	for ; i < len(ch); i++ {
		if ch[i].off > off {
			return ch[i].at, true
		}
	}
	for j := range ch {
		if ch[j].off > off {
			return ch[j].at, true
		}
	}
	return 0, false
}

// close stops the watcher and waits for its summary line.
func (w *commitWatch) close() {
	w.closed.Do(func() {
		stopSelf(w.cmd, w.stdin, w.done, 5*time.Second)
		_ = w.cmd.Wait()
	})
}

// snapshot returns a copy of the changes seen so far.
func (w *commitWatch) snapshot() [][]commitChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([][]commitChange, len(w.changes))
	for i, c := range w.changes {
		out[i] = slices.Clone(c)
	}
	return out
}

// runCommitWatchChild is the child side.
func runCommitWatchChild(js string) {
	var spec watchSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fatalf("commit watcher: %v", err)
	}
	cfg := benchClientConfig()
	cfg.ClientID = "safeack-bench-commit-watch"
	client, err := sarama.NewClient(spec.Brokers, cfg)
	if err != nil {
		fatalf("commit watcher: %v", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		fatalf("commit watcher: %v", err)
	}
	parts := make([]int32, spec.Partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	req := map[string][]int32{spec.Topic: parts}
	last := make([]int64, spec.Partitions)
	lastMeta := make([]string, spec.Partitions)
	for i := range last {
		last[i] = -1
	}
	out := bufio.NewWriter(os.Stdout)
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	var rtts []time.Duration
	ready := false
	errs := 0
	tick := time.NewTicker(spec.Poll)
	defer tick.Stop()
	for {
		t0 := time.Now()
		resp, err := admin.ListConsumerGroupOffsets(spec.Group, req)
		now := time.Now()
		if errors.Is(err, sarama.ErrGroupIDNotFound) {
			// The group has not joined yet (kfake answers so): nothing
			// committed.
			resp, err = &sarama.OffsetFetchResponse{}, nil
		}
		if err == nil {
			rtts = append(rtts, now.Sub(t0))
			for i, p := range parts {
				if b := resp.GetBlock(spec.Topic, p); b != nil && b.Err == sarama.ErrNoError && (b.Offset != last[i] || b.Metadata != lastMeta[i]) {
					last[i], lastMeta[i] = b.Offset, b.Metadata
					if b.Offset >= 0 {
						fmt.Fprintf(out, "C %d %d %d %s\n", now.UnixNano(), p, b.Offset, strconv.Quote(b.Metadata))
					}
				}
			}
			if !ready {
				fmt.Fprintln(out, "READY")
				ready = true
			}
			_ = out.Flush()
		} else if errs++; errs == 1 || errs%1000 == 0 {
			fmt.Fprintf(os.Stderr, "commit watcher: offset fetch (%d failures): %v\n", errs, err)
		}
		select {
		case <-tick.C:
		case <-stop:
			slices.Sort(rtts)
			var med, p99 time.Duration
			if len(rtts) > 0 {
				med, p99 = rtts[len(rtts)/2], rtts[min(len(rtts)-1, len(rtts)*99/100)]
			}
			fmt.Fprintf(out, "RTT %d %d %d\n", med, p99, len(rtts))
			_ = out.Flush()
			_ = admin.Close()
			return
		}
	}
}
