package frontier

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// --- a reference encoder, written from the format comment alone, and helpers ---

// tailRefMerge coalesces adjacent ranges, as the encoder promises to.
func tailRefMerge(rs []Range) []Range {
	var m []Range
	for _, r := range rs {
		if len(m) > 0 && m[len(m)-1].To == r.From {
			m[len(m)-1].To = r.To
			continue
		}
		m = append(m, r)
	}
	return m
}

// tailRefRaw builds the raw version-1 payload of the first k (maximal) ranges,
// straight from the format description. It returns nil for a bitmap that
// would exceed MaxTailPayload.
func tailRefRaw(base int64, m []Range, k int, bitmap bool) []byte {
	b := binary.AppendUvarint(nil, uint64(base))
	bc := uint64(0)
	if k < len(m) {
		bc = uint64(m[k].From - m[k-1].To)
	}
	b = binary.AppendUvarint(b, bc)
	if !bitmap {
		b = binary.AppendUvarint(b, uint64(k))
		prev := base
		for i, r := range m[:k] {
			gap := r.From - prev
			if i > 0 {
				gap--
			}
			b = binary.AppendUvarint(b, uint64(gap))
			b = binary.AppendUvarint(b, uint64(r.To-r.From-1))
			prev = r.To
		}
		return b
	}
	start, end := m[0].From, m[k-1].To
	nbits := end - start
	if nbits > 8*MaxTailPayload {
		return nil
	}
	b = binary.AppendUvarint(b, uint64(start-base))
	b = binary.AppendUvarint(b, uint64(nbits))
	bm := make([]byte, (nbits+7)/8)
	for _, r := range m[:k] {
		for o := r.From; o < r.To; o++ {
			bm[(o-start)/8] |= 1 << ((o - start) % 8)
		}
	}
	return append(b, bm...)
}

// tailRefMinLen is the smaller raw size of the first k ranges.
func tailRefMinLen(base int64, m []Range, k int) int {
	n := len(tailRefRaw(base, m, k, false))
	if bm := tailRefRaw(base, m, k, true); bm != nil {
		n = min(n, len(bm))
	}
	return n
}

func tailMeta(kind byte, raw []byte) string {
	return "sa1:" + string(kind) + base64.RawURLEncoding.EncodeToString(raw)
}

func tailDeflateBytes(t testing.TB, raw []byte) []byte {
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(raw)
	w.Close()
	return buf.Bytes()
}

func tailUV(xs ...uint64) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.AppendUvarint(b, x)
	}
	return b
}

// tailPayloadOf returns the kind letter and raw (inflated) payload of meta.
func tailPayloadOf(t testing.TB, meta string) (byte, []byte) {
	t.Helper()
	kind := meta[4]
	p, err := base64.RawURLEncoding.DecodeString(meta[5:])
	if err != nil {
		t.Fatalf("payload of %q: %v", meta, err)
	}
	if kind == 'R' || kind == 'B' {
		raw, err := tailInflate(p)
		if err != nil {
			t.Fatalf("inflate %q: %v", meta, err)
		}
		return kind, raw
	}
	return kind, p
}

