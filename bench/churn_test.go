package main

import (
	"testing"
	"time"

	"github.com/safeack/safeack"
)

// ms is a time in the synthetic runs below, in ns since the recorder's base.
func at(msec int) int64 { return int64(msec) * int64(time.Millisecond) }

// TestChurnAnalysis applies the churn definitions to a hand-made history
// of two partitions around two events: partition 0 stays with member 0 and
// stops 300 ms at the first event; partition 1 moves from member 1 to
// member 2 at the first event (its old owner's final commit 40 ms after its
// last delivery, the new owner's first delivery 500 ms after it), and is
// not delivered at all after the second event.
func TestChurnAnalysis(t *testing.T) {
	c := newChurnRecorder()
	deliver := func(p int, member int, times ...int) {
		for _, x := range times {
			c.dels[p] = append(c.dels[p], churnDelivery{at: at(x), member: member})
		}
	}
	// Steady window [0, 1000): gaps of 10 ms, one of 30 ms on partition 1.
	deliver(0, 0, 0, 10, 20, 990, 1000, 1300, 1310, 2000, 2010)
	deliver(1, 1, 0, 30, 990, 1005)
	deliver(1, 2, 1505, 1515, 1520)
	c.finalCommit(1, safeack.CommitEvent{Final: true, Start: c.base.Add(time.Duration(at(1040))),
		Partitions: []safeack.CommittedPartition{{Partition: 1}}})
	a := c.analyse(at(0), at(1000), []int64{at(1000), at(1800)}, at(2500))

	// Steady window: the longest gap is partition 0's 970 ms (20 → 990).
	if got := a.extra["basegap"]; got != 970 {
		t.Errorf("steady gap = %v ms, want 970", got)
	}
	// Event 0 [1000, 1800): partition 0 unmoved, its longest gap 300 ms
	// (1000 → 1300); partition 1 moved, stop 1005 → resume 1505.
	// Event 1 [1800, 2500): partition 0 unmoved (gap 690 ms, 1310 →
	// 2000); partition 1 not delivered since 1520: still member 2's,
	// stopped until the window's end, 2500 − 1520 = 980 ms.
	wantGaps := []time.Duration{300 * time.Millisecond, 690 * time.Millisecond, 980 * time.Millisecond}
	if len(a.gaps) != len(wantGaps) {
		t.Fatalf("unmoved gaps %v, want %v", a.gaps, wantGaps)
	}
	for _, w := range wantGaps {
		found := false
		for _, g := range a.gaps {
			found = found || g == w
		}
		if !found {
			t.Errorf("unmoved gaps %v lack %v", a.gaps, w)
		}
	}
	if len(a.resumes) != 1 || a.resumes[0] != 500*time.Millisecond {
		t.Errorf("stop→resume %v, want [500ms]", a.resumes)
	}
	if len(a.drains) != 1 || a.drains[0] != 35*time.Millisecond {
		t.Errorf("drains %v, want [35ms] (final commit at 1040, stop at 1005)", a.drains)
	}
	if len(a.excess) != 1 || a.excess[0] != 465*time.Millisecond {
		t.Errorf("resume beyond drain %v, want [465ms]", a.excess)
	}
	// Process-wide stall over the window: nothing delivered 1520 → 2000.
	if got := a.extra["stall"]; got != 480 {
		t.Errorf("stall = %v ms, want 480", got)
	}
	// Beyond the process's silence: partition 1's 980 ms (1520 → 2500)
	// less the 480 ms in which nothing at all was delivered.
	if got := a.extra["gapbeyond"]; got != 500 {
		t.Errorf("gap beyond stall = %v ms, want 500", got)
	}
}

// TestChurnSmoke runs the churn workload briefly on the consumer protocol
// against an embedded broker in this process (kfake, 250 ms heartbeats):
// a member joins and leaves once, and the run must measure gaps of
// partitions that stayed, handovers of partitions that moved, a rate and
// the backlog. The figures themselves are not asserted: speed is the
// bench's to report, not a test's to require (under -race, with the
// producer and the broker in this process, the producer may not keep up).
func TestChurnSmoke(t *testing.T) {
	saved := opt
	t.Cleanup(func() { opt = saved })
	opt = options{
		inprocBroker:   true,
		reps:           1,
		churnPeriod:    2 * time.Second,
		churnDuration:  4 * time.Second,
		churnBacklog:   500,
		churnHeartbeat: 250 * time.Millisecond,
	}
	ctx := t.Context()
	env, err := setupBroker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer env.close()
	w := churnWorkload()
	var c *caseSpec
	for _, x := range w.cases {
		if x.label == churnConsumer {
			c = x
		}
	}
	r := runChurnCase(ctx, env, w, c, 1)
	if r.err != nil {
		t.Fatal(r.err)
	}
	x := r.extra
	t.Logf("%.0f rec/s, extra %v", r.rate(), x)
	if r.n == 0 || r.rate() <= 0 {
		t.Errorf("no record acked in the window (n %d)", r.n)
	}
	if x["unmoved"] == 0 || x["moved"] == 0 {
		t.Errorf("unmoved %v, moved %v (partition, event) pairs: want both: a join and a leave move some partitions and keep the others", x["unmoved"], x["moved"])
	}
	if _, ok := x["gapmax"]; !ok {
		t.Error("no unmoved gap measured")
	}
	if _, ok := x["resmax"]; !ok {
		t.Error("no handover measured")
	}
	if _, ok := x["minlag"]; !ok {
		t.Error("no backlog sampled")
	}
}
