package frontier

// The completed-tail encoder behind EncodeTail and AppendTail. The wire
// format is described in tail.go.

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"sync"
)

const (
	// tailMinCompress is the raw size below which deflate is not tried: its
	// block overhead eats anything it could save on a payload this small.
	tailMinCompress = 48

	// tailMaxSteps caps the binary search over prefix lengths when only a
	// compressed encoding can fit more than the raw ones. log2(MaxTailRanges)
	// is 18, so the cap only guards against mistakes; the search is bounded
	// by ~18 compressions.
	tailMaxSteps = 24

	// tailPrecision: the compressed search stops when the longest fitting
	// prefix is known within 1/256 of its length, which saves a third of
	// the compressions on long tails for at most 0.4% of coverage.
	tailPrecision = 256

	// tailGateNum/tailGateDen: when deflating the largest candidate saves
	// less than 1/16 of its size, the tail is judged incompressible and
	// compression is not tried on shorter prefixes either.
	tailGateNum = 15
	tailGateDen = 16
)

// tailEncLen is the length of the metadata string for a payload of n bytes.
func tailEncLen(n int) int { return tailPrefixLen + tailB64.EncodedLen(n) }

// tailUvarintLen is the length of binary.AppendUvarint(nil, x).
func tailUvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// tailLenBound bounds the length of the metadata EncodeTail writes, with any
// budget, for at most n ranges within [base, end). Every uvarint of a range
// (its gap and length) and the bound code are at most end-base; the raw
// payload is the shorter of runs and bitmap, deflate is used only when it is
// shorter still, and a cut tail is shorter than the whole one.
func tailLenBound(base, end int64, n int) int {
	span := uint64(max(end-base, 1))
	v := tailUvarintLen(span)
	runs := tailUvarintLen(uint64(n)) + 2*n*v
	bitmap := 2*v + int((span+7)/8)
	return tailEncLen(tailUvarintLen(uint64(base)) + v + min(runs, bitmap))
}

// tailEncoder holds the scratch memory of one encoding; encoders are pooled
// so that steady-state encoding does not allocate (a flate.Writer alone
// weighs several hundred kilobytes).
type tailEncoder struct {
	base   int64
	rs     []Range // the ranges being encoded: the caller's, or merged
	merged []Range // scratch for coalescing adjacent ranges
	raw    []byte  // raw payload built by buildRaw

	// Compression. comp receives each deflate; best holds the fitting
	// result of the largest prefix so far (bestK ranges, kind bestKd); alt
	// holds the best so far while chooseDeflate compares candidates. zk and
	// zl are the kind and writer that probes use, chosen once per encoding.
	fw              [2]*flate.Writer // by tailLevels index
	comp, best, alt *bytes.Buffer
	bestK, zl       int
	bestKd, zk      byte

	// Bodies of the first bmK / runsK ranges, built once per encoding and
	// cut into the prefixes that probes compress. runEnds[i] is the length
	// of the runs body up to range i.
	bm, runs   []byte
	runEnds    []int
	bmK, runsK int
	hdr        []byte
	last       [1]byte

	out []byte // EncodeTail's output scratch
}

var tailEncoders = sync.Pool{New: func() any {
	return &tailEncoder{comp: new(bytes.Buffer), best: new(bytes.Buffer), alt: new(bytes.Buffer)}
}}

func (e *tailEncoder) release() {
	e.rs = nil // do not keep the caller's slice alive
	tailEncoders.Put(e)
}

