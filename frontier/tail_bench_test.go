//go:build !race

// Benchmarks and allocation checks of the tail codec. They are left out of
// race builds: sync.Pool drops items at random there, and timings under the
// race detector mean nothing.

package frontier

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

type tailBenchCase struct {
	name string
	base int64
	rs   []Range
}

// tailBenchCases are the retained windows of a tracker whose head is
// unfinished: n entries at consecutive offsets.
func tailBenchCases() []tailBenchCase {
	r := rand.New(rand.NewPCG(42, 42))
	var cs []tailBenchCase
	for _, n := range []int{10_000, 100_000} {
		add := func(shape string, mk func() (int64, []Range)) {
			base, rs := mk()
			cs = append(cs, tailBenchCase{fmt.Sprintf("%s/%d", shape, n), base, rs})
		}
		add("oneGap", func() (int64, []Range) { return tailShaped(r, n, 1) })
		add("random50", func() (int64, []Range) { return tailShaped(r, n, 0.5) })
		add("alternating", func() (int64, []Range) { return tailAlternating(n) })
		add("random90", func() (int64, []Range) { return tailShaped(r, n, 0.9) })
	}
	return cs
}

// reportTail reports the string size, the fraction of completed offsets it
// covers, whether it was truncated, and the ranges it holds.
func reportTail(b *testing.B, c tailBenchCase, meta string, bound int64) {
	var all, covered, ranges int64
	for _, r := range c.rs {
		all += r.To - r.From
		if r.From < bound {
			covered += r.To - r.From
			ranges++
		}
	}
	truncated := 0.0
	if bound != math.MaxInt64 {
		truncated = 1
	}
	b.ReportMetric(float64(len(meta)), "bytes")
	b.ReportMetric(float64(covered)/float64(all), "covered")
	b.ReportMetric(truncated, "truncated")
	b.ReportMetric(float64(ranges), "ranges")
}

func BenchmarkEncodeTail(b *testing.B) {
	for _, c := range tailBenchCases() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var meta string
			var bound int64
			for b.Loop() {
				meta, bound, _ = EncodeTail(c.base, c.rs, DefaultMetadataBudget)
			}
			reportTail(b, c, meta, bound)
		})
	}
}

func BenchmarkAppendTail(b *testing.B) {
	for _, c := range tailBenchCases() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, DefaultMetadataBudget)
			var bound int64
			for b.Loop() {
				buf, bound, _ = AppendTail(buf[:0], c.base, c.rs, DefaultMetadataBudget)
			}
			reportTail(b, c, string(buf), bound)
		})
	}
}

func BenchmarkDecodeTail(b *testing.B) {
	for _, c := range tailBenchCases() {
		meta, bound, _ := EncodeTail(c.base, c.rs, DefaultMetadataBudget)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeTail(meta, c.base); err != nil {
					b.Fatal(err)
				}
			}
			reportTail(b, c, meta, bound)
		})
	}
}

func TestTailAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("allocation counts differ under coverage")
	}
	for _, c := range tailBenchCases() {
		buf := make([]byte, 0, DefaultMetadataBudget)
		// Collect now, so that no collection empties the pool in the loop,
		// then warm the pool.
		runtime.GC()
		buf, _, _ = AppendTail(buf, c.base, c.rs, DefaultMetadataBudget)
		allocs := testing.AllocsPerRun(50, func() {
			buf, _, _ = AppendTail(buf[:0], c.base, c.rs, DefaultMetadataBudget)
		})
		if allocs > 0.5 {
			t.Errorf("%s: AppendTail allocates %.1f times per call", c.name, allocs)
		}
	}
}

// TestTailCapacityAtDefaultBudget measures how many completed offsets fit in
// Kafka's default 4096 bytes for tails too long to fit whole, and logs the
// table (go test -run TailCapacity -v). The worst dense pattern bounds what a
// partition without offset holes can always carry.
func TestTailCapacityAtDefaultBudget(t *testing.T) {
	const n = 1 << 20 // retained entries: enough to overflow the budget
	r := rand.New(rand.NewPCG(9, 9))
	type row struct {
		name  string
		base  int64
		rs    []Range
		dense bool
	}
	rows := []row{}
	add := func(name string, dense bool, base int64, rs []Range) {
		rows = append(rows, row{name, base, rs, dense})
	}
	b, rs := tailAlternating(n)
	add("alternating", true, b, rs)
	for _, p := range []float64{0.99, 0.9, 0.75, 0.5, 0.25, 0.1, 1.0 / 16, 1.0 / 32, 1.0 / 64} {
		b, rs := tailShaped(r, n, p)
		add(fmt.Sprintf("random p=%.3g", p), true, b, rs)
	}
	// Single completed offsets with uniform random gaps.
	singles := func(lo, hi int64, count int) []Range {
		const base = 1_234_567_890
		rs := make([]Range, 0, count)
		o := int64(base)
		for range count {
			o += lo + r.Int64N(hi-lo+1)
			rs = append(rs, Range{o, o + 1})
		}
		return rs
	}
	for _, g := range [][2]int64{{1, 30}, {2, 126}, {8, 24}, {12, 20}, {128, 16383}, {16384, 1<<21 - 1}} {
		add(fmt.Sprintf("singles gap %d..%d", g[0], g[1]), g[1] < 1<<14, 1_234_567_890, singles(g[0], g[1], 100_000))
	}
	add("singles gap ~2^49 (holes)", false, 1_234_567_890, singles(1<<49, 1<<50, 2000))

	var sb strings.Builder
	fmt.Fprintf(&sb, "%-28s %9s %9s %8s %6s %s\n", "pattern (4096 bytes)", "offsets", "ranges", "of all", "bytes", "kind")
	worst, worstName := int64(math.MaxInt64), ""
	for _, rw := range rows {
		meta, bound, err := EncodeTail(rw.base, rw.rs, DefaultMetadataBudget)
		if err != nil {
			t.Fatal(err)
		}
		tail, err := DecodeTail(meta, rw.base)
		if err != nil {
			t.Fatal(err)
		}
		var all int64
		for _, r := range rw.rs {
			all += r.To - r.From
		}
		fmt.Fprintf(&sb, "%-28s %9d %9d %7.1f%% %6d %c\n", rw.name, tail.Len(), len(tail.Ranges), 100*float64(tail.Len())/float64(all), len(meta), meta[4])
		if bound != math.MaxInt64 && rw.dense && tail.Len() < worst {
			worst, worstName = tail.Len(), rw.name
		}
	}
	fmt.Fprintf(&sb, "worst dense pattern: %s, %d completed offsets", worstName, worst)
	t.Log("\n" + sb.String())
	if worst < 1000 {
		t.Errorf("only %d completed offsets fit for %s", worst, worstName)
	}
}
