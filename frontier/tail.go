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
// Version 2 (tail_epoch.go) adds the leader epoch of the records below the
// committed offset in front of the same tail.
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
	"encoding/base64"
	"errors"
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
)

// tailB64 is the payload alphabet: URL- and filename-safe, unpadded, and
// strict about trailing bits so that every payload has one spelling.
var tailB64 = base64.RawURLEncoding.Strict()

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