func (e *tailEncoder) encode(dst []byte, base int64, ranges []Range, budget int) ([]byte, int64, error) {
	if err := e.load(base, ranges, budget); err != nil {
		return dst, 0, err
	}
	n := len(e.rs)
	if n == 0 {
		return dst, math.MaxInt64, nil
	}

	// limit: the largest raw payload whose string fits the budget.
	limit := -1
	if m := budget - tailPrefixLen; m > 0 {
		limit = min(m, 2*MaxTailPayload) * 3 / 4
	}
	limit = min(limit, MaxTailPayload)
	if limit < 5 { // the smallest payload: base, bound and three bytes of body
		return dst, e.rs[0].From, nil
	}

	// kRaw: longest prefix whose smaller raw encoding fits. kTop: longest
	// prefix the format allows at all (caps), the ceiling for compression.
	kMax := min(n, MaxTailRanges)
	full := e.minRawLen(kMax)
	var kRaw, kTop, rawTop int
	switch {
	case full <= limit:
		kRaw, kTop, rawTop = kMax, kMax, full
	case full <= MaxTailPayload:
		kRaw = e.fitPrefix(limit, kMax)
		kTop, rawTop = kMax, full
	default:
		kRaw = e.fitPrefix(limit, kMax)
		kTop = e.fitPrefix(MaxTailPayload, kMax)
		if kTop > 0 {
			rawTop = e.minRawLen(kTop)
		}
	}

	e.bestK, e.zk, e.bmK, e.runsK = -1, 0, 0, 0
	k := kRaw
	tryCompress := true
	if kRaw < kTop {
		// Only a compressed encoding can cover more. Try the whole tail
		// first: compressible tails usually fit whole, and then the
		// first compression that fits is taken.
		enc := e.chooseDeflate(kTop, rawTop, budget)
		switch {
		case enc <= budget:
			e.keep(kTop)
			k = kTop
		case enc*tailGateDen >= tailEncLen(rawTop)*tailGateNum:
			tryCompress = false // incompressible: kRaw it is
		default:
			// Deterministic binary search over [0, kTop): the probe
			// sequence depends only on the answers, and every answer
			// "fits" for a budget is also "fits" for a larger one, so
			// a larger budget never covers less. Prefixes up to kRaw
			// fit without compressing anything. The search stops once
			// the prefix is known within 1/tailPrecision of itself.
			lo, hi := 0, kTop
			for step := 0; hi-lo > 1 && hi-lo > lo/tailPrecision && step < tailMaxSteps; step++ {
				mid := lo + (hi-lo)/2
				if mid <= kRaw {
					lo = mid
					continue
				}
				e.deflatePrefix(e.zk, e.zl, mid)
				if tailEncLen(e.comp.Len()) <= budget {
					e.keep(mid)
					lo = mid
				} else {
					hi = mid
				}
			}
			k = max(lo, kRaw)
		}
	}
	if k == 0 {
		return dst, e.rs[0].From, nil
	}

	bound := int64(math.MaxInt64)
	if k < n {
		bound = e.rs[k].From
	}

	var kind byte
	var payload []byte
	if k <= kRaw {
		kind = e.buildRaw(k)
		payload = e.raw
		rawEnc := tailEncLen(len(e.raw))
		if e.bestK != k && tryCompress && len(e.raw) >= tailMinCompress {
			if e.zk != 0 {
				e.deflatePrefix(e.zk, e.zl, k)
			} else {
				e.chooseDeflate(k, len(e.raw), -1)
			}
			e.keep(k)
		}
		if e.bestK == k && tailEncLen(e.best.Len()) < rawEnc {
			kind, payload = tailDeflated(e.bestKd), e.best.Bytes()
		}
	} else {
		// k came from a fitting compression, which was kept in best.
		kind, payload = tailDeflated(e.bestKd), e.best.Bytes()
	}

	start := len(dst)
	dst = append(dst, tailTag...)
	dst = append(dst, kind)
	dst = tailB64.AppendEncode(dst, payload)
	if len(dst)-start > budget {
		// Unreachable: every path above checked the length. Were it
		// reached, committing without metadata beats a commit that
		// Kafka rejects.
		return dst[:start], 0, fmt.Errorf("frontier: internal error: tail of %d bytes for budget %d", len(dst)-start, budget)
	}
	return dst, bound, nil
}

func tailDeflated(kind byte) byte {
	if kind == tailKindRuns {
		return tailKindRunsDeflate
	}
	return tailKindBitmapDeflate
}

