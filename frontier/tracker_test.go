package frontier_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sync"
	"testing"

	"github.com/safeack/safeack/frontier"
)

// ---- helpers ---------------------------------------------------------------

func mustNew(t testing.TB, start int64, capacity int) *frontier.Tracker {
	t.Helper()
	tr, err := frontier.New(start, capacity)
	if err != nil {
		t.Fatalf("New(%d, %d): %v", start, capacity, err)
	}
	return tr
}

func mustOffer(t testing.TB, tr *frontier.Tracker, offsets []int64, next int64) []frontier.Ticket {
	t.Helper()
	tks, err := tr.Offer(offsets, next)
	if err != nil {
		t.Fatalf("Offer(%v, %d): %v", offsets, next, err)
	}
	if len(tks) != len(offsets) {
		t.Fatalf("Offer(%v, %d) returned %d tickets", offsets, next, len(tks))
	}
	for i, tk := range tks {
		if !tk.Valid() || tk.Offset() != offsets[i] {
			t.Fatalf("Offer(%v, %d): ticket %d = {valid %v, offset %d}", offsets, next, i, tk.Valid(), tk.Offset())
		}
	}
	return tks
}

func mustOfferOne(t testing.TB, tr *frontier.Tracker, offset, next int64) frontier.Ticket {
	t.Helper()
	tk, err := tr.OfferOne(offset, next)
	if err != nil {
		t.Fatalf("OfferOne(%d, %d): %v", offset, next, err)
	}
	if !tk.Valid() || tk.Offset() != offset {
		t.Fatalf("OfferOne(%d, %d): ticket {valid %v, offset %d}", offset, next, tk.Valid(), tk.Offset())
	}
	return tk
}

func mustComplete(t testing.TB, tr *frontier.Tracker, tk frontier.Ticket) {
	t.Helper()
	if !tr.Complete(tk) {
		t.Fatalf("Complete(ticket %d) = false, want true", tk.Offset())
	}
}

func safeOf(t testing.TB, tr *frontier.Tracker) int64 {
	t.Helper()
	s, err := tr.SafeOffset()
	if err != nil {
		t.Fatalf("SafeOffset: %v", err)
	}
	return s
}

func wantSafe(t testing.TB, tr *frontier.Tracker, want int64) {
	t.Helper()
	if got := safeOf(t, tr); got != want {
		t.Fatalf("SafeOffset = %d, want %d", got, want)
	}
}

// snapshot is everything observable about a Tracker without changing it.
type snapshot struct {
	Stats   frontier.Stats
	Safe    int64
	SafeErr error
	Ranges  []frontier.Range
}

func snap(tr *frontier.Tracker) snapshot {
	s, err := tr.SafeOffset()
	return snapshot{Stats: tr.Stats(), Safe: s, SafeErr: err, Ranges: tr.AppendCompleted(nil)}
}

func wantUnchanged(t testing.TB, tr *frontier.Tracker, before snapshot, what string) {
	t.Helper()
	if after := snap(tr); !reflect.DeepEqual(before, after) {
		t.Fatalf("%s changed the tracker:\nbefore %+v\nafter  %+v", what, before, after)
	}
}

// forEachPermutation calls f with every permutation of 0..n-1 (Heap's
// algorithm). f must not keep p.
func forEachPermutation(n int, f func(p []int)) {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	c := make([]int, n)
	f(p)
	for i := 0; i < n; {
		if c[i] < i {
			if i%2 == 0 {
				p[0], p[i] = p[i], p[0]
			} else {
				p[c[i]], p[i] = p[i], p[c[i]]
			}
			f(p)
			c[i]++
			i = 0
		} else {
			c[i] = 0
			i++
		}
	}
}

func factorial(n int) int {
	f := 1
	for i := 2; i <= n; i++ {
		f *= i
	}
	return f
}

// batch is one Offer call of a scenario.
type batch struct {
	offsets []int64
	next    int64
}

// record is one delivered record of a scenario with the resume position the
// contract gives it: the next offered offset of its batch, or the batch's
// next for the batch's last record. Computed here, not by the tracker.
type record struct {
	offset, resume int64
}

func recordsOf(batches []batch) []record {
	var recs []record
	for _, b := range batches {
		for i, off := range b.offsets {
			resume := b.next
			if i+1 < len(b.offsets) {
				resume = b.offsets[i+1]
			}
			recs = append(recs, record{off, resume})
		}
	}
	return recs
}

// expectation derives, from the set of completed records alone, what the
// tracker must report: the completed prefix is the longest run of completed
// records from the first delivered one.
type expectation struct {
	safe     int64
	retained int
	blocked  int
	oldest   int64
	hasOld   bool
	ranges   []frontier.Range
}

func expect(start int64, recs []record, done []bool) expectation {
	return expectInto(nil, start, recs, done)
}

// expectInto is expect reusing rangeBuf for the ranges.
func expectInto(rangeBuf []frontier.Range, start int64, recs []record, done []bool) expectation {
	e := expectation{safe: start, ranges: rangeBuf[:0]}
	u := 0
	for u < len(recs) && done[u] {
		e.safe = recs[u].resume
		u++
	}
	if u == len(recs) {
		return e
	}
	e.retained = len(recs) - u
	e.oldest, e.hasOld = recs[u].offset, true
	open := false
	for i := u; i < len(recs); i++ {
		if !done[i] {
			open = false
			continue
		}
		e.blocked++
		if !open {
			e.ranges = append(e.ranges, frontier.Range{From: recs[i].offset})
			open = true
		}
		e.ranges[len(e.ranges)-1].To = recs[i].resume
	}
	return e
}

