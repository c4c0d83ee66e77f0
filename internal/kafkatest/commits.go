package kafkatest

import (
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ObservedCommit is one OffsetCommit request as the broker received it,
// before handling. It is what a client tried to commit, not necessarily what
// the broker accepted (a fenced generation or an injected fault can still
// reject it): checking attempts is the stricter check.
type ObservedCommit struct {
	// Seq numbers commits from 1 in the order the broker saw them.
	Seq uint64
	// At is when the broker saw the request. It carries a monotonic clock
	// reading, so comparing it with time.Now() taken in the test (e.g. when
	// a handler acked) orders the two events; compare with Before/After,
	// not ==.
	At time.Time
	// Node is the broker that received the request.
	Node       int32
	Group      string
	Generation int32
	MemberID   string
	InstanceID string // empty for dynamic members
	Version    int16  // OffsetCommit request version
	// Offsets holds, per partition, the committed next offset and metadata.
	Offsets map[TopicPartition]CommittedOffset
}

// Offset returns the commit for topic/partition, if this request has one.
func (o ObservedCommit) Offset(topic string, partition int32) (CommittedOffset, bool) {
	co, ok := o.Offsets[TopicPartition{topic, partition}]
	return co, ok
}

func (o ObservedCommit) clone() ObservedCommit {
	o.Offsets = maps.Clone(o.Offsets)
	return o
}

// CommitLog records every OffsetCommit request the embedded broker receives
// from the moment ObserveCommits returns until the test ends. Its methods are
// safe for concurrent use and return copies.
type CommitLog struct {
	mu      sync.Mutex
	commits []ObservedCommit
	changed chan struct{} // closed and replaced on every append
	// inspect, when set (InspectCommits), is called with each commit
	// inside the broker's request loop, before it is recorded.
	inspect func(ObservedCommit)
}

// commitObservers fans every OffsetCommit request out to the cluster's
// CommitLogs. It is one kfake control function, installed when the cluster
// starts and never removed, rather than one per CommitLog: kfake removes a
// control function from its list while iterating over that list, so the
// function after one that drops itself is skipped for that request. With a
// control per log, a test whose log dropped itself on the next commit made
// the next log miss that commit (seen as a parallel test waiting forever
// for an early commit the broker had stored).
type commitObservers struct {
	mu   sync.Mutex
	logs map[*CommitLog]struct{}
}

// observeCommits installs the cluster's one OffsetCommit control function.
// It handles nothing: the broker processes every request normally after it
// has been recorded.
func (c *Cluster) observeCommits() {
	kf := c.kf
	kf.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		r, ok := req.(*kmsg.OffsetCommitRequest)
		if !ok {
			return nil, nil, false
		}
		c.observers.mu.Lock()
		defer c.observers.mu.Unlock()
		if len(c.observers.logs) == 0 {
			return nil, nil, false
		}
		oc := observed(kf, r)
		for l := range c.observers.logs {
			if l.inspect != nil {
				l.inspect(oc.clone())
			}
			l.record(oc.clone())
		}
		return nil, nil, false
	})
}

// CanObserveCommits reports whether ObserveCommits works here: only on the
// embedded broker. Elsewhere, poll CommittedOffsets.
func (c *Cluster) CanObserveCommits() bool { return c.kf != nil }

// ObserveCommits starts recording every OffsetCommit request the broker
// receives, from every client, into a new CommitLog. The broker handles each
// request normally after recording. Recording stops when tb ends.
//
// It returns nil on a real cluster, where the broker cannot be observed (see
// CanObserveCommits); callers fall back to CommittedOffsets polling, or call
// RequireEmbedded first.
func (c *Cluster) ObserveCommits(tb testing.TB) *CommitLog {
	tb.Helper()
	return c.InspectCommits(tb, nil)
}

// InspectCommits is ObserveCommits calling inspect (when not nil) with each
// commit inside the broker's request loop, before the broker handles it:
// what inspect reads then (a database a consumer writes, say) is at least
// as new as anything the committing client had done before it sent the
// request. The broker waits for inspect: keep it quick. It returns nil on
// a real cluster, as ObserveCommits does.
func (c *Cluster) InspectCommits(tb testing.TB, inspect func(ObservedCommit)) *CommitLog {
	tb.Helper()
	if c.kf == nil {
		return nil
	}
	l := &CommitLog{changed: make(chan struct{}), inspect: inspect}
	// The cluster's control function (see observeCommits) runs inside
	// kfake's request loop, serially with all other request handling, and
	// only copies each request into the registered logs.
	c.observers.mu.Lock()
	c.observers.logs[l] = struct{}{}
	c.observers.mu.Unlock()
	tb.Cleanup(func() {
		c.observers.mu.Lock()
		delete(c.observers.logs, l)
		c.observers.mu.Unlock()
	})
	return l
}

