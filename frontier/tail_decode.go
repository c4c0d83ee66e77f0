package frontier

// The completed-tail decoder behind DecodeTail. It never trusts its input:
// see DecodeTail in tail.go for what it rejects and the wire format there.

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sync"
)

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
	if ver == "2" {
		return tailDecodeV2(meta, base)
	}
	if ver != "1" {
		return Tail{}, tailCorrupt("unknown version %q (this build reads versions 1 and 2)", ver)
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