// checkExpectation compares tr with e; ctx describes the situation and is
// only called on failure. It is called in hot loops, so it does not call
// t.Helper (which is costly under -race).
func checkExpectation(t testing.TB, tr *frontier.Tracker, e expectation, buf []frontier.Range, ctx func() string) []frontier.Range {
	if got, err := tr.SafeOffset(); err != nil || got != e.safe {
		t.Fatalf("%s: SafeOffset = %d, %v; want %d", ctx(), got, err, e.safe)
	}
	st := tr.Stats()
	if st.SafeOffset != e.safe || st.Retained != e.retained || st.Blocked != e.blocked ||
		st.HasUnfinished != e.hasOld || (e.hasOld && st.OldestUnfinished != e.oldest) {
		t.Fatalf("%s: Stats = %+v, want safe %d retained %d blocked %d oldest %d (has %v)",
			ctx(), st, e.safe, e.retained, e.blocked, e.oldest, e.hasOld)
	}
	if tr.Retained() != e.retained {
		t.Fatalf("%s: Retained() = %d, want %d", ctx(), tr.Retained(), e.retained)
	}
	buf = tr.AppendCompleted(buf[:0])
	if len(buf) != len(e.ranges) {
		t.Fatalf("%s: AppendCompleted = %v, want %v", ctx(), buf, e.ranges)
	}
	for i := range buf {
		if buf[i] != e.ranges[i] {
			t.Fatalf("%s: AppendCompleted = %v, want %v", ctx(), buf, e.ranges)
		}
	}
	return buf
}

// ---- New -------------------------------------------------------------------

func TestNewRejectsBadArguments(t *testing.T) {
	for _, tc := range []struct {
		start    int64
		capacity int
	}{
		{-1, 10}, {math.MinInt64, 10}, {0, 0}, {0, -1}, {5, math.MinInt}, {-3, 0},
	} {
		if tr, err := frontier.New(tc.start, tc.capacity); err == nil || tr != nil {
			t.Errorf("New(%d, %d) = %v, %v; want nil tracker and an error", tc.start, tc.capacity, tr, err)
		}
	}
	for _, tc := range []struct {
		start    int64
		capacity int
	}{
		{0, 1}, {100, 3}, {math.MaxInt64 - 1, 1 << 20},
	} {
		tr := mustNew(t, tc.start, tc.capacity)
		want := frontier.Stats{Start: tc.start, SafeOffset: tc.start, Delivered: tc.start, Capacity: tc.capacity}
		if got := tr.Stats(); got != want {
			t.Errorf("New(%d, %d).Stats() = %+v, want %+v", tc.start, tc.capacity, got, want)
		}
		wantSafe(t, tr, tc.start)
		if tr.Capacity() != tc.capacity || tr.Delivered() != tc.start || tr.Retained() != 0 || tr.Revoked() {
			t.Errorf("New(%d, %d): accessors disagree: capacity %d delivered %d retained %d revoked %v",
				tc.start, tc.capacity, tr.Capacity(), tr.Delivered(), tr.Retained(), tr.Revoked())
		}
		if got := tr.AppendCompleted(nil); got != nil {
			t.Errorf("fresh AppendCompleted = %v, want nil", got)
		}
	}
}

// ---- every completion order --------------------------------------------------

// TestArticleEveryCompletionOrder is the article's exhaustive test: five
// records with holes between their offsets and a next beyond the last one,
// completed in each of the 120 orders, the safe offset checked after every
// completion against an expectation computed from the completed set alone.
func TestArticleEveryCompletionOrder(t *testing.T) {
	offsets := []int64{100, 104, 105, 109, 115}
	const next = 120
	// start 100 is the article's; start 97 shows that "nothing complete"
	// means the start, not the first offered offset.
	for _, start := range []int64{100, 97} {
		runs, assertions := 0, 0
		forEachPermutation(len(offsets), func(order []int) {
			runs++
			tr := mustNew(t, start, len(offsets))
			tks := mustOffer(t, tr, offsets, next)
			wantSafe(t, tr, start)
			done := make([]bool, len(offsets))
			for step, i := range order {
				mustComplete(t, tr, tks[i])
				done[i] = true
				// Independent expectation: walk delivery order up to the
				// first unfinished record; the safe offset is the resume
				// position of the record before it (the next offered offset,
				// or next for the last record), or start if it is the first.
				want := start
				for j := range offsets {
					if !done[j] {
						break
					}
					if j+1 < len(offsets) {
						want = offsets[j+1]
					} else {
						want = next
					}
				}
				if got := safeOf(t, tr); got != want {
					t.Fatalf("start %d order %v after step %d (offset %d): SafeOffset = %d, want %d",
						start, order, step, offsets[i], got, want)
				}
				assertions++
			}
			if st := tr.Stats(); st.Retained != 0 || st.Blocked != 0 || st.HasUnfinished || st.SafeOffset != next {
				t.Fatalf("order %v: final stats %+v", order, st)
			}
		})
		if runs != 120 || assertions != 600 {
			t.Fatalf("ran %d orders with %d assertions, want 120 and 600", runs, assertions)
		}
	}
}

// TestEveryCompletionOrderUpToEight completes every permutation of 1..8
// records, in two layouts (one batch; a batch followed by single-record
// batches, offered alternately with Offer and OfferOne), with holes before the
// first offset, between offsets, and between batches. After every completion it checks the safe offset, the statistics
// and the completed tail against an expectation computed from the completed
// set alone.
func TestEveryCompletionOrderUpToEight(t *testing.T) {
	maxN := 8
	if testing.Short() {
		maxN = 7
	}
	const start = 997
	for n := 1; n <= maxN; n++ {
		offsets := make([]int64, n)
		for i := range offsets {
			offsets[i] = 1000 + 4*int64(i) + int64(i%2) // holes of 3 or 4
		}
		layouts := map[string][]batch{
			"one batch": {{offsets, offsets[n-1] + 7}},
		}
		if n > 1 {
			// The first half in one batch whose next is the following
			// offset, then one record per batch, each next leaving a hole
			// before the following batch.
			h := n / 2
			mixed := []batch{{offsets[:h], offsets[h]}}
			for i := h; i < n; i++ {
				mixed = append(mixed, batch{offsets[i : i+1], offsets[i] + 2})
			}
			layouts["batch then singles"] = mixed
		}
		for name, layout := range layouts {
			t.Run(fmt.Sprintf("n=%d/%s", n, name), func(t *testing.T) {
				recs := recordsOf(layout)
				done := make([]bool, n)
				var buf, rangeBuf []frontier.Range
				var order []int
				var step int
				var tks []frontier.Ticket
				ctx := func() string {
					if step < 0 {
						return fmt.Sprintf("order %v before any completion", order)
					}
					return fmt.Sprintf("order %v step %d (offset %d)", order, step, recs[order[step]].offset)
				}
				runs := 0
				forEachPermutation(n, func(perm []int) {
					order = perm
					runs++
					// No t.Helper-calling helpers in this loop: they dominate
					// its cost under -race.
					tr, err := frontier.New(start, n)
					if err != nil {
						t.Fatal(err)
					}
					tks = tks[:0]
					for _, b := range layout {
						if len(b.offsets) == 1 && len(tks)%2 == 1 {
							tk, err := tr.OfferOne(b.offsets[0], b.next)
							if err != nil || tk.Offset() != b.offsets[0] {
								t.Fatalf("OfferOne(%d, %d) = %v, %v", b.offsets[0], b.next, tk, err)
							}
							tks = append(tks, tk)
						} else {
							got, err := tr.Offer(b.offsets, b.next)
							if err != nil || len(got) != len(b.offsets) {
								t.Fatalf("Offer(%v, %d) = %v, %v", b.offsets, b.next, got, err)
							}
							tks = append(tks, got...)
						}
					}
					clear(done)
					step = -1
					e := expectInto(rangeBuf, start, recs, done)
					buf = checkExpectation(t, tr, e, buf, ctx)
					for step = range order {
						i := order[step]
						if !tr.Complete(tks[i]) {
							t.Fatalf("%s: Complete = false", ctx())
						}
						done[i] = true
						e = expectInto(e.ranges, start, recs, done)
						buf = checkExpectation(t, tr, e, buf, ctx)
					}
					rangeBuf = e.ranges
					if tr.Complete(tks[order[0]]) {
						t.Fatalf("order %v: a second completion of the first completed ticket was accepted", order)
					}
				})
				if runs != factorial(n) {
					t.Fatalf("ran %d orders, want %d", runs, factorial(n))
				}
			})
		}
	}
}