// load validates the input and sets e.base and e.rs, coalescing adjacent
// ranges (without allocating when there are none).
func (e *tailEncoder) load(base int64, ranges []Range, budget int) error {
	if budget < 0 {
		return fmt.Errorf("%w: budget %d is negative", ErrInvalidTail, budget)
	}
	if base < 0 {
		return fmt.Errorf("%w: base offset %d is negative", ErrInvalidTail, base)
	}
	adjacent := false
	for i, r := range ranges {
		if r.From >= r.To {
			return fmt.Errorf("%w: range %d [%d, %d) is empty", ErrInvalidTail, i, r.From, r.To)
		}
		if i == 0 {
			if r.From < base {
				return fmt.Errorf("%w: range 0 [%d, %d) starts below base %d", ErrInvalidTail, r.From, r.To, base)
			}
			continue
		}
		p := ranges[i-1]
		if r.From < p.To {
			return fmt.Errorf("%w: range %d [%d, %d) overlaps or precedes range %d [%d, %d)", ErrInvalidTail, i, r.From, r.To, i-1, p.From, p.To)
		}
		if r.From == p.To {
			adjacent = true
		}
	}
	e.base = base
	if !adjacent {
		e.rs = ranges
		return nil
	}
	m := e.merged[:0]
	for _, r := range ranges {
		if len(m) > 0 && m[len(m)-1].To == r.From {
			m[len(m)-1].To = r.To
		} else {
			m = append(m, r)
		}
	}
	e.merged, e.rs = m, m
	return nil
}

// boundCode is the encoded bound of the prefix of k ranges: 0 for the whole
// tail, else the distance from its last To to the first range left out.
func (e *tailEncoder) boundCode(k int) uint64 {
	if k == len(e.rs) {
		return 0
	}
	return uint64(e.rs[k].From - e.rs[k-1].To)
}

// pairLen is the run-encoding size of range i.
func (e *tailEncoder) pairLen(i int) int {
	r := e.rs[i]
	gap := r.From - e.base
	if i > 0 {
		gap = r.From - e.rs[i-1].To - 1
	}
	return tailUvarintLen(uint64(gap)) + tailUvarintLen(uint64(r.To-r.From-1))
}

func (e *tailEncoder) headerLen(k int) int {
	return tailUvarintLen(uint64(e.base)) + tailUvarintLen(e.boundCode(k))
}

// runsLen is the raw run-encoding size of the first k ranges, given the sum
// of their pair sizes.
func (e *tailEncoder) runsLen(k, pairs int) int {
	return e.headerLen(k) + tailUvarintLen(uint64(k)) + pairs
}

// runsLenOf is runsLen computing the pair sizes: O(k).
func (e *tailEncoder) runsLenOf(k int) int {
	pairs := 0
	for i := range k {
		pairs += e.pairLen(i)
	}
	return e.runsLen(k, pairs)
}

// bitmapLen is the raw bitmap size of the first k ranges, or
// MaxTailPayload+1 when the bitmap would exceed the payload cap.
func (e *tailEncoder) bitmapLen(k int) int {
	nbits := uint64(e.rs[k-1].To - e.rs[0].From)
	if nbits > 8*MaxTailPayload {
		return MaxTailPayload + 1
	}
	return e.headerLen(k) + tailUvarintLen(uint64(e.rs[0].From-e.base)) + tailUvarintLen(nbits) + int((nbits+7)/8)
}

// runsFloor is a lower bound of runsLen(k): every pair takes two bytes or more.
func (e *tailEncoder) runsFloor(k int) int { return e.headerLen(k) + tailUvarintLen(uint64(k)) + 2*k }

// bitmapWins reports whether the bitmap is the smaller raw encoding of the
// first k ranges, decided in O(1) when it beats the runs' lower bound. Ties
// go to the runs.
func (e *tailEncoder) bitmapWins(k int) bool {
	bm := e.bitmapLen(k)
	return bm <= MaxTailPayload && bm < e.runsFloor(k)
}

