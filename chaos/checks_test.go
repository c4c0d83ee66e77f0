//go:build chaos

package chaos

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestChecksCatchViolations feeds the invariant checks a made-up history
// with one violation of each kind, so that a scenario passing them means
// something.
func TestChecksCatchViolations(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := newLedger()
	seq := uint64(0)
	ev := func(kind byte, o int64, key string, ms int) {
		seq++
		l.add(event{consumer: 1, seq: seq, kind: kind, p: 0, o: o, key: key, assign: 1, at: at(ms)})
	}
	ev('S', 0, "a", 0)
	ev('A', 0, "a", 1)
	ev('S', 1, "a", 2)
	ev('S', 2, "a", 3) // overlaps 0@1 of the same key
	ev('A', 1, "a", 4)
	ev('A', 2, "a", 5)
	ev('S', 5, "b", 6)
	ev('A', 5, "b", 7)
	ev('S', 3, "b", 8) // starts after 0@5 of the same key, same assignment
	ev('A', 3, "b", 30)
	ev('S', 4, "", 9)
	ev('S', 6, "", 9) // overlaps 0@4: key-less records run one at a time per partition
	ev('A', 4, "", 10)
	// 0@6 is never acked.
	end := map[int32]int64{0: 7}

	tail, _, err := frontier.EncodeTail(2, []frontier.Range{{From: 3, To: 5}}, frontier.DefaultMetadataBudget)
	if err != nil {
		t.Fatal(err)
	}
	views := []commitView{
		{source: "fine", at: at(20), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 3}}},
		{source: "early", at: at(4), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 2}}},                 // 0@1 acked at 4: not before
		{source: "tail", at: at(20), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 2, Metadata: tail}}}, // claims 0@3, acked at 30
		{source: "hole", at: at(40), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 7}}},                 // past 0@6, never acked
		{source: "past end", at: at(40), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 8}}},
		{source: "garbage", at: at(40), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 1, Metadata: "sa1:%%%"}}},
	}
	var v verdict
	l.checkCommits(&v, views, end)
	l.checkKeyOrder(&v)
	want := []string{"early", "tail", "hole", "past end", "garbage", "still running", "started 0@3 after offset 5", "0@6 with no key started while 0@4"}
	all := strings.Join(v.msgs, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no violation mentions %q; got:\n%s", w, all)
		}
	}
	if strings.Contains(all, "fine") {
		t.Errorf("a valid commit was reported:\n%s", all)
	}
	if v.n != len(want) {
		t.Errorf("%d violations, want %d:\n%s", v.n, len(want), all)
	}
	if miss := l.missing(end); len(miss) != 1 || miss[0] != (po{0, 6}) {
		t.Errorf("missing %v, want [0@6]", miss)
	}
	l.add(event{consumer: 2, seq: 1, kind: 'A', p: 0, o: 0, at: at(50)})
	if twice, extra := l.duplicates(); twice != 1 || extra != 1 {
		t.Errorf("duplicates %d/%d, want 1/1", twice, extra)
	}
}

// TestChecksFloor feeds the checks a made-up history of a group that
// started at offset 3 (OffsetNewest, three records of history): a record
// below the floor handled, a commit below it, and one never acked from it
// are violations; a commit at the floor before anything was acked is not.
func TestChecksFloor(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := newLedger()
	l.setFloor(map[int32]int64{0: 3})
	seq := uint64(0)
	ev := func(kind byte, o int64, ms int) {
		seq++
		l.add(event{consumer: 1, seq: seq, kind: kind, p: 0, o: o, assign: 1, at: at(ms)})
	}
	ev('S', 3, 1)
	ev('A', 3, 2)
	ev('S', 1, 3) // history
	ev('A', 1, 4)
	ev('S', 4, 5)
	ev('A', 4, 6)
	// 0@5 is never acked.
	end := map[int32]int64{0: 6}
	views := []commitView{
		{source: "start", at: at(0), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 3}}},
		{source: "fine", at: at(10), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 5}}},
		{source: "below", at: at(10), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 0}}},
		{source: "early", at: at(5), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 5}}}, // 0@4 acked at 6
		{source: "hole", at: at(10), offsets: map[int32]kafkatest.CommittedOffset{0: {Offset: 6}}},
	}
	var v verdict
	l.checkCommits(&v, views, end)
	l.checkHistory(&v)
	want := []string{"below where the group started (3)", "early", "hole", "handled record 0@1"}
	all := strings.Join(v.msgs, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no violation mentions %q; got:\n%s", w, all)
		}
	}
	for _, ok := range []string{"start", "fine"} {
		if strings.Contains(all, ok+":") {
			t.Errorf("a valid commit (%s) was reported:\n%s", ok, all)
		}
	}
	if v.n != len(want) {
		t.Errorf("%d violations, want %d:\n%s", v.n, len(want), all)
	}
	if miss := l.missing(end); len(miss) != 1 || miss[0] != (po{0, 5}) {
		t.Errorf("missing %v, want [0@5]", miss)
	}
}