// observed copies an OffsetCommit request as the broker received it. It
// runs inside kfake's control function.
func observed(kf *kfake.Cluster, r *kmsg.OffsetCommitRequest) ObservedCommit {
	at := time.Now()
	oc := ObservedCommit{
		At:         at,
		Node:       kf.CurrentNode(),
		Group:      r.Group,
		Generation: r.Generation,
		MemberID:   r.MemberID,
		Version:    r.Version,
		Offsets:    make(map[TopicPartition]CommittedOffset),
	}
	if r.InstanceID != nil {
		oc.InstanceID = *r.InstanceID
	}
	for _, t := range r.Topics {
		topic := t.Topic
		if topic == "" && t.TopicID != [16]byte{} {
			// v10+ names topics by ID. kfake serves admin calls while a
			// control function runs, so the lookup cannot deadlock.
			if ti := kf.TopicIDInfo(t.TopicID); ti != nil {
				topic = ti.Topic
			} else {
				topic = fmt.Sprintf("unknown-topic-id-%x", t.TopicID)
			}
		}
		for _, p := range t.Partitions {
			co := CommittedOffset{Offset: p.Offset}
			if p.Metadata != nil {
				co.Metadata = *p.Metadata
			}
			oc.Offsets[TopicPartition{topic, p.Partition}] = co
		}
	}
	return oc
}

func (l *CommitLog) record(oc ObservedCommit) {
	l.mu.Lock()
	oc.Seq = uint64(len(l.commits)) + 1
	l.commits = append(l.commits, oc)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// Commits returns a copy of every commit observed so far, in broker order.
func (l *CommitLog) Commits() []ObservedCommit {
	return l.filter(func(ObservedCommit) bool { return true })
}

// Len returns how many commits have been observed.
func (l *CommitLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.commits)
}

// Since returns copies of the commits with Seq > seq: pass Len() taken
// earlier to see only what came after that point.
func (l *CommitLog) Since(seq uint64) []ObservedCommit {
	return l.filter(func(o ObservedCommit) bool { return o.Seq > seq })
}

// Until returns copies of the commits the broker saw at or before t.
func (l *CommitLog) Until(t time.Time) []ObservedCommit {
	return l.filter(func(o ObservedCommit) bool { return !o.At.After(t) })
}

func (l *CommitLog) filter(keep func(ObservedCommit) bool) []ObservedCommit {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ObservedCommit
	for _, o := range l.commits {
		if keep(o) {
			out = append(out, o.clone())
		}
	}
	return out
}

// CheckUntil runs check on every commit the broker saw at or before t
// (typically time.Now() once the workload has stopped) and reports each
// non-nil error through tb.Errorf, naming the commit; after 20 reports the
// rest are only counted. It returns how many commits were checked, so a test
// can also insist that there were some.
func (l *CommitLog) CheckUntil(tb testing.TB, t time.Time, check func(ObservedCommit) error) int {
	tb.Helper()
	commits := l.Until(t)
	failed := 0
	for _, o := range commits {
		if err := check(o); err != nil {
			failed++
			if failed <= 20 {
				tb.Errorf("kafkatest: commit #%d (group %s gen %d member %s): %v", o.Seq, o.Group, o.Generation, o.MemberID, err)
			}
		}
	}
	if failed > 20 {
		tb.Errorf("kafkatest: %d more commits failed the check", failed-20)
	}
	return len(commits)
}

// Latest returns, per partition of topic, the last offset observed being
// committed for group (what the group most recently asked to commit; the
// broker's stored offset may differ if that request was rejected).
func (l *CommitLog) Latest(group, topic string) map[int32]CommittedOffset {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int32]CommittedOffset)
	for _, o := range l.commits {
		if o.Group != group {
			continue
		}
		for tp, co := range o.Offsets {
			if tp.Topic == topic {
				out[tp.Partition] = co
			}
		}
	}
	return out
}

// WaitForOffsets waits until, for every partition in want, a commit of at
// least that offset has been observed for group on topic, and fails the test
// after timeout. It wakes on each commit rather than polling.
func (l *CommitLog) WaitForOffsets(tb testing.TB, timeout time.Duration, group, topic string, want map[int32]int64) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	reached := func() (bool, <-chan struct{}) {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		// Grab the channel before reading so a commit between the read and
		// the wait still wakes us.
		latest := l.Latest(group, topic)
		for p, off := range want {
			if co, ok := latest[p]; !ok || co.Offset < off {
				return false, ch
			}
		}
		return true, ch
	}
	for {
		ok, ch := reached()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			latest := l.Latest(group, topic)
			got := make(map[int32]int64, len(latest))
			for p, co := range latest {
				got[p] = co.Offset
			}
			tb.Fatalf("kafkatest: timed out after %v waiting for group %s to commit %v on %s; last observed %v",
				timeout, group, want, topic, got)
			return
		}
	}
}