// minRawLen is the smaller raw size of the first k ranges: O(1) when the
// bitmap clearly wins, O(k) otherwise.
func (e *tailEncoder) minRawLen(k int) int {
	if e.bitmapWins(k) {
		return e.bitmapLen(k)
	}
	return min(e.bitmapLen(k), e.runsLenOf(k))
}

// fitPrefix returns the longest prefix (at most kMax ranges) whose smaller raw
// encoding is at most limit bytes. Both sizes grow with k (a range adds more
// bytes than any change of the bound code can save), so that prefix is the
// longer of the longest fitting runs prefix, found by a scan that stops at
// the first misfit (at most limit/2 steps), and the longest fitting bitmap
// prefix, found by binary search.
func (e *tailEncoder) fitPrefix(limit, kMax int) int {
	kRuns, pairs := 0, 0
	for i := 1; i <= kMax; i++ {
		pairs += e.pairLen(i - 1)
		if e.runsLen(i, pairs) > limit {
			break
		}
		kRuns = i
	}
	lo, hi := 0, kMax+1 // bitmapLen(lo) fits (or lo == 0), hi does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if e.bitmapLen(mid) <= limit {
			lo = mid
		} else {
			hi = mid
		}
	}
	return max(kRuns, lo)
}

// appendHeader appends the raw header of the first k ranges for kind.
func (e *tailEncoder) appendHeader(b []byte, kind byte, k int) []byte {
	b = binary.AppendUvarint(b, uint64(e.base))
	b = binary.AppendUvarint(b, e.boundCode(k))
	if kind == tailKindRuns {
		return binary.AppendUvarint(b, uint64(k))
	}
	b = binary.AppendUvarint(b, uint64(e.rs[0].From-e.base))
	return binary.AppendUvarint(b, uint64(e.rs[k-1].To-e.rs[0].From))
}

// appendPairs appends the runs body of the first k ranges and, when record
// is set, appends to ends where each pair ends (relative to the body start).
func (e *tailEncoder) appendPairs(b []byte, k int, ends []int, record bool) ([]byte, []int) {
	prev, start := e.base, len(b)
	for i, r := range e.rs[:k] {
		gap := r.From - prev
		if i > 0 {
			gap--
		}
		b = binary.AppendUvarint(b, uint64(gap))
		b = binary.AppendUvarint(b, uint64(r.To-r.From-1))
		prev = r.To
		if record {
			ends = append(ends, len(b)-start)
		}
	}
	return b, ends
}

// appendBitmap appends the bitmap body of the first k ranges.
func (e *tailEncoder) appendBitmap(b []byte, k int) []byte {
	start := e.rs[0].From
	nbits := uint64(e.rs[k-1].To - start)
	body := len(b)
	b = append(b, make([]byte, (nbits+7)/8)...) // appending a make only grows b
	bm := b[body:]
	for _, r := range e.rs[:k] {
		tailSetBits(bm, uint64(r.From-start), uint64(r.To-start))
	}
	return b
}

// tailSetBits sets bits [from, to) of bm (LSB-first within each byte); from < to.
func tailSetBits(bm []byte, from, to uint64) {
	first, last := from/8, (to-1)/8
	fm := byte(0xFF) << (from % 8)
	lm := byte(0xFF) >> (7 - (to-1)%8)
	if first == last {
		bm[first] |= fm & lm
		return
	}
	bm[first] |= fm
	mid := bm[first+1 : last]
	for i := range mid {
		mid[i] = 0xFF
	}
	bm[last] |= lm
}

// buildRaw writes the smaller raw encoding of the first k ranges to e.raw
// and returns its kind.
func (e *tailEncoder) buildRaw(k int) byte {
	if !e.bitmapWins(k) {
		b := e.appendHeader(e.raw[:0], tailKindRuns, k)
		b, _ = e.appendPairs(b, k, nil, false)
		e.raw = b
		if len(b) <= e.bitmapLen(k) {
			return tailKindRuns
		}
	}
	b := e.appendHeader(e.raw[:0], tailKindBitmap, k)
	e.raw = e.appendBitmap(b, k)
	return tailKindBitmap
}