// checkTail encodes ranges with budget and checks everything the contract
// promises: the size, the prefix, the bound, the raw optimality of the
// prefix, the payload against the reference encoder, the choice of the
// smaller encoding, the round trip and Contains/Len against a naive set.
// It returns the bound.
func checkTail(t testing.TB, base int64, rs []Range, budget int) int64 {
	t.Helper()
	meta, bound, err := EncodeTail(base, rs, budget)
	if err != nil {
		t.Fatalf("EncodeTail(%d, %d ranges, %d): %v", base, len(rs), budget, err)
	}
	if len(meta) > budget {
		t.Fatalf("meta of %d bytes over budget %d", len(meta), budget)
	}
	if ab, ab2, err := AppendTail([]byte("x"), base, rs, budget); err != nil || string(ab) != "x"+meta || ab2 != bound {
		t.Fatalf("AppendTail disagrees with EncodeTail: %q %d %v vs %q %d", ab, ab2, err, meta, bound)
	}
	m := tailRefMerge(rs)

	// The bound names the first range left out, or MaxInt64.
	k := len(m)
	if bound != math.MaxInt64 {
		k = slices.IndexFunc(m, func(r Range) bool { return r.From == bound })
		if k < 0 {
			t.Fatalf("bound %d is not the start of a range", bound)
		}
	}
	if meta == "" && k != 0 && len(m) != 0 {
		t.Fatalf("empty meta but bound %d covers %d ranges", bound, k)
	}
	if len(m) == 0 && (meta != "" || bound != math.MaxInt64) {
		t.Fatalf("empty tail encoded as %q, bound %d", meta, bound)
	}
	// Longest raw prefix: one more range does not fit raw.
	if k < len(m) && k+1 <= MaxTailRanges {
		if n := tailRefMinLen(base, m, k+1); tailEncLen(n) <= budget {
			t.Fatalf("prefix of %d ranges fits raw (%d bytes) in %d, but only %d encoded", k+1, tailEncLen(n), budget, k)
		}
	}

	tail, err := DecodeTail(meta, base)
	if err != nil {
		t.Fatalf("DecodeTail(%q): %v", meta, err)
	}
	if tail.Base != base {
		t.Fatalf("decoded base %d, want %d", tail.Base, base)
	}
	if meta == "" {
		if tail.Bound != base || len(tail.Ranges) != 0 {
			t.Fatalf("DecodeTail(\"\") = %+v", tail)
		}
	} else {
		if tail.Bound != bound {
			t.Fatalf("decoded bound %d, encoder said %d", tail.Bound, bound)
		}
		if !slices.Equal(tail.Ranges, m[:k]) {
			t.Fatalf("decoded %d ranges, want the first %d of %d", len(tail.Ranges), k, len(m))
		}
		// The payload is exactly the reference encoding: the smaller one
		// when raw, and shorter than that when deflated.
		kind, raw := tailPayloadOf(t, meta)
		runs, bm := tailRefRaw(base, m, k, false), tailRefRaw(base, m, k, true)
		want := runs
		if kind == 'b' || kind == 'B' {
			want = bm
		}
		if !bytes.Equal(raw, want) {
			t.Fatalf("payload %x differs from the reference %x (kind %c)", raw, want, kind)
		}
		minRaw := len(runs)
		if bm != nil {
			minRaw = min(minRaw, len(bm))
		}
		if (kind == 'r' || kind == 'b') && len(raw) != minRaw {
			t.Fatalf("kind %c has %d raw bytes, the other encoding %d", kind, len(raw), minRaw)
		}
		if (kind == 'R' || kind == 'B') && len(meta) >= tailEncLen(minRaw) {
			t.Fatalf("compressed to %d bytes, raw would be %d", len(meta), tailEncLen(minRaw))
		}
	}

	// Contains and Len against a naive set.
	var covered int64
	set := map[int64]bool{}
	for _, r := range m[:k] {
		covered += r.To - r.From
		if covered <= 200_000 {
			for o := r.From; o < r.To; o++ {
				set[o] = true
			}
		}
	}
	if tail.Len() != covered && meta != "" {
		t.Fatalf("Len %d, want %d", tail.Len(), covered)
	}
	if covered <= 200_000 {
		probe := []int64{base - 1, base, bound - 1, bound}
		for i, r := range m {
			if i > 200 && i < len(m)-50 {
				continue
			}
			probe = append(probe, r.From-1, r.From, r.To-1, r.To)
		}
		if len(m) > 0 {
			pr := rand.New(rand.NewPCG(uint64(len(m)), uint64(budget)))
			span := m[len(m)-1].To - base + 2
			for range 100 {
				probe = append(probe, base+pr.Int64N(span))
			}
		}
		for _, o := range probe {
			want := set[o] && o < tail.Bound
			if meta == "" {
				want = false
			}
			if got := tail.Contains(o); got != want {
				t.Fatalf("Contains(%d) = %v, want %v (bound %d)", o, got, want, tail.Bound)
			}
		}
	}
	return bound
}

type tailGenShape struct {
	maxGap, maxLen int64
	holes          bool // occasional huge gaps (compaction)
	adjacent       bool // occasional adjacent ranges
}

