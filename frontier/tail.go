package frontier

// The completed-tail codec.
//
// A commit can only carry the completed prefix (the safe offset). Records that
// completed behind an unfinished head would be replayed by the next owner of
// the partition after a crash or a rebalance. The codec packs those completed
// offsets into the commit's metadata string so that the next owner can skip
// them. Kafka caps that string (offset.metadata.max.bytes, 4096 bytes by
// default) and fails the whole commit above the cap, so the encoder never
// exceeds a byte budget: when the tail does not fit it keeps the longest
// prefix of ranges that does and states the bound it covers, instead of
// dropping everything.
//
// Wire format (version 1):
//
//	meta    = "sa1:" kind payload
//	kind    = "r" (runs) | "b" (bitmap) | "R" (deflated runs) | "B" (deflated bitmap)
//	payload = base64url, no padding (RFC 4648 §5), of raw or of raw-DEFLATE(raw)
//	raw     = uvarint(base) uvarint(boundCode) body
//	body r  = uvarint(n) n × ( uvarint(gap) uvarint(length-1) )
//	          gap = From-base for the first range, From-previousTo-1 after it
//	body b  = uvarint(start-base) uvarint(nbits) ceil(nbits/8) bytes
//	          bit i (byte i/8, bit i%8, LSB first) set = offset start+i completed;
//	          the first and last bits are set and the padding bits are zero
//	boundCode = 0 when the tail is complete (Bound = math.MaxInt64),
//	          else Bound - To of the last range (>= 1)
//
// Uvarints are those of encoding/binary, minimal length. Ranges are always
// maximal (adjacent ranges are coalesced), so gaps and lengths are stored
// minus one where they cannot be zero: an empty, overlapping, adjacent or
// unordered range cannot be written at all.

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sync"
)

// Range is the half-open offset interval [From, To).
//
// Half-open ranges need no off-by-one adjustments: the length is To-From, and
// a range that ends at a record's resume position also covers the holes
// (compacted offsets, transaction markers) that follow the record.
type Range struct{ From, To int64 }

const (
	// DefaultMetadataBudget is Kafka's default offset.metadata.max.bytes.
	// A commit whose metadata is longer fails as a whole with
	// OFFSET_METADATA_TOO_LARGE, so it is the natural budget for EncodeTail.
	DefaultMetadataBudget = 4096

	// MaxTailRanges bounds the ranges of one tail. DecodeTail rejects more,
	// and EncodeTail encodes at most this many (reporting the bound), so that
	// a short compressed string cannot make a decoder allocate without limit.
	MaxTailRanges = 1 << 18

	// MaxTailPayload bounds the raw (uncompressed) payload of one tail in
	// bytes, for the same reason: DecodeTail stops inflating past it, and
	// EncodeTail never produces more.
	MaxTailPayload = 1 << 20
)

var (
	// ErrForeignMetadata reports commit metadata that was not written by
	// this codec (another client's, or a human's). It says nothing about
	// completed offsets: the records after the committed offset are all
	// processed.
	ErrForeignMetadata = errors.New("frontier: commit metadata is not a safeack tail")

	// ErrBaseMismatch reports a well-tagged tail that was encoded relative
	// to another offset than the committed one. Its ranges no longer
	// describe the records after the committed offset (the offset was reset
	// or moved by something else), so they must not be trusted.
	ErrBaseMismatch = errors.New("frontier: tail metadata is relative to another offset")

	// ErrCorruptMetadata reports metadata that carries this codec's tag but
	// does not decode to a valid tail. Nothing of it is trusted.
	ErrCorruptMetadata = errors.New("frontier: corrupt tail metadata")

	// ErrInvalidTail reports ranges or a budget that break EncodeTail's
	// contract. Nothing is encoded.
	ErrInvalidTail = errors.New("frontier: invalid tail")
)