// TestCommitTapDecodes checks the tap's decoding of OffsetCommit requests
// (flexible and not; v9, the consumer protocol's, with the member epoch;
// v10, which names the topic by id) and the consumer processes' commit
// lines.
func TestCommitTapDecodes(t *testing.T) {
	md := "sa1:xyz"
	id := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	tap := &commitTap{topic: "t", topicID: id}
	for _, v := range []int16{2, 7, 8, 9, 10} {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Version = v
		req.Group, req.Generation, req.MemberID = "g", 4, "m-1"
		tp := kmsg.NewOffsetCommitRequestTopic()
		if v >= 10 {
			tp.TopicID = id
		} else {
			tp.Topic = "t"
		}
		for p := range int32(2) {
			pp := kmsg.NewOffsetCommitRequestTopicPartition()
			pp.Partition, pp.Offset, pp.Metadata = p, 100+int64(p), &md
			tp.Partitions = append(tp.Partitions, pp)
		}
		req.Topics = append(req.Topics, tp)
		client := "chaos-member-1"
		b := kmsg.NewRequestFormatter(kmsg.FormatterClientID(client)).AppendRequest(nil, req, 7)
		got, ok := decodeOffsetCommit(b)
		if !ok {
			t.Fatalf("v%d: not decoded", v)
		}
		if !tap.names(got.Topics[0]) {
			t.Fatalf("v%d: the tap does not see its topic in %+v", v, got.Topics[0])
		}
		other := got.Topics[0]
		other.Topic, other.TopicID = "", [16]byte{9}
		if v < 10 {
			other.Topic = "u"
		}
		if tap.names(other) {
			t.Fatalf("v%d: the tap takes another topic (%+v) for its own", v, other)
		}
		if got.Group != "g" || len(got.Topics) != 1 || len(got.Topics[0].Partitions) != 2 ||
			got.Topics[0].Partitions[1].Offset != 101 || *got.Topics[0].Partitions[1].Metadata != md {
			t.Fatalf("v%d: decoded %+v", v, got)
		}
		if v >= 1 && (got.Generation != 4 || got.MemberID != "m-1") {
			t.Fatalf("v%d: generation %d member %q", v, got.Generation, got.MemberID)
		}
		if _, ok := decodeOffsetCommit(b[:len(b)-1]); ok {
			t.Fatalf("v%d: a truncated request decoded", v)
		}
	}
	fetch := kmsg.NewPtrFetchRequest()
	fetch.Version = 12
	if _, ok := decodeOffsetCommit(kmsg.NewRequestFormatter().AppendRequest(nil, fetch, 1)); ok {
		t.Fatal("a fetch request decoded as a commit")
	}
	c := sentCommit{at: time.Unix(0, 1234567), generation: 3, offsets: map[int32]kafkatest.CommittedOffset{
		0: {Offset: 5, Metadata: "a b:c,d"}, 3: {Offset: 9},
	}}
	back, ok := parseCommitLine(commitLine(42, c))
	if !ok || !back.at.Equal(c.at) || back.generation != 3 || len(back.offsets) != 2 ||
		back.offsets[0] != c.offsets[0] || back.offsets[3] != c.offsets[3] {
		t.Fatalf("commit line round trip: %+v, %v", back, ok)
	}
	if got := unownedOf([][]int32{{0, 2}, {}, {5}}, 6); !slices.Equal(got, []int32{1, 3, 4}) {
		t.Fatalf("unownedOf: %v", got)
	}
}

// TestGroupWatch runs the group watch over a made-up group that never
// owns partition 2: past the limit it must restart a consumer, say what
// the broker reports, count the stall, and count it as a violation on a
// real broker only; it must not act again before another limit.
func TestGroupWatch(t *testing.T) {
	sc := newScenario(t, "group-watch", scenarioOpts{partitions: 3})
	owned := func() [][]int32 { return [][]int32{{0}, {1}} }
	restarts := make(chan time.Time, 10)
	w := sc.watchGroup(time.Second, owned, func() (string, error) {
		restarts <- time.Now()
		return "made-up consumer restarted", nil
	})
	t0 := time.Now()
	var first time.Time
	select {
	case first = <-restarts:
	case <-time.After(30 * time.Second):
		w.stop()
		t.Fatal("the watch did not act on a partition unowned for 30s")
	}
	if d := first.Sub(t0); d < time.Second {
		t.Errorf("the watch acted after %v, before its limit", d)
	}
	// A change resets the clock.
	sc.changed()
	changed := time.Now()
	var second time.Time
	select {
	case second = <-restarts:
	case <-time.After(30 * time.Second):
	}
	w.stop()
	if second.IsZero() || second.Sub(changed) < time.Second {
		t.Errorf("second restart %v after the change, want one after the limit", second.Sub(changed))
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.groupStalls < 2 {
		t.Errorf("%d group stalls counted, want 2 or more", sc.groupStalls)
	}
	if want := 0; !sc.c.Embedded() {
		if len(sc.groupIssues) < 2 {
			t.Errorf("on a real broker the stalls must be violations; got %q", sc.groupIssues)
		}
	} else if len(sc.groupIssues) != want {
		t.Errorf("on the embedded broker the stalls are the broker's, not violations; got %q", sc.groupIssues)
	}
	tl := strings.Join(sc.timeline, "\n")
	if !strings.Contains(tl, "partitions [2] owned by no live consumer") || !strings.Contains(tl, "made-up consumer restarted") {
		t.Errorf("the timeline does not tell the stall:\n%s", tl)
	}
	if !strings.Contains(tl, "the broker says: group ") && !strings.Contains(tl, "the broker says: consumer group ") {
		t.Errorf("the timeline does not say what the broker reports of the group:\n%s", tl)
	}
}