// tailRandom makes a random valid tail.
func tailRandom(r *rand.Rand) (int64, []Range) {
	var base int64
	switch r.IntN(4) {
	case 0:
		base = 0
	case 1:
		base = r.Int64N(1000)
	case 2:
		base = r.Int64N(1 << 40)
	case 3:
		base = math.MaxInt64 - (1 << 50) - r.Int64N(1<<20)
	}
	sizes := []int{0, 1, 2, 5, 30, 300, 3000}
	n := sizes[r.IntN(len(sizes))]
	gaps := []int64{1, 2, 4, 16, 200, 20_000}
	lens := []int64{1, 2, 8, 100, 5000}
	sh := tailGenShape{
		maxGap:   gaps[r.IntN(len(gaps))],
		maxLen:   lens[r.IntN(len(lens))],
		holes:    r.IntN(4) == 0,
		adjacent: r.IntN(4) == 0,
	}
	return base, tailGen(r, base, n, sh)
}

func tailGen(r *rand.Rand, base int64, n int, sh tailGenShape) []Range {
	rs := make([]Range, 0, n)
	pos := base + r.Int64N(sh.maxGap+1) // may start at base
	var covered int64
	for range n {
		l := 1 + r.Int64N(sh.maxLen)
		if covered+l > 50_000 {
			break
		}
		covered += l
		rs = append(rs, Range{pos, pos + l})
		gap := 1 + r.Int64N(sh.maxGap)
		if sh.adjacent && r.IntN(5) == 0 {
			gap = 0
		}
		if sh.holes && r.IntN(50) == 0 {
			gap = 1 + r.Int64N(1<<36)
		}
		pos += l + gap
	}
	return rs
}

// tailFromDone turns per-offset completion flags (offset base+i done when
// done[i]) into ranges.
func tailFromDone(base int64, done []bool) []Range {
	var rs []Range
	for i, d := range done {
		if !d {
			continue
		}
		o := base + int64(i)
		if len(rs) > 0 && rs[len(rs)-1].To == o {
			rs[len(rs)-1].To++
		} else {
			rs = append(rs, Range{o, o + 1})
		}
	}
	return rs
}

// tailShaped is a tracker's retained window of n entries at a realistic
// base: the head (base) unfinished, each later entry done with probability p.
func tailShaped(r *rand.Rand, n int, p float64) (int64, []Range) {
	const base = 1_234_567_890
	done := make([]bool, n)
	for i := 1; i < n; i++ {
		done[i] = r.Float64() < p
	}
	return base, tailFromDone(base, done)
}

func tailRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

// tailAlternating is the head unfinished, then done / not done alternating:
// n/2 ranges of length one.
func tailAlternating(n int) (int64, []Range) {
	const base = 1_234_567_890
	done := make([]bool, n)
	for i := 1; i < n; i += 2 {
		done[i] = true
	}
	return base, tailFromDone(base, done)
}

// --- tests ---

func TestTailRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	iters := 400
	if testing.Short() {
		iters = 50
	}
	budgets := []int{0, 6, 8, 10, 12, 16, 24, 40, 64, 100, 300, 1000, DefaultMetadataBudget, 1 << 16}
	for i := range iters {
		base, rs := tailRandom(r)
		picked := []int{budgets[r.IntN(len(budgets))], budgets[r.IntN(len(budgets))], r.IntN(5000), r.IntN(200)}
		slices.Sort(picked)
		prev := int64(math.MinInt64)
		for _, b := range picked {
			bound := checkTail(t, base, rs, b)
			if len(rs) > 0 && bound < prev {
				t.Fatalf("iteration %d: budget %d covers less (bound %d) than a smaller budget (bound %d)", i, b, bound, prev)
			}
			prev = bound
		}
	}
}