// ---- capacity --------------------------------------------------------------

func TestCapacityRejectionLeavesNoPartialBatch(t *testing.T) {
	tr := mustNew(t, 0, 5)
	a := mustOffer(t, tr, []int64{0, 1, 2}, 3)

	before := snap(tr)
	tks, err := tr.Offer([]int64{5, 6, 7}, 8)
	if !errors.Is(err, frontier.ErrCapacity) || errors.Is(err, frontier.ErrInvalidOffer) || tks != nil {
		t.Fatalf("Offer over capacity = %v, %v; want nil, ErrCapacity", tks, err)
	}
	wantUnchanged(t, tr, before, "a rejected batch")

	// The rejected batch did not move the delivered position: offsets 3 and 4
	// (below the rejected batch's 5 and its next 8) are still acceptable.
	b := mustOffer(t, tr, []int64{3, 4}, 5)
	if got := tr.Stats(); got.Retained != 5 || got.Delivered != 5 || got.Offered != 5 {
		t.Fatalf("after filling: %+v", got)
	}

	// Full: even one more record is refused, by both forms of offer.
	before = snap(tr)
	if tk, err := tr.OfferOne(5, 6); !errors.Is(err, frontier.ErrCapacity) || tk != (frontier.Ticket{}) {
		t.Fatalf("OfferOne at capacity = %v, %v; want zero ticket, ErrCapacity", tk, err)
	}
	if _, err := tr.Offer([]int64{5}, 6); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("Offer at capacity: %v, want ErrCapacity", err)
	}
	wantUnchanged(t, tr, before, "an offer at capacity")

	// Completed entries behind an unfinished head still count.
	mustComplete(t, tr, a[1])
	mustComplete(t, tr, b[1])
	if _, err := tr.OfferOne(5, 6); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("OfferOne with completed-but-blocked entries: %v, want ErrCapacity", err)
	}
	// Completing the head releases it and the completed entry behind it.
	mustComplete(t, tr, a[0])
	if got := tr.Retained(); got != 3 {
		t.Fatalf("Retained = %d after the head completed, want 3", got)
	}
	// Exactly filling the capacity is allowed; one more is not.
	if _, err := tr.Offer([]int64{5, 6, 7}, 8); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("Offer of 3 with 2 free: %v, want ErrCapacity", err)
	}
	c := mustOffer(t, tr, []int64{5, 7}, 8)
	if tr.Retained() != 5 {
		t.Fatalf("Retained = %d, want 5", tr.Retained())
	}
	for _, tk := range []frontier.Ticket{a[2], b[0], c[0], c[1]} {
		mustComplete(t, tr, tk)
	}
	wantSafe(t, tr, 8)
	if st := tr.Stats(); st.Retained != 0 || st.Blocked != 0 || st.Offered != 7 || st.Completed != 7 {
		t.Fatalf("final stats %+v", st)
	}
}

// TestCapacityRejectionReplayed drives two trackers with the same valid
// offers; one also gets rejected batches interleaved. They must stay
// indistinguishable.
func TestCapacityRejectionReplayed(t *testing.T) {
	plain, noisy := mustNew(t, 10, 4), mustNew(t, 10, 4)
	p1 := mustOffer(t, plain, []int64{10, 12}, 13)
	n1 := mustOffer(t, noisy, []int64{10, 12}, 13)
	if _, err := noisy.Offer([]int64{13, 14, 15}, 20); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("want ErrCapacity, got %v", err)
	}
	p2 := mustOffer(t, plain, []int64{13, 14}, 16)
	n2 := mustOffer(t, noisy, []int64{13, 14}, 16)
	if _, err := noisy.Offer([]int64{16}, 17); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("want ErrCapacity, got %v", err)
	}
	order := []struct{ p, n frontier.Ticket }{{p2[1], n2[1]}, {p1[0], n1[0]}, {p2[0], n2[0]}, {p1[1], n1[1]}}
	for _, o := range order {
		if plain.Complete(o.p) != noisy.Complete(o.n) {
			t.Fatal("completion results differ")
		}
		if a, b := snap(plain), snap(noisy); !reflect.DeepEqual(a, b) {
			t.Fatalf("trackers diverged:\nplain %+v\nnoisy %+v", a, b)
		}
	}
	wantSafe(t, noisy, 16)
}

// ---- blocked behind a slow head -------------------------------------------

