package frontier_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/safeack/safeack/frontier"
)

func TestAppendWindowExample(t *testing.T) {
	tr := mustNew(t, 100, 16)
	tks := mustOffer(t, tr, []int64{100, 101, 104, 105, 106}, 107)
	tk7 := mustOfferOne(t, tr, 110, 111)
	mustComplete(t, tr, tks[1])
	mustComplete(t, tr, tks[2])
	mustComplete(t, tr, tks[4])
	mustComplete(t, tr, tk7)

	got, more := tr.AppendWindow(nil, 0)
	want := []frontier.WindowRun{
		{From: 100, To: 101, Records: 1, Done: false},
		{From: 101, To: 105, Records: 2, Done: true}, // 101, 104 and the holes 102..103
		{From: 105, To: 106, Records: 1, Done: false},
		{From: 106, To: 111, Records: 2, Done: true}, // 106, 110 and the holes 107..109
	}
	if more || !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendWindow = %v, more %v; want %v", got, more, want)
	}

	got, more = tr.AppendWindow(got[:0], 3)
	want = want[:2]
	want[1].To = 105 // resume of 104, the last record looked at
	if !more || !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendWindow(3) = %v, more %v; want %v, more true", got, more, want)
	}

	mustComplete(t, tr, tks[0])
	got, _ = tr.AppendWindow(got[:0], 0)
	want = []frontier.WindowRun{
		{From: 105, To: 106, Records: 1},
		{From: 106, To: 111, Records: 2, Done: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after the head completed: %v; want %v", got, want)
	}

	mustComplete(t, tr, tks[3])
	if got, more = tr.AppendWindow(got[:0], 0); len(got) != 0 || more {
		t.Fatalf("all completed: %v, more %v; want nothing", got, more)
	}

	tr2 := mustNew(t, 0, 4)
	mustOfferOne(t, tr2, 0, 1)
	tr2.Revoke()
	if got, more = tr2.AppendWindow(nil, 0); len(got) != 0 || more {
		t.Fatalf("revoked: %v, more %v; want nothing", got, more)
	}
}

// windowModel is the naive picture of a tracker: every offered record with
// its resume position and whether it completed.
type windowModel struct {
	offsets []int64
	resumes []int64
	done    []bool
}

// runs computes the expected window: the records from the first unfinished
// one on, grouped into runs, looking at no more than limit of them.
func (m *windowModel) runs(limit int) ([]frontier.WindowRun, bool) {
	first := len(m.done)
	for i, d := range m.done {
		if !d {
			first = i
			break
		}
	}
	var out []frontier.WindowRun
	last := len(m.done)
	more := false
	if limit > 0 && last-first > limit {
		last, more = first+limit, true
	}
	for i := first; i < last; i++ {
		if n := len(out); n > 0 && out[n-1].Done == m.done[i] {
			out[n-1].Records++
			out[n-1].To = m.resumes[i]
			continue
		}
		if n := len(out); n > 0 {
			out[n-1].To = m.offsets[i]
		}
		out = append(out, frontier.WindowRun{From: m.offsets[i], To: m.resumes[i], Records: 1, Done: m.done[i]})
	}
	return out, more
}

func TestAppendWindowModel(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			start := rng.Int64N(1000)
			tr := mustNew(t, start, 64)
			var m windowModel
			var open []int // indexes into m of unfinished records
			tickets := map[int]frontier.Ticket{}
			next := start
			var buf []frontier.WindowRun
			for step := 0; step < 300; step++ {
				if rng.IntN(3) > 0 && tr.Retained() < tr.Capacity() {
					// Offer a batch of one to four records with random holes.
					k := min(1+rng.IntN(4), tr.Capacity()-tr.Retained())
					offs := make([]int64, k)
					for i := range offs {
						next += 1 + int64(rng.IntN(3)*rng.IntN(2))
						offs[i] = next - 1
					}
					after := next + int64(rng.IntN(2))
					next = after
					tks := mustOffer(t, tr, offs, after)
					for i, off := range offs {
						resume := after
						if i+1 < len(offs) {
							resume = offs[i+1]
						}
						idx := len(m.offsets)
						m.offsets = append(m.offsets, off)
						m.resumes = append(m.resumes, resume)
						m.done = append(m.done, false)
						open = append(open, idx)
						tickets[idx] = tks[i]
					}
				} else if len(open) > 0 {
					j := rng.IntN(len(open))
					idx := open[j]
					open = append(open[:j], open[j+1:]...)
					mustComplete(t, tr, tickets[idx])
					m.done[idx] = true
				}
				limit := 0
				if rng.IntN(2) == 0 {
					limit = 1 + rng.IntN(20)
				}
				want, wantMore := m.runs(limit)
				var more bool
				buf, more = tr.AppendWindow(buf[:0], limit)
				if more != wantMore || !reflect.DeepEqual(append([]frontier.WindowRun{}, buf...), append([]frontier.WindowRun{}, want...)) {
					t.Fatalf("step %d, limit %d: AppendWindow = %v (more %v); want %v (more %v)", step, limit, buf, more, want, wantMore)
				}
				checkWindowAgainstStats(t, tr, buf, more)
			}
		})
	}
}