const (
	tailTag       = "sa1:"
	tailPrefixLen = len(tailTag) + 1 // tag and encoding letter

	tailKindRuns          = 'r'
	tailKindBitmap        = 'b'
	tailKindRunsDeflate   = 'R'
	tailKindBitmapDeflate = 'B'

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

// tailB64 is the payload alphabet: URL- and filename-safe, unpadded, and
// strict about trailing bits so that every payload has one spelling.
var tailB64 = base64.RawURLEncoding.Strict()

// tailEncLen is the length of the metadata string for a payload of n bytes.
func tailEncLen(n int) int { return tailPrefixLen + tailB64.EncodedLen(n) }

// tailUvarintLen is the length of binary.AppendUvarint(nil, x).
func tailUvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// EncodeTail encodes the completed ranges above base (the offset being
// committed) into an ASCII string of at most budget bytes, to be committed as
// that offset's metadata.
//
// ranges must be sorted, non-empty, non-overlapping and start at or above
// base; adjacent ranges are coalesced. The Tracker's AppendCompleted yields
// exactly such ranges. base must be non-negative and budget must not be
// negative. Invalid input returns an error wrapping ErrInvalidTail and no
// string.
//
// bound states what the string covers: every offset in [base, bound) that is
// in no encoded range is NOT known to be completed, and nothing is said about
// offsets >= bound. When everything fits, bound is math.MaxInt64. When it
// does not, the longest prefix of ranges that fits is encoded and bound is
// the From of the first range left out, so a caller detects truncation with
// bound != math.MaxInt64. An empty ranges slice encodes to "" with bound
// math.MaxInt64 (plain offsets: nothing to say). A budget too small for even
// one range also yields "", with bound = ranges[0].From.
//
// The encoder writes the shorter of a run-length and a bitmap encoding, or a
// deflated one when that is shorter still. Raw prefix sizes are computed
// without building anything (O(1) per bitmap prefix, a scan bounded by the
// budget for runs). When only a compressed encoding could fit more, the whole
// tail is compressed once per encoding kind worth trying; if that fits, or
// saves too little to matter, the search ends there. Otherwise the kind that
// compressed better is kept and the prefix length is found by a
// deterministic binary search (at most ~18 more compressions), so that a
// larger budget never covers less. At most MaxTailRanges ranges and
// MaxTailPayload raw bytes are encoded. Encoding 100,000 retained entries
// takes well under a millisecond for typical shapes; call it when
// committing, not on every acknowledgement.
func EncodeTail(base int64, ranges []Range, budget int) (meta string, bound int64, err error) {
	e := tailEncoders.Get().(*tailEncoder)
	defer e.release()
	out, bound, err := e.encode(e.out[:0], base, ranges, budget)
	e.out = out
	if err != nil {
		return "", 0, err
	}
	return string(out), bound, nil
}

// AppendTail is EncodeTail appending the metadata to dst, for callers that
// reuse a buffer per partition: with a reused dst it does not allocate in the
// steady state. budget limits the appended bytes only. On error dst is
// returned unchanged.
func AppendTail(dst []byte, base int64, ranges []Range, budget int) ([]byte, int64, error) {
	e := tailEncoders.Get().(*tailEncoder)
	defer e.release()
	return e.encode(dst, base, ranges, budget)
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

// Tail is a decoded completed tail: the offsets above Base known to be
// completed when the metadata was written. Offsets at or above Bound are
// not covered (the encoder ran out of budget); Bound is math.MaxInt64 when
// the tail is complete. The zero Tail, and the Tail returned with any error,
// contains nothing, so ignoring an error is never unsafe.
type Tail struct {
	// Base is the committed offset the tail is relative to.
	Base int64
	// Bound is the first offset the tail says nothing about.
	Bound int64
	// Ranges are the completed ranges: sorted, maximal (non-adjacent),
	// non-empty, within [Base, Bound).
	Ranges []Range
}

// Contains reports whether offset is known completed, in O(log n). Offsets
// below Base are not part of the tail (they are committed) and report false.
func (t Tail) Contains(offset int64) bool {
	if offset < t.Base || offset >= t.Bound {
		return false
	}
	lo, hi := 0, len(t.Ranges) // first range with To > offset
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if t.Ranges[mid].To <= offset {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo < len(t.Ranges) && t.Ranges[lo].From <= offset
}

// Len returns the number of offsets covered by the ranges, e.g. for logging
// how many records a new owner may skip. Holes inside a range (offsets that
// hold no record) count too.
func (t Tail) Len() int64 {
	var n int64
	for _, r := range t.Ranges {
		n += r.To - r.From
	}
	return n
}

// DecodeTail parses metadata committed with offset base.
//
// It never panics and never trusts its input. "" yields an empty Tail
// (Bound = Base: nothing known) and a nil error. Metadata without this codec's tag (another
// client's) yields ErrForeignMetadata; a tail encoded relative to another
// offset yields ErrBaseMismatch; anything else that is not a valid tail
// (unknown version or encoding, bad base64, truncated or overlong varints,
// offsets that overflow, trailing bytes, a bad deflate stream, a payload
// inflating past MaxTailPayload, more than MaxTailRanges ranges, non-canonical
// bitmaps) yields ErrCorruptMetadata. Errors wrap these sentinels (use
// errors.Is) and say what was wrong. With an error, the returned Tail is
// empty (Base = Bound = base) and contains nothing.
func DecodeTail(meta string, base int64) (Tail, error) {
	empty := Tail{Base: base, Bound: base}
	if meta == "" {
		return empty, nil
	}
	t, err := tailDecode(meta, base)
	if err != nil {
		return empty, err
	}
	return t, nil
}

// tailMaxEncoded bounds the base64 text: no valid payload is longer than
// MaxTailPayload bytes, compressed or not.
var tailMaxEncoded = tailB64.EncodedLen(MaxTailPayload)

func tailCorrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptMetadata, fmt.Sprintf(format, args...))
}

// tailSnippet quotes the start of foreign metadata for an error message.
func tailSnippet(s string) string {
	if len(s) > 32 {
		return fmt.Sprintf("%q…", s[:32])
	}
	return fmt.Sprintf("%q", s)
}

// tailSplitTag recognizes "sa<digits>:" and returns the version digits and
// the rest. Anything else is not ours.
func tailSplitTag(meta string) (ver, rest string, ok bool) {
	if len(meta) < 4 || meta[0] != 's' || meta[1] != 'a' {
		return "", "", false
	}
	i := 2
	for i < len(meta) && i < 12 && '0' <= meta[i] && meta[i] <= '9' {
		i++
	}
	if i == 2 || i >= len(meta) || meta[i] != ':' {
		return "", "", false
	}
	return meta[2:i], meta[i+1:], true
}

func tailDecode(meta string, base int64) (Tail, error) {
	ver, rest, ok := tailSplitTag(meta)
	if !ok {
		return Tail{}, fmt.Errorf("%w: %s", ErrForeignMetadata, tailSnippet(meta))
	}
	if ver != "1" {
		return Tail{}, tailCorrupt("unknown version %q (this build reads version 1)", ver)
	}
	if rest == "" {
		return Tail{}, tailCorrupt("missing encoding letter")
	}
	kind, text := rest[0], rest[1:]
	switch kind {
	case tailKindRuns, tailKindBitmap, tailKindRunsDeflate, tailKindBitmapDeflate:
	default:
		return Tail{}, tailCorrupt("unknown encoding %q", kind)
	}
	if len(text) > tailMaxEncoded {
		return Tail{}, tailCorrupt("payload of %d characters exceeds the limit of %d", len(text), tailMaxEncoded)
	}
	raw, err := tailB64.DecodeString(text)
	if err != nil {
		return Tail{}, tailCorrupt("bad base64 payload: %v", err)
	}
	if tailB64.EncodedLen(len(raw)) != len(text) { // the decoder skips \r and \n
		return Tail{}, tailCorrupt("bad base64 payload: line breaks")
	}
	switch kind {
	case tailKindRunsDeflate:
		kind = tailKindRuns
		raw, err = tailInflate(raw)
	case tailKindBitmapDeflate:
		kind = tailKindBitmap
		raw, err = tailInflate(raw)
	}
	if err != nil {
		return Tail{}, err
	}
	return tailParse(raw, kind, base)
}

var tailInflaters sync.Pool // of io.ReadCloser implementing flate.Resetter

// tailInflate decompresses a raw DEFLATE stream of at most MaxTailPayload
// bytes that must end exactly at the end of comp.
func tailInflate(comp []byte) ([]byte, error) {
	br := bytes.NewReader(comp) // an io.ByteReader: flate reads no byte past its stream
	fr, _ := tailInflaters.Get().(io.ReadCloser)
	if fr == nil {
		fr = flate.NewReader(br)
	} else if err := fr.(flate.Resetter).Reset(br, nil); err != nil {
		return nil, tailCorrupt("bad deflate stream: %v", err)
	}
	defer tailInflaters.Put(fr)
	raw, err := io.ReadAll(io.LimitReader(fr, MaxTailPayload+1))
	if err != nil {
		return nil, tailCorrupt("bad deflate stream: %v", err)
	}
	if len(raw) > MaxTailPayload {
		return nil, tailCorrupt("deflated payload inflates past %d bytes", MaxTailPayload)
	}
	if br.Len() != 0 {
		return nil, tailCorrupt("%d trailing bytes after the deflate stream", br.Len())
	}
	return raw, nil
}

// tailReader reads minimal uvarints from a raw payload.
type tailReader struct{ b []byte }

func (r *tailReader) uvarint(what string) (uint64, error) {
	x, n := binary.Uvarint(r.b)
	switch {
	case n == 0:
		return 0, tailCorrupt("truncated %s", what)
	case n < 0:
		return 0, tailCorrupt("%s overflows 64 bits", what)
	case n > 1 && r.b[n-1] == 0:
		return 0, tailCorrupt("%s is not a minimal varint", what)
	}
	r.b = r.b[n:]
	return x, nil
}

func tailParse(raw []byte, kind byte, base int64) (Tail, error) {
	rd := tailReader{raw}
	b, err := rd.uvarint("base offset")
	if err != nil {
		return Tail{}, err
	}
	if b > math.MaxInt64 {
		return Tail{}, tailCorrupt("base offset %d overflows int64", b)
	}
	if int64(b) != base {
		return Tail{}, fmt.Errorf("%w: tail is relative to offset %d, committed offset is %d", ErrBaseMismatch, b, base)
	}
	bc, err := rd.uvarint("bound")
	if err != nil {
		return Tail{}, err
	}
	var ranges []Range
	if kind == tailKindRuns {
		ranges, err = tailParseRuns(&rd, base)
	} else {
		ranges, err = tailParseBitmap(&rd, base)
	}
	if err != nil {
		return Tail{}, err
	}
	if len(rd.b) != 0 {
		return Tail{}, tailCorrupt("%d trailing bytes", len(rd.b))
	}
	bound := int64(math.MaxInt64)
	if bc != 0 {
		last := ranges[len(ranges)-1].To
		if bc >= uint64(math.MaxInt64-last) {
			return Tail{}, tailCorrupt("bound %d past offset %d overflows int64", bc, last)
		}
		bound = last + int64(bc)
	}
	// Defense in depth: the format cannot express a bad range, but the
	// result is checked against the contract anyway.
	if err := tailCheck(ranges, base, bound); err != nil {
		return Tail{}, err
	}
	return Tail{Base: base, Bound: bound, Ranges: ranges}, nil
}

func tailParseRuns(rd *tailReader, base int64) ([]Range, error) {
	n, err := rd.uvarint("range count")
	if err != nil {
		return nil, err
	}
	switch {
	case n == 0:
		return nil, tailCorrupt("no ranges (an empty tail is the empty string)")
	case n > MaxTailRanges:
		return nil, tailCorrupt("%d ranges exceed the limit of %d", n, MaxTailRanges)
	case n > uint64(len(rd.b)/2):
		return nil, tailCorrupt("%d ranges cannot fit in the %d bytes left", n, len(rd.b))
	}
	ranges := make([]Range, 0, n)
	prev := base
	for i := range n {
		gap, err := rd.uvarint("gap")
		if err != nil {
			return nil, fmt.Errorf("%w (range %d)", err, i)
		}
		length, err := rd.uvarint("length")
		if err != nil {
			return nil, fmt.Errorf("%w (range %d)", err, i)
		}
		// Need prev + skip + gap + length + 1 <= MaxInt64, where skip is
		// the one offset between two ranges that cannot be completed.
		room := uint64(math.MaxInt64 - prev)
		skip := uint64(min(i, 1))
		if room < skip || gap >= room-skip || length >= room-skip-gap {
			return nil, tailCorrupt("range %d: offset overflows int64", i)
		}
		from := prev + int64(skip+gap)
		to := from + int64(length) + 1
		ranges = append(ranges, Range{from, to})
		prev = to
	}
	return ranges, nil
}

func tailParseBitmap(rd *tailReader, base int64) ([]Range, error) {
	off, err := rd.uvarint("bitmap start")
	if err != nil {
		return nil, err
	}
	nbits, err := rd.uvarint("bitmap length")
	if err != nil {
		return nil, err
	}
	if nbits == 0 {
		return nil, tailCorrupt("empty bitmap (an empty tail is the empty string)")
	}
	if off >= uint64(math.MaxInt64-base) || nbits > uint64(math.MaxInt64-base)-off {
		return nil, tailCorrupt("bitmap of %d bits at %d past base overflows int64", nbits, off)
	}
	nbytes := nbits/8 + min(nbits%8, 1)
	if nbytes > uint64(len(rd.b)) {
		return nil, tailCorrupt("bitmap truncated: %d of %d bytes", len(rd.b), nbytes)
	}
	bm := rd.b[:nbytes]
	rd.b = rd.b[nbytes:]
	if bm[0]&1 == 0 {
		return nil, tailCorrupt("bitmap does not start with a completed offset")
	}
	last := bm[nbytes-1]
	if tail := nbits % 8; tail != 0 && last>>tail != 0 {
		return nil, tailCorrupt("bitmap has nonzero padding bits")
	}
	if last&(1<<((nbits-1)%8)) == 0 {
		return nil, tailCorrupt("bitmap does not end with a completed offset")
	}
	// Count the runs (a set bit after a clear one) before allocating.
	var runs uint64
	carry := byte(0)
	for _, x := range bm {
		runs += uint64(bits.OnesCount8(x &^ (x<<1 | carry)))
		carry = x >> 7
	}
	if runs > MaxTailRanges {
		return nil, tailCorrupt("bitmap holds %d ranges, more than the limit of %d", runs, MaxTailRanges)
	}
	ranges := make([]Range, 0, runs)
	start := base + int64(off)
	open := false
	var from int64
	for i, x := range bm {
		// Jump from one transition to the next within the byte: the next
		// set bit while closed, the next clear bit while open.
		for pos := 0; pos < 8; {
			m := x
			if open {
				m = ^x
			}
			m &= 0xFF << pos
			if m == 0 {
				break
			}
			p := bits.TrailingZeros8(m)
			at := start + int64(i)*8 + int64(p)
			if open {
				ranges = append(ranges, Range{from, at})
			} else {
				from = at
			}
			open = !open
			pos = p + 1
		}
	}
	if open {
		ranges = append(ranges, Range{from, start + int64(nbits)})
	}
	return ranges, nil
}

// tailCheck verifies the Tail contract: ranges non-empty, sorted, maximal,
// within [base, bound).
func tailCheck(ranges []Range, base, bound int64) error {
	prev := base - 1 // ranges may start at base; base >= 0 here
	for i, r := range ranges {
		switch {
		case r.From >= r.To:
			return tailCorrupt("range %d [%d, %d) is empty", i, r.From, r.To)
		case i == 0 && r.From < base:
			return tailCorrupt("range 0 [%d, %d) starts below base %d", r.From, r.To, base)
		case i > 0 && r.From <= prev:
			return tailCorrupt("range %d [%d, %d) overlaps, touches or precedes the range before it", i, r.From, r.To)
		case r.To > bound:
			return tailCorrupt("range %d [%d, %d) extends beyond the bound %d", i, r.From, r.To, bound)
		}
		prev = r.To
	}
	return nil
}