func TestCompletedEntriesBlockedBehindSlowHead(t *testing.T) {
	tr := mustNew(t, 0, 100)
	offsets := []int64{0, 2, 4, 6, 8, 10, 12, 14, 16, 18}
	tks := mustOffer(t, tr, offsets, 25)
	for i := 1; i < len(tks); i++ {
		if i == 5 {
			continue
		}
		mustComplete(t, tr, tks[i])
	}
	st := tr.Stats()
	if st.Retained != 10 || st.Blocked != 8 || !st.HasUnfinished || st.OldestUnfinished != 0 || st.SafeOffset != 0 || st.Completed != 8 {
		t.Fatalf("slow head: %+v", st)
	}
	// Holes inside a run are covered: [2,10) spans 2,4,6,8 and the holes
	// between them, up to the resume position of 8 (the next offer, 10).
	wantRanges := []frontier.Range{{From: 2, To: 10}, {From: 12, To: 25}}
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, wantRanges) {
		t.Fatalf("AppendCompleted = %v, want %v", got, wantRanges)
	}

	mustComplete(t, tr, tks[0])
	st = tr.Stats()
	if st.SafeOffset != 10 || st.Retained != 5 || st.Blocked != 4 || st.OldestUnfinished != 10 || !st.HasUnfinished {
		t.Fatalf("after head: %+v", st)
	}
	wantRanges = []frontier.Range{{From: 12, To: 25}}
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, wantRanges) {
		t.Fatalf("AppendCompleted = %v, want %v", got, wantRanges)
	}

	mustComplete(t, tr, tks[5])
	st = tr.Stats()
	if st.SafeOffset != 25 || st.Retained != 0 || st.Blocked != 0 || st.HasUnfinished || st.Completed != 10 {
		t.Fatalf("all done: %+v", st)
	}
	if got := tr.AppendCompleted(nil); got != nil {
		t.Fatalf("AppendCompleted = %v, want nil", got)
	}
}

// TestSlowHeadLargeBacklog lets one record hold up many completions through
// several ring growths, then releases them in one step.
func TestSlowHeadLargeBacklog(t *testing.T) {
	const n = 5000
	tr := mustNew(t, 0, n)
	head := mustOfferOne(t, tr, 0, 1)
	var last frontier.Ticket
	for i := int64(1); i < n; i++ {
		last = mustOfferOne(t, tr, 3*i, 3*i+1)
		mustComplete(t, tr, last)
	}
	if st := tr.Stats(); st.Retained != n || st.Blocked != n-1 || st.OldestUnfinished != 0 || st.SafeOffset != 0 {
		t.Fatalf("backlog: %+v", st)
	}
	if _, err := tr.OfferOne(3*n, 3*n+1); !errors.Is(err, frontier.ErrCapacity) {
		t.Fatalf("OfferOne into a full backlog: %v, want ErrCapacity", err)
	}
	// One run of completed entries is one range, holes between the batches
	// included: it ends at the resume position of the last one.
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, []frontier.Range{{From: 3, To: 3*(n-1) + 1}}) {
		t.Fatalf("AppendCompleted = %v", got)
	}
	mustComplete(t, tr, head)
	wantSafe(t, tr, 3*(n-1)+1)
	if tr.Retained() != 0 || tr.Complete(last) {
		t.Fatal("backlog not released, or a released ticket completed twice")
	}
}

// ---- several batches --------------------------------------------------------

func TestBatchesShareOneFrontier(t *testing.T) {
	t.Run("a batch's last entry resumes at its next, not the following batch's first offset", func(t *testing.T) {
		tr := mustNew(t, 100, 10)
		b1 := mustOffer(t, tr, []int64{100, 104, 105}, 106)
		b2 := mustOffer(t, tr, []int64{110, 111}, 115)
		b3 := mustOfferOne(t, tr, 120, 121)
		if tr.Delivered() != 121 {
			t.Fatalf("Delivered = %d, want 121", tr.Delivered())
		}
		mustComplete(t, tr, b1[2])
		mustComplete(t, tr, b1[0])
		wantSafe(t, tr, 104)
		mustComplete(t, tr, b1[1])
		wantSafe(t, tr, 106) // not 110
		if st := tr.Stats(); st.OldestUnfinished != 110 || st.Retained != 3 {
			t.Fatalf("stats %+v", st)
		}
		mustComplete(t, tr, b2[0])
		wantSafe(t, tr, 111)
		mustComplete(t, tr, b2[1])
		wantSafe(t, tr, 115) // not 120
		mustComplete(t, tr, b3)
		wantSafe(t, tr, 121)
	})
	t.Run("a later batch completed first waits for the earlier one", func(t *testing.T) {
		tr := mustNew(t, 100, 10)
		b1 := mustOffer(t, tr, []int64{100, 104, 105}, 106)
		b2 := mustOffer(t, tr, []int64{110, 111}, 115)
		mustComplete(t, tr, b2[0])
		mustComplete(t, tr, b2[1])
		wantSafe(t, tr, 100)
		if st := tr.Stats(); st.Blocked != 2 || st.Retained != 5 {
			t.Fatalf("stats %+v", st)
		}
		mustComplete(t, tr, b1[0])
		mustComplete(t, tr, b1[2])
		wantSafe(t, tr, 104)
		// 105 (the end of the first batch) and 110, 111 are one run of
		// completed entries, so one range: the hole 106..109 between the
		// batches is covered, exactly as the safe offset will pass it when
		// 104 completes.
		want := []frontier.Range{{From: 105, To: 115}}
		if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, want) {
			t.Fatalf("AppendCompleted = %v, want %v", got, want)
		}
		mustComplete(t, tr, b1[1])
		wantSafe(t, tr, 115)
	})
	t.Run("a batch may start exactly at the delivered position", func(t *testing.T) {
		tr := mustNew(t, 0, 10)
		a := mustOffer(t, tr, []int64{0, 1}, 2)
		b := mustOffer(t, tr, []int64{2}, 3)
		mustComplete(t, tr, a[0])
		mustComplete(t, tr, b[0])
		mustComplete(t, tr, a[1])
		wantSafe(t, tr, 3)
	})
}

// ---- duplicates, foreign, revoked, zero tickets ------------------------------