// TestTailCompressedTruncation exercises the path where only a compressed
// encoding fits more than the raw ones: a tail mostly done, with sparse
// single unfinished records, too long to fit whole.
func TestTailCompressedTruncation(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	base, rs := tailShaped(r, 100_000, 0.9)
	var sawTruncatedDeflate bool
	prev := int64(math.MinInt64)
	for budget := 0; budget <= 12_000; budget += 487 {
		bound := checkTail(t, base, rs, budget)
		if bound < prev {
			t.Fatalf("budget %d covers less (bound %d) than a smaller one (%d)", budget, bound, prev)
		}
		prev = bound
		meta, _, _ := EncodeTail(base, rs, budget)
		if bound != math.MaxInt64 && meta != "" && (meta[4] == 'B' || meta[4] == 'R') {
			sawTruncatedDeflate = true
		}
	}
	if !sawTruncatedDeflate {
		t.Fatal("no budget produced a truncated compressed tail: the search path went untested")
	}
	// Compression covers more than the raw encodings would at 4096.
	_, bound, _ := EncodeTail(base, rs, DefaultMetadataBudget)
	m := tailRefMerge(rs)
	k := slices.IndexFunc(m, func(r Range) bool { return r.From == bound })
	kRaw := 0
	for kRaw < len(m) && tailEncLen(tailRefMinLen(base, m, kRaw+1)) <= DefaultMetadataBudget {
		kRaw++
	}
	if k <= kRaw {
		t.Fatalf("compressed prefix %d ranges, raw alone %d", k, kRaw)
	}
	t.Logf("90%% done, 100k entries, 4096 bytes: %d of %d ranges (raw alone: %d)", k, len(m), kRaw)
}

func TestTailBudgetNeverCoversLess(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 25 {
		base, rs := tailRandom(r)
		prev := int64(math.MinInt64)
		for budget := 0; budget < 700; budget += 1 + r.IntN(9) {
			_, bound, err := EncodeTail(base, rs, budget)
			if err != nil {
				t.Fatal(err)
			}
			if bound < prev {
				t.Fatalf("budget %d: bound %d below %d of a smaller budget", budget, bound, prev)
			}
			prev = bound
		}
	}
}

func TestTailEmpty(t *testing.T) {
	for _, rs := range [][]Range{nil, {}} {
		meta, bound, err := EncodeTail(42, rs, DefaultMetadataBudget)
		if meta != "" || bound != math.MaxInt64 || err != nil {
			t.Fatalf("EncodeTail(empty) = %q, %d, %v", meta, bound, err)
		}
	}
	tail, err := DecodeTail("", 42)
	if err != nil || tail.Base != 42 || tail.Bound != 42 || tail.Ranges != nil {
		t.Fatalf("DecodeTail(\"\") = %+v, %v", tail, err)
	}
	if tail.Contains(42) || tail.Contains(43) || tail.Len() != 0 {
		t.Fatal("empty tail contains something")
	}
	if (Tail{}).Contains(0) {
		t.Fatal("zero Tail contains 0")
	}
	// A budget too small for one range: "" and the bound of the first range.
	for _, budget := range []int{0, 1, 5, 9} {
		meta, bound, err := EncodeTail(10, []Range{{12, 15}}, budget)
		if meta != "" || bound != 12 || err != nil {
			t.Fatalf("budget %d: %q, %d, %v", budget, meta, bound, err)
		}
	}
}

func TestTailSmallExamples(t *testing.T) {
	tests := []struct {
		base int64
		rs   []Range
		want string
	}{
		{100, []Range{{101, 105}, {107, 108}}, "sa1:b" + base64.RawURLEncoding.EncodeToString([]byte{100, 0, 1, 7, 0x4f})},
		{0, []Range{{1, 100_000}}, "sa1:r" + base64.RawURLEncoding.EncodeToString(tailUV(0, 0, 1, 1, 99_998))},
		{5, []Range{{5, 6}}, "sa1:r" + base64.RawURLEncoding.EncodeToString(tailUV(5, 0, 1, 0, 0))},
	}
	for _, tt := range tests {
		meta, bound, err := EncodeTail(tt.base, tt.rs, DefaultMetadataBudget)
		if err != nil || meta != tt.want || bound != math.MaxInt64 {
			t.Errorf("EncodeTail(%d, %v) = %q, %d, %v; want %q", tt.base, tt.rs, meta, bound, err, tt.want)
		}
		checkTail(t, tt.base, tt.rs, DefaultMetadataBudget)
	}
}