// tailLevels are the compress/flate levels tried, in order. Both write
// plain DEFLATE for the same decoder. BestSpeed wins on anything periodic;
// Huffman-only coding is cheaper and wins on random-looking bitmaps, where
// BestSpeed's short matches cost more than they save.
var tailLevels = [2]int{flate.BestSpeed, flate.HuffmanOnly}

// deflate compresses the concatenation of parts into e.comp with the writer
// of tailLevels[level]. (Writes to a bytes.Buffer cannot fail, and the
// levels are valid.)
func (e *tailEncoder) deflate(level int, parts ...[]byte) {
	e.comp.Reset()
	fw := e.fw[level]
	if fw == nil {
		fw, _ = flate.NewWriter(e.comp, tailLevels[level])
		e.fw[level] = fw
	} else {
		fw.Reset(e.comp)
	}
	for _, p := range parts {
		_, _ = fw.Write(p)
	}
	_ = fw.Close()
}

// deflatePrefix compresses the raw encoding of kind of the first k ranges
// into e.comp. The body is cut from one built for the largest k asked for
// so far in this encoding (probes mostly shrink), instead of being rebuilt.
func (e *tailEncoder) deflatePrefix(kind byte, level, k int) {
	e.hdr = e.appendHeader(e.hdr[:0], kind, k)
	if kind == tailKindRuns {
		if e.runsK < k {
			e.runs, e.runEnds = e.appendPairs(e.runs[:0], k, e.runEnds[:0], true)
			e.runsK = k
		}
		e.deflate(level, e.hdr, e.runs[:e.runEnds[k-1]])
		return
	}
	if e.bmK < k {
		e.bm = e.appendBitmap(e.bm[:0], k)
		e.bmK = k
	}
	nbits := uint64(e.rs[k-1].To - e.rs[0].From)
	nb := (nbits + 7) / 8
	e.last[0] = e.bm[nb-1] & (0xFF >> (7 - (nbits-1)%8))
	e.deflate(level, e.hdr, e.bm[:nb-1], e.last[:])
}

// chooseDeflate compresses the first k ranges in each raw encoding worth
// trying (within 2× of the smaller raw size rawMin, and within the payload
// cap) with each of tailLevels, leaves the smallest result in e.comp, sets
// e.zk and e.zl to how it was made, and returns its string length. It stops
// at the first result whose string fits in stopAt (-1: try everything).
// Deflate can reverse the raw ranking: runs of similar lengths may compress
// better than the bitmap of the same ranges.
func (e *tailEncoder) chooseDeflate(k, rawMin, stopAt int) int {
	worth := min(MaxTailPayload, 2*rawMin)
	e.zk = 0
	for _, kind := range [2]byte{tailKindBitmap, tailKindRuns} {
		if kind == tailKindBitmap && e.bitmapLen(k) > worth ||
			kind == tailKindRuns && (e.runsFloor(k) > worth || e.runsLenOf(k) > worth) {
			continue
		}
		for level := range tailLevels {
			if e.zk != 0 {
				e.comp, e.alt = e.alt, e.comp // alt: the best so far
			}
			e.deflatePrefix(kind, level, k)
			if e.zk == 0 || e.comp.Len() < e.alt.Len() {
				e.zk, e.zl = kind, level
			} else {
				e.comp, e.alt = e.alt, e.comp
			}
			if tailEncLen(e.comp.Len()) <= stopAt {
				return tailEncLen(e.comp.Len())
			}
		}
	}
	return tailEncLen(e.comp.Len())
}

// keep records e.comp, the compression of the first k ranges in kind e.zk,
// as the best so far.
func (e *tailEncoder) keep(k int) {
	e.comp, e.best = e.best, e.comp
	e.bestK, e.bestKd = k, e.zk
}