func TestDuplicateCompletions(t *testing.T) {
	tr := mustNew(t, 0, 10)
	tks := mustOffer(t, tr, []int64{0, 1, 2, 3}, 4)

	mustComplete(t, tr, tks[2]) // blocked
	before := snap(tr)
	if tr.Complete(tks[2]) {
		t.Fatal("duplicate completion of a blocked entry accepted")
	}
	wantUnchanged(t, tr, before, "a duplicate completion of a blocked entry")

	mustComplete(t, tr, tks[0]) // released at once
	before = snap(tr)
	if tr.Complete(tks[0]) {
		t.Fatal("duplicate completion of a released entry accepted")
	}
	wantUnchanged(t, tr, before, "a duplicate completion of a released entry")

	mustComplete(t, tr, tks[1]) // releases 1 and 2
	before = snap(tr)
	for _, tk := range tks[:3] {
		if tr.Complete(tk) {
			t.Fatalf("duplicate completion of %d accepted", tk.Offset())
		}
	}
	wantUnchanged(t, tr, before, "duplicate completions")
	if st := tr.Stats(); st.Completed != 3 || st.SafeOffset != 3 || st.Retained != 1 {
		t.Fatalf("stats %+v", st)
	}
	mustComplete(t, tr, tks[3])
	if tr.Complete(tks[3]) {
		t.Fatal("duplicate completion of the last entry accepted")
	}
	// A later ticket at a new position must not be confused with old ones.
	tk := mustOfferOne(t, tr, 4, 5)
	for _, old := range tks {
		if tr.Complete(old) {
			t.Fatalf("old ticket %d accepted after a new offer", old.Offset())
		}
	}
	mustComplete(t, tr, tk)
	wantSafe(t, tr, 5)
}

func TestZeroTicket(t *testing.T) {
	var zero frontier.Ticket
	if zero.Valid() || zero.Offset() != 0 {
		t.Fatalf("zero ticket: valid %v offset %d", zero.Valid(), zero.Offset())
	}
	tr := mustNew(t, 0, 4)
	if tr.Complete(zero) {
		t.Fatal("zero ticket accepted by an empty tracker")
	}
	// The first entry of a tracker at offset 0 looks most like the zero value.
	tks := mustOffer(t, tr, []int64{0, 1}, 2)
	before := snap(tr)
	if tr.Complete(zero) {
		t.Fatal("zero ticket accepted by a tracker with an entry at offset 0")
	}
	wantUnchanged(t, tr, before, "the zero ticket")
	mustComplete(t, tr, tks[0])
	mustComplete(t, tr, tks[1])
	tr.Revoke()
	if tr.Complete(zero) {
		t.Fatal("zero ticket accepted by a revoked tracker")
	}
}

func TestTicketOfAnotherTracker(t *testing.T) {
	// Same start, same offsets, same sequence positions: only the issuing
	// tracker may accept a ticket.
	a, b := mustNew(t, 100, 8), mustNew(t, 100, 8)
	ta := mustOffer(t, a, []int64{100, 104, 105}, 106)
	tb := mustOffer(t, b, []int64{100, 104, 105}, 106)
	beforeB := snap(b)
	for _, tk := range ta {
		if b.Complete(tk) {
			t.Fatalf("tracker b accepted a's ticket %d", tk.Offset())
		}
	}
	wantUnchanged(t, b, beforeB, "foreign tickets")
	beforeA := snap(a)
	for _, tk := range tb {
		if a.Complete(tk) {
			t.Fatalf("tracker a accepted b's ticket %d", tk.Offset())
		}
	}
	wantUnchanged(t, a, beforeA, "foreign tickets")
	// Progress on one does not move the other.
	for _, tk := range ta {
		mustComplete(t, a, tk)
	}
	wantSafe(t, a, 106)
	wantUnchanged(t, b, beforeB, "completions on another tracker")
	for _, tk := range tb {
		mustComplete(t, b, tk)
	}
	wantSafe(t, b, 106)
}

func TestRevoke(t *testing.T) {
	tr := mustNew(t, 100, 8)
	tks := mustOffer(t, tr, []int64{100, 104, 105}, 106)
	mustComplete(t, tr, tks[0])
	mustComplete(t, tr, tks[2])
	tr.Revoke()
	if !tr.Revoked() {
		t.Fatal("Revoked() = false after Revoke")
	}
	if _, err := tr.SafeOffset(); !errors.Is(err, frontier.ErrRevoked) {
		t.Fatalf("SafeOffset after Revoke: %v, want ErrRevoked", err)
	}
	st := tr.Stats()
	if !st.Revoked || st.Retained != 0 || st.Blocked != 0 || st.HasUnfinished || st.Completed != 2 || st.Offered != 3 {
		t.Fatalf("stats after Revoke: %+v", st)
	}
	if tr.Retained() != 0 || tr.AppendCompleted(nil) != nil {
		t.Fatal("revoked tracker still retains entries")
	}
	before := snap(tr)
	for _, tk := range tks {
		if tr.Complete(tk) {
			t.Fatalf("revoked tracker accepted its ticket %d", tk.Offset())
		}
	}
	if tks, err := tr.Offer([]int64{106}, 107); !errors.Is(err, frontier.ErrRevoked) || tks != nil {
		t.Fatalf("Offer after Revoke = %v, %v; want nil, ErrRevoked", tks, err)
	}
	if tk, err := tr.OfferOne(106, 107); !errors.Is(err, frontier.ErrRevoked) || tk.Valid() {
		t.Fatalf("OfferOne after Revoke = %v, %v; want zero ticket, ErrRevoked", tk, err)
	}
	// An invalid offer to a revoked tracker still changes nothing.
	if _, err := tr.Offer(nil, 0); err == nil {
		t.Fatal("empty offer to a revoked tracker succeeded")
	}
	tr.Revoke() // harmless twice
	wantUnchanged(t, tr, before, "operations on a revoked tracker")
}

// TestReplacedTrackerRejectsOldTickets is the article's last line: a new
// tracker for the same partition and offsets never accepts an old ticket,
// whether the old tracker was revoked or simply abandoned.
func TestReplacedTrackerRejectsOldTickets(t *testing.T) {
	for _, revoke := range []bool{true, false} {
		old := mustNew(t, 100, 3)
		oldTks := mustOffer(t, old, []int64{100, 104, 105}, 106)
		mustComplete(t, old, oldTks[2])
		if revoke {
			old.Revoke()
		}
		repl := mustNew(t, 100, 3)
		if repl.Complete(oldTks[0]) {
			t.Fatalf("revoke=%v: replacement accepted an old ticket before any offer", revoke)
		}
		newTks := mustOffer(t, repl, []int64{100, 104, 105}, 106)
		before := snap(repl)
		for _, tk := range oldTks {
			if repl.Complete(tk) {
				t.Fatalf("revoke=%v: replacement accepted old ticket %d", revoke, tk.Offset())
			}
		}
		wantUnchanged(t, repl, before, "old tickets")
		for _, tk := range newTks {
			mustComplete(t, repl, tk)
		}
		wantSafe(t, repl, 106)
		for _, tk := range newTks {
			if old.Complete(tk) {
				t.Fatalf("revoke=%v: the old tracker accepted the replacement's ticket", revoke)
			}
		}
	}
}

