package frontier_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/safeack/safeack/frontier"
)

// BenchmarkOfferComplete measures the steady state of a consumer whose
// handlers keep up: each iteration offers one record (OfferOne) and completes
// it at once, so nothing stays retained. One op = one OfferOne + one Complete.
func BenchmarkOfferComplete(b *testing.B) {
	b.ReportAllocs()
	tr, err := frontier.New(0, 1024)
	if err != nil {
		b.Fatal(err)
	}
	var off int64
	for b.Loop() {
		tk, err := tr.OfferOne(off, off+1)
		if err != nil {
			b.Fatal(err)
		}
		if !tr.Complete(tk) {
			b.Fatal("complete refused")
		}
		off++
	}
	if tr.Retained() != 0 {
		b.Fatalf("retained %d", tr.Retained())
	}
}

// BenchmarkWindow measures one OfferOne plus one Complete with many entries
// retained, the case of a partition with many records in flight.
//
// Records are numbered 0, 1, 2, ... (with holes between their offsets). N
// records are offered before timing starts; iteration j offers record N+j
// and completes one record of block j/N, the records of a block (N
// consecutive records) being completed in the order of a permutation of 0..N-1:
//
//   - in-order: the identity permutation; iteration j completes record j, the
//     head, so the prefix advances by one every time and exactly N entries
//     stay retained;
//   - shuffled: a random permutation (the same for every block); most
//     completions land behind an unfinished head and stay blocked, and when a
//     block's first record completes, the prefix sweeps over everything of the
//     block completed so far. Retained stays between N and 2N.
//
// The cost reported per op is therefore the amortized cost of one offer, one
// completion and its share of the prefix sweep, with N (or N..2N) entries
// retained. Tickets are kept by the benchmark (as a caller would), in a slice
// of 2N.
func BenchmarkWindow(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		for _, order := range []string{"in-order", "shuffled"} {
			b.Run(fmt.Sprintf("retained=%d/%s", n, order), func(b *testing.B) {
				perm := make([]int, n)
				for i := range perm {
					perm[i] = i
				}
				if order == "shuffled" {
					r := rand.New(rand.NewPCG(uint64(n), 42))
					r.Shuffle(n, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
				}
				benchWindow(b, n, perm)
			})
		}
	}
}

func benchWindow(b *testing.B, n int, perm []int) {
	b.ReportAllocs()
	tr, err := frontier.New(0, 2*n+1)
	if err != nil {
		b.Fatal(err)
	}
	tickets := make([]frontier.Ticket, 2*n) // record k lives at tickets[k % 2n]
	offset := func(k int) int64 { return 3 * int64(k) }
	for k := range n {
		if tickets[k], err = tr.OfferOne(offset(k), offset(k)+1); err != nil {
			b.Fatal(err)
		}
	}
	j, slot, block, pos := 0, n, 0, 0 // slot = (n+j) % 2n
	maxRetained := 0
	step := func() {
		k := n + j
		tk, err := tr.OfferOne(offset(k), offset(k)+1)
		if err != nil {
			b.Fatal(err)
		}
		tickets[slot] = tk
		// record block*n+perm[pos] lives at slot (block*n+perm[pos]) % 2n
		if !tr.Complete(tickets[(block&1)*n+perm[pos]]) {
			b.Fatal("complete refused")
		}
		maxRetained = max(maxRetained, tr.Retained())
		j++
		if slot++; slot == 2*n {
			slot = 0
		}
		if pos++; pos == n {
			pos = 0
			block++
		}
	}
	// Warm up for two blocks, untimed, so that the ring has reached its
	// final size and the timed loop measures the steady state only.
	for range 2 * n {
		step()
	}
	for b.Loop() {
		step()
	}
	b.ReportMetric(float64(maxRetained), "max-retained")
}

// BenchmarkRetainedMemory reports the tracker's heap bytes per retained
// entry with 100,000 entries retained (all offered, none completed):
// HeapAlloc after a GC, before creating the tracker and after filling it.
// Tickets are not kept, so this is the tracker's own cost; the time per op
// is that of filling a fresh tracker with 100,000 records (GC excluded).
func BenchmarkRetainedMemory(b *testing.B) {
	b.ReportAllocs()
	const n = 100_000
	var sum float64
	runs := 0
	for b.Loop() {
		b.StopTimer()
		sum += retainedBytesPerEntry(n) // GCs are outside the timer ...
		runs++
		b.StartTimer()
		fill(b, n) // ... so time the fill on its own
	}
	b.ReportMetric(sum/float64(runs), "B/entry")
}

func fill(b *testing.B, n int) {
	tr, err := frontier.New(0, n)
	if err != nil {
		b.Fatal(err)
	}
	for i := range int64(n) {
		if _, err := tr.OfferOne(2*i, 2*i+1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOfferBatch measures Offer of a 64-record batch followed by the
// completion of all of it in reverse order (the worst order for the head).
// One op = one batch.
func BenchmarkOfferBatch(b *testing.B) {
	b.ReportAllocs()
	tr, err := frontier.New(0, 64)
	if err != nil {
		b.Fatal(err)
	}
	offs := make([]int64, 64)
	var base int64
	for b.Loop() {
		for i := range offs {
			offs[i] = base + 2*int64(i)
		}
		base += 128
		tks, err := tr.Offer(offs, base)
		if err != nil {
			b.Fatal(err)
		}
		for i := len(tks) - 1; i >= 0; i-- {
			tr.Complete(tks[i])
		}
	}
}

// BenchmarkStats measures a statistics snapshot with entries retained.
func BenchmarkStats(b *testing.B) {
	b.ReportAllocs()
	tr, err := frontier.New(0, 1024)
	if err != nil {
		b.Fatal(err)
	}
	for i := range int64(1000) {
		tk, _ := tr.OfferOne(i, i+1)
		if i%2 == 1 {
			tr.Complete(tk)
		}
	}
	var st frontier.Stats
	for b.Loop() {
		st = tr.Stats()
	}
	if st.Retained != 1000 {
		b.Fatal(st)
	}
}