func TestTailAdjacentCoalesced(t *testing.T) {
	rs := []Range{{11, 13}, {13, 15}, {15, 16}, {20, 21}, {21, 30}}
	meta, _, err := EncodeTail(10, rs, DefaultMetadataBudget)
	if err != nil {
		t.Fatal(err)
	}
	tail, err := DecodeTail(meta, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Range{{11, 16}, {20, 30}}; !slices.Equal(tail.Ranges, want) {
		t.Fatalf("got %v, want %v", tail.Ranges, want)
	}
	checkTail(t, 10, rs, DefaultMetadataBudget)
	checkTail(t, 10, rs, 12)
}

func TestTailInvalidInput(t *testing.T) {
	tests := []struct {
		name   string
		base   int64
		rs     []Range
		budget int
		msg    string
	}{
		{"negative budget", 0, []Range{{1, 2}}, -1, "budget -1 is negative"},
		{"negative base", -5, []Range{{1, 2}}, 100, "base offset -5 is negative"},
		{"empty range", 0, []Range{{1, 2}, {4, 4}}, 100, "range 1 [4, 4) is empty"},
		{"inverted range", 0, []Range{{9, 3}}, 100, "range 0 [9, 3) is empty"},
		{"below base", 10, []Range{{9, 12}}, 100, "starts below base 10"},
		{"overlapping", 0, []Range{{1, 5}, {4, 8}}, 100, "overlaps or precedes"},
		{"unordered", 0, []Range{{10, 12}, {1, 2}}, 100, "overlaps or precedes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			meta, _, err := EncodeTail(tt.base, tt.rs, tt.budget)
			if !errors.Is(err, ErrInvalidTail) || meta != "" || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("EncodeTail = %q, %v; want ErrInvalidTail with %q", meta, err, tt.msg)
			}
			dst := []byte("keep")
			out, _, err := AppendTail(dst, tt.base, tt.rs, tt.budget)
			if !errors.Is(err, ErrInvalidTail) || string(out) != "keep" {
				t.Fatalf("AppendTail = %q, %v", out, err)
			}
		})
	}
}

func TestDecodeTailBaseMismatch(t *testing.T) {
	meta, _, err := EncodeTail(1000, []Range{{1001, 1010}, {1020, 1021}}, DefaultMetadataBudget)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []int64{0, 999, 1001, -1, math.MaxInt64} {
		tail, err := DecodeTail(meta, base)
		if !errors.Is(err, ErrBaseMismatch) || errors.Is(err, ErrCorruptMetadata) {
			t.Fatalf("base %d: %v", base, err)
		}
		if !strings.Contains(err.Error(), "relative to offset 1000") {
			t.Fatalf("message %q does not name the encoded base", err)
		}
		if tail.Contains(1005) || tail.Len() != 0 || tail.Base != base || tail.Bound != base {
			t.Fatalf("mismatched tail is not empty: %+v", tail)
		}
	}
	// Compressed payloads carry the base too.
	rs := make([]Range, 0, 5000)
	for o := int64(1001); len(rs) < cap(rs); o += 2 {
		rs = append(rs, Range{o, o + 1})
	}
	meta, _, _ = EncodeTail(1000, rs, DefaultMetadataBudget)
	if meta[4] != 'B' && meta[4] != 'R' {
		t.Fatalf("alternating tail not compressed: %q", meta[:5])
	}
	if _, err := DecodeTail(meta, 1002); !errors.Is(err, ErrBaseMismatch) {
		t.Fatalf("compressed, wrong base: %v", err)
	}
}

func TestDecodeTailForeign(t *testing.T) {
	for _, meta := range []string{
		"{\"consumer\":\"java\",\"ts\":1}",
		"hello",
		"sa",
		"sa1",
		"sa:r",
		"sa1r",
		"sax:r",
		"SA1:rAA",
		" sa1:rAA",
		"\x00\x01\x02",
		"sa12345678901:r",
		"ßa1:",
		strings.Repeat("z", 10_000),
	} {
		tail, err := DecodeTail(meta, 7)
		if !errors.Is(err, ErrForeignMetadata) || errors.Is(err, ErrCorruptMetadata) {
			t.Errorf("DecodeTail(%.20q) = %v, want ErrForeignMetadata", meta, err)
			continue
		}
		if tail.Len() != 0 || tail.Contains(7) || tail.Contains(8) {
			t.Errorf("foreign metadata produced a tail: %+v", tail)
		}
	}
}