// ---- invalid input ------------------------------------------------------------

func TestInvalidOffers(t *testing.T) {
	// The tracker starts at 50 and has already delivered up to 60 with one
	// entry done and one blocked, so that "unchanged" is a non-trivial state.
	setup := func(t *testing.T) *frontier.Tracker {
		tr := mustNew(t, 50, 6)
		tks := mustOffer(t, tr, []int64{50, 53, 57}, 60)
		mustComplete(t, tr, tks[0])
		mustComplete(t, tr, tks[2])
		return tr
	}
	for _, tc := range []struct {
		name    string
		offsets []int64
		next    int64
		want    error
	}{
		{"nil batch", nil, 70, frontier.ErrInvalidOffer},
		{"empty batch", []int64{}, 70, frontier.ErrInvalidOffer},
		{"negative offset", []int64{-1}, 70, frontier.ErrInvalidOffer},
		{"most negative offset", []int64{math.MinInt64, 61}, 70, frontier.ErrInvalidOffer},
		{"negative later offset", []int64{61, -5}, 70, frontier.ErrInvalidOffer},
		{"repeated offset", []int64{61, 62, 62}, 70, frontier.ErrInvalidOffer},
		{"decreasing offsets", []int64{61, 64, 63}, 70, frontier.ErrInvalidOffer},
		{"below delivered", []int64{59}, 70, frontier.ErrInvalidOffer},
		{"below delivered, then fine", []int64{59, 60, 61}, 70, frontier.ErrInvalidOffer},
		{"overlapping an entry", []int64{57}, 70, frontier.ErrInvalidOffer},
		{"next equals last", []int64{60, 65}, 65, frontier.ErrInvalidOffer},
		{"next below last", []int64{60, 65}, 62, frontier.ErrInvalidOffer},
		{"next equals single", []int64{61}, 61, frontier.ErrInvalidOffer},
		{"next negative", []int64{61}, -1, frontier.ErrInvalidOffer},
		{"over capacity", []int64{60, 61, 62, 63, 64}, 70, frontier.ErrCapacity},
		{"far over capacity", []int64{60, 61, 62, 63, 64, 65, 66, 67}, 70, frontier.ErrCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := setup(t)
			before := snap(tr)
			tks, err := tr.Offer(tc.offsets, tc.next)
			if !errors.Is(err, tc.want) || tks != nil {
				t.Fatalf("Offer(%v, %d) = %v, %v; want nil, %v", tc.offsets, tc.next, tks, err, tc.want)
			}
			other := frontier.ErrCapacity
			if tc.want == frontier.ErrCapacity {
				other = frontier.ErrInvalidOffer
			}
			if errors.Is(err, other) || errors.Is(err, frontier.ErrRevoked) {
				t.Fatalf("Offer(%v, %d): %v matches the wrong sentinel", tc.offsets, tc.next, err)
			}
			wantUnchanged(t, tr, before, "a rejected offer")
			if len(tc.offsets) == 1 {
				tk, err := tr.OfferOne(tc.offsets[0], tc.next)
				if !errors.Is(err, tc.want) || tk != (frontier.Ticket{}) {
					t.Fatalf("OfferOne(%d, %d) = %v, %v; want zero ticket, %v", tc.offsets[0], tc.next, tk, err, tc.want)
				}
				wantUnchanged(t, tr, before, "a rejected OfferOne")
			}
			// Still fully usable: a valid offer at the delivered position.
			mustOffer(t, tr, []int64{60, 61}, 62)
		})
	}
}

// TestOfferDoesNotKeepTheSlice checks that the tracker copies what it needs:
// changing the caller's slice afterwards changes nothing.
func TestOfferDoesNotKeepTheSlice(t *testing.T) {
	tr := mustNew(t, 0, 8)
	offs := []int64{0, 5, 9}
	tks := mustOffer(t, tr, offs, 10)
	offs[0], offs[1], offs[2] = 100, 200, 300
	mustComplete(t, tr, tks[0])
	wantSafe(t, tr, 5)
	if st := tr.Stats(); st.OldestUnfinished != 5 {
		t.Fatalf("stats %+v", st)
	}
}

func TestExtremeOffsets(t *testing.T) {
	tr := mustNew(t, math.MaxInt64-10, 4)
	tks := mustOffer(t, tr, []int64{math.MaxInt64 - 3, math.MaxInt64 - 1}, math.MaxInt64)
	mustComplete(t, tr, tks[1])
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, []frontier.Range{{From: math.MaxInt64 - 1, To: math.MaxInt64}}) {
		t.Fatalf("AppendCompleted = %v", got)
	}
	if st := tr.Stats(); st.OldestUnfinished != math.MaxInt64-3 || st.Blocked != 1 {
		t.Fatalf("stats %+v", st)
	}
	mustComplete(t, tr, tks[0])
	wantSafe(t, tr, math.MaxInt64)
	if _, err := tr.OfferOne(math.MaxInt64, math.MaxInt64); !errors.Is(err, frontier.ErrInvalidOffer) {
		t.Fatalf("offer past MaxInt64: %v", err)
	}
	tr0 := mustNew(t, 0, 2)
	tk := mustOfferOne(t, tr0, 0, math.MaxInt64)
	mustComplete(t, tr0, tk)
	wantSafe(t, tr0, math.MaxInt64)
}

// ---- OfferOne agrees with Offer --------------------------------------------------

