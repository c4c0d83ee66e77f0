package frontier

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// peekTailBase reads the base offset a version-1 tail claims, so that the
// fuzzer can decode mutated payloads against their own base and reach past
// the base check.
func peekTailBase(meta string) (int64, bool) {
	if len(meta) < 5 || meta[:4] != "sa1:" {
		return 0, false
	}
	p, err := base64.RawURLEncoding.DecodeString(meta[5:])
	if err != nil {
		return 0, false
	}
	if meta[4] == 'R' || meta[4] == 'B' {
		if p, err = tailInflate(p); err != nil {
			return 0, false
		}
	}
	b, n := binary.Uvarint(p)
	if n <= 0 || b > math.MaxInt64 {
		return 0, false
	}
	return int64(b), true
}

// checkTailDecoded decodes meta and checks the decoder's contract: one sentinel
// per error and an empty Tail with it; otherwise ranges that are sorted,
// maximal, non-empty, within [base, Bound), and that re-encode to the same
// tail, no longer than meta when meta is a complete raw tail.
func checkTailDecoded(t *testing.T, meta string, base int64) {
	tail, err := DecodeTail(meta, base)
	if err != nil {
		n := 0
		for _, s := range []error{ErrForeignMetadata, ErrBaseMismatch, ErrCorruptMetadata} {
			if errors.Is(err, s) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("DecodeTail(%q, %d): error %v matches %d sentinels", meta, base, err, n)
		}
		if tail.Base != base || tail.Bound != base || len(tail.Ranges) != 0 {
			t.Fatalf("DecodeTail(%q, %d): error %v with a non-empty tail %+v", meta, base, err, tail)
		}
		return
	}
	if tail.Base != base {
		t.Fatalf("Base %d, want %d", tail.Base, base)
	}
	if meta == "" {
		if tail.Bound != base || len(tail.Ranges) != 0 {
			t.Fatalf("DecodeTail(\"\") = %+v", tail)
		}
		return
	}
	if len(tail.Ranges) == 0 || len(tail.Ranges) > MaxTailRanges {
		t.Fatalf("DecodeTail(%q) accepted %d ranges", meta, len(tail.Ranges))
	}
	prev := int64(math.MinInt64)
	for i, r := range tail.Ranges {
		if r.From >= r.To || r.From < base || r.To > tail.Bound || (i > 0 && r.From <= prev) {
			t.Fatalf("DecodeTail(%q): bad range %d %v (base %d, bound %d, previous To %d)", meta, i, r, base, tail.Bound, prev)
		}
		prev = r.To
	}
	if !tail.Contains(tail.Ranges[0].From) || tail.Contains(tail.Ranges[0].From-1) {
		t.Fatalf("Contains disagrees with the ranges of %q", meta)
	}
	m2, b2, err := EncodeTail(base, tail.Ranges, math.MaxInt)
	if err != nil {
		t.Fatalf("re-encoding the ranges of %q: %v", meta, err)
	}
	if b2 != math.MaxInt64 {
		t.Fatalf("re-encoding the ranges of %q truncated at %d", meta, b2)
	}
	t2, err := DecodeTail(m2, base)
	if err != nil || len(t2.Ranges) != len(tail.Ranges) {
		t.Fatalf("re-encoded %q: %d ranges, %v", m2, len(t2.Ranges), err)
	}
	for i := range t2.Ranges {
		if t2.Ranges[i] != tail.Ranges[i] {
			t.Fatalf("re-encoded %q: range %d is %v, want %v", m2, i, t2.Ranges[i], tail.Ranges[i])
		}
	}
	if tail.Bound == math.MaxInt64 && (meta[4] == 'r' || meta[4] == 'b') && len(m2) > len(meta) {
		t.Fatalf("the encoder wrote %d bytes for what %q says in %d", len(m2), meta, len(meta))
	}
}

func FuzzDecodeTail(f *testing.F) {
	enc := func(base int64, rs []Range, budget int) {
		meta, _, err := EncodeTail(base, rs, budget)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(meta, base)
	}
	enc(100, []Range{{101, 105}, {107, 108}}, DefaultMetadataBudget)
	enc(0, []Range{{1, 100_000}}, DefaultMetadataBudget)
	enc(7, []Range{{7, 8}, {1 << 40, 1<<40 + 3}}, DefaultMetadataBudget)
	enc(0, []Range{{1, 2}, {3, 4}, {5, 6}, {9, 10}}, 12)
	base, alt := tailAlternating(2000)
	enc(base, alt, DefaultMetadataBudget)
	base, r90 := tailShaped(tailRand(1), 3000, 0.9)
	enc(base, r90, 300)
	enc(base, r90, DefaultMetadataBudget)
	for _, s := range []string{"", "{}", "sa1:", "sa1:r", "sa2:rAA", "sa1:RAAAA", "sa1:bZAABB08", "sa1:rAAEBAg"} {
		f.Add(s, int64(0))
		f.Add(s, int64(100))
	}
	f.Fuzz(func(t *testing.T, meta string, base int64) {
		checkTailDecoded(t, meta, base)
		if b, ok := peekTailBase(meta); ok && b != base {
			checkTailDecoded(t, meta, b)
		}
	})
}

// FuzzTailRoundTrip builds a tail from the fuzzer's bytes (pairs of gap and
// length, a set high bit making a wide hole) and checks the round trip and
// the prefix at the given budget and at twice it.
func FuzzTailRoundTrip(f *testing.F) {
	f.Add([]byte{1, 0, 3, 1, 0, 1, 5}, int64(0), uint16(4096))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, int64(1<<40), uint16(12))
	f.Add([]byte{3, 0x81, 2, 0, 0, 0xff, 0xff, 7, 7}, int64(99), uint16(20))
	f.Fuzz(func(t *testing.T, data []byte, base int64, budget uint16) {
		if base < 0 {
			base = -(base + 1)
		}
		base = min(base, math.MaxInt64-1<<50)
		var rs []Range
		pos := base
		if len(data) > 0 {
			pos += int64(data[0] % 4)
		}
		for i := 1; i+1 < len(data); i += 2 {
			l := int64(data[i+1]%64) + 1
			rs = append(rs, Range{pos, pos + l})
			gap := int64(data[i] & 0x7f)
			if data[i]&0x80 != 0 {
				gap = (gap + 1) << 34
			}
			pos += l + gap
		}
		b1 := checkTail(t, base, rs, int(budget))
		b2 := checkTail(t, base, rs, 2*int(budget)+1)
		if b2 < b1 {
			t.Fatalf("budget %d covers less (bound %d) than %d (bound %d)", 2*int(budget)+1, b2, budget, b1)
		}
	})
}