func TestDecodeTailCorrupt(t *testing.T) {
	ok := tailUV(7, 0, 1, 1, 2) // base 7, complete, one range [8, 11)
	if tail, err := DecodeTail(tailMeta('r', ok), 7); err != nil || !slices.Equal(tail.Ranges, []Range{{8, 11}}) {
		t.Fatalf("control: %+v, %v", tail, err)
	}
	valid := tailMeta('r', ok)
	bomb := append(tailUV(7, 0, 1), make([]byte, 2<<20)...)
	alternating := append(tailUV(7, 0, 1, 8<<17-1), bytes.Repeat([]byte{0x55}, 1<<17)...) // 2^19 ranges
	comp := tailDeflateBytes(t, ok)
	tests := []struct {
		name, meta, msg string
	}{
		{"unknown version", "sa3:" + valid[4:], `unknown version "3"`},
		{"version 2 without epoch", "sa2:" + valid[4:], "bad leader epoch"},
		{"version 2 epoch with leading zero", "sa2:07:" + valid[4:], "bad leader epoch"},
		{"version 2 epoch over int32", "sa2:2147483648:" + valid[4:], "bad leader epoch"},
		{"version 2 missing encoding", "sa2:7:", "missing encoding"},
		{"version with leading zero", "sa01:" + valid[4:], `unknown version "01"`},
		{"missing encoding", "sa1:", "missing encoding"},
		{"unknown encoding", "sa1:x" + valid[5:], `unknown encoding 'x'`},
		{"bad base64", "sa1:r!!!!", "bad base64"},
		{"std alphabet", "sa1:r+/+/", "bad base64"},
		{"padding", valid + "=", "bad base64"},
		{"nonzero trailing bits", "sa1:rAB", "bad base64"},
		{"impossible length", "sa1:rA", "bad base64"},
		{"line break", valid[:7] + "\n" + valid[7:], "line breaks"},
		{"too long", "sa1:r" + strings.Repeat("A", tailMaxEncoded+4), "exceeds the limit"},
		{"empty payload", "sa1:r", "truncated base offset"},
		{"truncated base", tailMeta('r', []byte{0x87}), "truncated base offset"},
		{"base overflows int64", tailMeta('r', tailUV(1<<63)), "base offset 9223372036854775808 overflows int64"},
		{"varint over 64 bits", tailMeta('r', bytes.Repeat([]byte{0xff}, 11)), "overflows 64 bits"},
		{"non-minimal varint", tailMeta('r', append([]byte{0x87, 0x00}, ok[1:]...)), "not a minimal varint"},
		{"truncated bound", tailMeta('r', tailUV(7)), "truncated bound"},
		{"truncated count", tailMeta('r', tailUV(7, 0)), "truncated range count"},
		{"zero ranges", tailMeta('r', tailUV(7, 0, 0)), "no ranges"},
		{"count beyond payload", tailMeta('r', tailUV(7, 0, 3, 1, 2)), "3 ranges cannot fit in the 2 bytes left"},
		{"count beyond limit", tailMeta('r', tailUV(7, 0, MaxTailRanges+1)), "exceed the limit"},
		{"truncated gap", tailMeta('r', append(tailUV(7, 0, 2, 1, 2), 0x80, 0x80)), "truncated gap (range 1)"},
		{"truncated length", tailMeta('r', append(tailUV(7, 0, 1, 1), 0x80, 0x80)), "truncated"},
		{"offset overflow in gap", tailMeta('r', tailUV(7, 0, 1, math.MaxInt64-7, 0)), "range 0: offset overflows int64"},
		{"offset overflow in length", tailMeta('r', tailUV(7, 0, 1, 1, math.MaxInt64-8)), "range 0: offset overflows int64"},
		{"offset wraps to negative", tailMeta('r', tailUV(7, 0, 2, 0, math.MaxInt64-9, 0, 0)), "range 1: offset overflows int64"},
		{"trailing bytes", tailMeta('r', append(slices.Clone(ok), 0)), "1 trailing bytes"},
		{"bound overflows", tailMeta('r', tailUV(7, math.MaxInt64-10, 1, 1, 2)), "overflows int64"},
		{"bitmap truncated start", tailMeta('b', tailUV(7, 0)), "truncated bitmap start"},
		{"bitmap truncated length", tailMeta('b', tailUV(7, 0, 1)), "truncated bitmap length"},
		{"bitmap empty", tailMeta('b', tailUV(7, 0, 1, 0)), "empty bitmap"},
		{"bitmap truncated", tailMeta('b', append(tailUV(7, 0, 1, 20), 0xff, 0xff)), "bitmap truncated: 2 of 3 bytes"},
		{"bitmap starts with a hole", tailMeta('b', append(tailUV(7, 0, 1, 4), 0x0e)), "does not start with a completed offset"},
		{"bitmap ends with a hole", tailMeta('b', append(tailUV(7, 0, 1, 4), 0x07)), "does not end with a completed offset"},
		{"bitmap padding", tailMeta('b', append(tailUV(7, 0, 1, 4), 0x1f)), "nonzero padding bits"},
		{"bitmap trailing bytes", tailMeta('b', append(tailUV(7, 0, 1, 8), 0xff, 0)), "1 trailing bytes"},
		{"bitmap overflow", tailMeta('b', append(tailUV(7, 0, math.MaxInt64-9, 8), 0xff)), "overflows int64"},
		{"bitmap too many ranges", tailMeta('B', tailDeflateBytes(t, alternating)), "more than the limit"},
		{"decompression bomb", tailMeta('R', tailDeflateBytes(t, bomb)), "inflates past"},
		{"bad deflate stream", tailMeta('R', []byte{0xff, 0xff, 0xff, 0xff}), "bad deflate stream"},
		{"truncated deflate stream", tailMeta('R', comp[:len(comp)-2]), "bad deflate stream"},
		{"trailing bytes after deflate", tailMeta('R', append(slices.Clone(comp), 0, 0)), "2 trailing bytes after the deflate stream"},
		{"empty deflate stream", "sa1:R", "bad deflate stream"},
		{"deflated garbage", tailMeta('B', tailDeflateBytes(t, append(tailUV(7), "garbage"...))), "bitmap truncated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tail, err := DecodeTail(tt.meta, 7)
			if !errors.Is(err, ErrCorruptMetadata) {
				t.Fatalf("DecodeTail(%.40q) = %v, want ErrCorruptMetadata", tt.meta, err)
			}
			if errors.Is(err, ErrForeignMetadata) || errors.Is(err, ErrBaseMismatch) {
				t.Fatalf("%v matches another sentinel", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("message %q does not say %q", err, tt.msg)
			}
			if tail.Len() != 0 || tail.Contains(8) || tail.Bound != 7 {
				t.Fatalf("corrupt metadata produced a tail: %+v", tail)
			}
		})
	}
}