// checkWindowAgainstStats checks the runs against the tracker's own
// counters: they start at the oldest unfinished record, alternate, and
// (when complete) count every retained and every blocked record.
func checkWindowAgainstStats(t *testing.T, tr *frontier.Tracker, runs []frontier.WindowRun, more bool) {
	t.Helper()
	st := tr.Stats()
	if len(runs) == 0 {
		if st.Retained != 0 {
			t.Fatalf("no runs but %d retained", st.Retained)
		}
		return
	}
	if runs[0].Done || runs[0].From != st.OldestUnfinished || runs[0].From < st.SafeOffset {
		t.Fatalf("first run %+v; oldest unfinished %d, safe %d", runs[0], st.OldestUnfinished, st.SafeOffset)
	}
	records, blocked := 0, 0
	for i, r := range runs {
		if r.Records <= 0 || r.To <= r.From {
			t.Fatalf("run %d is empty: %+v", i, r)
		}
		if i > 0 && (r.Done == runs[i-1].Done || r.From != runs[i-1].To) {
			t.Fatalf("runs %d and %d do not alternate and tile: %+v %+v", i-1, i, runs[i-1], r)
		}
		records += r.Records
		if r.Done {
			blocked += r.Records
		}
	}
	if !more && (records != st.Retained || blocked != st.Blocked || runs[len(runs)-1].To != st.Delivered) {
		t.Fatalf("runs count %d records, %d blocked, end %d; stats say %d, %d, %d",
			records, blocked, runs[len(runs)-1].To, st.Retained, st.Blocked, st.Delivered)
	}
}

func TestAppendWindowNoAllocs(t *testing.T) {
	tr := mustNew(t, 0, 1024)
	var tks []frontier.Ticket
	for i := int64(0); i < 1000; i++ {
		tks = append(tks, mustOfferOne(t, tr, i, i+1))
	}
	for i := 1; i < len(tks); i += 2 {
		mustComplete(t, tr, tks[i])
	}
	buf := make([]frontier.WindowRun, 0, 1000)
	allocs := testing.AllocsPerRun(100, func() {
		buf, _ = tr.AppendWindow(buf[:0], 0)
	})
	if allocs != 0 || len(buf) != 1000 {
		t.Fatalf("AppendWindow into a large enough buffer: %v allocs, %d runs; want 0 allocs, 1000 runs", allocs, len(buf))
	}
}

func ExampleTracker_AppendWindow() {
	tr, _ := frontier.New(0, 16)
	tks, _ := tr.Offer([]int64{0, 1, 2, 3, 4, 5}, 6)
	// Records 1, 2 and 4 finish; 0 (the slow head), 3 and 5 are still running.
	tr.Complete(tks[1])
	tr.Complete(tks[2])
	tr.Complete(tks[4])
	runs, _ := tr.AppendWindow(nil, 0)
	for _, r := range runs {
		state := "unfinished"
		if r.Done {
			state = "done, blocked"
		}
		fmt.Printf("[%d,%d) %d %s\n", r.From, r.To, r.Records, state)
	}
	// Output:
	// [0,1) 1 unfinished
	// [1,3) 2 done, blocked
	// [3,4) 1 unfinished
	// [4,5) 1 done, blocked
	// [5,6) 1 unfinished
}