func TestOfferOneAgreesWithOffer(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	viaOffer, viaOne := mustNew(t, 20, 8), mustNew(t, 20, 8)
	var tOffer, tOne []frontier.Ticket
	for op := range 20000 {
		if r.IntN(3) == 0 || len(tOffer) == 0 {
			d := viaOffer.Delivered()
			off := d + int64(r.IntN(4)) - 1 // sometimes below delivered
			if r.IntN(20) == 0 {
				off = -1 - int64(r.IntN(3))
			}
			next := off + int64(r.IntN(4)) // sometimes not after off
			tks, err1 := viaOffer.Offer([]int64{off}, next)
			tk, err2 := viaOne.OfferOne(off, next)
			if (err1 == nil) != (err2 == nil) ||
				errors.Is(err1, frontier.ErrInvalidOffer) != errors.Is(err2, frontier.ErrInvalidOffer) ||
				errors.Is(err1, frontier.ErrCapacity) != errors.Is(err2, frontier.ErrCapacity) {
				t.Fatalf("op %d: Offer([%d], %d) -> %v but OfferOne -> %v", op, off, next, err1, err2)
			}
			if err1 == nil {
				if tks[0].Offset() != tk.Offset() {
					t.Fatalf("op %d: ticket offsets %d vs %d", op, tks[0].Offset(), tk.Offset())
				}
				tOffer, tOne = append(tOffer, tks[0]), append(tOne, tk)
			} else if tk.Valid() {
				t.Fatalf("op %d: failed OfferOne returned a valid ticket", op)
			}
		} else {
			// Mostly recent tickets (live ones), sometimes any (duplicates).
			i := r.IntN(len(tOffer))
			if r.IntN(4) != 0 {
				i = max(0, len(tOffer)-1-r.IntN(16))
			}
			if a, b := viaOffer.Complete(tOffer[i]), viaOne.Complete(tOne[i]); a != b {
				t.Fatalf("op %d: Complete results differ: %v vs %v", op, a, b)
			}
		}
		if a, b := snap(viaOffer), snap(viaOne); !reflect.DeepEqual(a, b) {
			t.Fatalf("op %d: trackers diverged:\nOffer    %+v\nOfferOne %+v", op, a, b)
		}
	}
}

// ---- AppendCompleted -----------------------------------------------------------

func TestAppendCompleted(t *testing.T) {
	tr := mustNew(t, 0, 32)
	// Offsets with holes; two batches with a hole between them.
	b1 := mustOffer(t, tr, []int64{0, 3, 4, 8, 9, 15}, 20) // resumes 3 4 8 9 15 20
	b2 := mustOffer(t, tr, []int64{22, 23, 30}, 31)        // resumes 23 30 31

	if got := tr.AppendCompleted(nil); got != nil {
		t.Fatalf("nothing completed: %v", got)
	}
	// Completing only the head never produces a range: it is released.
	mustComplete(t, tr, b1[0])
	if got := tr.AppendCompleted(nil); got != nil {
		t.Fatalf("only the head completed: %v", got)
	}

	mustComplete(t, tr, b1[2]) // 4 -> [4,8)
	mustComplete(t, tr, b1[3]) // 8 -> extends to [4,9)
	mustComplete(t, tr, b1[5]) // 15 -> [15,20)
	mustComplete(t, tr, b2[0]) // 22 -> same run as 15 (the next entry): [15,23), the hole between the batches covered
	mustComplete(t, tr, b2[2]) // 30 -> [30,31)
	want := []frontier.Range{{From: 4, To: 9}, {From: 15, To: 23}, {From: 30, To: 31}}
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendCompleted = %v, want %v", got, want)
	}
	// The ranges start after the oldest unfinished offset and never cover it
	// or any other unfinished record.
	st := tr.Stats()
	unfinished := []int64{3, 9, 23}
	for _, rg := range tr.AppendCompleted(nil) {
		if rg.From <= st.OldestUnfinished || rg.From >= rg.To {
			t.Fatalf("range %v does not start after the oldest unfinished %d", rg, st.OldestUnfinished)
		}
		for _, u := range unfinished {
			if u >= rg.From && u < rg.To {
				t.Fatalf("range %v covers unfinished offset %d", rg, u)
			}
		}
	}
	// It appends, keeping what dst held.
	dst := []frontier.Range{{From: -7, To: -6}}
	got := tr.AppendCompleted(dst)
	if !reflect.DeepEqual(got, append([]frontier.Range{{From: -7, To: -6}}, want...)) {
		t.Fatalf("AppendCompleted(dst) = %v", got)
	}
	// With enough room it does not allocate.
	buf := make([]frontier.Range, 0, 8)
	if n := testing.AllocsPerRun(100, func() { buf = tr.AppendCompleted(buf[:0]) }); n != 0 {
		t.Fatalf("AppendCompleted into a large enough buffer allocates %v times", n)
	}

	// Filling the hole at 9 joins [4,9) and [15,23) through 9's resume (15).
	mustComplete(t, tr, b1[4])
	want = []frontier.Range{{From: 4, To: 23}, {From: 30, To: 31}}
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendCompleted = %v, want %v", got, want)
	}
	// Completing the head releases everything up to 23.
	mustComplete(t, tr, b1[1])
	wantSafe(t, tr, 23)
	want = []frontier.Range{{From: 30, To: 31}}
	if got := tr.AppendCompleted(nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendCompleted = %v, want %v", got, want)
	}
	if st := tr.Stats(); st.OldestUnfinished != 23 || st.Blocked != 1 || st.Retained != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// ---- cheapness -------------------------------------------------------------

func TestSteadyStateDoesNotAllocate(t *testing.T) {
	tr := mustNew(t, 0, 64)
	// Warm up the ring, then keep a window of retained entries.
	var window [16]frontier.Ticket
	var off int64
	for i := range window {
		window[i] = mustOfferOne(t, tr, off, off+1)
		off++
	}
	i := 0
	var st frontier.Stats
	allocs := testing.AllocsPerRun(10000, func() {
		tk, err := tr.OfferOne(off, off+2)
		if err != nil {
			panic(err)
		}
		off += 2
		if !tr.Complete(window[i]) {
			panic("complete failed")
		}
		window[i] = tk
		i = (i + 1) % len(window)
		st = tr.Stats()
		_, _ = tr.SafeOffset()
	})
	if allocs != 0 {
		t.Fatalf("OfferOne+Complete+Stats allocates %v times per run", allocs)
	}
	if st.Retained != len(window) {
		t.Fatalf("retained %d, want %d", st.Retained, len(window))
	}
}

// TestMemoryPerRetainedEntry checks the tracker's own heap cost of a retained
// entry (tickets live with the caller and are not counted).
func TestMemoryPerRetainedEntry(t *testing.T) {
	const n = 100_000
	perEntry := retainedBytesPerEntry(n)
	t.Logf("%.1f heap bytes per retained entry with %d retained", perEntry, n)
	if perEntry > 32 {
		t.Fatalf("%.1f heap bytes per retained entry, want at most 32", perEntry)
	}
}

