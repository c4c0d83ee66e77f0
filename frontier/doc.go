// Package frontier keeps the per-partition bookkeeping that decides which
// Kafka offset may be committed when records of one partition are processed
// concurrently and complete out of order.
//
// The rule is the completed prefix: a consumer may resume after a record only
// when that record and every record delivered before it have completed. A
// Tracker records the delivered records of one partition assignment in
// delivery order, hands out a Ticket per record, and reports the resume
// position justified by the contiguous run of completed tickets at its head.
//
// Offsets may have holes (compaction, transaction markers): a Tracker never
// waits for an offset that was not offered to it.
//
// A Tracker is single-owner: it has no locks and no goroutines, and its
// methods must not be called concurrently. Callers that complete tickets from
// several goroutines serialize the calls (the safeack subscriber guards each
// partition's Tracker with that partition's mutex). Distinct Trackers share
// no state and may be used from different goroutines freely.
//
// # The completed tail
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
//
// Version 2 puts the leader epoch of the records below the committed offset
// in front of the same tail, for the truncation check a client that cannot
// set the commit's own epoch field needs (KIP-320; see AppendTailEpoch):
//
//	meta    = "sa2:" epoch [ ":" kind payload ]
//	epoch   = decimal, 0 to 2147483647, no sign, no leading zero
//
// "sa2:7" is the epoch alone, with no tail. DecodeTail reads both versions.
//
// EncodeTail and AppendTail write version 1, AppendTailEpoch version 2;
// DecodeTail reads them and trusts
// nothing else: another client's metadata (ErrForeignMetadata), a tail
// relative to another offset (ErrBaseMismatch) and anything malformed
// (ErrCorruptMetadata) yield an empty Tail.
package frontier