// TestTailCheck covers the classes the format cannot express (unordered,
// overlapping, empty, below base, beyond the bound): the decoder re-checks
// its result against them anyway.
func TestTailCheck(t *testing.T) {
	tests := []struct {
		rs  []Range
		msg string
	}{
		{[]Range{{5, 5}}, "is empty"},
		{[]Range{{4, 6}}, "starts below base"},
		{[]Range{{6, 9}, {8, 10}}, "overlaps"},
		{[]Range{{6, 9}, {9, 10}}, "touches"},
		{[]Range{{12, 14}, {6, 9}}, "precedes"},
		{[]Range{{6, 9}, {20, 31}}, "beyond the bound 30"},
	}
	for _, tt := range tests {
		err := tailCheck(tt.rs, 5, 30)
		if !errors.Is(err, ErrCorruptMetadata) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("tailCheck(%v) = %v, want %q", tt.rs, err, tt.msg)
		}
	}
	if err := tailCheck([]Range{{5, 6}, {7, 30}}, 5, 30); err != nil {
		t.Errorf("valid ranges rejected: %v", err)
	}
}

func TestTailLimits(t *testing.T) {
	// More ranges than MaxTailRanges: the encoder stops at the cap and
	// reports the bound even with an unlimited budget.
	rs := make([]Range, MaxTailRanges+10)
	for i := range rs {
		o := int64(3 * i)
		rs[i] = Range{o + 1, o + 2}
	}
	meta, bound, err := EncodeTail(0, rs, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	if bound != rs[MaxTailRanges].From {
		t.Fatalf("bound %d, want %d", bound, rs[MaxTailRanges].From)
	}
	tail, err := DecodeTail(meta, 0)
	if err != nil || len(tail.Ranges) != MaxTailRanges {
		t.Fatalf("decoded %d ranges, %v", len(tail.Ranges), err)
	}
	// Holes too wide for a bitmap and too many for the payload cap.
	wide := make([]Range, 200_000)
	for i := range wide {
		o := int64(i) << 40
		wide[i] = Range{o + 1, o + 2}
	}
	meta, bound, err = EncodeTail(0, wide, math.MaxInt)
	if err != nil || bound == math.MaxInt64 {
		t.Fatalf("bound %d, %v", bound, err)
	}
	if _, raw := tailPayloadOf(t, meta); len(raw) > MaxTailPayload {
		t.Fatalf("raw payload %d over the cap", len(raw))
	}
	if _, err := DecodeTail(meta, 0); err != nil {
		t.Fatal(err)
	}
	// Offsets at the very top of int64.
	top := []Range{{math.MaxInt64 - 10, math.MaxInt64 - 5}, {math.MaxInt64 - 3, math.MaxInt64}}
	checkTail(t, math.MaxInt64-20, top, DefaultMetadataBudget)
	checkTail(t, math.MaxInt64-20, top, 14)
}

func TestTailDecodeOwnBoundary(t *testing.T) {
	// A decoded truncated tail says nothing at or above Bound.
	rs := []Range{{1, 2}, {5, 6}, {9, 10}}
	for budget := range 40 {
		meta, bound, _ := EncodeTail(0, rs, budget)
		tail, err := DecodeTail(meta, 0)
		if err != nil {
			t.Fatal(err)
		}
		if meta != "" && tail.Bound != bound {
			t.Fatalf("bound %d vs %d", tail.Bound, bound)
		}
		for o := tail.Bound; o < 12 && o >= 0; o++ {
			if tail.Contains(o) {
				t.Fatalf("budget %d: Contains(%d) at or past bound %d", budget, o, tail.Bound)
			}
		}
	}
}

// TestTailLenBound: whatever the budget, EncodeTail writes no more than
// tailLenBound says for the ranges' count and span, and for the tails of a
// tracker's window the bound stays within a small factor of the encoding.
func TestTailLenBound(t *testing.T) {
	check := func(what string, base int64, rs []Range, budgets ...int) {
		t.Helper()
		m := tailRefMerge(rs)
		if len(m) == 0 {
			return
		}
		bound := tailLenBound(base, m[len(m)-1].To, len(m))
		for _, b := range budgets {
			meta, _, err := EncodeTail(base, rs, b)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if len(meta) > bound {
				t.Fatalf("%s, budget %d: %d bytes, above the bound %d (%d ranges over %d offsets)",
					what, b, len(meta), bound, len(m), m[len(m)-1].To-base)
			}
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 300 {
		base, rs := tailRandom(r)
		check(fmt.Sprintf("random tail %d", i), base, rs, 0, 8, 24, 100, r.IntN(5000), DefaultMetadataBudget, 1<<20)
	}
	for _, p := range []float64{0.01, 0.5, 0.9, 0.999} {
		for _, n := range []int{2, 10, 100, 1000, 20_000} {
			base, rs := tailShaped(r, n, p)
			check(fmt.Sprintf("window of %d, %v done", n, p), base, rs, 48, DefaultMetadataBudget, 1<<20)
		}
	}
	// The bound is close to the shorter raw encoding (deflate is what it
	// cannot foresee), and a single range costs a few bytes.
	for _, n := range []int{20, 2000, 20_000} {
		base, rs := tailShaped(r, n, 0.5)
		raw := tailEncLen(tailRefMinLen(base, rs, len(rs)))
		bound := tailLenBound(base, rs[len(rs)-1].To, len(rs))
		if bound > 2*raw+16 {
			t.Fatalf("window of %d, half done: raw encoding %d bytes, bound %d", n, raw, bound)
		}
		t.Logf("window of %d, half done: raw encoding %d bytes, bound %d", n, raw, bound)
	}
	if bound := tailLenBound(100, 150, 1); bound > 16 {
		t.Fatalf("one range: bound %d", bound)
	}
}