func retainedBytesPerEntry(n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr, err := frontier.New(0, n)
	if err != nil {
		panic(err)
	}
	for i := range int64(n) {
		if _, err := tr.OfferOne(2*i, 2*i+1); err != nil {
			panic(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if tr.Retained() != n {
		panic("not all entries retained")
	}
	runtime.KeepAlive(tr)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// ---- the single-owner contract under -race ------------------------------------

// TestDistinctTrackersConcurrently drives one tracker per goroutine with no
// locks at all; the goroutines also pass tickets to each other, and each
// rejects the others' tickets. Under -race this checks that distinct trackers
// share no state.
func TestDistinctTrackersConcurrently(t *testing.T) {
	const workers = 16
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	foreign := make(chan frontier.Ticket, 4*workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for w := range workers {
		wg.Go(func() {
			errs <- driveAlone(rand.New(rand.NewPCG(seed, uint64(w))), rounds, foreign)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func driveAlone(r *rand.Rand, rounds int, foreign chan frontier.Ticket) error {
	start := int64(r.IntN(1000))
	tr, err := frontier.New(start, 64)
	if err != nil {
		return err
	}
	var recs []record
	var done []bool
	var tks []frontier.Ticket
	for range rounds {
		// Offer a batch with holes.
		n := 1 + r.IntN(8)
		if tr.Retained()+n > tr.Capacity() {
			n = tr.Capacity() - tr.Retained()
		}
		if n > 0 {
			offs := make([]int64, n)
			o := tr.Delivered() + int64(r.IntN(3))
			for i := range offs {
				offs[i] = o
				o += 1 + int64(r.IntN(3))
			}
			got, err := tr.Offer(offs, o)
			if err != nil {
				return fmt.Errorf("Offer(%v, %d): %w", offs, o, err)
			}
			recs = append(recs, recordsOf([]batch{{offs, o}})...)
			done = append(done, make([]bool, n)...)
			tks = append(tks, got...)
			select { // share a ticket with another goroutine
			case foreign <- got[0]:
			default:
			}
		}
		// Complete a few in random order, and try a foreign ticket.
		for range 1 + r.IntN(8) {
			i := r.IntN(len(tks))
			if tr.Complete(tks[i]) == done[i] {
				return fmt.Errorf("Complete(%d) disagrees with done=%v", recs[i].offset, done[i])
			}
			done[i] = true
		}
		select {
		case tk := <-foreign:
			if tr.Complete(tk) {
				// It may be our own ticket coming back; only that is allowed.
				own := false
				for i := range tks {
					if tks[i] == tk {
						own, done[i] = true, true
					}
				}
				if !own {
					return fmt.Errorf("accepted a foreign ticket %d", tk.Offset())
				}
			}
		default:
		}
		want := expect(start, recs, done)
		if s, err := tr.SafeOffset(); err != nil || s != want.safe {
			return fmt.Errorf("SafeOffset = %d, %v; want %d", s, err, want.safe)
		}
		if st := tr.Stats(); st.Retained != want.retained || st.Blocked != want.blocked {
			return fmt.Errorf("Stats %+v, want retained %d blocked %d", st, want.retained, want.blocked)
		}
	}
	return nil
}

// TestOneTrackerSerializedByMutex follows the documented pattern: one owner
// offers under a mutex, worker goroutines complete under the same mutex.
// Under the lock the test checks that the safe offset never moves backwards
// and never passes a record that was not completed.
func TestOneTrackerSerializedByMutex(t *testing.T) {
	const (
		workers  = 8
		capacity = 32
	)
	records := 20000
	if testing.Short() {
		records = 2000
	}
	var (
		mu       sync.Mutex
		freed    = sync.NewCond(&mu)
		tr       = mustNew(t, 0, capacity)
		offered  []int64            // offsets in delivery order (guarded by mu)
		done     = map[int64]bool{} // guarded by mu
		checked  int                // offered[:checked] are below the safe offset
		lastSafe int64
		failure  error
	)
	work := make(chan frontier.Ticket, capacity)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for tk := range work {
				if r.IntN(4) == 0 {
					runtime.Gosched() // vary the completion order
				}
				mu.Lock()
				if !tr.Complete(tk) && failure == nil {
					failure = fmt.Errorf("first completion of %d refused", tk.Offset())
				}
				done[tk.Offset()] = true
				if r.IntN(8) == 0 && tr.Complete(tk) && failure == nil {
					failure = fmt.Errorf("duplicate completion of %d accepted", tk.Offset())
				}
				safe, err := tr.SafeOffset()
				if (err != nil || safe < lastSafe) && failure == nil {
					failure = fmt.Errorf("safe offset went from %d to %d (%v)", lastSafe, safe, err)
				}
				lastSafe = safe
				for checked < len(offered) && offered[checked] < safe {
					if !done[offered[checked]] && failure == nil {
						failure = fmt.Errorf("safe offset %d passed unfinished %d", safe, offered[checked])
					}
					checked++
				}
				freed.Broadcast()
				mu.Unlock()
			}
		})
	}

	r := rand.New(rand.NewPCG(1, 2))
	var off int64
	for sent := 0; sent < records; {
		n := min(1+r.IntN(6), records-sent)
		offs := make([]int64, n)
		for i := range offs {
			offs[i] = off
			off += 1 + int64(r.IntN(2))
		}
		mu.Lock()
		var tks []frontier.Ticket
		for {
			var err error
			tks, err = tr.Offer(offs, off)
			if err == nil {
				break
			}
			if !errors.Is(err, frontier.ErrCapacity) {
				mu.Unlock()
				t.Fatalf("Offer: %v", err)
			}
			freed.Wait() // at capacity: pause delivery until something is released
		}
		offered = append(offered, offs...)
		mu.Unlock()
		for _, tk := range tks {
			work <- tk
		}
		sent += n
	}
	close(work)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if failure != nil {
		t.Fatal(failure)
	}
	wantSafe(t, tr, off)
	if st := tr.Stats(); st.Retained != 0 || st.Offered != uint64(records) || st.Completed != uint64(records) {
		t.Fatalf("final stats %+v", st)
	}
}
