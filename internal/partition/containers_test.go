package partition

import "testing"

// TestFifoStorageBounded: a queue that never empties (one pushed per one
// popped, a backlog always waiting) keeps its storage bounded by the most it
// held, instead of growing with every value passed through it.
func TestFifoStorageBounded(t *testing.T) {
	var q fifo[*int]
	const backlog = 100
	for i := 0; i < backlog; i++ {
		v := i
		q.push(&v)
	}
	next := 0
	for i := backlog; i < 1_000_000; i++ {
		v := i
		q.push(&v)
		if got := q.pop(); *got != next {
			t.Fatalf("pop %d: got %d", next, *got)
		}
		next++
		if c := cap(q.items); c > 4*backlog {
			t.Fatalf("after %d values passed through a queue of %d, storage holds %d slots", i+1, backlog, c)
		}
	}
	if q.len() != backlog {
		t.Fatalf("len %d, want %d", q.len(), backlog)
	}
	// The slots before head and after the live values hold nothing: popped
	// values can be collected.
	for i, v := range q.items[:q.head] {
		if v != nil {
			t.Fatalf("slot %d before head still holds %d", i, *v)
		}
	}
}

// TestFifoOrderWithPushFront: redeliveries pushed to the front come out
// first, and the order survives compaction.
func TestFifoOrderWithPushFront(t *testing.T) {
	var q fifo[int]
	want := []int{}
	next := 0
	for round := 0; round < 1000; round++ {
		for i := 0; i < 3; i++ {
			q.push(next)
			want = append(want, next)
			next++
		}
		got := q.pop()
		if got != want[0] {
			t.Fatalf("round %d: pop %d, want %d", round, got, want[0])
		}
		want = want[1:]
		if round%7 == 0 {
			q.pushFront(-round)
			want = append([]int{-round}, want...)
		}
	}
	for len(want) > 0 {
		if got := q.pop(); got != want[0] {
			t.Fatalf("drain: pop %d, want %d", got, want[0])
		}
		want = want[1:]
	}
	if q.len() != 0 {
		t.Fatalf("len %d after draining", q.len())
	}
}

// BenchmarkFifoSteadyBacklog is a queue with a standing backlog, one value
// in and one out per operation: it reports the storage it ends with.
func BenchmarkFifoSteadyBacklog(b *testing.B) {
	var q fifo[*int]
	v := new(int)
	for i := 0; i < 1000; i++ {
		q.push(v)
	}
	b.ReportAllocs()
	for b.Loop() {
		q.push(v)
		q.pop()
	}
	b.ReportMetric(float64(cap(q.items)), "slots")
}
